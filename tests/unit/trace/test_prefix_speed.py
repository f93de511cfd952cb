"""The fast paths of the chain hashing give exactly the ids of the plain computation they replace."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from oomload.ingest import LogSource, SkipLog, openai_fast
from oomload.trace.blockhash import (
    PRF_CHUNK,
    BlockHasher,
    _canonical_ids,
    block_ids,
    chain_marks,
    keyed_hash,
    keyed_multipliers,
    message_block_ids,
)

SALT = b"speed-salt"


def _plain_chain(hasher: BlockHasher, ids_text: str) -> tuple[int, ...]:
    """The ids computed the plain way, one prompt and one block at a time: the ids joined by ", ", read
    as little-endian 8-byte words; block k's digest sums each word's keyed term up to the block's end
    (the last word cut there), and its id is the keyed hash of the digest (``_aes_reference``)."""
    data = _canonical_ids(ids_text)
    ids = data.split(b", ") if data else []
    size = hasher.block_tokens
    padded = data + bytes(16)
    words = [int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded) - 8, 8)]
    multipliers = keyed_multipliers(
        SALT, b"oomload-words", 1 << max((len(data) + 2 + 7) // 8, 512).bit_length()
    )
    mask = (1 << 64) - 1

    def term(word: int, at: int) -> int:
        mixed = ((word ^ (word >> 32)) * int(multipliers[at])) & mask
        return mixed ^ (mixed >> 32)

    out = []
    ends = [at - 2 for at in itertools.accumulate(len(i) + 2 for i in ids)]  # each id's end: its ", "
    whole, summed = 0, 0  # the sum of the terms of words [0, whole)
    for k in range(len(ids) // size):
        end = ends[(k + 1) * size - 1]
        while whole < end // 8:
            summed += term(words[whole], whole)
            whole += 1
        digest = summed + term(words[end // 8] & ((1 << (8 * (end % 8))) - 1), end // 8)
        keyed = np.array([_aes_reference(hasher.token_key, digest & mask)], np.uint64)
        out.append(int(block_ids(keyed)[0]))
    return tuple(out)


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
    ", ".join(str(i) for i in range(5000)),  # past the first multiplier table's 512 words
]


@pytest.mark.parametrize("block_tokens", [1, 2, 3, 16])
def test_token_text_chains_equal_the_plain_prefix_digests(block_tokens: int) -> None:
    hasher = BlockHasher(SALT, block_tokens)
    rng = np.random.default_rng(block_tokens)
    texts = [*TEXTS, *(", ".join(map(str, rng.integers(0, 200_000, n).tolist())) for n in (15, 16, 17, 900))]
    plain = [_plain_chain(hasher, t) for t in texts]
    assert hasher.chain_token_texts(texts) == plain  # the odd texts make the whole batch canonicalised
    assert [hasher.chain_token_text(t) for t in texts] == plain
    as_logged = [t.encode() for t in texts if t.isascii() and t == _canonical_ids(t).decode()]
    assert len(as_logged) >= 6  # the usual batch, taken as it is: vLLM's own "1, 2, 3"
    assert hasher.chain_token_texts(as_logged) == [_plain_chain(hasher, t.decode()) for t in as_logged]


def test_ids_are_sixteen_digits_and_spacing_does_not_matter() -> None:
    hasher = BlockHasher(SALT, 2)
    ids = hasher.chain_tokens(list(range(4000)))
    assert len(ids) == 2000 and all(10**15 <= i < 2**53 for i in ids)
    assert hasher.chain_token_text(" 1,2 , 3,4\t") == hasher.chain_token_text("1, 2, 3, 4")
    assert hasher.chain_token_texts([b"1, 2, 3, 4", "1, 2, 3, 4"]) == [hasher.chain_tokens([1, 2, 3, 4])] * 2


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
def test_prompts_sharing_a_start_share_its_blocks_and_match_the_plain_ones(block_tokens: int) -> None:
    hasher = BlockHasher(SALT, block_tokens)
    rng = np.random.default_rng(7)
    system = rng.integers(0, 50_000, 1500).tolist()  # past 512 words: another multiplier table
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
    chains = hasher.chain_token_texts(texts)
    assert chains == [_plain_chain(hasher, t) for t in texts]
    assert len(chains[0]) == 1500 // block_tokens and chains[5][: len(chains[0])] == chains[0] == chains[6]
    assert not set(chains[5][len(chains[0]) + 1 :]) & set(chains[0])


def _aes_reference(key: bytes, first: int, second: int = 0) -> int:
    """The keyed hash of one input the plain way: AES-128 of its 16 bytes (two little-endian words), the
    ciphertext's first 8 bytes as a little-endian integer."""
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    sealed = encryptor.update(first.to_bytes(8, "little") + second.to_bytes(8, "little"))
    return int.from_bytes(sealed[:8], "little")


def test_the_keyed_hash_is_aes_128_of_the_two_words() -> None:
    # FIPS-197, appendix C.1: key 00 01 … 0f, plaintext 00 11 … ff → 69c4e0d86a7b0430 d8cdb78070b4c55a
    key = bytes(range(16))
    plain = np.frombuffer(bytes.fromhex("00112233445566778899aabbccddeeff"), dtype="<u8").astype(np.uint64)
    assert int(keyed_hash(key, plain[:1], plain[1:])[0]).to_bytes(8, "little").hex() == "69c4e0d86a7b0430"
    m0 = np.array([0, 1, 2**64 - 1, 0x0706050403020100], dtype=np.uint64)
    m1 = np.array([0, 2**63, 12345, 0x0F0E0D0C0B0A0908], dtype=np.uint64)
    expected = [_aes_reference(key, int(a), int(b)) for a, b in zip(m0, m1, strict=True)]
    assert keyed_hash(key, m0, m1).tolist() == expected
    assert keyed_hash(key, m0[:0], m1[:0]).tolist() == []
    one_word = [_aes_reference(key, int(a)) for a in m0]
    assert keyed_hash(key, m0).tolist() == one_word != expected
    assert keyed_hash(bytes(16), m0, m1).tolist() != expected  # another key, other outputs


def _plain_message_ids(
    hasher: BlockHasher,
    marks: list[int],
    tokens: list[int],
    per_prompt: list[int],
    limits: list[int],
    size: int,
) -> tuple[list[int], list[int]]:
    """Message chains as first written: one prompt at a time, the keyed hash message by message, and each
    block's message found by a search over the prompt's message ends."""
    ids: list[int] = []
    keys: list[int] = []
    at = 0
    for count, limit in zip(per_prompt, limits, strict=True):
        previous = 0
        own = []
        for mark in marks[at : at + count]:
            previous = _aes_reference(hasher.chain_key, previous, mark)
            own.append(previous)
        keys += own
        ends = np.cumsum(tokens[at : at + count])
        full = min(int(ends[-1]) if count else 0, max(limit, 0)) // size
        for block in range(full):
            end = (block + 1) * size
            part = int(np.searchsorted(ends, end, side="left"))
            offset = end - (int(ends[part]) - tokens[at + part])
            keyed = np.array([_aes_reference(hasher.block_key, own[part], offset)], dtype=np.uint64)
            ids.append(int(block_ids(keyed)[0]))
        at += count
    return keys, ids


@pytest.mark.parametrize("block_tokens", [1, 3, 16])
def test_message_chains_of_many_prompts_equal_the_plain_ones(block_tokens: int) -> None:
    hasher = BlockHasher(SALT)
    rng = np.random.default_rng(block_tokens)
    per_prompt = rng.integers(0, 7, 300).tolist()  # prompts of 0 to 6 messages, in any order
    marks = rng.integers(0, 2**63, sum(per_prompt), dtype=np.uint64)
    marks[rng.random(len(marks)) < 0.3] = 12345  # many identical messages (a shared system prompt)
    tokens = rng.integers(0, 40, len(marks)).tolist()  # empty messages too
    limits = rng.integers(-3, 150, len(per_prompt)).tolist()  # chains cut inside and past the prompt
    counts = np.array(per_prompt, dtype=np.int64)
    keys = chain_marks(hasher.chain_key, marks, counts)
    ids, offsets = message_block_ids(
        hasher.block_key,
        keys,
        np.array(tokens, dtype=np.int64),
        counts,
        np.array(limits, dtype=np.int64),
        block_tokens,
    )
    plain_keys, plain_ids = _plain_message_ids(
        hasher, marks.tolist(), tokens, per_prompt, limits, block_tokens
    )
    assert keys.tolist() == plain_keys
    assert ids.tolist() == plain_ids
    lengths = [
        min(sum(tokens[a : a + n]), max(limit, 0)) // block_tokens
        for a, n, limit in zip(np.cumsum([0, *per_prompt[:-1]]).tolist(), per_prompt, limits, strict=True)
    ]
    assert np.diff(offsets).tolist() == lengths


def test_keyed_hash_in_slices_equals_one_pass() -> None:
    key = BlockHasher(SALT).block_key
    rng = np.random.default_rng(5)
    for count in (0, 1, PRF_CHUNK, PRF_CHUNK + 1, 3 * PRF_CHUNK + 17):
        a = rng.integers(0, 2**64, count, dtype=np.uint64, endpoint=False)
        b = rng.integers(0, 2**64, count, dtype=np.uint64, endpoint=False)
        for words in ((a,), (a, b)):
            plain = np.zeros((count, 2), dtype="<u8")
            for column, word in enumerate(words):
                plain[:, column] = word
            sealed = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(plain.tobytes())
            assert keyed_hash(key, *words).tolist() == np.frombuffer(sealed, "<u8")[::2].tolist()


def test_the_crc_of_a_message_is_zlibs_whichever_library_computes_it() -> None:
    """Every id depends on each message's CRC-32: ISA-L's (``isal``, when installed) must be zlib's."""
    import zlib

    import msgspec

    from oomload.trace.blockhash import crc32, part_mark

    rng = np.random.default_rng(7)
    sizes = (0, 1, 7, 8, 15, 64, 333, 4096, 70_001)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    parts += [b'{"role":"user","content":"h\\u00e9 \\"x\\""}', "日本語 🙂".encode()]
    for part in parts:
        assert crc32(part) == zlib.crc32(part)
        assert crc32(memoryview(part)) == zlib.crc32(part)
        assert part_mark(part) == (len(part) << 32 | zlib.crc32(part))
    raws = msgspec.json.decode(b'[{"a": "\\u00e9"}, "text", [1, 2]]', type=list[msgspec.Raw])
    assert [crc32(r) for r in raws] == [zlib.crc32(bytes(r)) for r in raws]
