from __future__ import annotations

from pathlib import Path

from oomload.outcome import Outcome, RequestResult
from oomload.rundir import RunReader, RunWriter


def test_requests_from_every_worker_file_and_torn_lines_survive(tmp_path: Path) -> None:
    with RunWriter(tmp_path) as main, RunWriter(tmp_path, worker="w1") as worker:
        main.write_json("config.json", {"schema": 1})
        main.request(RequestResult("a", 0, 1, 2.0, 3.0, Outcome.OK, 10, 5, 10, 5, ttft_ms=1.0))
        worker.request(RequestResult("b", 0, 1, 1.0, 3.0, Outcome.CONTEXT_OVERFLOW, 9000, 5, http_status=400))
        main.event("server_dead", 4.0, step=0)
    with open(tmp_path / "requests.jsonl", "a") as fh:
        fh.write('{"request_id": "torn", "ste')  # a crash mid-write
    reader = RunReader(tmp_path)
    results = reader.requests()
    assert [r.request_id for r in results] == ["b", "a"]
    assert results[0].outcome is Outcome.CONTEXT_OVERFLOW
    assert [e["kind"] for e in reader.stream("events")] == ["server_dead"]
    assert reader.status() is None


def test_a_request_line_with_a_field_of_another_kind_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """A whole JSON line whose fields are of the wrong kind (a hand edit, another tool's file): before,
    it became a result and `oomload report` ended in an internal error (exit 70) — "'<' not supported
    between instances of 'float' and 'NoneType'" for an end time of null, "unsupported operand type(s)
    for +" for a length of "x". Now it is skipped, as a torn line is."""
    import json

    from oomload.cli import main as cli_main

    good = RequestResult("a", 0, 1, 2.0, 3.0, Outcome.OK, 10, 5, 10, 5, ttft_ms=1.0, e2e_ms=1000.0)
    with RunWriter(tmp_path) as writer:
        writer.write_json("config.json", {"schema": 1})
        writer.request(good)
    bad = {
        "end_unix_s": None,
        "prompt_tokens_asked": "x",
        "output_tokens_asked": None,
        "e2e_ms": "x",
        "ttft_ms": [],
        "usage_completion_tokens": "x",
        "request_id": [],
        "step": True,
    }
    with open(tmp_path / "requests.jsonl", "a") as fh:
        for key, value in bad.items():
            fh.write(json.dumps({**good.to_json(), "request_id": f"bad-{key}", key: value}) + "\n")
    assert [r.request_id for r in RunReader(tmp_path).requests()] == ["a"]
    assert cli_main(["report", str(tmp_path), "--format", "json"]) in (0, 3)
