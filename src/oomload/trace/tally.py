"""``trace stats``' prefix reuse in memory that does not grow with the log: exact up to a bound, then sampled.

``PrefixTally`` takes requests one at a time, in trace order, and gathers what ``PrefixStats`` holds: the
share of prompt tokens in blocks seen earlier (an infinite cache), the share an LRU pool of a given size
would still hold (``oomload.trace.prefix.CacheModel``: its memory is the pool's, one entry a block), the
largest shared prefixes and the turns per conversation.

**The chain tree.** Every full prompt block is a node of one tree (``_ChainTree``): its uses, its depth and
its parent. Ids are chained (block k's id names the whole prefix through block k, as every source of
``hash_ids`` oomload writes or reads is), so a block seen earlier means its whole prefix was seen earlier:
the blocks of a prompt that were seen form a leading run, and "seen earlier" is "a node of the tree".

**Exact up to ``EXACT_BLOCKS`` distinct blocks.** Up to that many nodes every figure is exactly what
a tally with unbounded memory gives. Past it the tree is **thinned**: ``step`` doubles (2, 4, 8, …)
until the tree is three quarters full, and a node stays when its depth (1, 2, … from the prompt's
start) is a multiple of ``step`` or it was used ``step`` times or more (a system prompt; its ancestors
were used as often, so they stay too); a kept node's parent becomes its nearest kept ancestor. From
then on a new block is added only at a depth that is a multiple of ``step``, and every node held counts
its uses exactly (a block's depth is fixed by its id, so a kept depth was held from its first use).
A prompt has at most 1,000,000 blocks, so ``step`` is bounded and the tree holds at most
``EXACT_BLOCKS`` nodes. Once thinned, every block seen also goes into a Bloom filter (``_SeenBloom``,
64 MiB, filled ``PENDING_BLOCKS`` blocks at a time with numpy, those meanwhile held in a set): it never
says "no" to a block it was given. When it is filled depends on the requests alone, so the figures
do not depend on how the log was read (batches, workers, a log or its trace). What that costs, and
what the output states:

- **seen earlier**: a prompt's run of seen blocks is at least the depth of its deepest block held
  (or still in the set) and at most the depth before its first block that is at a kept
  depth and not held, or that the Bloom filter never saw. The figure is the middle of the summed
  intervals and ``seen_hit_tokens_error`` half their width: ``|figure − exact| ≤ error``, a bound
  that always holds (given chained ids), not a probability;
- **largest shared prefixes**: found among the nodes held (their uses exact), so each is up to
  ``step − 1`` blocks longer than listed (``tokens_error``): a deeper prefix with as many uses would
  have a held node at the next multiple of ``step``;
- **conversations** (a ``session`` column, or inferred from the chains: a request whose chain of
  full blocks holds an earlier request's last full block is its next turn, and each turn is
  continued once — the replay's rule, ``oomload.load.payload.conversation_units``): at most
  ``EXACT_CONVERSATIONS`` keys (sessions; chain ends) are held, the least recently used given up
  first (a hundredth at a time). A request whose key was given up starts a new conversation (or,
  inferred, joins the one a shallower end names). A Bloom filter (``_Bloom``, fixed size, no false
  negatives) of the keys given up counts every request that may have gone elsewhere; each moves one
  request (and its later turns) to another conversation, which changes the count of conversations by
  at most one, so ``|count − exact| ≤ count_error`` (with sessions the count is only ever too high).
  Their turns may be split too.

A conversation that can gain no more turns (no chain end points to it) is counted at once in a
histogram, so conversations are held only while they can still grow, in exact mode too. The pool
figure is always exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np
import numpy.typing as npt

from oomload.trace.model import PrefixInfo
from oomload.trace.prefix import CacheModel, ConversationTurns, SharedPrefix, describe_prefix, top_prefixes

EXACT_BLOCKS = 2_000_000  # distinct blocks held exactly: ~165 bytes each (measured)
EXACT_CONVERSATIONS = 500_000  # sessions, or chain ends, held at once: ~200 bytes each (measured)
BLOOM_BITS = 1 << 26  # 8 MiB of bits for what was given up (conversations, chain ends)
SEEN_BLOOM_BITS = 1 << 29  # 64 MiB of bits for every block seen, once the tree is thinned
PENDING_BLOCKS = 1 << 18  # blocks gathered (exactly, in a set) before they go into that filter at once
_MIX = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


class _Bloom:
    """A fixed-size Bloom filter of ints (3 probes): ``maybe`` is never false for an added key."""

    def __init__(self, bits: int = BLOOM_BITS) -> None:
        self.bits = bytearray(bits // 8)
        self.mask = bits - 1
        self.empty = True

    def _probes(self, key: int) -> tuple[int, int, int]:
        h = ((key & _MASK64) * _MIX) & _MASK64
        h ^= h >> 29
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 32
        return h & self.mask, (h >> 21) & self.mask, ((h >> 42) ^ (h << 3)) & self.mask

    def add(self, key: int) -> None:
        self.empty = False
        for bit in self._probes(key):
            self.bits[bit >> 3] |= 1 << (bit & 7)

    def maybe(self, key: int) -> bool:
        if self.empty:
            return False
        h = ((key & _MASK64) * _MIX) & _MASK64  # ``_probes``, inline: one call a block of a prompt
        h ^= h >> 29
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 32
        bits, mask = self.bits, self.mask
        bit = h & mask
        if not bits[bit >> 3] >> (bit & 7) & 1:
            return False
        bit = (h >> 21) & mask
        if not bits[bit >> 3] >> (bit & 7) & 1:
            return False
        bit = ((h >> 42) ^ (h << 3)) & mask
        return bool(bits[bit >> 3] >> (bit & 7) & 1)


class _SeenBloom:
    """Every block seen once the tree is thinned: a Bloom filter of ``SEEN_BLOOM_BITS`` bits (3 probes,
    numpy), filled ``PENDING_BLOCKS`` blocks at a time (``pending`` holds them until then, exactly). "No"
    is certain: the first block of a prompt it says no to bounds the prompt's run of seen blocks. When
    it is filled depends on the requests alone, not on how they were read (batches, workers), so the
    figures are the same for a log and for the trace built from it."""

    def __init__(self, bits: int) -> None:
        self.words = np.zeros(bits // 8, dtype=np.uint8)
        self.mask = np.uint64(bits - 1)
        self.pending: set[int] = set()

    @staticmethod
    def _mix(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        with np.errstate(over="ignore"):
            h = keys * np.uint64(_MIX)
            h ^= h >> np.uint64(29)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(32)
        return h

    def _probes(self, keys: npt.NDArray[np.uint64]) -> list[npt.NDArray[np.uint64]]:
        h = self._mix(keys)
        return [
            h & self.mask,
            (h >> np.uint64(21)) & self.mask,
            ((h >> np.uint64(42)) ^ (h << np.uint64(3))) & self.mask,
        ]

    def add(self, keys: npt.NDArray[np.uint64]) -> None:
        for bit in self._probes(keys):
            np.bitwise_or.at(
                self.words, bit >> np.uint64(3), np.left_shift(1, bit & np.uint64(7)).astype(np.uint8)
            )

    def flush(self) -> None:
        if self.pending:
            self.add(np.fromiter(self.pending, dtype=np.uint64, count=len(self.pending)))
            self.pending.clear()

    def maybe(self, key: int) -> bool:
        """Whether ``key`` may have been added (never False for one that was)."""
        if key in self.pending:
            return True
        h = ((key & _MASK64) * _MIX) & _MASK64  # ``_mix`` and ``_probes`` on one Python int
        h ^= h >> 29
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 32
        mask, words = int(self.mask), self.words
        for bit in (h & mask, (h >> 21) & mask, ((h >> 42) ^ ((h << 3) & _MASK64)) & mask):
            if not words[bit >> 3] >> (bit & 7) & 1:
                return False
        return True


class _ChainTree:
    """Uses, depth and parent of every kept block (module docstring: exact, then thinned by depth)."""

    def __init__(self, block_tokens: int, max_nodes: int) -> None:
        self.block_tokens = block_tokens
        self.max_nodes = max_nodes
        self.step = 1  # blocks at depths that are a multiple of it are kept (and those used ≥ step times)
        self.uses: Counter[int] = Counter()
        self.depth: dict[int, int] = {}
        self.parent: dict[int, int | None] = {}
        self.seen: _SeenBloom | None = None  # once thinned

    def add(self, ids: Sequence[int]) -> None:
        """A request's full blocks (after the seen-earlier lookup: its own blocks hit nothing)."""
        uses, depth, parent, step = self.uses, self.depth, self.parent, self.step
        if step == 1:
            uses.update(ids)
            for k, block_id in enumerate(ids):
                if block_id not in depth:
                    depth[block_id] = k + 1
                    parent[block_id] = ids[k - 1] if k else None
        else:
            assert self.seen is not None
            self.seen.pending.update(ids)
            above: int | None = None
            for k, block_id in enumerate(ids):
                if block_id in depth:
                    uses[block_id] += 1
                    above = block_id
                elif (k + 1) % step == 0:
                    uses[block_id] = 1
                    depth[block_id] = k + 1
                    parent[block_id] = above
                    above = block_id
            if len(self.seen.pending) > PENDING_BLOCKS:
                self.seen.flush()
        if len(depth) > self.max_nodes:
            self._thin()

    def _thin(self) -> None:
        """Double ``step`` until the tree is at most three quarters full: a node stays when its depth is
        a multiple of ``step`` or it was used ``step`` times or more (then so were its ancestors); a
        kept node's parent becomes its nearest kept ancestor."""
        if self.seen is None:
            self.seen = _SeenBloom(SEEN_BLOOM_BITS)
            self.seen.add(np.fromiter(self.depth, dtype=np.uint64, count=len(self.depth)))
        while len(self.depth) > self.max_nodes * 3 // 4:
            step = self.step * 2
            depth, parent, uses = self.depth, self.parent, self.uses
            kept = {b: d for b, d in depth.items() if d % step == 0 or uses[b] >= step}
            self.depth = kept  # rebuilt, not thinned in place: a dict keeps its table when emptied
            self.parent = {b: _kept_ancestor(parent, kept, b) for b in kept}
            del parent
            self.uses = Counter({b: uses[b] for b in kept})
            del uses, depth
            self.step = step

    def run_bounds(self, ids: Sequence[int]) -> tuple[int, int]:
        """The fewest and most leading blocks of ``ids`` seen earlier (equal while exact). Once thinned:
        at least through the deepest block held or seen in this batch, at most up to the first block at
        a kept depth not held, or the first the Bloom filter never saw."""
        depth, step, n = self.depth, self.step, len(ids)
        if step == 1:
            run = 0
            while run < n and ids[run] in depth:
                run += 1
            return run, run
        seen = self.seen
        assert seen is not None
        pending = seen.pending
        low = 0
        for k, block_id in enumerate(ids):
            if block_id in depth or block_id in pending:
                low = k + 1
            elif (k + 1) % step == 0 or not seen.maybe(block_id):
                return low, k
        return low, n

    def top(self, count: int) -> list[SharedPrefix]:
        """The ``count`` held prefixes with the most tokens × uses that no longer held one matches in uses."""
        return top_prefixes(self.uses, self.parent, self.depth, self.block_tokens, count)


def _kept_ancestor(parent: dict[int, int | None], kept: dict[int, int], block_id: int) -> int | None:
    up = parent[block_id]
    while up is not None and up not in kept:
        up = parent[up]
    return up


class _Conversations:
    """Requests per conversation, holding at most ``max_keys`` keys (sessions, or chain ends) at once.

    ``keys`` maps a key to its conversation, least recently used first; ``live`` a conversation to
    [requests, keys pointing to it]. A conversation no key points to can gain no more requests: it
    goes into ``histogram`` (requests → conversations). A key given up for room goes into ``gone``;
    a request whose conversation a key in ``gone`` could have decided counts in ``maybe_split``.
    """

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self.keys: dict[object, int] = {}
        self.live: dict[int, list[int]] = {}
        self.histogram: Counter[int] = Counter()
        self.started = 0
        self.given_up = 0
        self.maybe_split = 0
        self.gone = _Bloom()

    def join(self, conversation: int | None, key: object, doubt: bool = False) -> int:
        """One request: of ``conversation`` (``None``: a new one), now found by ``key``; ``doubt``: a key
        given up may have put it elsewhere (counted in ``maybe_split``)."""
        live = self.live
        if conversation is None:
            conversation = self.started
            self.started += 1
            live[conversation] = [0, 0]
        if doubt:
            self.maybe_split += 1
        entry = live[conversation]
        entry[0] += 1
        keys = self.keys
        old = keys.pop(key, None)  # then inserted again: the keys stay in order of last use
        keys[key] = conversation
        if old != conversation:
            entry[1] += 1
            if old is not None:
                self._unref(old)
        if len(keys) > self.max_keys:
            # the least recently used hundredth at once: the keys given up leave empty slots at the
            # front of the dict, and each walk to the first key passes them
            for first in list(islice(keys, max(1, self.max_keys // 100))):
                self.gone.add(first if isinstance(first, int) else hash(first))
                self.given_up += 1
                self._unref(keys.pop(first))
        return conversation

    def release(self, key: object) -> None:
        """``key`` finds its conversation no more (a chain end that was continued)."""
        conversation = self.keys.pop(key, None)
        if conversation is not None:
            self._unref(conversation)

    def _unref(self, conversation: int) -> None:
        entry = self.live[conversation]
        entry[1] -= 1
        if entry[1] == 0:
            self.histogram[entry[0]] += 1
            del self.live[conversation]

    def counts(self) -> Counter[int]:
        """Requests → conversations, every conversation (held or closed)."""
        counts = Counter(self.histogram)
        counts.update(entry[0] for entry in self.live.values())
        return counts


@dataclass(frozen=True, slots=True)
class PrefixStats:
    """What ``trace stats`` says about prefix reuse (``PrefixTally.result``)."""

    info: PrefixInfo
    block_tokens: int  # the block size hits are counted in (the server's when given, else the trace's)
    requests: int
    requests_with_ids: int
    prompt_tokens: int
    seen_hit_tokens: int  # infinite cache: the upper bound (the middle of its interval once sampled)
    pool_blocks: int | None
    pool_hit_tokens: int | None
    shared: tuple[SharedPrefix, ...]
    turns: ConversationTurns
    exact_blocks_limit: int = EXACT_BLOCKS
    exact_conversations_limit: int = EXACT_CONVERSATIONS
    sample_step_blocks: int = 1  # blocks kept at every this-many depths (1: all, exact)
    seen_hit_tokens_error: int = 0  # |seen_hit_tokens − exact| ≤ it
    shared_tokens_error: int = 0  # each shared prefix is up to this many tokens longer
    conversations_error: int = 0  # conversations counted too many, at most

    @property
    def seen_share(self) -> float:
        return self.seen_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def seen_share_error(self) -> float:
        return self.seen_hit_tokens_error / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def pool_share(self) -> float | None:
        if self.pool_hit_tokens is None:
            return None
        return self.pool_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def approximate(self) -> bool:
        return self.sample_step_blocks > 1 or self.conversations_error > 0

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.info.source,
            "trace_block_tokens": self.info.block_tokens,
            "exact": self.info.exact,
            "truncated_requests": self.info.truncated_requests,
            "description": describe_prefix(self.info),
            "block_tokens": self.block_tokens,
            "requests_with_ids": self.requests_with_ids,
            "prompt_tokens": self.prompt_tokens,
            "seen_hit_tokens": self.seen_hit_tokens,
            "seen_hit_fraction": self.seen_share,
            "pool_blocks": self.pool_blocks,
            "pool_hit_tokens": self.pool_hit_tokens,
            "pool_hit_fraction": self.pool_share,
            "largest_shared_prefixes": [
                {
                    "block_id": p.block_id,
                    "tokens": p.tokens,
                    "uses": p.uses,
                    "tokens_error": self.shared_tokens_error,
                }
                for p in self.shared
            ],
            "conversations": {
                "count": self.turns.conversations,
                "requests": self.turns.requests,
                "mean_turns": self.turns.mean_turns,
                "max_turns": self.turns.max_turns,
                "turns_histogram": {str(k): v for k, v in self.turns.histogram.items()},
                "inferred_from_chains": self.turns.inferred,
                "count_error": self.conversations_error,
            },
            "approximation": {
                "approximate": self.approximate,
                "exact_blocks_limit": self.exact_blocks_limit,
                "exact_conversations_limit": self.exact_conversations_limit,
                "sample_step_blocks": self.sample_step_blocks,
                "seen_hit_tokens_error": self.seen_hit_tokens_error,
                "seen_hit_fraction_error": self.seen_share_error,
            },
        }


class PrefixTally:
    """Everything ``PrefixStats`` holds, gathered one request at a time in trace order (module docstring)."""

    def __init__(
        self,
        info: PrefixInfo,
        *,
        pool_blocks: int | None = None,
        server_block_tokens: int | None = None,
        top: int = 5,
        exact_blocks: int = EXACT_BLOCKS,
        exact_conversations: int = EXACT_CONVERSATIONS,
    ) -> None:
        self.info = info
        shape = CacheModel(info, None, server_block_tokens)  # the block arithmetic, and its checks
        self.block_tokens, self.factor = shape.block_tokens, shape.factor
        self.trace_block_tokens = info.block_tokens
        self.pool = None if pool_blocks is None else CacheModel(info, pool_blocks, server_block_tokens)
        self.exact_blocks = exact_blocks
        self.tree = _ChainTree(info.block_tokens, exact_blocks)
        self.top = top
        self.requests = self.with_ids = self.prompt_tokens = self.pool_hits = 0
        self.seen_low = self.seen_high = 0  # blocks, in the server's
        self.has_sessions = False
        self.exact_conversations = exact_conversations
        self.sessions = _Conversations(exact_conversations)
        self.chains = _Conversations(exact_conversations)

    def add(
        self,
        hash_ids: Sequence[int] | None,
        prompt_tokens: int,
        output_tokens: int,
        session: str | None = None,
    ) -> None:
        ids = hash_ids or ()
        self.requests += 1
        self.with_ids += bool(ids)
        self.prompt_tokens += prompt_tokens
        full = prompt_tokens // self.trace_block_tokens
        full_ids = ids if len(ids) <= full else ids[:full]
        if full_ids:
            factor = self.factor
            cap = min(max(prompt_tokens - 1, 0) // self.block_tokens, len(full_ids) // factor)
            if factor == 1 or self.tree.step > 1:
                low, high = self.tree.run_bounds(full_ids)
                self.seen_low += min(low // factor, cap)
                self.seen_high += min(high // factor, cap)
            else:  # the server's blocks, exact: its leading run, as CacheModel counts it
                known = self.tree.depth
                run = 0
                while run < cap and full_ids[factor * (run + 1) - 1] in known:
                    run += 1
                self.seen_low += run
                self.seen_high += run
        if self.pool is not None:
            self.pool_hits += self.pool.admit(ids, prompt_tokens, output_tokens)
        if session is not None:
            if not self.has_sessions:
                self.has_sessions = True
            sessions = self.sessions
            held = sessions.keys.get(session)
            sessions.join(held, session, held is None and sessions.gone.maybe(hash(session)))
        elif not self.has_sessions and full_ids:
            self._chain_turn(full_ids)
        if full_ids:
            self.tree.add(full_ids)

    def _chain_turn(self, ids: Sequence[int]) -> None:
        """The conversation a chain continues: the deepest of its blocks that ends an earlier chain
        (in doubt when a deeper block may be an end given up for room)."""
        chains = self.chains
        keys, gone = chains.keys, chains.gone
        maybe_gone = None if gone.empty else gone.maybe
        doubt = False
        found = None
        for block_id in reversed(ids[:-1]):  # a chain equal to an earlier one is a repeat, not a turn
            found = keys.get(block_id)
            if found is not None:
                break
            if maybe_gone is not None and not doubt and maybe_gone(block_id):
                doubt = True
        chains.join(found, ids[-1], doubt)
        if found is not None:
            chains.release(block_id)  # a turn is continued once (as the replay sends them)

    def add_without_ids(self, requests: int, prompt_tokens: int, total_blocks: int) -> None:
        """Many requests that carry no ids and no session at once (a length-only batch): they hit
        nothing, and in a pool their ``total_blocks`` push cached blocks out."""
        self.requests += requests
        self.prompt_tokens += prompt_tokens
        if self.pool is not None:
            self.pool.take_private(total_blocks)

    def result(self) -> PrefixStats:
        inferred = not self.has_sessions
        found = self.chains if inferred else self.sessions
        counts = found.counts()
        if inferred:  # a lone request is no conversation
            counts.pop(1, None)
        conversations = sum(counts.values())
        block = self.block_tokens
        step = self.tree.step
        return PrefixStats(
            info=self.info,
            block_tokens=block,
            requests=self.requests,
            requests_with_ids=self.with_ids,
            prompt_tokens=self.prompt_tokens,
            seen_hit_tokens=(self.seen_low + self.seen_high) * block // 2,
            pool_blocks=None if self.pool is None else self.pool.pool_blocks,
            pool_hit_tokens=None if self.pool is None else self.pool_hits,
            shared=tuple(self.tree.top(self.top)),
            turns=ConversationTurns(
                conversations=conversations,
                requests=sum(turns * n for turns, n in counts.items()),
                max_turns=max(counts, default=0),
                histogram=dict(sorted(counts.items())),
                inferred=inferred,
            ),
            exact_blocks_limit=self.exact_blocks,
            exact_conversations_limit=self.exact_conversations,
            sample_step_blocks=step,
            seen_hit_tokens_error=-(-(self.seen_high - self.seen_low) * block // 2),
            shared_tokens_error=(step - 1) * self.trace_block_tokens,
            conversations_error=found.maybe_split,
        )
