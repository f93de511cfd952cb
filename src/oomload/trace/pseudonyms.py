"""Salted pseudonyms of the names a trace carries: request ids, ``session`` and ``parent`` (pure).

A name is replaced by 16 hexadecimal digits, a keyed function of its UTF-8 bytes under the build's
salt: the same name gives the same pseudonym everywhere in one build (a ``parent`` still names its
parent's ``id`` or ``session``), and without the salt a pseudonym tells nothing of the name — not its
length, not whether a guessed name is it, not whether another trace holds it (built with another salt).

How, for a whole column at once (numpy, no Python work per name): each name's bytes are laid out in
8-byte little-endian words (zero-padded); word j's term is ``oomload.trace.blockhash``'s keyed
bijection under a keyed odd multiplier for position j, and a name's digest is the wrapping sum of its
words' terms (two names share a digest with odds about 2⁻⁶³; the length goes in below, so padding is
never ambiguous). The pseudonym is ``keyed_hash`` (AES-128, keyed: a PRF) of the digest and the byte
length, under a key of its own derived from the salt, written as 16 hex digits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from oomload.trace.blockhash import keyed_hash, keyed_multipliers, mixed_words, prf_key

PSEUDONYM_CHARS = 16
WIDE_FACTOR = 3  # a matrix of names padded to the longest may take this many times their bytes
_HEX = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), dtype="<u2")


@dataclass(frozen=True, slots=True)
class Pseudonyms:
    """The pseudonyms of one build (module docstring); ``salt`` is never written anywhere."""

    salt: bytes

    def __repr__(self) -> str:  # never print the salt
        return "Pseudonyms()"

    def of(self, column: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Each string of ``column`` as its pseudonym (nulls stay null)."""
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
            array = pc.cast(array, pa.string())
        n = len(array)
        if n == 0:
            return pa.array([], pa.string())
        offset_type = np.int64 if pa.types.is_large_string(array.type) else np.int32
        offsets = np.frombuffer(array.buffers()[1], dtype=offset_type)[array.offset : array.offset + n + 1]
        offsets = offsets.astype(np.int64)
        data_buffer = array.buffers()[2]
        data = np.zeros(0, np.uint8) if data_buffer is None else np.frombuffer(data_buffer, np.uint8)
        lengths = np.diff(offsets)
        data = data[int(offsets[0]) : int(offsets[-1])]
        digests = _digests(data, lengths, self.salt)
        hashed = keyed_hash(prf_key(self.salt, b"oomload-names"), digests, lengths.astype(np.uint64))
        text = _HEX[hashed.astype(">u8").view(np.uint8)].reshape(n, 8)  # 2 hex digits a byte, high first
        mask = None
        if array.null_count:
            mask = pa.py_buffer(np.packbits(np.asarray(array.is_valid()), bitorder="little"))
        return pa.StringArray.from_buffers(
            n,
            pa.py_buffer(np.arange(0, (n + 1) * PSEUDONYM_CHARS, PSEUDONYM_CHARS, dtype=np.int32)),
            pa.py_buffer(np.ascontiguousarray(text)),
            mask,
            null_count=array.null_count,
        )


def _digests(
    data: npt.NDArray[np.uint8], lengths: npt.NDArray[np.int64], salt: bytes
) -> npt.NDArray[np.uint64]:
    """Each name's keyed digest: the wrapping sum of ``mixed_words`` of its 8-byte words (zero-padded),
    word j under the keyed multiplier of position j. A zero word's term is 0, so names padded to
    one width give the same sums: when that width costs at most ``WIDE_FACTOR`` times the names'
    bytes, the names are laid out as the rows of one matrix (filled by a mask, the fast way);
    otherwise (a few long names among short ones) each name's words are placed end to end."""
    n = len(lengths)
    width = (int(lengths.max(initial=0)) + 7) // 8  # words a row
    multipliers = keyed_multipliers(salt, b"oomload-nameword", 1 << max(width, 64).bit_length())
    if n * width * 8 <= WIDE_FACTOR * len(data) + (1 << 16):
        rows = np.zeros((n, width * 8), dtype=np.uint8)
        rows[np.arange(width * 8)[None, :] < lengths[:, None]] = data
        words = rows.view("<u8")
        terms = mixed_words(words, np.broadcast_to(multipliers[:width], words.shape).copy())
        digests: npt.NDArray[np.uint64] = terms.sum(axis=1, dtype=np.uint64)
        return digests
    widths = (lengths + 7) // 8
    word_starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(widths, out=word_starts[1:])
    total_words = int(word_starts[-1])
    padded = np.zeros(total_words * 8, dtype=np.uint8)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    at = np.repeat(word_starts[:-1] * 8 - starts, lengths)
    at += np.arange(len(data), dtype=np.int64)
    padded[at] = data
    position = np.arange(total_words, dtype=np.int64) - np.repeat(word_starts[:-1], widths)
    terms = mixed_words(padded.view("<u8"), multipliers[position])
    sums = np.zeros(total_words + 1, dtype=np.uint64)
    np.cumsum(terms, out=sums[1:])
    wide: npt.NDArray[np.uint64] = sums[word_starts[1:]] - sums[word_starts[:-1]]
    return wide
