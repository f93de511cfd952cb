"""A replay whose client is starved on purpose says so in its verdict; the same replay unstarved does not.

The replay runs as a subprocess pinned (``os.sched_setaffinity``) to one CPU; the simulated vLLM is
pinned to another, so the server keeps its CPU. Starving means, once the first step has begun:
CPU-bound neighbour processes pinned to the replay's CPU, and the replay's users' thread at nice 10
(both per-process settings; no cgroup, no system setting). The neighbours end with the last step (and
on their own after ``BURN_MAX_S`` whatever happens), so the verdict is written at full speed.
Assertions are on what the verdict says, never on timings. Loopback only; every load is bounded by
``--max-duration-s`` and the test's own deadline. The unstarved control is void on a host whose other
work took the client's CPU anyway (seen: a real vLLM run beside it, the client waiting 91 %): it then
checks only that no step below the thresholds was called starved, and is skipped with the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from burners import TWO_CPUS, burn
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace
from oomload.verdict.loadgen import LOOP_LAG_STARVED_MS, WAIT_SHARE_STARVED

REPO = Path(__file__).resolve().parents[2]
SIM = ("--num-gpu-blocks", "4000", "--block-size", "16", "--max-model-len", "2048", "--time-scale", "0.05")
LEVELS = "4,8"
NEIGHBOURS = 3
CLIENT_NICE = 10
BURN_MAX_S = 90
DEADLINE_S = 240.0  # a hang detector, not a timing assertion

pytestmark = [pytest.mark.slow, TWO_CPUS]


@pytest.fixture(scope="module")
def cpus() -> tuple[int, int]:
    mine = sorted(os.sched_getaffinity(0))
    return mine[0], mine[1]


@pytest.fixture(scope="module")
def sim(cpus: tuple[int, int]) -> Iterator[SimServer]:
    with SimServer(SIM) as server:
        assert server.pid is not None
        for tid in os.listdir(f"/proc/{server.pid}/task"):  # every thread of the server on its own CPU
            os.sched_setaffinity(int(tid), {cpus[1]})
        yield server


def _ended_steps(run_dir: Path) -> int:
    path = run_dir / "steps.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"event": "end"' in line)


def _replay(sim: SimServer, tmp_path: Path, cpu: int, *, starve: bool) -> tuple[str, dict[str, object]]:
    trace = tmp_path / "trace.jsonl"
    records = [TraceRecord(f"r{i}", i * 0.05, 200 + (i % 7) * 30, 40) for i in range(400)]
    write_trace(trace, records, TraceHeader(format="test"))
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "oomload", "replay", str(trace), "--url", sim.url, "--concurrency", LEVELS,
        "--hold-s", "4", "--stop-on", "never", "--no-refine", "--no-live", "--gpu", "none",
        "--max-duration-s", "60", "--run-dir", str(run_dir),
    ]  # fmt: skip
    env = {**os.environ, "OPENAI_API_KEY": "sk-oomload-test"}
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    neighbours: list[subprocess.Popen[bytes]] = []
    deadline = time.time() + DEADLINE_S
    try:
        if starve:
            while not (run_dir / "steps.jsonl").exists() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.1)
            os.setpriority(os.PRIO_PROCESS, proc.pid, CLIENT_NICE)  # the thread that runs the users
            neighbours = [burn(cpu, BURN_MAX_S) for _ in range(NEIGHBOURS)]
            while _ended_steps(run_dir) < len(LEVELS.split(",")) and proc.poll() is None:
                assert time.time() < deadline, "the starved replay did not end its steps"
                time.sleep(0.2)
            for n in neighbours:
                n.kill()
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
    finally:
        for n in neighbours:
            n.kill()
            n.wait()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    return out, summary


def test_a_starved_client_says_so_in_its_verdict(
    sim: SimServer, tmp_path: Path, cpus: tuple[int, int]
) -> None:
    out, summary = _replay(sim, tmp_path, cpus[0], starve=True)
    steps = summary["verdict"]["steps"]
    assert isinstance(steps, list)
    starved = [s for s in steps if s["starved"] is not None]
    assert starved, [(s["index"], s["concurrency_held"], s["loadgen"]) for s in steps]
    # below the line by the client's own figure (vLLM's queue may still count the level as held)
    assert all(s["delivered_concurrency"] < 0.8 * s["concurrency"] for s in starved), starved
    assert "the load generator was starved in step" in " ".join(out.split())
    notes = [n for n in summary["verdict"]["confidence"]["notes"] if n["kind"] == "loadgen_starved"]
    assert {n["step"] for n in notes} == {s["index"] for s in starved}


def test_the_same_client_unstarved_does_not(sim: SimServer, tmp_path: Path, cpus: tuple[int, int]) -> None:
    out, summary = _replay(sim, tmp_path, cpus[0], starve=False)
    steps = summary["verdict"]["steps"]
    assert isinstance(steps, list)
    assert all(len(s["loadgen"]) == 1 for s in steps)  # measured, in every step
    crossed = [s for s in steps if _crossed(s["loadgen"][0])]
    assert [s["starved"] for s in steps if s not in crossed] == [None] * (len(steps) - len(crossed))
    if crossed:  # another workload on this shared host took the client's CPU: the control is void
        figures = [(s["loadgen"][0]["cpu_wait_share"], s["loadgen"][0]["loop_lag_max_ms"]) for s in crossed]
        pytest.skip(f"the host itself starved the unstarved client (wait share, lag ms: {figures})")
    assert "load generator was starved" not in " ".join(out.split())


def _crossed(row: dict[str, float | None]) -> bool:
    """The process's figures crossed a starvation threshold (whether or not the step held)."""
    wait, lag = row["cpu_wait_share"], row["loop_lag_max_ms"]
    return (wait is not None and wait >= WAIT_SHARE_STARVED) or (
        lag is not None and lag >= LOOP_LAG_STARVED_MS
    )
