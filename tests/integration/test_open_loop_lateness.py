"""An open-loop replay says when its requests left late, and why, on the simulated vLLM.

24 requests of 256 + 256 tokens arrive 0.1 s apart. Two users cannot keep up (each sends one request
at a time and a request takes seconds): nearly every request leaves seconds after its arrival time,
because no user was free — the verdict names the step and asks for a higher user cap. Thirty-two users
send each on time: no such finding. The whole trace is sent either way. The trace's clock starts when its
step does, so a slow ``/metrics`` (the step's first scrape) or a slow set-up makes no send late."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clirun import oomload
from onsetload import SIM, fixed_trace
from oomload.sim.process import SimServer
from stubserver import limiting_gateway

METRICS_DELAY_S = 1.5  # each /metrics scrape, the step's first included, answered this late


def _replay(tmp_path: Path, users: int, *server: str) -> tuple[dict[str, Any], str]:
    trace = fixed_trace(tmp_path / "t.jsonl", count=24)
    run = tmp_path / f"run{users}"
    proc = oomload(
        *("replay", str(trace), "--open-loop", "--concurrency", str(users), *server),
        *("--no-live", "--no-html", "--gpu", "none", "--run-dir", str(run)),
    )
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    end = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()][-1]
    return end, proc.stdout


def test_too_few_users_is_named_as_the_user_cap(tmp_path: Path) -> None:
    end, out = _replay(tmp_path, 2)
    (loadgen,) = end["loadgen"]
    assert loadgen["sends_timed"] == 24 and loadgen["sends_late"] >= 20
    assert loadgen["sends_late_busy"] >= loadgen["sends_late"] // 2
    assert "because every user was busy" in out and "higher user cap" in out


def test_enough_users_send_on_time_and_the_whole_trace(tmp_path: Path) -> None:
    end, out = _replay(tmp_path, 32)
    (loadgen,) = end["loadgen"]
    assert loadgen["sends_timed"] == 24 and loadgen["sends_late_busy"] == 0
    assert "after their arrival time" not in out and "starved" not in out


def test_a_slow_metrics_endpoint_makes_no_send_late(tmp_path: Path) -> None:
    """The step's first ``/metrics`` scrape took 1.5 s: when the clock started before it (1 s ahead, at
    set-up), the first requests of the trace left 0.5 s late and the verdict blamed the load host."""
    with SimServer(SIM.split()) as sim, limiting_gateway(sim.url, 64, metrics_delay_s=METRICS_DELAY_S) as url:
        end, out = _replay(tmp_path, 32, "--url", url)
    (loadgen,) = end["loadgen"]
    assert loadgen["sends_timed"] == 24 and loadgen["sends_late"] == 0, loadgen
    assert "after their arrival time" not in out
