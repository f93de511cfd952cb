"""Prefix structure of a trace: chained, salted block ids, and how much of the prompts a cache would hold.

**Chained block ids** (``BlockHasher``). A prompt is cut into blocks of ``block_tokens`` tokens;
only full blocks get an id (a partial last block is never shared, as in vLLM). Block k's id is a
keyed hash of everything from token 0 through the end of block k, so — like vLLM's block hashes —
two prompts share block k exactly when they are identical from token 0 through the end of block k.
The keyed step is SipHash-1-3 (a keyed PRF; Python's own string hash) under a 128-bit key derived
from the build's salt, computed with numpy over all blocks at once — no Python work per block, so
hashing keeps the build's speed. The salt is random per build and never written (ingest/prefixes.py
makes it; ``OOMLOAD_PREFIX_SALT`` fixes it for reproducible builds): without it an id reveals
nothing of the text or token ids, a guessed prompt cannot be tested, and ids cannot be matched
against another trace's. The id written is the top ``ID_BITS`` (53) bits: a JSON number every
reader holds exactly (JavaScript's too), 16 digits at most; two different prefixes collide with
odds of about n²/2⁵⁴ for n distinct blocks (one in 10⁴ for a million).

What is keyed: for token ids (``chain_tokens``; ``chain_token_text`` reads a vLLM log's id list
as bytes, never parsing it), a 64-bit digest of the prefix — a keyed linear hash of its bytes
(each byte's table entry times its position's multiplier, summed: block sums, then prefix sums,
and a prompt sharing its start with an earlier one of the batch reuses those sums) — keyed with
the depth. When only message boundaries are known
(``chain_messages`` / ``message_block_ids``), each message enters a keyed chain by its length and
CRC-32 (``message_keys``: one fast pass over its raw bytes, then SipHash over 16 bytes, one step
per message position for a whole batch of requests), and block k's id mixes the chained key of the
message that holds the block's last token with the block's end offset in that message. So blocks
match only when every message up to there is identical and starts at the same token, and a message
is never split finer than its token count allows.

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
chain being cumulative.

``shared_prefixes`` lists the longest prefixes that several requests share (ids only),
``conversation_turns`` the turns per conversation; ``PrefixTally`` gathers all of it one request at
a time for ``trace stats``. For the replay and the predictions: ``expected_hit_tokens(records,
prefix_info, pool_blocks=None, server_block_tokens=None) -> PrefixReuse`` (per-request hit tokens
and totals), ``CacheModel.admit`` for a request stream, ``full_block_ids`` and ``regroup``.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from oomload.trace import PrefixInfo, TraceRecord

DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size: the trace then predicts any multiple of it
ID_BITS = 53
_ID_SHIFT = 64 - ID_BITS
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_START = b"oomload-prefix-v1"


@dataclass(frozen=True, slots=True)
class BlockHasher:
    """Chained keyed block ids for one build (module docstring); ``salt`` is never written anywhere."""

    salt: bytes
    block_tokens: int = DEFAULT_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError("block_tokens must be ≥ 1")
        if not 1 <= len(self.salt) <= 64:
            raise ValueError("the salt must be 1 to 64 bytes")

    def __repr__(self) -> str:  # never print the salt
        return f"BlockHasher(block_tokens={self.block_tokens})"

    def chain_tokens(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids of the full blocks of a prompt given as token ids (module docstring)."""
        return self.chain_token_text(",".join(map(str, token_ids)))

    def chain_token_text(self, ids_text: str) -> tuple[int, ...]:
        """The ids of the full blocks of ``"1, 2, 3"`` (token ids as vLLM logs them; spaces ignored)."""
        return self.chain_token_texts([ids_text])[0]

    def chain_token_texts(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """``chain_token_text`` of many prompts, the keyed step done once for all of them.

        The text is never parsed to integers: the digest of a prefix is a keyed linear hash of its
        bytes (``_prefix_digests``), read at the comma that ends each block. The digests are prefix
        sums, so a prompt that starts like an earlier one of the batch with the same first block (a
        shared system prompt, a conversation's previous turn) takes the digests of their common
        blocks from it and reads only the bytes after them.
        """
        size = self.block_tokens
        digests: list[npt.NDArray[np.uint64]] = []
        earlier: dict[bytes, tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]] = {}  # by first block
        for ids_text in texts:
            text = _id_bytes(ids_text)
            data = np.frombuffer(text, np.uint8)
            commas = np.flatnonzero(data == _COMMA)
            full = (len(commas) + 1) // size if len(data) else 0
            if full == 0:
                digests.append(np.empty(0, dtype=np.uint64))
                continue
            ends = np.append(commas, len(data))[size - 1 :: size][:full]  # each block's end (exclusive)
            if ends[0] == 0:  # an empty first id: no first block to look up
                digests.append(_prefix_digests(self.salt, data, ends))
                continue
            head = text[: ends[0]]
            before = earlier.get(head)
            done = None if before is None else _common_digests(data, ends, *before)
            digests.append(_prefix_digests(self.salt, data, ends, done))
            earlier[head] = (data, digests[-1])
        counts = [len(d) for d in digests]
        if not sum(counts):
            return [() for _ in texts]
        depth = np.concatenate([np.arange(n, dtype=np.uint64) for n in counts])
        keyed = _siphash13(self.sip_key, np.concatenate(digests), depth)
        flat = (keyed >> np.uint64(_ID_SHIFT)).astype(np.int64).tolist()
        bounds = np.cumsum([0, *counts]).tolist()
        return [tuple(flat[bounds[i] : bounds[i + 1]]) for i in range(len(texts))]

    def conversation_chain(self, conversation: str, prompt_tokens: int) -> tuple[int, ...]:
        """The ids of the first ``prompt_tokens // block_tokens`` blocks of a conversation's token stream:
        keyed by the conversation id and the depth, so turns of one conversation share their common
        length and nothing else matches (a log with a conversation column but no text)."""
        full = max(prompt_tokens, 0) // self.block_tokens
        if full == 0:
            return ()
        digest = hashlib.blake2b(conversation.encode(), digest_size=8, key=self.salt, person=b"conversation")
        base = np.full(full, int.from_bytes(digest.digest(), "big"), dtype=np.uint64)
        keyed = _siphash13(self.sip_key, base, np.arange(full, dtype=np.uint64))
        return tuple((keyed >> np.uint64(_ID_SHIFT)).astype(np.int64).tolist())

    @property
    def sip_key(self) -> tuple[np.uint64, np.uint64]:
        """The two 64-bit words of the SipHash key, derived from the salt."""
        return _sip_key(self.salt)

    def message_keys(self, parts: Sequence[bytes]) -> list[int]:
        """The chained keyed digest of each message (of every message up to it): 64-bit integers."""
        marks = np.array([part_mark(p) for p in parts], dtype=np.uint64)
        keys = chain_marks(self.sip_key, marks, np.array([len(parts)], dtype=np.int64))
        return [int(k) for k in keys]

    def chain_messages(
        self, messages: Sequence[tuple[bytes, int]], limit_tokens: int | None = None
    ) -> tuple[int, ...]:
        """The ids of the full blocks of a prompt known as ``(message, token count)`` pairs.

        Block k's id mixes the chained key of the message holding its last token with the block's end
        offset in that message (module docstring); the chain stops at ``limit_tokens``.
        """
        keys = np.array(self.message_keys([m for m, _ in messages]), dtype=np.uint64)
        tokens = np.array([max(t, 0) for _, t in messages], dtype=np.int64)
        limit = int(tokens.sum()) if limit_tokens is None else limit_tokens
        values, _ = message_block_ids(
            keys, tokens, np.array([len(messages)]), np.array([limit]), self.block_tokens
        )
        return tuple(values.tolist())


_COMMA = ord(",")


@functools.lru_cache(maxsize=4)
def _coefficients(salt: bytes, size: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """The keyed linear hash's byte table and per-position odd multipliers (``size`` of them)."""
    seed = int.from_bytes(hashlib.blake2b(salt, digest_size=16, person=b"oomload-bytes").digest(), "big")
    rng = np.random.default_rng(seed)
    table = rng.integers(0, 2**64, 256, dtype=np.uint64, endpoint=False)
    return table, rng.integers(0, 2**64, size, dtype=np.uint64, endpoint=False) | np.uint64(1)


def _id_bytes(ids_text: str) -> bytes:
    """The logged ids as ASCII bytes without spaces or surrounding whitespace (C passes only)."""
    if ids_text.isascii():  # the usual case: bytes.translate drops the spaces in one pass
        return ids_text.encode("ascii").translate(None, b" ").strip()
    return ids_text.replace(" ", "").strip().encode("ascii", errors="replace")


def _prefix_digests(
    salt: bytes,
    data: npt.NDArray[np.uint8],
    ends: npt.NDArray[np.intp],
    done: npt.NDArray[np.uint64] | None = None,
) -> npt.NDArray[np.uint64]:
    """The digest of the bytes before each of ``ends`` (increasing): the wrapping sum of
    table[byte] × the position's multiplier (a keyed linear hash: two different prefixes of one
    length collide with odds about 2⁻⁶³). One pass over the bytes up to the last end: each block's
    sum (``reduceat``), then their prefix sums. ``done``: the digests of the first blocks, already
    known (``_common_digests``): only the bytes after them are read."""
    size = 1 << max(len(data) - 1, 4095).bit_length()  # tables grow by powers of two, cached
    table, multipliers = _coefficients(salt, size)
    if ends[0] == 0:  # an empty first id (a leading comma): the whole text's digest, as it always was
        every = np.cumsum(table[data] * multipliers[: len(data)], dtype=np.uint64)
        return every[ends - 1]
    known = 0 if done is None else len(done)
    if done is not None and known >= len(ends):
        return done[: len(ends)]
    first = int(ends[known - 1]) if known else 0
    last = int(ends[-1])  # the ends are commas' positions (and the length): strictly increasing
    terms = np.take(table, data[first:last])
    np.multiply(terms, multipliers[first:last], out=terms)
    starts = np.empty(len(ends) - known, dtype=np.intp)
    starts[0] = 0
    starts[1:] = ends[known:-1] - first
    sums = np.add.reduceat(terms, starts)
    if done is not None and known:
        sums[:1] += done[known - 1 :]  # wrapping, as the sums
        return np.concatenate([done, np.cumsum(sums, dtype=np.uint64)])
    return np.cumsum(sums, dtype=np.uint64)


def _common_digests(
    data: npt.NDArray[np.uint8],
    ends: npt.NDArray[np.intp],
    other: npt.NDArray[np.uint8],
    other_digests: npt.NDArray[np.uint64],
) -> npt.NDArray[np.uint64]:
    """The digests of the blocks ``data`` shares with ``other`` (whose digests are given): those that
    end before the first differing byte — their commas, hence their block numbers, are the same."""
    n = min(len(data), len(other))
    differ = data[:n] != other[:n]
    at = int(np.argmax(differ))  # the first differing byte (0 when none differs)
    common = at if differ[at] else n
    blocks = min(int(np.searchsorted(ends, common, side="left")), len(other_digests))
    return other_digests[:blocks]


@functools.lru_cache(maxsize=8)
def _sip_key(salt: bytes) -> tuple[np.uint64, np.uint64]:
    words = hashlib.blake2b(salt, digest_size=16, person=b"oomload-prefix").digest()
    return np.uint64(int.from_bytes(words[:8], "big")), np.uint64(int.from_bytes(words[8:], "big"))


def part_mark(part: bytes | memoryview | Any) -> int:
    """A message's mark in the chain: its length and CRC-32 (one fast pass over its bytes, no copy)."""
    return (len(part) & 0xFFFFFFFF) << 32 | zlib.crc32(part)


def part_marks(sizes: npt.NDArray[np.int64], crcs: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``part_mark`` of many messages from their lengths and CRC-32s."""
    return ((sizes.astype(np.uint64) & np.uint64(0xFFFFFFFF)) << np.uint64(32)) | crcs


_U = np.uint64


def _siphash13(
    key: tuple[np.uint64, np.uint64], m0: npt.NDArray[np.uint64], m1: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    """SipHash-1-3 of the 16 bytes ``m0 m1`` under ``key``, for arrays of messages at once (in place:
    four state arrays and one scratch array, whatever the rounds)."""
    k0, k1 = key
    v0 = np.full(m0.shape, k0 ^ _U(0x736F6D6570736575), dtype=np.uint64)
    v1 = np.full(m0.shape, k1 ^ _U(0x646F72616E646F6D), dtype=np.uint64)
    v2 = np.full(m0.shape, k0 ^ _U(0x6C7967656E657261), dtype=np.uint64)
    v3 = np.full(m0.shape, k1 ^ _U(0x7465646279746573), dtype=np.uint64)
    scratch = np.empty(m0.shape, dtype=np.uint64)

    def rotl(v: npt.NDArray[np.uint64], bits: int) -> None:
        np.left_shift(v, _U(bits), out=scratch)
        np.right_shift(v, _U(64 - bits), out=v)
        v |= scratch

    def rounds(count: int) -> None:
        for _ in range(count):
            np.add(v0, v1, out=v0)
            rotl(v1, 13)
            np.bitwise_xor(v1, v0, out=v1)
            rotl(v0, 32)
            np.add(v2, v3, out=v2)
            rotl(v3, 16)
            np.bitwise_xor(v3, v2, out=v3)
            np.add(v0, v3, out=v0)
            rotl(v3, 21)
            np.bitwise_xor(v3, v0, out=v3)
            np.add(v2, v1, out=v2)
            rotl(v1, 17)
            np.bitwise_xor(v1, v2, out=v1)
            rotl(v2, 32)

    for m in (m0, m1, _U(16 << 56)):
        v3 ^= m
        rounds(1)
        v0 ^= m
    v2 ^= _U(0xFF)
    rounds(3)
    v0 ^= v1
    v0 ^= v2
    v0 ^= v3
    return v0


def chain_marks(
    key: tuple[np.uint64, np.uint64], marks: npt.NDArray[np.uint64], parts_per_prompt: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint64]:
    """Each message's chained key: SipHash-1-3 (keyed) of the previous message's key and its mark,
    for many prompts at once — one vectorized step per message position, all prompts together."""
    prompts = len(parts_per_prompt)
    keys = np.empty(len(marks), dtype=np.uint64)
    if not len(marks):
        return keys
    owner = np.repeat(np.arange(prompts), parts_per_prompt)
    first = np.cumsum(parts_per_prompt) - parts_per_prompt
    position = np.arange(len(marks)) - first[owner]
    order = np.argsort(position, kind="stable")
    bounds = np.searchsorted(position[order], np.arange(int(position.max()) + 2))
    previous = np.zeros(prompts, dtype=np.uint64)
    for j in range(len(bounds) - 1):
        at = order[bounds[j] : bounds[j + 1]]
        chained = _siphash13(key, previous[owner[at]], marks[at])
        keys[at] = chained
        previous[owner[at]] = chained
    return keys


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finalizer (wrapping uint64 arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def message_block_ids(
    keys: npt.NDArray[np.uint64],
    tokens: npt.NDArray[np.int64],
    parts_per_prompt: npt.NDArray[np.int64],
    limit_tokens: npt.NDArray[np.int64],
    block_tokens: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Block ids of many prompts at once, as a list column: flat ids and ``len + 1`` offsets.

    ``keys``/``tokens`` are every prompt's messages in order (``BlockHasher.message_keys``, token
    counts); ``parts_per_prompt`` says how many belong to each prompt; a prompt's chain covers its
    full blocks up to the smaller of its messages' tokens and ``limit_tokens``.
    """
    prompts = len(parts_per_prompt)
    owner = np.repeat(np.arange(prompts), parts_per_prompt)
    ends = np.cumsum(tokens)  # over all prompts
    totals = np.bincount(owner, weights=tokens, minlength=prompts).astype(np.int64)
    bases = np.cumsum(totals) - totals  # where each prompt starts on that one axis
    counts = np.minimum(totals, np.maximum(limit_tokens, 0)) // block_tokens
    offsets = np.zeros(prompts + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.empty(0, dtype=np.int64), offsets
    which = np.repeat(np.arange(prompts), counts)
    block_end = (np.arange(total) - offsets[:-1][which] + 1) * block_tokens  # in the prompt
    part = np.searchsorted(ends, bases[which] + block_end, side="left")
    offset = (block_end - (ends[part] - tokens[part] - bases[which])).astype(np.uint64)
    ids = _mix(keys[part] ^ (offset * _GOLDEN)) >> np.uint64(_ID_SHIFT)
    return ids.astype(np.int64), offsets


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


def regroup(ids: Sequence[int], factor: int) -> tuple[int, ...]:
    """Chained ids of blocks ``factor`` times bigger: every ``factor``-th id (the chain is cumulative)."""
    return tuple(ids[factor - 1 :: factor]) if factor > 1 else tuple(ids)


class CacheModel:
    """One prefix cache, infinite or an LRU pool of blocks, fed requests in trace order (module docstring)."""

    def __init__(
        self, prefix: PrefixInfo, pool_blocks: int | None = None, server_block_tokens: int | None = None
    ) -> None:
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
        self._seen: set[int] = set()
        self._lru: OrderedDict[int, None] = OrderedDict()
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

    def admit(self, hash_ids: Sequence[int], prompt_tokens: int, output_tokens: int) -> int:
        """The request's hit tokens; then its blocks are cached (freed to the pool's tail)."""
        full = prompt_tokens // self.trace_block_tokens
        ids = regroup(hash_ids if len(hash_ids) <= full else hash_ids[:full], self.factor)
        block = self.block_tokens
        cap = min(max(prompt_tokens - 1, 0) // block, len(ids))
        cached = self._seen if self.pool_blocks is None else self._lru
        run = 0
        while run < cap and ids[run] in cached:
            run += 1
        if self.pool_blocks is None:
            self._seen.update(ids)
            return run * block
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
        return run * block


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
        child_best: dict[int, int] = {}
        for block_id, uses in self.uses.items():
            up = self.parent[block_id]
            if up is not None and uses > child_best.get(up, 0):
                child_best[up] = uses
        found = [
            SharedPrefix(block_id, self.depth[block_id] * self.block_tokens, uses)
            for block_id, uses in self.uses.items()
            if uses >= 2 and child_best.get(block_id, 0) < uses
        ]
        found.sort(key=lambda p: (-p.tokens * p.uses, -p.tokens, p.block_id))
        return found[:count]


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
    inferred: bool = False  # from the chains (no ``session`` in the trace): ``ConversationFinder``

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


@dataclass(frozen=True, slots=True)
class PrefixStats:
    """What ``trace stats`` says about prefix reuse (``PrefixTally.result``)."""

    info: PrefixInfo
    block_tokens: int  # the block size hits are counted in (the server's when given, else the trace's)
    requests: int
    requests_with_ids: int
    prompt_tokens: int
    seen_hit_tokens: int  # infinite cache: the upper bound
    pool_blocks: int | None
    pool_hit_tokens: int | None
    shared: tuple[SharedPrefix, ...]
    turns: ConversationTurns

    @property
    def seen_share(self) -> float:
        return self.seen_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def pool_share(self) -> float | None:
        if self.pool_hit_tokens is None:
            return None
        return self.pool_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

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
                {"block_id": p.block_id, "tokens": p.tokens, "uses": p.uses} for p in self.shared
            ],
            "conversations": {
                "count": self.turns.conversations,
                "requests": self.turns.requests,
                "mean_turns": self.turns.mean_turns,
                "max_turns": self.turns.max_turns,
                "turns_histogram": {str(k): v for k, v in self.turns.histogram.items()},
                "inferred_from_chains": self.turns.inferred,
            },
        }


class PrefixTally:
    """Everything ``PrefixStats`` holds, gathered one request at a time in trace order."""

    def __init__(
        self,
        info: PrefixInfo,
        *,
        pool_blocks: int | None = None,
        server_block_tokens: int | None = None,
        top: int = 5,
    ) -> None:
        self.info = info
        self.seen = CacheModel(info, None, server_block_tokens)
        self.pool = None if pool_blocks is None else CacheModel(info, pool_blocks, server_block_tokens)
        self.tree = PrefixTree(info.block_tokens)
        self.top = top
        self.requests = self.with_ids = self.prompt_tokens = self.seen_hits = self.pool_hits = 0
        self.sessions: Counter[str] = Counter()
        self.finder = ConversationFinder()

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
        self.seen_hits += self.seen.admit(ids, prompt_tokens, output_tokens)
        if self.pool is not None:
            self.pool_hits += self.pool.admit(ids, prompt_tokens, output_tokens)
        self.tree.add(ids, prompt_tokens)
        if session is not None:
            self.sessions[session] += 1
        elif not self.sessions:
            self.finder.add(self.tree.full(ids, prompt_tokens))

    def add_without_ids(self, requests: int, prompt_tokens: int, total_blocks: int) -> None:
        """Many requests that carry no ids and no session at once (a length-only batch): they hit
        nothing, and in a pool their ``total_blocks`` push cached blocks out."""
        self.requests += requests
        self.prompt_tokens += prompt_tokens
        if self.pool is not None:
            self.pool.take_private(total_blocks)

    def result(self) -> PrefixStats:
        inferred = not self.sessions
        turns: Counter[Any] = self.finder.turns if inferred else self.sessions
        turns = Counter({k: v for k, v in turns.items() if not inferred or v > 1})
        return PrefixStats(
            info=self.info,
            block_tokens=self.seen.block_tokens,
            requests=self.requests,
            requests_with_ids=self.with_ids,
            prompt_tokens=self.prompt_tokens,
            seen_hit_tokens=self.seen_hits,
            pool_blocks=None if self.pool is None else self.pool.pool_blocks,
            pool_hit_tokens=None if self.pool is None else self.pool_hits,
            shared=tuple(self.tree.top(self.top)),
            turns=ConversationTurns(
                conversations=len(turns),
                requests=sum(turns.values()),
                max_turns=max(turns.values(), default=0),
                histogram=dict(sorted(Counter(turns.values()).items())),
                inferred=inferred,
            ),
        )


class ConversationFinder:
    """Conversations inferred from chains, for traces without ``session``: a request whose chain
    starts with an earlier request's whole chain is that request's next turn (the earlier chain's
    last id is looked up at each depth of the new one, longest first: one dict probe a block)."""

    def __init__(self) -> None:
        self.ends: dict[int, int] = {}  # last id of a request's chain → its conversation
        self.turns: Counter[int] = Counter()  # conversation → requests

    def add(self, ids: Sequence[int]) -> int | None:
        """The conversation the request joins or starts (``None`` without a chain)."""
        if not ids:
            return None
        conversation = len(self.turns)
        for block_id in reversed(ids):
            found = self.ends.get(block_id)
            if found is not None:
                conversation = found
                break
        self.turns[conversation] += 1
        self.ends[ids[-1]] = conversation
        return conversation


def describe_prefix(info: PrefixInfo) -> str:
    """One plain sentence: what a trace's prefix ids are (``trace build`` and ``trace stats`` print it)."""
    block = f"{info.block_tokens}-token blocks"
    if info.source == "none":
        text = "no prefix structure in this log (reuse unknown: replays and predictions count every block)"
    elif info.source == "token-ids":
        text = f"chained ids of {block} from the prompt token ids (exact)"
    elif info.source == "messages":
        counts = "per-message token counts" + (
            " from the tokenizer" if info.exact else " estimated from characters (not exact)"
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
