"""No request is sent once the server has been declared dead — in any process.

With ``--processes 2`` the master declared a SIGKILLed server dead, but its stop message reached the
workers 0.07–0.16 s later: 6 requests were sent after the declaration in one drill. Now the master
first leaves a marker in the run directory, and every user takes its start time and then asks
``ReplayContext.may_send`` — so no request may start after the ``server_dead`` event's time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oomload.rundir import SERVER_DEAD_MARKER
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

pytestmark = pytest.mark.slow  # kill -9 drills with 1 and 2 load processes: `make test-slow`

SIM = ("--num-gpu-blocks", "400", "--block-size", "16", "--max-model-len", "2048", "--time-scale", "0.2")


def _lines(run_dir: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in run_dir.glob("requests*.jsonl"))


@pytest.mark.parametrize("processes", [1, 2])
def test_kill_9_no_request_starts_after_the_server_is_declared_dead(tmp_path: Path, processes: int) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 200, 200) for i in range(200)], TraceHeader(format="t"))
    run_dir = tmp_path / "run"
    server = SimServer(SIM).start()
    cmd = [
        sys.executable, "-m", "oomload", "replay", str(trace), "--url", server.url, "--concurrency", "8",
        "--hold-s", "60", "--stop-on", "never", "--run-dir", str(run_dir), "--no-live", "--gpu", "none",
        "--processes", str(processes), "--max-duration-s", "120",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(300):  # bounded: at most 60 s until four requests are on disk
            if _lines(run_dir) >= 4 or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGKILL)
        _out, err = proc.communicate(timeout=90)
    finally:
        server.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err  # no gate: 0
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    declared = next(e["t_unix_s"] for e in events if e["kind"] == "server_dead")
    requests = [json.loads(x) for f in run_dir.glob("requests*.jsonl") for x in f.read_text().splitlines()]
    after = [
        (r["outcome"], round(r["start_unix_s"] - declared, 3))
        for r in requests
        if r["start_unix_s"] > declared
    ]
    assert after == [], after
    assert (run_dir / SERVER_DEAD_MARKER).exists()
