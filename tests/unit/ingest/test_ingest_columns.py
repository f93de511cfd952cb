"""The vectorized trace-line writer agrees with ``TraceRecord.to_json``; tokenizers count for real."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.errors import ConfigError
from oomload.ingest.columns import batch_from_records, format_lines, lines_bytes, records_from_batch
from oomload.ingest.tokens import load_token_counter
from oomload.trace.model import TraceRecord

text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
record = st.builds(
    TraceRecord,
    id=text,
    arrival_s=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    prompt_tokens=st.integers(0, 10**6),
    output_tokens=st.integers(0, 10**5),
    max_tokens=st.none() | st.integers(0, 10**5),
    ok=st.booleans(),
    model=st.none() | text,
    hash_ids=st.lists(st.integers(0, 2**40), max_size=5).map(tuple),
    session=st.none() | text,
    parent=st.none() | text,
    turn=st.none() | st.integers(0, 100),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(record, min_size=1, max_size=20), st.integers(0, 1000))
def test_format_lines_matches_to_json(records: list[TraceRecord], first_index: int) -> None:
    batch = batch_from_records(records)
    origin = records[0].arrival_s
    data = bytes(lines_bytes(format_lines(batch, origin_s=origin, first_index=first_index)))
    lines = data.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == len(records) + 1
    for index, (line, rec) in enumerate(zip(lines, records, strict=False)):
        got = json.loads(line)
        expected = rec.to_json()
        expected["id"] = rec.id or f"r{first_index + index}"
        expected["arrival_s"] = round(rec.arrival_s - origin, 6)
        # Both round to 1 µs, but pyarrow rounds the scaled value (x·10⁶) while Python rounds the
        # binary value's exact decimal: near a half-way point the two can differ by that last µs
        # (4398047.0104915 → …492 here, …491 in Python). The trace's resolution is the µs; the two
        # decimals, read back as floats, are a µs apart give or take their last bits (4194304.974614
        # and …613 are 1.00024 µs apart as doubles), hence the ulps.
        want = expected.pop("arrival_s")
        assert got.pop("arrival_s") == pytest.approx(want, abs=1e-6 + 4 * math.ulp(want))
        assert got == expected


def test_records_round_trip_through_a_batch() -> None:
    recs = [
        TraceRecord("a", 5.0, 10, 2, max_tokens=4, ok=False, model="m", hash_ids=(1, 2), session="s", turn=3),
        TraceRecord("", 6.5, 0, 0),
    ]
    back = list(records_from_batch(batch_from_records(recs), origin_s=5.0))
    assert back[0] == TraceRecord(
        "a", 0.0, 10, 2, max_tokens=4, ok=False, model="m", hash_ids=(1, 2), session="s", turn=3
    )
    assert back[1] == TraceRecord("", 1.5, 0, 0)


def test_local_tiktoken_file_counts_tokens(tmp_path: Path) -> None:
    ranks = {bytes([i]): i for i in range(256)}
    ranks.update({b"he": 256, b"ll": 257, b"hell": 258, b"hello": 259})
    path = tmp_path / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(tok).decode()} {rank}\n" for tok, rank in ranks.items()))
    counter = load_token_counter(f"tiktoken:{path}")
    assert counter.name == f"tiktoken:{path}"
    assert counter.count("hello") == 1
    assert counter.count("hello world") == 7  # "hello" + " world" as 6 single bytes


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nonsense", "unknown --tokenizer"),
        ("tiktoken:/no/such/file.tiktoken", "no such tiktoken file"),
        ("hf:/no/such/dir", "has no tokenizer.json"),
    ],
)
def test_bad_tokenizer_specs(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_token_counter(spec)


def test_sixteen_digit_ids_render_as_the_generic_cast_does() -> None:
    """The numpy renderer of derived ids (16 digits) writes what pyarrow's cast and join write, for
    lists with nulls, empty lists, sliced and chunked columns; other ids take the generic path."""
    from oomload.ingest.columns import _sixteen_digit_lists

    def generic(column: pa.Array | pa.ChunkedArray) -> list[str | None]:
        texts = pc.binary_join(pc.cast(column, pa.list_(pa.string())), ",").to_pylist()
        return [None if not t else "[" + t for t in texts]

    rng = np.random.default_rng(5)
    for trial in range(200):
        rows = [
            None if r < 0.15 else [] if r < 0.3 else rng.integers(10**15, 10**16, rng.integers(1, 6)).tolist()
            for r in rng.random(int(rng.integers(1, 30)))
        ]
        rows[0] = [10**15, 10**16 - 1]  # the range's two ends
        column: pa.Array | pa.ChunkedArray = pa.array(rows, pa.list_(pa.int64()))
        if trial % 3 == 1:
            column = column.slice(int(rng.integers(0, len(rows))))
        elif trial % 3 == 2:
            column = pa.chunked_array([column.slice(0, len(rows) // 2), column.slice(len(rows) // 2)])
        fixed = _sixteen_digit_lists(column)
        if all(t is None for t in generic(column)):  # the caller renders nothing then
            continue
        assert fixed is not None and fixed.to_pylist() == generic(column)
    assert _sixteen_digit_lists(pa.array([[1, 2], None], pa.list_(pa.int64()))) is None  # Mooncake's ids
    assert _sixteen_digit_lists(pa.array([[10**16]], pa.list_(pa.int64()))) is None


def test_strings_that_need_escaping_render_as_json_in_any_slice_of_a_batch() -> None:
    """Ids and models are escaped only when their bytes need it (``_json_string_pieces``): a quote, a
    backslash, a control character, in a sliced or chunked column, render as JSON in every case."""
    recs = [
        TraceRecord("new\nline", 0.0, 1, 1, model="m"),
        TraceRecord('say "hi"', 1.0, 2, 2, model="back\\slash"),
        TraceRecord("plain", 2.0, 3, 3, model=None),
        TraceRecord("tab\there", 3.0, 4, 4, model='q"'),
        TraceRecord("", 4.0, 5, 5, model="ünï"),
    ]
    batch = batch_from_records(recs)
    for start in range(len(recs)):
        for stop in range(start + 1, len(recs) + 1):
            part = batch.slice(start, stop - start)
            chunked = pa.concat_tables([part.slice(0, 1), part.slice(1)])  # two chunks a column
            for table in (part, chunked):
                lines = bytes(lines_bytes(format_lines(table, origin_s=0.0, first_index=start))).decode()
                fresh = batch_from_records(recs[start:stop])
                assert (
                    lines == bytes(lines_bytes(format_lines(fresh, origin_s=0.0, first_index=start))).decode()
                )
                got = [json.loads(line) for line in lines.splitlines()]
                assert [g["id"] for g in got] == [
                    r.id or f"r{start + i}" for i, r in enumerate(recs[start:stop])
                ]
                assert [g.get("model") for g in got] == [r.model for r in recs[start:stop]]
