"""A trace built from a gateway log tells nothing of the log's text, lengths or names (issue 34, item 5).

The attack of the review that found the old message-path ids invertible is run here as it was: a
block id was ``ID_BASE`` + the top 52 bits of SplitMix64's finalizer (a public bijection) of
``offset · GOLDEN ^ key``, ``key`` the message's chained key. For two consecutive ids of one message
(offsets ``o`` and ``o + 16``), 4,096 guesses of the 12 cut bits and 16 of the first offset give back
the key and the offset — so where each message starts, hence its length. ``_recovered_starts`` tries
every guess on every pair of consecutive ids; against ids made by the old function (kept here as
``_unkeyed``, the reference) it finds every message start of the log, and against a real build it
finds nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from oomload.ingest import build_trace
from oomload.ingest.prefixes import PREFIX_SALT_ENV
from oomload.trace import blockhash
from oomload.trace.blockhash import ID_BASE, ID_BITS
from oomload.trace.model import read_trace, read_trace_header

BLOCK = 16
GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
CUT = 64 - ID_BITS  # the bits an id does not keep
U = np.uint64
FACTORS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _unkeyed(key: bytes, words: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
    """The old per-block step, the reference: SplitMix64's finalizer of ``offset · GOLDEN ^ key``, which
    ignores the build's key (given a message's key and the block's offset; else of the one word)."""
    x = words.copy() if offsets is None else (offsets * U(GOLDEN)) ^ words
    x ^= x >> U(30)
    x *= U(FACTORS[0])
    x ^= x >> U(27)
    x *= U(FACTORS[1])
    x ^= x >> U(31)
    return x


def _unshift(y: np.ndarray, shift: int) -> np.ndarray:
    x = y.copy()
    for _ in range(64 // shift + 1):
        x = y ^ (x >> U(shift))
    return x


def _unmix(y: np.ndarray) -> np.ndarray:
    """The finalizer's inverse (it is a bijection: no key, nothing to guess)."""
    x = _unshift(y, 31)
    x *= U(pow(FACTORS[1], -1, 1 << 64))
    x = _unshift(x, 27)
    x *= U(pow(FACTORS[0], -1, 1 << 64))
    return _unshift(x, 30)


def _recovered_starts(chain: tuple[int, ...]) -> set[int]:
    """Message starts (in tokens) read off one request's ids by the review's inversion: for each pair
    of consecutive ids, every guess of the cut bits and of the first id's offset in its message
    (1–16: the first block that ends in a message); a guess is right when it predicts the second id."""
    guesses = np.arange(1 << CUT, dtype=np.uint64)
    offsets = np.arange(1, BLOCK + 1, dtype=np.uint64)
    found: set[int] = set()
    for k in range(len(chain) - 1):
        first = U(chain[k] - ID_BASE) << U(CUT)
        x = _unmix(first | guesses)  # every candidate for offset · GOLDEN ^ key
        keys = x[:, None] ^ (offsets[None, :] * U(GOLDEN))
        predicted = _unkeyed(b"", (((offsets + U(BLOCK)) * U(GOLDEN))[None, :] ^ keys).ravel())
        hits = np.flatnonzero((predicted >> U(CUT)) + U(ID_BASE) == U(chain[k + 1]))
        for hit in hits.tolist():
            offset = int(offsets[hit % BLOCK])
            found.add((k + 1) * BLOCK - offset)
    return found


def _messages(i: int) -> list[dict[str, str]]:
    """A conversation of four messages of different lengths (each several blocks long)."""
    return [
        {"role": "system", "content": "You are a careful assistant. " * (9 + i % 3)},
        {"role": "user", "content": f"question {i}: " + "why " * (40 + 7 * i)},
        {"role": "assistant", "content": "because " * (25 + i)},
        {"role": "user", "content": "and then? " * (30 + 2 * i)},
    ]


def _message_starts(messages: list[dict[str, str]]) -> set[int]:
    """Where each message starts in tokens as the build counts them (its JSON's bytes / 4, rounded up)."""
    starts, at = set(), 0
    for message in messages:
        starts.add(at)
        at += math.ceil(len(json.dumps(message).encode()) / 4)
    return starts


def _gateway_log(path: Path, count: int = 6) -> Path:
    lines = []
    for i in range(count):
        messages = _messages(i)
        total = max(_message_starts(messages)) + 200
        lines.append(
            json.dumps(
                {
                    "timestamp": 1_760_000_000 + i,
                    "request_id": f"req-secret-{i}",
                    "request": {"model": "m", "messages": messages, "max_tokens": 64},
                    "response": {"usage": {"prompt_tokens": total, "completion_tokens": 9}},
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _build(log: Path, out: Path) -> list:
    build_trace([log], out, workers=1)
    return read_trace(out)


def test_no_message_start_is_recovered_from_a_trace_with_a_random_salt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PREFIX_SALT_ENV, raising=False)
    log = _gateway_log(tmp_path / "gateway.jsonl")
    truth = [_message_starts(_messages(i)) for i in range(6)]
    assert all(len(starts) == 4 for starts in truth)

    # the control: ids made by the old unkeyed step give every message start back
    with monkeypatch.context() as patched:
        patched.setattr(blockhash, "keyed_hash", _unkeyed)
        old = _build(log, tmp_path / "old.jsonl")
    assert [_recovered_starts(r.hash_ids) for r in old] == truth

    # a real build with a random salt: not one pair of ids gives a guess away
    records = _build(log, tmp_path / "trace.jsonl")
    assert [len(r.hash_ids) for r in records] == [len(r.hash_ids) for r in old]
    assert min(len(r.hash_ids) for r in records) >= 16
    assert [_recovered_starts(r.hash_ids) for r in records] == [set()] * 6


def test_two_builds_of_one_log_share_no_id_and_names_are_pseudonyms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PREFIX_SALT_ENV, raising=False)
    log = _gateway_log(tmp_path / "gateway.jsonl")
    first, second = _build(log, tmp_path / "a.jsonl"), _build(log, tmp_path / "b.jsonl")

    def ids(records: list) -> set[object]:
        return {r.id for r in records} | {h for r in records for h in r.hash_ids}

    assert len(ids(first)) == len(ids(second)) > 100
    assert ids(first).isdisjoint(ids(second))
    # the prefix structure is the same: the same blocks are shared in both builds
    shared = [[a == b for a, b in zip(r.hash_ids, first[0].hash_ids, strict=False)] for r in first]
    assert shared == [[a == b for a, b in zip(r.hash_ids, second[0].hash_ids, strict=False)] for r in second]
    text = (tmp_path / "a.jsonl").read_text()
    assert "req-secret" not in text and all(len(r.id) == 16 for r in first)
    header = read_trace_header(tmp_path / "a.jsonl").extra
    assert (header["salt"], header["ids"]) == ("random", "pseudonyms")


def test_a_fixed_salt_is_marked_never_written_and_keep_ids_keeps_the_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PREFIX_SALT_ENV, "our-team-salt-7f3a")
    log = _gateway_log(tmp_path / "gateway.jsonl")
    first, second = _build(log, tmp_path / "a.jsonl"), _build(log, tmp_path / "b.jsonl")
    assert first == second  # matchable across builds, which the header says
    text = (tmp_path / "a.jsonl").read_text()
    assert "our-team-salt" not in text
    assert read_trace_header(tmp_path / "a.jsonl").extra["salt"] == "fixed"
    build_trace([log], tmp_path / "kept.jsonl", workers=1, keep_ids=True)
    kept = read_trace(tmp_path / "kept.jsonl")
    assert [r.id for r in kept] == [f"req-secret-{i}" for i in range(6)]
    assert [r.hash_ids for r in kept] == [r.hash_ids for r in first]  # only the names differ
    assert read_trace_header(tmp_path / "kept.jsonl").extra["ids"] == "kept"


def test_pseudonyms_keep_equality_and_nulls_whatever_the_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    from oomload.trace import pseudonyms

    names = ["chatcmpl-1", None, "", "chatcmpl-1", "é" * 100, "x", "abcdefgh", "abcdefgh\0", "r7"]
    column = pa.chunked_array([pa.array(names[:4]), pa.array(names[4:])])
    named = pseudonyms.Pseudonyms(b"salt-one").of(column).to_pylist()
    assert named[1] is None and named[0] == named[3] and len(set(named) - {None}) == len(names) - 2
    assert all(n is None or (len(n) == 16 and int(n, 16) >= 0) for n in named)
    monkeypatch.setattr(pseudonyms, "WIDE_FACTOR", 0)  # names placed end to end, not as matrix rows
    assert pseudonyms.Pseudonyms(b"salt-one").of(pa.array(names)).to_pylist() == named
    assert pseudonyms.Pseudonyms(b"salt-one").of(pa.array(names).slice(3)).to_pylist() == named[3:]
    other = pseudonyms.Pseudonyms(b"salt-two").of(pa.array(names)).to_pylist()
    assert set(other).isdisjoint(set(named) - {None})
    assert "salt" not in repr(pseudonyms.Pseudonyms(b"salt-one"))
