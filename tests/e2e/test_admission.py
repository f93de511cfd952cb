"""Admission rejection on the real vLLM: with ``--max-num-queued-reqs``, every 503 — also the error event
that vLLM sometimes sends inside an HTTP 200 stream — is counted as a rejection, never as a success.

The server's own counters are the referee: ``vllm:admission_rejections_total`` must rise by exactly
the number of requests oomload recorded as ``admission_rejected``, and ``vllm:request_success_total``
by exactly the number it recorded as ``ok``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import FIGURES, Run, ServerPool, replay, write_trace_file
from probe import scrape

pytestmark = pytest.mark.e2e

REJECTED = "vllm:admission_rejections_total"
SUCCEEDED = "vllm:request_success_total"


def test_503s_in_status_and_in_stream_are_rejections(vllm_servers: ServerPool, tmp_path: Path) -> None:
    server = vllm_servers.get(max_num_seqs=2, max_num_queued_reqs=2)
    trace = write_trace_file(tmp_path / "t.jsonl", [(64, 64)] * 200)
    run_dir = tmp_path / "run"
    before = scrape(server.url)
    proc = replay(
        server.url,
        trace,
        run_dir,
        *("--concurrency", "12", "--hold-s", "5", "--warmup-s", "0", "--no-refine", "--stop-on", "never"),
    )
    after = scrape(server.url)
    assert "Traceback" not in proc.stderr, proc.stderr
    run = Run.read(run_dir)
    outcomes = [r["outcome"] for r in run.requests]
    rejected = [r for r in run.requests if r["outcome"] == "admission_rejected"]
    ok = [r for r in run.requests if r["outcome"] == "ok"]
    assert rejected, "a queue limit of 2 with 12 concurrent requests must reject"
    # a rejected user waits 1 s before it sends again (re-sending at once: 1,993 rejections in the 5 s
    # hold, and 14 answers where the engine gave 26 without the storm)
    assert len(rejected) <= 12 * (5 + 2), len(rejected)
    assert ok, "the two running and two queued requests must still succeed"
    assert len(rejected) + len(ok) == len(outcomes), sorted(set(outcomes))
    assert after[REJECTED] - before[REJECTED] == len(rejected)
    assert after[SUCCEEDED] - before[SUCCEEDED] == len(ok)
    assert {(r["usage_prompt_tokens"], r["usage_completion_tokens"]) for r in ok} == {(64, 64)}
    in_stream = [r for r in rejected if r.get("http_status") == 200]
    assert {r.get("http_status") for r in rejected} <= {200, 503}
    FIGURES.append(
        f"admission: {len(ok)} ok, {len(rejected)} rejected "
        f"({len(in_stream)} of them as an SSE error inside HTTP 200)"
    )
    assert run.summary is not None
    steps = run.summary["verdict"]["steps"]
    assert sum(s["outcomes"].get("admission_rejected", 0) for s in steps) == len(rejected)
