"""What an OpenAI-style line gives, read by both readers (columns and the line parser): its time,
its status and its counts, where gateways and proxies put them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from oomload.ingest import LogSource, SkipLog, iter_records, openai_fast, openai_log, untimed
from oomload.ingest.columns import batches_from_records
from oomload.ingest.openai_fast import read_openai_batches
from oomload.ingest.openai_log import read_openai_records

USAGE = {"usage": {"prompt_tokens": 5, "completion_tokens": 2}}


def _both(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], SkipLog]:
    """The rows of the column reader and of the line parser (which must agree), and the skips."""
    source = LogSource(path)
    fast_skips, exact_skips = SkipLog(), SkipLog()
    fast = [b.replace_schema_metadata(None) for b in read_openai_batches(source, fast_skips, None)]
    exact = list(batches_from_records(read_openai_records(source, exact_skips, None)))
    rows = pa.concat_tables(fast).to_pylist() if fast else []
    exact_rows = pa.concat_tables(exact).to_pylist() if exact else []
    assert (fast_skips.counts, fast_skips.notes) == (exact_skips.counts, exact_skips.notes)
    return rows, exact_rows, fast_skips


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("piece_bytes", [64, 256 * 1024])
def test_requests_before_the_first_timed_one_take_its_time(
    tmp_path: Path, piece_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[untimed, untimed, 1700000000, untimed, 1700000002]: the trace spans 2 s, not 54 years."""
    monkeypatch.setattr(openai_fast, "PIECE_BYTES", piece_bytes)
    times: list[float | None] = [None, None, 1_700_000_000, None, 1_700_000_002]
    lines = [{"response": USAGE} if t is None else {"timestamp": t, "response": USAGE} for t in times]
    path = _write(tmp_path / "gw.jsonl", lines)
    fast, exact, skips = _both(path)
    assert [r["time_s"] for r in fast] == [1_700_000_000] * 4 + [1_700_000_002]
    assert fast == exact
    assert any("3 requests had no timestamp" in note for note in skips.notes)
    recs = list(iter_records([path]))
    assert [r.arrival_s for r in recs] == [0.0, 0.0, 0.0, 0.0, 2.0]


def test_a_log_without_any_time_arrives_at_0(tmp_path: Path) -> None:
    path = _write(tmp_path / "gw.jsonl", [{"response": USAGE}] * 3)
    fast, exact, _ = _both(path)
    assert [r["time_s"] for r in fast] == [0.0, 0.0, 0.0] and fast == exact


def test_past_the_hold_a_log_with_no_time_yet_keeps_0_and_is_not_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requests before the first timed one are held for its time only up to ``UNTIMED_HOLD_ROWS``
    (bounded memory on a log with no time at all): past it they keep 0, as a log without time does."""
    monkeypatch.setattr(LogSource.iter_views, "__defaults__", (64,))  # chunks of a line or two
    monkeypatch.setattr(untimed, "UNTIMED_HOLD_ROWS", 3)  # the column reader's hold
    monkeypatch.setattr(openai_log, "UNTIMED_HOLD_ROWS", 3)  # the record reader's
    lines = [{"response": USAGE}] * 5 + [{"timestamp": 1_700_000_000, "response": USAGE}]
    source = LogSource(_write(tmp_path / "gw.jsonl", lines))
    batches = read_openai_batches(source, SkipLog(), None)
    first = next(batches)  # yielded before the timed line is read: nothing held past the bound
    assert first.column("time_s").to_pylist()[0] == 0.0
    fast, exact, _ = _both(source.path)
    assert [r["time_s"] for r in fast] == [0.0] * 5 + [1_700_000_000] and fast == exact


def _litellm(request_id: str, status: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """LiteLLM's StandardLoggingPayload: ``status`` in words, the counts at the top level."""
    return {
        "id": request_id,
        "call_type": "acompletion",
        "startTime": 1_700_000_000.5,
        "status": status,
        "model": "m",
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "messages": [{"role": "user", "content": "my secret question"}],
        "response": {"choices": [{"message": {"content": "an answer"}}]} if status == "success" else None,
        "error_str": None if status == "success" else "RateLimitError",
    }


def test_a_status_in_words_and_top_level_counts_litellm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [
        _litellm("a", "success", 10, 4),
        _litellm("b", "failure", 12, 0),
        {**_litellm("c", "success", 7, 3), "status": "failed"},
        {**_litellm("d", "success", 8, 1), "status_code": "error"},
        {"id": "e", "timestamp": 1_700_000_001, "status": "Failure", "response": USAGE},
    ]
    path = _write(tmp_path / "litellm.jsonl", lines)
    fast, exact, skips = _both(path)
    assert [(r["id"], r["prompt_tokens"], r["output_tokens"], r["ok"]) for r in fast] == [
        ("a", 10, 4, True),
        ("b", 12, 0, False),
        ("c", 7, 3, False),
        ("d", 8, 1, False),
        ("e", 5, 2, False),
    ]
    assert fast == exact and skips.total == 0

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a LiteLLM line went to the exact path")

    monkeypatch.setattr(openai_fast, "_exact_row", refuse)  # the schema reads them: no line is parsed whole
    assert sum(b.num_rows for b in read_openai_batches(LogSource(path), SkipLog(), None)) == 5


def test_a_responses_api_created_at_and_an_epoch_written_as_a_string_are_times(tmp_path: Path) -> None:
    lines = [
        {"response": {"object": "response", "created_at": 1_700_000_000, **USAGE}},  # the Responses API
        {"timestamp": "1700000002", "response": USAGE},  # an epoch as a string
        {"timestamp": "1700000003500", "response": USAGE},  # … in ms
        {"timestamp": "20231114", "response": USAGE},  # a basic ISO-8601 date stays a date
    ]
    fast, exact, skips = _both(_write(tmp_path / "gw.jsonl", lines))
    assert [r["time_s"] for r in fast] == [1_700_000_000, 1_700_000_002, 1_700_000_003.5, 1_699_920_000]
    assert fast == exact and not any("no timestamp" in note for note in skips.notes)


def test_a_number_no_json_reader_holds_is_its_own_skip_reason(tmp_path: Path) -> None:
    """``"timestamp": 1e400`` was skipped as "not a JSON object": the line is an object whose number
    is past a float's range. Both readers now say so (and of ``NaN`` / ``Infinity``); a line that is
    not JSON at all keeps its reason."""
    good = json.dumps({"timestamp": 1_700_000_000, "response": USAGE})
    lines = [
        good,
        good.replace("1700000000", "1e400"),
        good.replace("1700000000", "NaN"),
        good.replace('"prompt_tokens": 5', '"prompt_tokens": -Infinity'),
        good.replace("5", "9" * 400),  # an integer of 400 digits: as a float, infinite
        good[:-1],  # cut
    ]
    path = tmp_path / "gw.jsonl"
    path.write_text("\n".join(lines) + "\n")
    fast, exact, skips = _both(path)
    assert len(fast) == 1 and fast == exact
    assert skips.counts == {"a number out of range or not JSON (1e400, NaN)": 4, "not a JSON object": 1}
    assert skips.examples["not a JSON object"] == [f"{path}:6"]


@pytest.mark.parametrize("piece_bytes", [64, 256 * 1024])
def test_a_time_that_cannot_be_read_is_counted_apart_from_a_missing_one(
    tmp_path: Path, piece_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``"timestamp": "2024-13-45T99:00:00Z"`` was counted in "had no timestamp" only: a bad time
    looked like a missing one. It is kept and given a time the same way, and has its own note."""
    monkeypatch.setattr(openai_fast, "PIECE_BYTES", piece_bytes)
    bad_iso = "2024-13-45T99:00:00Z"
    lines: list[dict[str, Any]] = [
        {"response": USAGE},  # missing
        {"timestamp": bad_iso, "response": USAGE},  # unreadable, before the first time
        {"timestamp": 1_700_000_000, "response": USAGE},
        {"timestamp": None, "created_at": "", "response": USAGE},  # missing: null and "" say nothing
        {"timestamp": bad_iso, "response": {**USAGE, "created": 1_700_000_003}},  # the response's time
        {"start_time": "yesterday", "response": USAGE},  # unreadable
        {"timestamp": True, "response": USAGE},  # unreadable (the exact path: the schema refuses a bool)
        {"timestamp": -5, "response": USAGE},  # a negative epoch: unreadable
        {"response": {**USAGE, "created": "soon"}},  # unreadable, in the response
        {"timestamp": 1_700_000_009, "response": USAGE},
    ]
    fast, exact, skips = _both(_write(tmp_path / "gw.jsonl", lines))
    assert fast == exact and skips.total == 0
    assert [r["time_s"] for r in fast] == [1_700_000_000] * 4 + [1_700_000_003] * 5 + [1_700_000_009]
    assert [note.split(": ", 1)[1].split(" (")[0] for note in skips.notes] == [
        "2 requests had no timestamp",
        "5 requests had a time that could not be read",
    ]
