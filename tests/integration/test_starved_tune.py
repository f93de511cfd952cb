"""A tune whose load generator is starved on purpose stops and says the load host limits; it never names
a smaller setting for want of evidence (issue 32).

The same starving as ``test_starved_client.py``'s replay, for a whole tune: the tune (and so every
candidate's replay, its children) runs pinned to one CPU at ``nice 10``, with CPU-bound neighbours
pinned to that CPU from the start; the simulated vLLM it starts is moved to the other CPU by a
``taskset`` in front of ``--serve`` (a wrapper the serve line keeps), so the server keeps its CPU and
every missing request is the client's. One candidate only (``--max-num-seqs 8`` on one pool): the
simulator never preempts at the target, so its step proves something only if the client holds 8 of 8.
Starved, it held no level, was measured again, and the tune must stop with exit 4, no winner, "the load
host limits" and the figures of the wait. Assertions are on what the tune says, never on timings; the
load is bounded by the tune's own ``--max-duration-s`` and the test's deadline. Per-process settings
only (affinity, niceness): no cgroup, no system setting.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from burners import TWO_CPUS, burn
from oomload.errors import ExitCode
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]
NEIGHBOURS = 3
CLIENT_NICE = 10
BURN_MAX_S = 600
DEADLINE_S = 700.0  # a hang detector, not a timing assertion

pytestmark = [pytest.mark.slow, TWO_CPUS]


def _starve(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    os.nice(CLIENT_NICE)


def test_a_starved_load_host_stops_the_tune_instead_of_naming_a_smaller_setting(tmp_path: Path) -> None:
    client_cpu, server_cpu = sorted(os.sched_getaffinity(0))[:2]
    trace = tmp_path / "trace.jsonl"
    records = [TraceRecord(f"r{i}", i * 0.05, 200 + (i % 7) * 30, 40) for i in range(400)]
    write_trace(trace, records, TraceHeader(format="test"))
    serve = shlex.join(
        ["taskset", "-c", str(server_cpu), "oomload", "sim", "serve",
         "--block-size", "16", "--max-model-len", "2048", "--time-scale", "0.05"]
    )  # fmt: skip
    out = tmp_path / "tune"
    argv = [
        sys.executable, "-m", "oomload", "tune", str(trace), "--serve", serve, "--target-concurrency", "8",
        "--num-gpu-blocks", "4000", "--max-num-seqs", "8", "--hold-s", "4", "--max-starts", "2",
        "--startup-timeout-s", "60", "--replay-max-duration-s", "120", "--max-duration-s", "600",
        "--run-dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OPENAI_API_KEY": "sk-oomload-test"}
    neighbours = [burn(client_cpu, BURN_MAX_S) for _ in range(NEIGHBOURS)]
    try:
        proc = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False,
            preexec_fn=lambda: _starve(client_cpu),
        )  # fmt: skip
    finally:
        for n in neighbours:
            n.kill()
            n.wait()
    record = json.loads((out / "tune.json").read_text())
    table = [
        (c["settings"].get("max_num_seqs"), c["proof"] and c["proof"]["evidence"])
        for c in record["candidates"]
    ]
    assert proc.returncode == ExitCode.GATE_NOT_EVALUATED, (table, proc.stdout[-3000:], proc.stderr[-2000:])
    assert record["status"] == "no_evidence" and record["winner_index"] is None, table
    started = [c for c in record["candidates"] if c["started"]]
    assert [c["settings"]["max_num_seqs"] for c in started] == [8], table  # nothing smaller tried
    proof = started[0]["proof"]
    assert proof["no_evidence"] and proof["remeasured"] and proof["load_host_starved"], table
    note = record["notes"][-1]
    assert note.startswith("the load host limits: candidate") and "waited" in note, note
    assert "the load host limits" in " ".join(proc.stdout.split())
