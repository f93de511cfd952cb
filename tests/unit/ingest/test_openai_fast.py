"""The column reader of OpenAI-style logs gives exactly what the line-by-line parser gives.

``read_openai_batches`` decodes the usual gateway line against a narrow schema and sends every
other line to ``parse_openai_line``; generated logs mixing every shape the parser knows (and
shapes it refuses) must come out the same, row for row and skip for skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomload.ingest import LogSource, SkipLog, openai_fast
from oomload.ingest.columns import batches_from_records
from oomload.ingest.openai_fast import read_openai_batches
from oomload.ingest.openai_log import read_openai_records

ABSENT = object()
small_text = st.text(alphabet='ab"\\é\n', max_size=6)
integer_like = st.one_of(
    st.integers(-5, 10**6),
    st.integers(2**62, 2**64 - 1),
    st.floats(0, 1e6, allow_nan=False),
    st.just(12.0),
    st.sampled_from(["17", "x", ""]),
    st.none(),
    st.booleans(),
)
count = st.one_of(st.integers(0, 10**6), st.just(-1), st.none(), st.just("12"), st.just(5.0))
time_value = st.one_of(
    st.floats(0, 2e9, allow_nan=False),
    st.integers(1_600_000_000, 1_800_000_000),
    st.integers(1_600_000_000_000, 1_800_000_000_000),
    st.integers(1_600_000_000_000_000, 1_800_000_000_000_000),
    st.integers(1_600_000_000_000_000_000, 1_800_000_000_000_000_000),
    st.just(-3.0),
    st.sampled_from(["2024-05-01T12:00:00.25Z", "2024-05-01 12:00:01", "soon"]),
    st.none(),
    st.booleans(),
)
key_value = st.one_of(small_text, st.integers(0, 9), st.none(), st.booleans())


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(ABSENT), strategy)


def _object(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({k: _maybe(v) for k, v in fields.items()}).map(
        lambda d: {k: v for k, v in d.items() if v is not ABSENT}
    )


usage = _object(
    prompt_tokens=count,
    completion_tokens=count,
    input_tokens=count,
    output_tokens=count,
    total_tokens=st.integers(0, 9),
)
body = _object(
    id=key_value,
    model=key_value,
    usage=st.one_of(usage, st.none()),
    created=time_value,
    error=st.one_of(st.none(), small_text, st.just({})),
    choices=st.just([{"message": {"content": "some text"}}]),
)
response = st.one_of(
    body,
    _object(status_code=st.one_of(st.integers(200, 503), st.none()), body=st.one_of(body, st.none())),
    st.just(
        [{"choices": [{"delta": {"content": "x"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}]
    ),
    st.none(),
    st.just("oops"),
)
request_body = _object(
    model=key_value,
    max_tokens=integer_like,
    max_completion_tokens=integer_like,
    max_output_tokens=integer_like,
    messages=st.just([{"role": "user", "content": 'hello "there"'}]),
    prompt=st.one_of(st.just([1, 2, 3]), st.just("text")),
)
request = st.one_of(request_body, _object(body=st.one_of(request_body, st.just("raw"))), st.none())
line = _object(
    request=request,
    response=response,
    usage=st.one_of(usage, st.none()),
    status_code=st.one_of(st.integers(100, 600), st.none(), st.just("200")),
    status=st.one_of(st.integers(200, 500), st.just("ok")),
    error=st.one_of(st.none(), small_text, st.just({"message": "bad"})),
    timestamp=time_value,
    created_at=time_value,
    time=time_value,
    custom_id=key_value,
    request_id=key_value,
    id=key_value,
    messages=st.just([{"role": "user", "content": "hi"}]),
    prompt=st.just([5, 6]),
    model=key_value,
    max_tokens=integer_like,
    chunks=st.one_of(st.none(), st.just([])),
)
plain_line = st.builds(
    lambda t, p, o, i, m, mt: {
        "timestamp": t,
        "request": {"model": m, "max_tokens": mt, "messages": [{"content": "x" * 50}]},
        "response": {"id": i, "choices": [], "usage": {"prompt_tokens": p, "completion_tokens": o}},
        "status_code": 200,
    },
    st.floats(1.6e9, 1.8e9),
    st.integers(0, 10**5),
    st.integers(0, 10**4),
    small_text,
    key_value,
    integer_like,
)
raw_line = st.one_of(
    line.map(orjson.dumps),
    plain_line.map(orjson.dumps),
    st.sampled_from([b"", b"   ", b"[1, 2]", b"{not json", b'"text"', b"{}\r"]),
)


def _read_both(path: Path) -> tuple[pa.Table | None, SkipLog, pa.Table | None, SkipLog]:
    source = LogSource(path)
    fast_skips, exact_skips = SkipLog(), SkipLog()
    fast = [b.replace_schema_metadata(None) for b in read_openai_batches(source, fast_skips, None)]
    exact = list(batches_from_records(read_openai_records(source, exact_skips, None)))
    return (
        pa.concat_tables(fast) if fast else None,
        fast_skips,
        pa.concat_tables(exact) if exact else None,
        exact_skips,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(raw_line, max_size=25), piece_bytes=st.sampled_from([64, 300, 256 * 1024]))
def test_column_reader_matches_line_parser(
    lines: list[bytes], piece_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_fast, "PIECE_BYTES", piece_bytes)
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    fast, fast_skips, exact, exact_skips = _read_both(path)
    assert (fast is None) == (exact is None)
    if fast is not None and exact is not None:
        assert fast.to_pylist() == exact.to_pylist()
    assert fast_skips.counts == exact_skips.counts
    assert fast_skips.examples == exact_skips.examples
    assert fast_skips.notes == exact_skips.notes


def test_usual_gateway_lines_take_the_column_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's shape decodes as ``_Plain`` lines: no line goes to the per-line parsers."""
    line = {
        "timestamp": 1717000000.5,
        "request": {"model": "m", "max_tokens": 64, "messages": [{"content": "t" * 900}]},
        "response": {
            "id": "c-1",
            "choices": [{"message": {"content": "u" * 300}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3},
        },
        "status_code": 200,
    }
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(line) for _ in range(50)) + b"\n")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a usual line went line by line")

    monkeypatch.setattr(openai_fast, "_line_rows", refuse)
    batches = list(read_openai_batches(LogSource(path), SkipLog(), None))
    assert sum(b.num_rows for b in batches) == 50
    assert batches[0].column("id")[0].as_py() == "c-1"


def test_text_that_is_not_utf8_does_not_cost_the_request(tmp_path: Path) -> None:
    """The text is never read, so a broken byte inside it leaves the request usable."""
    path = tmp_path / "log.jsonl"
    path.write_bytes(
        b'{"timestamp": 5, "request": {"messages": [{"content": "caf\xe9"}]}, '
        b'"response": {"usage": {"prompt_tokens": 4, "completion_tokens": 2}}}\n'
    )
    skips = SkipLog()
    batches = list(read_openai_batches(LogSource(path), skips, None))
    assert [b.num_rows for b in batches] == [1]
    assert skips.total == 0


def test_a_first_line_with_text_that_is_not_utf8_is_detected_as_the_reader_reads_it(tmp_path: Path) -> None:
    """Detection refused such a first line ("starts like JSON but does not parse", exit 2) although
    ``--format openai`` read it: it now parses the line as the reader does, the broken byte unread."""
    from oomload.ingest import build_trace, detect_format
    from oomload.trace.model import read_trace

    path = tmp_path / "log.jsonl"
    line = (
        b'{"timestamp": 1700000000, "request": {"messages": [{"content": "caf\xe9"}]}, '
        b'"response": {"usage": {"prompt_tokens": 4, "completion_tokens": 2}}}\n'
    )
    path.write_bytes(line + line.replace(b"1700000000", b"1700000001"))
    assert detect_format(LogSource(path)) == "openai"
    result = build_trace([path], tmp_path / "t.jsonl")
    assert result.records_written == 2 and result.skips.total == 0
    assert [r.prompt_tokens for r in read_trace(tmp_path / "t.jsonl")] == [4, 4]


def test_a_cut_first_line_is_passed_over_by_detection(tmp_path: Path) -> None:
    """A log that starts inside a line (rotated, or cut with ``tail -c``): the format is told from the
    first line that parses, and the cut line is skipped by the reader like any broken line."""
    from oomload.ingest import build_trace, detect_format

    path = tmp_path / "log.jsonl"
    path.write_bytes(
        b'{"usage": {"prompt_tok\n'
        b'{"timestamp": 5, "response": {"usage": {"prompt_tokens": 4, "completion_tokens": 2}}}\n'
    )
    assert detect_format(LogSource(path)) == "openai"
    result = build_trace([path], tmp_path / "t.jsonl")
    assert result.records_written == 1 and result.skips.examples == {"not a JSON object": [f"{path}:1"]}
