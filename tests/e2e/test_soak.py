"""A 10-minute soak on the real vLLM at a safe level: no memory-trend alarm (issue 31, "Done when").

The server is the pool's default (12 blocks of 256 tokens); 128 + 128-token requests at concurrency 2
use 2 of its 12 blocks, so nothing preempts and nothing grows but what vLLM itself holds. Its host
memory is sampled from its process, found by the port of ``--url`` (loopback: ``--server-memory
auto``). A steady server must read "flat" or, when its noise is too large to say, "inconclusive" —
never "growing": a trend alarm on a steady server would make every soak worthless.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import FIGURES, ServerPool, replay, write_trace_file

from oomload.errors import ExitCode

pytestmark = pytest.mark.e2e

SOAK = "10m"
CONCURRENCY = 2


def test_a_steady_server_raises_no_trend_alarm(vllm_servers: ServerPool, tmp_path: Path) -> None:
    server = vllm_servers.get()
    trace = write_trace_file(tmp_path / "t.jsonl", [(128, 128)] * 200)
    run = tmp_path / "soak"
    result = replay(
        server.url, trace, run, "--soak", SOAK, "--concurrency", str(CONCURRENCY), "--no-live", "--no-html",
        timeout_s=1500.0,
    )  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-3000:]
    verdict = json.loads((run / "summary.json").read_text())["verdict"]
    assert verdict["onsets"]["engine_death"] is None
    memory = verdict["server_memory"]
    assert memory is not None and memory["samples"] >= 600, memory  # 0.5 s samples over 10 minutes
    (host,) = verdict["memory_trends"]  # --gpu none: the server's host memory only
    assert host["verdict"] in ("flat", "inconclusive"), host["sentence"]
    FIGURES.append(f"soak at concurrency {CONCURRENCY} for {SOAK}: {host['sentence']}")
