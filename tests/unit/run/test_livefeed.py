"""The web UI's live charts read the run directory as it grows: only complete lines, once each, and a
long run's preemptions are summed into buckets, never dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.outcome import Outcome, RequestResult
from oomload.run import livefeed
from oomload.run.livefeed import LiveFeed
from oomload.rundir.records import parse_step_lines


def _line(obj: dict[str, object]) -> str:
    return json.dumps(obj) + "\n"


def _result(request_id: str, outcome: str, ttft_ms: float) -> str:
    """A ``requests.jsonl`` line as the run writes it (``RequestResult.to_json``)."""
    result = RequestResult(request_id, 0, 2, 101.0, 102.0, Outcome(outcome), 10, 5, ttft_ms=ttft_ms)
    return _line(result.to_json())


def test_lines_are_read_once_and_a_torn_line_waits_for_its_end(tmp_path: Path) -> None:
    feed = LiveFeed(tmp_path)
    steps = tmp_path / "steps.jsonl"
    steps.write_text(
        _line({"event": "start", "step": 0, "concurrency": 2, "phase": "ramp", "t_unix_s": 100.0})
    )
    metric = {"t_unix_s": 101.0, "ok": True, "kv_cache_usage": 0.5, "preemptions_delta": 0}
    text = _line(metric)
    (tmp_path / "metrics.jsonl").write_text(text[:10])  # torn mid-write
    feed.poll()
    assert feed.metrics == []
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write(text[10:])
    feed.poll()
    feed.poll()
    assert len(feed.metrics) == 1
    with open(steps, "a") as fh:
        fh.write(_line({"event": "end", "step": 0, "t_unix_s": 104.0, "reason": "hold_done"}))
    (tmp_path / "requests.jsonl").write_text(
        _result("a", "ok", 10.0)
        + _result("b", "ok", 30.0)
        + _result("c", "server_error", 1.0)
        + _line({"step": 0, "outcome": "ok", "ttft_ms": 5.0})  # not a request result: skipped
    )
    feed.poll()
    tl = feed.timeline()
    assert tl["t0_unix_s"] == 100.0
    assert tl["steps"] == [{"index": 0, "concurrency": 2, "phase": "ramp", "start_s": 0.0, "end_s": 4.0}]
    assert tl["metrics"]["t_s"] == [1.0] and tl["metrics"]["kv_percent"] == [50.0]
    assert feed.ttft(0).to_json() == {
        "step": {"n": 2, "p50_ms": 10.0, "p99_ms": 30.0},
        "run": {"n": 2, "p50_ms": 10.0, "p99_ms": 30.0},
    }


def test_a_long_run_is_bucketed_without_losing_a_preemption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(livefeed, "MAX_POINTS", 10)
    lines = "".join(
        _line({"t_unix_s": 100.0 + i, "ok": True, "kv_cache_usage": i / 100, "preemptions_delta": 1})
        for i in range(95)
    )
    (tmp_path / "metrics.jsonl").write_text(lines)
    feed = LiveFeed(tmp_path)
    feed.poll()
    series = feed.timeline()["metrics"]
    assert len(series["t_s"]) <= 10
    assert sum(series["preemptions"]) == 95  # summed per bucket, none dropped
    assert max(series["kv_percent"]) == 94.0  # the peak survives


def test_the_live_steps_are_the_steps_the_verdict_reads(tmp_path: Path) -> None:
    """One reader of ``steps.jsonl``: the live feed pairs the lines as ``runview`` does, also when a
    step's end arrives in a later poll, a start is written twice or a line is not a step line."""
    lines = [
        {"event": "start", "step": 0, "concurrency": 2, "phase": "ramp", "t_unix_s": 100.0},
        {"event": "start", "step": 0, "concurrency": 9, "phase": "ramp", "t_unix_s": 100.5},  # first wins
        {"event": "start", "step": "1", "concurrency": 4, "t_unix_s": 101.0},  # no integer step
        {"event": "end", "step": 0, "t_unix_s": 104.0, "reason": "hold_done"},
        {"event": "start", "step": 1, "concurrency": 4, "phase": "refine", "t_unix_s": 105.0},
    ]
    feed = LiveFeed(tmp_path)
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(_line(obj) for obj in lines[:2]))
    feed.poll()
    with open(steps, "a") as fh:
        fh.write("".join(_line(obj) for obj in lines[2:]))
    feed.poll()
    assert feed.steps.boundaries() == parse_step_lines(lines)
    assert feed.timeline()["steps"] == [
        {"index": 0, "concurrency": 2, "phase": "ramp", "start_s": 0.0, "end_s": 4.0},
        {"index": 1, "concurrency": 4, "phase": "refine", "start_s": 5.0, "end_s": None},
    ]
