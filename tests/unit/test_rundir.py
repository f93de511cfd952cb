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
