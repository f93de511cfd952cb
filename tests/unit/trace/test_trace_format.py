from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from oomload.errors import TraceFormatError
from oomload.trace.model import TraceHeader, TraceRecord, is_trace_file, read_trace, write_trace


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    records = [
        TraceRecord("a", 0.0, 10, 5),
        TraceRecord(
            "b",
            1.5,
            7000,
            0,
            max_tokens=256,
            ok=False,
            model="m",
            hash_ids=(1, 2),
            session="s",
            parent="a",
            turn=2,
        ),
    ]
    path = tmp_path / "t.jsonl"
    assert write_trace(path, records, TraceHeader(source=("x.csv",), format="azure-csv")) == 2
    assert read_trace(path) == records
    assert is_trace_file(path)
    header = json.loads(path.read_text().splitlines()[0])
    assert header["oomload_trace"] == 1 and header["format"] == "azure-csv"


def test_plain_record_omits_optional_keys() -> None:
    assert TraceRecord("a", 0.0, 1, 2).to_json() == {
        "id": "a",
        "arrival_s": 0.0,
        "prompt_tokens": 1,
        "output_tokens": 2,
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ("TIMESTAMP,ContextTokens\n", "not an oomload trace"),
        ('{"oomload_trace": 99}\n', "schema version 99"),
        ('{"oomload_trace": 1}\n{"id": "a", "prompt_tokens": -1, "output_tokens": 1}\n', ":2:"),
        ('{"oomload_trace": 1}\n', "holds no requests"),
    ],
)
def test_bad_traces_give_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=message):
        read_trace(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bytes.jsonl", b"\x8f\xff\x00 random bytes\n", r"bytes\.jsonl:1: not UTF-8 text"),
        ("late.jsonl", b'{"oomload_trace": 1}\n\xff\xfe bad\n', r"late\.jsonl:2: not UTF-8 text"),
        ("plain.jsonl.gz", b"\x1f\x8bnot gzip at all\n", r"plain\.jsonl\.gz:1: damaged or not a gzip file"),
        (
            "text.jsonl.gz",
            b"not gzip at all\n",
            r"text\.jsonl\.gz:1: not an oomload trace",
        ),  # content decides
    ],
)
def test_undecodable_traces_are_trace_errors_naming_the_line(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        read_trace(path)
    assert is_trace_file(path) == (name == "late.jsonl")  # the sniff reads the header line only


def test_a_cut_gzip_trace_names_where_reading_stopped(tmp_path: Path) -> None:
    whole = tmp_path / "t.jsonl.gz"
    with gzip.open(whole, "wt", encoding="utf-8") as out:
        write_trace(out, [TraceRecord(f"r{i}", 0.0, i + 1, 1) for i in range(5000)], TraceHeader())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[:4000])
    assert len(read_trace(whole)) == 5000
    with pytest.raises(TraceFormatError, match=r"cut\.jsonl\.gz:\d+: damaged or not a gzip file"):
        read_trace(cut)
