"""A replay repeated against a long-lived server does not find the last run's prompts in its prefix
cache: each run's prompt tokens carry a salt of its own (``ReplayConfig.prompt_salt``), so the second
run of the same command measures what the first did — no "prefix mismatch", no gate left unevaluated.
(It did: the same ``--seed`` gave the same tokens, the simulator served run 2 from run 1's cache at 95 %
and every gate read NOT EVALUATED, exit 4.) Replays run in subprocesses (Locust patches with gevent)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(("--time-scale", "0.02", "--enable-prefix-caching")) as server:
        yield server


def _replay(sim: SimServer, trace: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        *(sys.executable, "-m", "oomload", "replay", str(trace), "--url", sim.url, "--no-live"),
        *("--concurrency", "1,2", "--hold-s", "1", "--no-refine", "--no-evidence", "--gpu", "none"),
        *("--no-html", "--gate", "no-preemption-below:2", "--run-dir", str(run_dir)),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=REPO)


def test_the_same_replay_twice_against_one_server_measures_the_same_thing(
    sim: SimServer, tmp_path: Path
) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 64, 8) for i in range(40)], TraceHeader(format="test"))
    salts, rates = [], []
    for n in (1, 2):
        run = tmp_path / f"run{n}"
        proc = _replay(sim, trace, run)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        salts.append(json.loads((run / "config.json").read_text())["prompt_salt"])
        prefix = json.loads((run / "summary.json").read_text())["verdict"]["prefix"]
        assert prefix["problem"] is None
        rates.append(prefix["server_hit_rate"])
    assert salts[0] != salts[1]
    assert rates[1] is not None and rates[1] < 0.1, rates  # run 2 is not served from run 1's cache
