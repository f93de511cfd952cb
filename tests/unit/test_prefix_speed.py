"""The fast paths of the chain hashing give exactly the ids of the plain computation they replace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oomload.blockhash import _ID_SHIFT, BlockHasher, _coefficients, _siphash13
from oomload.ingest import LogSource, SkipLog, openai_fast

SALT = b"speed-salt"


def _plain_chain(hasher: BlockHasher, ids_text: str) -> tuple[int, ...]:
    """The ids as first written: every byte's prefix digest (one cumsum), read at each block's end."""
    data = np.frombuffer(ids_text.replace(" ", "").strip().encode("ascii", errors="replace"), np.uint8)
    commas = np.flatnonzero(data == ord(","))
    size = hasher.block_tokens
    full = (len(commas) + 1) // size if len(data) else 0
    if full == 0:
        return ()
    ends = np.append(commas, len(data))[size - 1 :: size][:full]
    table, multipliers = _coefficients(SALT, 1 << max(len(data) - 1, 4095).bit_length())
    every = np.cumsum(table[data] * multipliers[: len(data)], dtype=np.uint64)
    keyed = _siphash13(hasher.sip_key, every[ends - 1], np.arange(full, dtype=np.uint64))
    return tuple((keyed >> np.uint64(_ID_SHIFT)).astype(np.int64).tolist())


TEXTS = [
    "1, 22, 333, 4444, 5, 6, 7, 8, 9",
    " 101,102 ,103,  104, 105 ",
    ", 1, 2, 3",  # an empty first id
    "1,,2,,3,,4",
    "7",
    "",
    "1, 2, 3\t",
    "\u00a01, 2, 3, 4, 5, 6\u00a0",  # not ASCII: the slower path
    "1, 2, é, 4, 5, 6, 7, 8",
    ", ".join(str(i) for i in range(5000)),  # past the first multiplier table's 4,096 bytes
]


@pytest.mark.parametrize("block_tokens", [1, 2, 3, 16])
def test_token_text_chains_equal_the_plain_prefix_digests(block_tokens: int) -> None:
    hasher = BlockHasher(SALT, block_tokens)
    rng = np.random.default_rng(block_tokens)
    texts = [*TEXTS, *(", ".join(map(str, rng.integers(0, 200_000, n).tolist())) for n in (15, 16, 17, 900))]
    assert hasher.chain_token_texts(texts) == [_plain_chain(hasher, t) for t in texts]
    assert [hasher.chain_token_text(t) for t in texts] == [_plain_chain(hasher, t) for t in texts]


def _chains_of(path: Path) -> list[object]:
    hasher = BlockHasher(SALT, 4)
    batches = openai_fast.read_openai_batches(LogSource(path), SkipLog(), None, hasher=hasher)
    return [ids for batch in batches for ids in batch.column("hash_ids").to_pylist()]


def test_openai_chains_do_not_depend_on_how_the_lines_are_cut_into_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # usual lines (the column path) and one odd line (the line-by-line path) in the same chunk
    lines = [
        f'{{"timestamp": {i}, "request": {{"model": "m", "messages": '
        '[{"role": "system", "content": "sys"}, '
        f'{{"role": "user", "content": "{"q" * (40 + 7 * i)}"}}]}}, '
        f'"response": {{"usage": {{"prompt_tokens": {20 + 2 * i}, "completion_tokens": 3}}}}}}'
        for i in range(30)
    ]
    lines[11] = lines[11].replace('"timestamp": 11', '"timestamp": "11"')
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    whole = _chains_of(path)
    monkeypatch.setattr(openai_fast, "PIECE_BYTES", 200)  # about a line a piece
    assert _chains_of(path) == whole
    assert len(whole) == 30 and all(whole)
    assert len({tuple(ids[:1]) for ids in whole if isinstance(ids, list)}) == 1  # the shared system message


@pytest.mark.parametrize("block_tokens", [1, 3, 16])
def test_prompts_sharing_a_start_take_its_digests_and_match_the_plain_ones(block_tokens: int) -> None:
    hasher = BlockHasher(SALT, block_tokens)
    rng = np.random.default_rng(7)
    system = rng.integers(0, 50_000, 1500).tolist()  # past 4,096 bytes: another multiplier table
    shared = ", ".join(map(str, system))
    texts = [
        shared,
        shared + ", 5, 6, 7",
        shared[:40],  # shorter than the earlier one: ends inside it
        shared[:40] + "9, 1, 2",  # differs inside an id
        shared[:41] + ", 1, 2",  # differs at a comma
        shared + ", " + ", ".join(map(str, rng.integers(0, 50_000, 3000).tolist())),
        shared,
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16",
    ]
    assert hasher.chain_token_texts(texts) == [_plain_chain(hasher, t) for t in texts]


def _siphash13_reference(k0: int, k1: int, m0: int, m1: int) -> int:
    """SipHash-1-3 of the 16 bytes ``m0 m1`` (two little-endian words), in plain Python."""
    mask = (1 << 64) - 1

    def rotl(x: int, b: int) -> int:
        return ((x << b) | (x >> (64 - b))) & mask

    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def sip_round() -> None:
        v[0] = (v[0] + v[1]) & mask
        v[1] = rotl(v[1], 13) ^ v[0]
        v[0] = rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & mask
        v[3] = rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & mask
        v[3] = rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & mask
        v[1] = rotl(v[1], 17) ^ v[2]
        v[2] = rotl(v[2], 32)

    for m in (m0, m1, 16 << 56):
        v[3] ^= m
        sip_round()
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(3):
        sip_round()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def test_the_vectorised_siphash_is_siphash_1_3() -> None:
    key = (np.uint64(0x0706050403020100), np.uint64(0x0F0E0D0C0B0A0908))
    m0 = np.array([0, 1, 2**64 - 1, 0x0706050403020100], dtype=np.uint64)
    m1 = np.array([0, 2**63, 12345, 0x0F0E0D0C0B0A0908], dtype=np.uint64)
    expected = [
        _siphash13_reference(int(key[0]), int(key[1]), int(a), int(b)) for a, b in zip(m0, m1, strict=True)
    ]
    assert _siphash13(key, m0, m1).tolist() == expected
    assert _siphash13(key, m0[:0], m1[:0]).tolist() == []
