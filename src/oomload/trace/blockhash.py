"""Chained, salted block ids of prompts: the prefix structure a trace carries without its text (pure).

**Chained block ids** (``BlockHasher``). A prompt is cut into blocks of ``block_tokens`` tokens;
only full blocks get an id (a partial last block is never shared, as in vLLM). Block k's id is a
keyed hash of everything from token 0 through the end of block k, so — like vLLM's block hashes —
two prompts share block k exactly when they are identical from token 0 through the end of block k.
The keyed step is AES-128 (``keyed_hash``: a keyed permutation, so a PRF) under a 128-bit key derived
from the build's salt for that use alone, run over all blocks at once on the CPU's AES instructions
(``cryptography``) — no Python work per block, a few ns a block, so hashing keeps the build's speed.
The salt is random per build and never written (ingest/prefixes.py makes it; ``OOMLOAD_PREFIX_SALT``
fixes it for reproducible builds): without it an id reveals nothing of the text or token ids, a
guessed prompt cannot be tested, and ids cannot be matched against another trace's. The id written
is ``ID_BASE`` (10¹⁵) plus the top ``ID_BITS`` (52) bits: always 16 digits (the trace writer renders
them as fixed-width text, ``ingest.columns``) and below 2⁵³, so every JSON reader holds it exactly
(JavaScript's too); two different prefixes collide with odds of about n²/2⁵³ for n distinct blocks
(one in 9,000 for a million).

What is keyed: for token ids (``chain_tokens``; ``token_text_chains`` reads a vLLM log's id lists
as bytes, never parsing them), a 64-bit digest of the prefix's text in vLLM's own form ``"1, 2, 3"``
(any other spacing is made that first: spaces never matter). The text is read as little-endian
8-byte words; word j's term is ``((w ^ w >> 32) · m_j) ^ (that >> 32)`` with ``m_j`` a keyed odd
multiplier for position j — a bijection of the word whose low bits depend on all of its bits — and
the digest of the first L bytes is the wrapping sum of the terms of its whole words plus that of
its last word cut at L (``_token_digests``). For a whole batch (a few MB of id lists) that is a
handful of numpy passes over the words: one cumulative sum of all terms, each digest a difference
of two of its entries; the block ends (every ``block_tokens``-th comma) are found from per-word
comma counts (``np.bitwise_count``, a cumulative sum, ``searchsorted``, then the byte within the
word by SWAR, ``_comma_byte``). Two different prefixes share a digest with odds about 2⁻⁶³.
When only message boundaries are known
(``chain_messages`` / ``message_block_ids``), each message enters a keyed chain by its length and
CRC-32 (``message_keys``: one fast pass over its raw bytes — ISA-L's CRC-32 when ``isal`` is
installed, zlib's otherwise, the same values — then the keyed hash of the previous key and that mark,
one step per message position for a whole batch of requests), and block k's id is the keyed hash (under
a key of its own) of the chained key of the message that holds the block's last token and the block's
end offset in that message. So blocks match only when every message up to there is identical and
starts at the same token, and a message is never split finer than its token count allows. Keyed end to
end, so without the salt neither the key nor the offset can be had back from an id — not from one, nor
from two consecutive ids of one message (``tests/unit/trace/test_trace_privacy.py`` tries it), so a
trace does not tell where its messages start or how long they are.

``oomload.trace.prefix`` models the cache these ids feed (reuse, the LRU pool, the trace's prefix stats).
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers import Cipher, modes

DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size: the trace then predicts any multiple of it
ID_BITS = 52  # of the keyed hash in an id
ID_BASE = 10**15  # ids are ID_BASE + the hash's top ID_BITS bits: 16 digits, all below 2**53
_ID_SHIFT = 64 - ID_BITS


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
        return self.chain_token_text(", ".join(map(str, token_ids)))

    def chain_token_text(self, ids_text: str) -> tuple[int, ...]:
        """The ids of the full blocks of ``"1, 2, 3"`` (token ids as vLLM logs them; spaces ignored)."""
        return self.chain_token_texts([ids_text])[0]

    def chain_token_texts(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """``chain_token_text`` of many prompts (``token_text_chains`` as tuples)."""
        flat, offsets, _ = self.token_text_chains(texts)
        values, bounds = flat.tolist(), offsets.tolist()
        return [tuple(values[bounds[i] : bounds[i + 1]]) for i in range(len(texts))]

    def token_text_chains(
        self, texts: Sequence[str | bytes]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The block ids of many prompts logged as id lists, as a list column — flat ids and ``len + 1``
        offsets — and each prompt's id count (``count_token_texts``). One pass of numpy calls for the
        whole batch, none per prompt (``_token_digests``)."""
        size = self.block_tokens
        text = _IdTexts.of(texts)
        ids_in = text.ids_in()
        full = ids_in // size
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(full, out=offsets[1:])
        total = int(offsets[-1])
        if total == 0:
            return np.empty(0, dtype=np.int64), offsets, ids_in
        depth = np.arange(total, dtype=np.int64)
        depth -= np.repeat(offsets[:-1], full)
        # block k ends at the text's comma number size·(k+1) − 1: the word holding it, then its byte
        before, starts = text.before, text.starts
        rank = depth * size
        rank += np.repeat(before[starts[:-1]] + size - 1, full)
        word = np.searchsorted(before, rank, side="right")
        word -= 1
        end = _comma_byte(text.comma_words[word], rank - before[word])
        end += word * 8
        first_word = np.repeat(starts[:-1], full)
        digests = _token_digests(self.salt, text.words, starts, word, end, first_word)
        return block_ids(keyed_hash(self.token_key, digests)), offsets, ids_in

    def conversation_chain(self, conversation: str, prompt_tokens: int) -> tuple[int, ...]:
        """The ids of the first ``prompt_tokens // block_tokens`` blocks of a conversation's token stream:
        keyed by the conversation id and the depth, so turns of one conversation share their common
        length and nothing else matches (a log with a conversation column but no text)."""
        full = max(prompt_tokens, 0) // self.block_tokens
        if full == 0:
            return ()
        digest = hashlib.blake2b(conversation.encode(), digest_size=8, key=self.salt, person=b"conversation")
        base = np.full(full, int.from_bytes(digest.digest(), "big"), dtype=np.uint64)
        keyed = keyed_hash(self.conversation_key, base, np.arange(full, dtype=np.uint64))
        return tuple(block_ids(keyed).tolist())

    @property
    def chain_key(self) -> bytes:
        """The key of the message chains (``chain_marks``), derived from the salt."""
        return prf_key(self.salt, b"oomload-chain")

    @property
    def block_key(self) -> bytes:
        """The key of the message-path block ids (``message_block_ids``), derived from the salt."""
        return prf_key(self.salt, b"oomload-block")

    @property
    def token_key(self) -> bytes:
        """The key of the token-text block ids (``token_text_chains``), derived from the salt."""
        return prf_key(self.salt, b"oomload-tokens")

    @property
    def conversation_key(self) -> bytes:
        """The key of the conversations' block ids (``conversation_chain``), derived from the salt."""
        return prf_key(self.salt, b"oomload-convers")

    def message_keys(self, parts: Sequence[bytes]) -> list[int]:
        """The chained keyed digest of each message (of every message up to it): 64-bit integers."""
        marks = np.array([part_mark(p) for p in parts], dtype=np.uint64)
        keys = chain_marks(self.chain_key, marks, np.array([len(parts)], dtype=np.int64))
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
            self.block_key, keys, tokens, np.array([len(messages)]), np.array([limit]), self.block_tokens
        )
        return tuple(values.tolist())


_COMMA = ord(",")
_SPACE = ord(" ")
_WORD = np.dtype("<u8")  # the digest reads a text as little-endian 64-bit words on any machine
_ONES = np.uint64(0x0101010101010101)
_HIGH_BITS = np.uint64(0x8080808080808080)  # a byte past ASCII
_BYTE_MASKS = np.array([(1 << (8 * r)) - 1 for r in range(8)], dtype=np.uint64)  # a word's first r bytes
_TERMINATORS = [b", " + b"\0" * ((-(length + 2)) % 8) for length in range(8)]  # by len % 8
_STRIPPED = np.zeros(256, dtype=bool)
_STRIPPED[list(b" \t\n\r\x0b\x0c")] = True  # what bytes.strip() removes


@functools.lru_cache(maxsize=8)
def keyed_multipliers(salt: bytes, purpose: bytes, size: int) -> npt.NDArray[np.uint64]:
    """``size`` keyed odd 64-bit multipliers, one per word position, for one use of the salt
    (``prf_key``): the token digest's (``oomload-words``) and the names' (``pseudonyms``)."""
    seed = int.from_bytes(prf_key(salt, purpose), "big")
    return np.random.default_rng(seed).integers(0, 2**64, size, dtype=np.uint64, endpoint=False) | _U(1)


def _ids_bytes(text: str | bytes) -> bytes:
    """A text as bytes, taken as they are (``_canonical`` checks them); a ``str`` not ASCII canonicalised."""
    if isinstance(text, bytes):
        return text
    return text.encode("ascii") if text.isascii() else _canonical_ids(text)


def _text(text: str | bytes) -> str:
    return text if isinstance(text, str) else text.decode("utf-8", errors="replace")


def _canonical_ids(ids_text: str) -> bytes:
    """The logged ids as ASCII ``"1, 2, 3"``: spaces dropped, whitespace around stripped, ``", "``
    between ids — vLLM's own format, which ``_IdTexts`` takes as it is."""
    if ids_text.isascii():
        text = ids_text.encode("ascii").translate(None, b" ").strip()
    else:
        text = ids_text.replace(" ", "").strip().encode("ascii", errors="replace")
    return text.replace(b",", b", ")


def count_token_texts(texts: Sequence[bytes]) -> npt.NDArray[np.int64]:
    """How many ids each ``"1, 2, 3"`` text lists (commas + 1; none for a blank one), for a batch at
    once: ``bytes.count`` per text is several times slower on long lists."""
    buffer, _, starts = _joined(list(texts))
    before = _commas_before(np.frombuffer(buffer, np.uint8) == _COMMA)
    counts = before[starts[1:]] - before[starts[:-1]]
    counts[[not t.strip() for t in texts]] = 0
    return counts


def _commas_before(commas: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """The commas before each 8-byte word of a buffer (and in all of it, last)."""
    before = np.empty(len(commas) // 8 + 1, dtype=np.int64)
    before[0] = 0
    np.cumsum(np.bitwise_count(commas.view(_WORD)), dtype=np.int64, out=before[1:])
    return before


@dataclass(frozen=True, slots=True)
class _IdTexts:
    """A batch of id lists in one buffer: each text (canonical, ``_canonical_ids``) followed by
    ``", "`` and NULs to a whole number of 8-byte words; ``starts``: each text's first word (and the
    end); ``before``: the commas before each word (a text's terminator counts, so a text's commas are
    its ids)."""

    words: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    comma_words: npt.NDArray[np.uint64]  # per word, its bytes as 0/1 (1: a comma)
    before: npt.NDArray[np.int64]

    @classmethod
    def of(cls, texts: Sequence[str | bytes]) -> _IdTexts:
        encoded = [_ids_bytes(t) for t in texts]
        buffer, lengths, starts = _joined(encoded)
        data = np.frombuffer(buffer, np.uint8)
        commas = data == _COMMA
        if not _canonical(data, commas, lengths, starts):  # rare: other spacing, whitespace around
            buffer, lengths, starts = _joined([_canonical_ids(_text(t)) for t in texts])
            data = np.frombuffer(buffer, np.uint8)
            commas = data == _COMMA
        return cls(np.frombuffer(buffer, _WORD), lengths, starts, commas.view(_WORD), _commas_before(commas))

    def ids_in(self) -> npt.NDArray[np.int64]:
        counts = self.before[self.starts[1:]] - self.before[self.starts[:-1]]
        counts[self.lengths == 0] = 0
        return counts


def _joined(
    encoded: list[bytes],
) -> tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    parts: list[bytes] = []
    for text in encoded:
        parts += (text, _TERMINATORS[len(text) % 8])
    starts = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum((lengths + 2 + 7) // 8, out=starts[1:])
    return b"".join(parts), lengths, starts


def _canonical(
    data: npt.NDArray[np.uint8],
    commas: npt.NDArray[np.bool_],
    lengths: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
) -> bool:
    """True when every text of the buffer is already ``_canonical_ids`` of itself: ASCII, a space
    exactly after each comma (so nowhere else), and nothing ``strip`` would remove at either end.

    On words: the space bytes must be the comma bytes moved one byte on (little-endian: ``<< 8``,
    with the top byte of the word before)."""
    if len(data) == 0:
        return True
    spaces = (data == _SPACE).view(_WORD)
    comma_words = commas.view(_WORD)
    moved = comma_words << _U(8)
    moved[1:] |= comma_words[:-1] >> _U(56)
    if not np.array_equal(spaces, moved) or (data.view(_WORD) & _HIGH_BITS).any():
        return False
    filled = lengths > 0
    first = starts[:-1][filled] * 8
    return not (_STRIPPED[data[first]].any() or _STRIPPED[data[first + lengths[filled] - 1]].any())


def _comma_byte(comma_words: npt.NDArray[np.uint64], number: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The byte (0–7) of comma ``number`` (0-based) in each word, given as 0/1 bytes (1: a comma).

    SWAR: times ``0x0101…01`` each byte holds the commas up to it (≤ 8); adding ``0x7F − number`` to
    every byte sets a byte's top bit exactly where that count passes ``number`` (no carry between
    bytes), and the bytes before the comma are the bytes whose top bit stays clear."""
    probe = comma_words * _ONES
    probe += (_U(0x7F) - number.astype(np.uint64)) * _ONES
    probe >>= _U(7)
    probe &= _ONES
    clear: npt.NDArray[np.int64] = 8 - np.bitwise_count(probe).astype(np.int64)
    return clear


def mixed_words(words: npt.NDArray[np.uint64], multipliers: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Each word's keyed term: ``((w ^ w >> 32) · m) ^ (that >> 32)``, a bijection of the word for its
    position's odd multiplier ``m``, whose low bits depend on every bit of the word."""
    out = words >> _U(32)
    out ^= words
    out *= multipliers
    np.right_shift(out, _U(32), out=multipliers)  # the caller's multipliers are a scratch copy
    out ^= multipliers
    return out


def _token_digests(
    salt: bytes,
    words: npt.NDArray[np.uint64],
    starts: npt.NDArray[np.int64],
    word: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    first_word: npt.NDArray[np.int64],
) -> npt.NDArray[np.uint64]:
    """The 64-bit digest of each text's bytes before ``end`` (a byte of the buffer, in ``word``; the text
    starts at ``first_word``): the wrapping sum of ``mixed_words`` terms of its whole words and of the last
    word's bytes before the end, each word keyed by its position in the text. The terms of every word
    of the buffer are summed once (one cumsum); a digest is a difference of two of those sums."""
    widths = np.diff(starts)
    multipliers = keyed_multipliers(salt, b"oomload-words", 1 << max(int(widths.max()), 512).bit_length())
    keyed = mixed_words(words, np.concatenate([multipliers[:w] for w in widths.tolist()]))
    sums = np.empty(len(words) + 1, dtype=np.uint64)
    sums[0] = 0
    np.cumsum(keyed, out=sums[1:])
    digests = sums[word] - sums[first_word]
    last = words[word]
    last &= _BYTE_MASKS[end & 7]
    digests += mixed_words(last, multipliers[word - first_word])
    return digests


def _crc32_function() -> Callable[[Any], int]:
    """ISA-L's CRC-32 (``isal``, the ``fast`` extra: zlib's polynomial and values, by carry-less
    multiplication: 4-5x zlib's speed on messages of a few hundred bytes), else zlib's."""
    try:
        from isal import isal_zlib  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return zlib.crc32
    crc: Callable[[Any], int] = isal_zlib.crc32
    return crc


crc32 = _crc32_function()  # zlib.crc32's values; the marks below, hence every id, depend on them


def part_mark(part: bytes | memoryview | Any) -> int:
    """A message's mark in the chain: its length and CRC-32 (one fast pass over its bytes, no copy)."""
    return (len(part) & 0xFFFFFFFF) << 32 | crc32(part)


def part_marks(sizes: npt.NDArray[np.int64], crcs: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``part_mark`` of many messages from their lengths and CRC-32s."""
    return ((sizes.astype(np.uint64) & np.uint64(0xFFFFFFFF)) << np.uint64(32)) | crcs


_U = np.uint64


@functools.lru_cache(maxsize=16)
def _cipher(key: bytes) -> Cipher[modes.ECB]:
    """AES-128 under ``key``, in ECB (each 16-byte block on its own). ``cryptography`` is imported here,
    by the first build that hashes: ~22 ms that a command without a trace to build does not pay."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    return Cipher(algorithms.AES(key), modes.ECB())


def prf_key(salt: bytes, purpose: bytes) -> bytes:
    """The 128-bit AES key of one use of the salt (``purpose``: at most 16 bytes), so that the uses never
    share a keyed function: the ids of blocks, of message chains, of token texts, of conversations, and
    the pseudonyms of names each have their own."""
    return hashlib.blake2b(salt, digest_size=16, person=purpose).digest()


PRF_CHUNK = 32_768  # 16-byte blocks encrypted at a time (two 512 KiB buffers: in the CPU cache)


def keyed_hash(key: bytes, *words: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """A keyed pseudo-random function of one or two 64-bit words, for every ``i`` at once: AES-128 under
    ``key`` of the 16 bytes ``words[0][i] words[1][i]`` (little-endian; a missing second word is 0), the
    first 8 bytes of the ciphertext read as a little-endian word.

    AES is a keyed permutation of 128-bit blocks, so different inputs never share a ciphertext, and
    without the key an output says nothing of its input; 64 bits of it are a PRF (two inputs share an
    output with odds 2⁻⁶⁴). ``cryptography``'s AES runs on the CPU's AES instructions at several GB/s:
    the whole batch is one ECB pass in slices of ``PRF_CHUNK`` blocks (buffers reused, so no page of
    them is faulted in twice), a few ns a word."""
    if not 1 <= len(words) <= 2:
        raise ValueError("keyed_hash takes one or two words an input")
    count = len(words[0])
    out = np.empty(count, dtype=np.uint64)
    if count == 0:
        return out
    step = min(count, PRF_CHUNK)
    plain = np.zeros((step, 2), dtype="<u8")
    sealed = np.empty(2 * step + 2, dtype="<u8")  # update_into wants a block's room more than its input
    encryptor = _cipher(key).encryptor()
    for start in range(0, count, step):
        stop = min(start + step, count)
        rows = plain[: stop - start]
        rows[:, 0] = words[0][start:stop]
        if len(words) == 2:
            rows[:, 1] = words[1][start:stop]
        # ECB: each block on its own, so the slices chain nothing
        encryptor.update_into(rows.data.cast("B"), sealed.data.cast("B"))
        out[start:stop] = sealed[0 : 2 * (stop - start) : 2]
    return out


def chain_marks(
    key: bytes, marks: npt.NDArray[np.uint64], parts_per_prompt: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint64]:
    """Each message's chained key: ``keyed_hash`` under ``key`` (``BlockHasher.chain_key``) of the previous
    message's key and its mark, for many prompts at once — one vectorized step per message position, all
    prompts together.

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
        chained = keyed_hash(key, previous[:n], marks[at])
        keys[at] = chained
        previous[:n] = chained
    return keys


def block_ids(keyed: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """The ids written for keyed 64-bit hashes (in place): ``ID_BASE`` + their top ``ID_BITS`` bits."""
    keyed >>= _U(_ID_SHIFT)
    keyed += _U(ID_BASE)
    return keyed.view(np.int64)


def message_block_ids(
    key: bytes,
    keys: npt.NDArray[np.uint64],
    tokens: npt.NDArray[np.int64],
    parts_per_prompt: npt.NDArray[np.int64],
    limit_tokens: npt.NDArray[np.int64],
    block_tokens: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Block ids of many prompts at once, as a list column: flat ids and ``len + 1`` offsets.

    ``key`` is the build's block key (``BlockHasher.block_key``); ``keys``/``tokens`` are every prompt's
    messages in order (``BlockHasher.message_keys``, token counts); ``parts_per_prompt`` says how many
    belong to each prompt; a prompt's chain covers its full blocks up to the smaller of its messages'
    tokens and ``limit_tokens``.


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
    return block_ids(keyed_hash(key, np.repeat(keys, held), offset.view(np.uint64))), offsets
