"""Keep-alive race on the real vLLM: uvicorn closes idle connections after 5 s, and a pooled client
that reuses one loses requests that never reach the server. Bursts of 20 concurrent requests with
idle gaps of 6.5 s between them: every request must be recorded, ok, and counted by the server."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from harness import Run, ServerPool, replay, write_trace_file
from probe import scrape

pytestmark = pytest.mark.e2e

BURSTS = 3
PER_BURST = 20
GAP_S = 6.5


def test_no_request_is_lost_across_idle_gaps(vllm_servers: ServerPool, tmp_path: Path) -> None:
    server = vllm_servers.get()
    count = BURSTS * PER_BURST
    arrivals = [GAP_S * (i // PER_BURST) for i in range(count)]
    trace = write_trace_file(tmp_path / "t.jsonl", [(32, 16)] * count, arrivals)
    run_dir = tmp_path / "run"
    before = scrape(server.url)
    proc = replay(
        server.url,
        trace,
        run_dir,
        *("--open-loop", "--concurrency", str(PER_BURST), "--hold-s", "30", "--warmup-s", "0"),
        *("--no-refine", "--stop-on", "never"),
    )
    after = scrape(server.url)
    assert "Traceback" not in proc.stderr, proc.stderr
    run = Run.read(run_dir)
    assert len(run.requests) == count, proc.stdout
    assert {r["outcome"] for r in run.requests} == {"ok"}
    assert {(r["usage_prompt_tokens"], r["usage_completion_tokens"]) for r in run.requests} == {(32, 16)}
    starts = sorted(r["start_unix_s"] for r in run.requests)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert sum(g > 5.0 for g in gaps) == BURSTS - 1, "the replay must have left idle gaps > 5 s"
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == count
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == count * 32
