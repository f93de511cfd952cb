"""Prefix reuse of a trace: how much of the prompts a prefix cache would hold, and the trace's prefix stats.

The block ids come from ``oomload.trace.blockhash`` (chained, salted: two prompts share block k exactly when
they are identical from token 0 through the end of block k); this module models the cache they feed.

**Reuse** (``expected_hit_tokens``). Requests are taken in trace order; a request's cache hit is
its longest run of leading full blocks already cached, capped (as vLLM V1 does) so that at least
one prompt token is computed: ``min(run, (prompt_tokens − 1) // block_tokens)`` blocks. Without a
pool the cache is infinite (every block seen before is held: the upper bound). With
``pool_blocks`` the cache is an LRU of that many blocks, as vLLM's free queue: a finished
request's blocks are appended to the queue tail in reverse order (its private blocks — the partial
prompt block and the output — first, then its prompt blocks from last to first), so the prefix is
evicted last, and a new request's blocks take the least recently freed ones. **Which blocks are
referenced at once**: this model serves requests one after another (each request's blocks are
referenced only while it is admitted, then freed), so no block is pinned by a concurrent request;
with real concurrency, running requests pin their blocks and the pool holds fewer cached ones, so
the pool share here is an upper bound for that pool size too (the scheduler predictions model the
pinning). ``server_block_tokens`` (a multiple of the trace's block size) regroups the chains for a
server with bigger blocks: the id of block ``(k+1)·m − 1`` identifies the k-th big block, the
chain being cumulative; ``hit_block_tokens`` serves a server with finer blocks (the run of cached
blocks rounded down to them: the verdict's expected hit rate, ``oomload.verdict.prefixrate``, is this
model too).

``shared_prefixes`` lists the longest prefixes that several requests share (ids only),
``conversation_turns`` the turns per conversation (``oomload.trace.tally`` gathers all of it one
request at a time, in bounded memory, for ``trace stats``). For the replay and the predictions:
``expected_hit_tokens(records, prefix_info, pool_blocks=None, server_block_tokens=None) ->
PrefixReuse`` (per-request hit tokens and totals), ``CacheModel.admit`` for a request stream,
``full_block_ids`` and ``regroup``.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

# The block hashing moved to ``oomload.trace.blockhash``; these names stay importable from here for the
# trace builders that import them from ``oomload.trace.prefix`` (ingest/*).
from oomload.trace.blockhash import DEFAULT_BLOCK_TOKENS as DEFAULT_BLOCK_TOKENS
from oomload.trace.blockhash import BlockHasher as BlockHasher
from oomload.trace.blockhash import chain_marks as chain_marks
from oomload.trace.blockhash import count_token_texts as count_token_texts
from oomload.trace.blockhash import message_block_ids as message_block_ids
from oomload.trace.blockhash import part_marks as part_marks
from oomload.trace.model import PrefixInfo, TraceRecord

Key = TypeVar("Key", bound=Hashable)  # a block's key: a trace id, or (pass, id) in the verdict


@dataclass(frozen=True, slots=True)
class PrefixReuse:
    """How many prompt tokens a prefix cache would serve, per request (trace order) and in total."""

    block_tokens: int  # the block size the hits are counted in (the server's, when regrouped)
    pool_blocks: int | None  # None: an infinite cache
    hit_tokens: tuple[int, ...]  # per request
    prompt_tokens: int  # all requests' prompt tokens
    requests_with_ids: int  # requests whose chain is known (the rest can hit nothing)

    @property
    def total_hit_tokens(self) -> int:
        return sum(self.hit_tokens)

    @property
    def share(self) -> float:
        """Hit tokens over prompt tokens (0 for a trace without prompt tokens)."""
        return self.total_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def full_block_ids(record: TraceRecord, block_tokens: int) -> tuple[int, ...]:
    """The ids of a request's full prompt blocks (a source trace's last id may be partial)."""
    full = record.prompt_tokens // block_tokens
    ids = record.hash_ids
    return ids if len(ids) <= full else ids[:full]


def regroup(ids: Sequence[Key], factor: int) -> tuple[Key, ...]:
    """Chained ids of blocks ``factor`` times bigger: every ``factor``-th id (the chain is cumulative)."""
    return tuple(ids[factor - 1 :: factor]) if factor > 1 else tuple(ids)


class CacheModel:
    """One prefix cache, infinite or an LRU pool of blocks, fed requests in trace order (module docstring)."""

    def __init__(
        self,
        prefix: PrefixInfo,
        pool_blocks: int | None = None,
        server_block_tokens: int | None = None,
        *,
        hit_block_tokens: int | None = None,
    ) -> None:
        """``server_block_tokens`` (a multiple of the trace's blocks) regroups the chains into the
        server's bigger blocks. ``hit_block_tokens`` is for a server whose blocks are finer than the
        blocks the ids stand for (a replay seeds the trace's blocks; vLLM caches in its own): the run
        of leading cached blocks is counted in the ids' blocks, then rounded down to whole
        ``hit_block_tokens`` and capped so that the last prompt token is computed
        (``⌊(prompt − 1) / B⌋ · B``)."""
        self.hit_block_tokens = hit_block_tokens
        self.trace_block_tokens = prefix.block_tokens
        self.block_tokens = prefix.block_tokens
        self.factor = 1
        if server_block_tokens is not None:
            if server_block_tokens < prefix.block_tokens or server_block_tokens % prefix.block_tokens:
                raise ValueError(
                    f"the trace's prefix blocks are {prefix.block_tokens} tokens: a server block of "
                    f"{server_block_tokens} tokens is not a multiple of it"
                )
            self.factor = server_block_tokens // prefix.block_tokens
            self.block_tokens = server_block_tokens
        if pool_blocks is not None and pool_blocks < 1:
            raise ValueError("pool_blocks must be ≥ 1")
        self.pool_blocks = pool_blocks
        self._seen: set[Hashable] = set()
        self._lru: OrderedDict[Hashable, None] = OrderedDict()
        self._private = -1  # keys of blocks no other request can hit

    def take_private(self, blocks: int) -> None:
        """``blocks`` blocks no other request can hit go through the pool (requests without ids)."""
        if self.pool_blocks is None:
            return
        lru = self._lru
        if blocks >= self.pool_blocks:
            lru.clear()
            blocks = self.pool_blocks
        for _ in range(blocks):
            lru[self._private] = None
            self._private -= 1
        while len(lru) > self.pool_blocks:
            lru.popitem(last=False)

    def admit(self, hash_ids: Sequence[Hashable], prompt_tokens: int, output_tokens: int) -> int:
        """The request's hit tokens; then its blocks are cached (freed to the pool's tail). Any
        hashable key stands for a block (the verdict keys each id by the replay's pass)."""
        full = prompt_tokens // self.trace_block_tokens
        ids = regroup(hash_ids if len(hash_ids) <= full else hash_ids[:full], self.factor)
        block = self.block_tokens
        fine = self.hit_block_tokens
        cap = len(ids) if fine else min(max(prompt_tokens - 1, 0) // block, len(ids))
        cached = self._seen if self.pool_blocks is None else self._lru
        run = 0
        while run < cap and ids[run] in cached:
            run += 1
        hit = (
            run * block
            if not fine
            else min(run * block // fine * fine, max(prompt_tokens - 1, 0) // fine * fine)
        )
        if self.pool_blocks is None:
            self._seen.update(ids)
            return hit
        lru = self._lru
        total_blocks = -(-(prompt_tokens + output_tokens) // block)
        for _ in range(max(total_blocks - len(ids), 0)):
            lru[self._private] = None
            self._private -= 1
        for block_id in reversed(ids):
            lru[block_id] = None
            lru.move_to_end(block_id)
        while len(lru) > self.pool_blocks:
            lru.popitem(last=False)
        return hit


def expected_hit_tokens(
    records: Iterable[TraceRecord],
    prefix: PrefixInfo,
    pool_blocks: int | None = None,
    *,
    server_block_tokens: int | None = None,
) -> PrefixReuse:
    """Per-request cache hits in trace order (infinite cache, or an LRU pool: module docstring)."""
    cache = CacheModel(prefix, pool_blocks, server_block_tokens)
    hits: list[int] = []
    prompt_total = 0
    with_ids = 0
    for record in records:
        prompt_total += record.prompt_tokens
        with_ids += bool(record.hash_ids)
        hits.append(cache.admit(record.hash_ids, record.prompt_tokens, record.output_tokens))
    return PrefixReuse(cache.block_tokens, pool_blocks, tuple(hits), prompt_total, with_ids)


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """A prefix several requests start with: its last block's id, its length and how many use it."""

    block_id: int
    tokens: int
    uses: int

    @property
    def saved_tokens(self) -> int:
        """Tokens a cache holding it serves: every use after the first."""
        return self.tokens * (self.uses - 1)


class PrefixTree:
    """Uses per chain node (a prefix), for ``shared_prefixes``; fed requests one at a time."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.uses: Counter[int] = Counter()
        self.depth: dict[int, int] = {}
        self.parent: dict[int, int | None] = {}

    def full(self, hash_ids: Sequence[int], prompt_tokens: int) -> Sequence[int]:
        full = prompt_tokens // self.block_tokens
        return hash_ids if len(hash_ids) <= full else hash_ids[:full]

    def add(self, hash_ids: Sequence[int], prompt_tokens: int) -> None:
        ids = self.full(hash_ids, prompt_tokens)
        self.uses.update(ids)
        for k, block_id in enumerate(ids):
            if block_id not in self.depth:
                self.depth[block_id] = k + 1
                self.parent[block_id] = ids[k - 1] if k else None

    def top(self, count: int = 5) -> list[SharedPrefix]:
        """The ``count`` shared prefixes with the most tokens × uses (``shared_prefixes``)."""
        return top_prefixes(self.uses, self.parent, self.depth, self.block_tokens, count)


def shared_prefixes(records: Iterable[TraceRecord], prefix: PrefixInfo, top: int = 5) -> list[SharedPrefix]:
    """The ``top`` shared prefixes by tokens × uses, each the longest one its users share.

    A prefix (a node of the chain tree) is listed when at least two requests use it and no longer
    prefix has as many users — a shared system prompt is listed once, not once per block.
    """
    tree = PrefixTree(prefix.block_tokens)
    for record in records:
        tree.add(record.hash_ids, record.prompt_tokens)
    return tree.top(top)


@dataclass(frozen=True, slots=True)
class ConversationTurns:
    """Turns per conversation (requests sharing a ``session``)."""

    conversations: int
    requests: int  # requests that belong to a conversation
    max_turns: int
    histogram: dict[int, int]  # turns → conversations
    inferred: bool = False  # from the chains (no ``session`` in the trace): ``oomload.trace.tally``

    @property
    def mean_turns(self) -> float:
        return self.requests / self.conversations if self.conversations else 0.0


def conversation_turns(records: Iterable[TraceRecord]) -> ConversationTurns:
    """Requests per ``session`` (a conversation's turns); all zero when the trace has no sessions."""
    turns: Counter[str] = Counter(r.session for r in records if r.session is not None)
    histogram = Counter(turns.values())
    return ConversationTurns(
        conversations=len(turns),
        requests=sum(turns.values()),
        max_turns=max(turns.values(), default=0),
        histogram=dict(sorted(histogram.items())),
    )


def top_prefixes(
    uses: Mapping[int, int],
    parent: Mapping[int, int | None],
    depth: Mapping[int, int],
    block_tokens: int,
    count: int,
) -> list[SharedPrefix]:
    """The ``count`` prefixes (nodes of a chain tree: ``uses``, ``parent``, ``depth`` per block id) with
    the most tokens × uses, each the longest its users share: a node is listed when at least two
    requests use it and no child is used as often."""
    child_best: dict[int, int] = {}
    for block_id, n in uses.items():
        up = parent[block_id]
        if up is not None and n > child_best.get(up, 0):
            child_best[up] = n
    found = [
        SharedPrefix(block_id, depth[block_id] * block_tokens, n)
        for block_id, n in uses.items()
        if n >= 2 and child_best.get(block_id, 0) < n
    ]
    found.sort(key=lambda p: (-p.tokens * p.uses, -p.tokens, p.block_id))
    return found[:count]


def describe_prefix(info: PrefixInfo) -> str:
    """One plain sentence: what a trace's prefix ids are (``trace build`` and ``trace stats`` print it)."""
    block = f"{info.block_tokens}-token blocks"
    if info.source == "none":
        text = "no prefix structure in this log (reuse unknown: replays and predictions count every block)"
    elif info.source == "token-ids":
        text = f"chained ids of {block} from the prompt token ids (exact)"
    elif info.source == "messages":
        counts = "per-message token counts" + (
            " from the tokenizer"
            if info.exact
            else " estimated (from characters, or with --tokenizer from the messages' text without the "
            "chat template's role and format tokens: not exact)"
        )
        text = f"chained ids of {block} over message boundaries, {counts}"
    elif info.source == "column":
        text = f"chained ids of {block} from the log's conversation / system-prompt id column"
    else:
        text = f"block ids as the source trace gave them ({block})"
    if info.truncated_requests:
        text += (
            f"; {info.truncated_requests} requests' chains cover only the logged part of the prompt "
            "(--max-log-len)"
        )
    return text
