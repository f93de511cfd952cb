"""What a file's bytes may hold that its readers must not see (a UTF-8 byte-order mark), and what an
error about an unreadable file may show of it: its shape, never what its lines say."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from oomload.errors import TraceFormatError, names_shown
from oomload.ingest import build_trace, detect_format, iter_records, parse_mapping
from oomload.ingest.source import LogSource
from oomload.trace.model import TraceHeader, TraceRecord, read_trace, write_trace

BOM = b"\xef\xbb\xbf"
OPENAI = (
    b'{"timestamp": 1700000000, "response": {"usage": {"prompt_tokens": 5, "completion_tokens": 2}}}\n' * 3
)
AZURE = (
    b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
    b"2023-11-16 18:17:03.98,4808,10\n2023-11-16 18:17:04.03,3180,8\n"
)
MOONCAKE = (
    b'{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
    b'{"timestamp": 5, "input_length": 3, "output_length": 1}\n'
)
SECRET = "my SSN is 123-45-6789"


def _trace_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "made.jsonl"
    write_trace(path, [TraceRecord("a", 0.0, 10, 5), TraceRecord("b", 1.0, 7, 2)], TraceHeader(source=("x",)))
    return path.read_bytes()


@pytest.mark.parametrize("gzipped", [False, True])
@pytest.mark.parametrize(("fmt", "count"), [("openai", 3), ("azure", 2), ("mooncake", 2), ("oomload", 2)])
def test_a_byte_order_mark_is_skipped_by_every_reader(
    tmp_path: Path, fmt: str, count: int, gzipped: bool
) -> None:
    content = {"openai": OPENAI, "azure": AZURE, "mooncake": MOONCAKE}.get(fmt) or _trace_bytes(tmp_path)
    path = tmp_path / ("bom.jsonl.gz" if gzipped else "bom.log")
    path.write_bytes(gzip.compress(BOM + content) if gzipped else BOM + content)
    assert detect_format(LogSource(path)) == fmt
    assert len(list(iter_records([path]))) == count
    result = build_trace([path], tmp_path / "out.jsonl")
    assert result.records_written == count and result.skips.total == 0


def test_a_trace_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(BOM + _trace_bytes(tmp_path))
    assert [r.id for r in read_trace(path)] == ["a", "b"]


@pytest.mark.parametrize(
    "content",
    [
        f'2024-01-01T00:00:00,{{"content":"{SECRET}"}},7\n'.encode(),  # a CSV row, no header
        json.dumps({SECRET: 1, "when": 2}).encode() + b"\n",  # keys that are not names
    ],
)
def test_an_undetectable_file_is_described_by_its_shape_only(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as caught:
        detect_format(LogSource(path))
    assert "SSN" not in str(caught.value) and "2024" not in str(caught.value)
    assert "3 columns" in str(caught.value) or "2 keys" in str(caught.value)


def test_a_mapping_error_shows_no_row_of_a_headerless_file(tmp_path: Path) -> None:
    csv = tmp_path / "rows.csv"
    csv.write_text(f"1700000000,{SECRET},5,2\n")
    with pytest.raises(TraceFormatError, match=r"but the file has 4 columns$") as caught:
        list(iter_records([csv], mapping=parse_mapping("input=in,output=out")))
    assert "SSN" not in str(caught.value)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps({SECRET: 5, "out": 2}) + "\n")
    with pytest.raises(TraceFormatError, match=r"first record has 2 keys$"):
        list(iter_records([jsonl], mapping=parse_mapping("input=in,output=out")))


def test_a_bad_trace_value_is_named_by_its_type(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"oomload_trace": 1}\n'
        + json.dumps({"id": "a", "arrival_s": 0, "prompt_tokens": SECRET, "output_tokens": 1})
        + "\n"
    )
    with pytest.raises(TraceFormatError, match="prompt_tokens must be an integer, got a str") as caught:
        read_trace(path)
    assert "SSN" not in str(caught.value)


def test_names_are_shown_only_when_they_are_plain_names() -> None:
    assert names_shown(["TIMESTAMP", "ContextTokens"], "columns") == "columns TIMESTAMP, ContextTokens"
    assert names_shown(["a", "my SSN is 1"], "columns") == "2 columns"
    assert names_shown(["2024-01-01"], "columns") == "1 columns"
    many = [f"column_{i}" for i in range(10)]
    assert names_shown(many, "columns") == "10 columns: column_0, column_1, column_2, column_3, …"
