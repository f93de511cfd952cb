"""Chained, salted block ids of prompts: the prefix structure a trace carries without its text (pure).

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

``oomload.prefix`` models the cache these ids feed (reuse, the LRU pool, the trace's prefix stats).
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

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
    for many prompts at once — one vectorized step per message position, all prompts together.

    The prompts are taken longest first, so the prompts that have a message at position j are the
    first ones of that order: their previous keys are one contiguous slice, updated in place.
    """
    keys = np.empty(len(marks), dtype=np.uint64)
    if not len(marks):
        return keys
    counts = np.asarray(parts_per_prompt, dtype=np.int64)
    order = np.argsort(-counts, kind="stable")
    first = (np.cumsum(counts) - counts)[order]  # each prompt's first message, longest prompt first
    alive = np.searchsorted(-counts[order], -np.arange(1, int(counts.max()) + 1), side="right")
    previous = np.zeros(len(order), dtype=np.uint64)
    for j, n in enumerate(alive.tolist()):  # n prompts have a message at position j
        at = first[:n] + j
        chained = _siphash13(key, previous[:n], marks[at])
        keys[at] = chained
        previous[:n] = chained
    return keys


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finalizer (wrapping uint64 arithmetic), in place: returns ``x``."""
    scratch = np.empty_like(x)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        np.right_shift(x, _U(shift), out=scratch)
        x ^= scratch
        x *= _U(factor)
    np.right_shift(x, _U(31), out=scratch)
    x ^= scratch
    return x


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

    Per message, the number of block ends it holds (multiples of ``block_tokens`` in its span of
    the prompt, up to the chain's end) — then each block's key and offset are ``np.repeat``s of
    per-message values plus a running block number: no search over the blocks.
    """
    size = block_tokens
    counts = np.asarray(parts_per_prompt, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    ends = np.zeros(len(tokens) + 1, dtype=np.int64)
    np.cumsum(tokens, out=ends[1:])  # over all prompts, from 0
    last = np.cumsum(counts)  # each prompt's end in the messages
    prompt_start = ends[last - counts]  # where each prompt starts on that one axis
    totals = ends[last] - prompt_start
    blocks = np.minimum(totals, np.maximum(limit_tokens, 0)) // size
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(blocks, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.empty(0, dtype=np.int64), offsets
    base = np.repeat(prompt_start, counts)
    start = ends[:-1] - base  # each message's span [start, start + tokens) in its prompt
    chain_end = np.repeat(blocks * size, counts)
    held = np.minimum(start + tokens, chain_end) // size - np.minimum(start, chain_end) // size
    before = np.cumsum(held) - held  # blocks before each message's first (over all prompts)
    # a message's k-th block ends at (start // size + 1 + k) * size: its offset in the message is
    # that less start; k is the block's number less ``before``
    first_offset = (start // size + 1) * size - start - before * size
    offset = np.repeat(first_offset, held)
    offset += np.arange(0, total * size, size, dtype=np.int64)
    ids = offset.view(np.uint64)
    ids *= _GOLDEN
    ids ^= np.repeat(keys, held)
    ids = _mix(ids)
    ids >>= _U(_ID_SHIFT)
    return ids.view(np.int64), offsets
