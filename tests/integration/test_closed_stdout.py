"""A reader of standard output that goes away (``| head``) never stops or spoils a command.

The replay goes on to its end with its output discarded — its run directory complete, its exit code
its verdict's, as if nobody read it; a short report command exits 0 quietly; ``oomload sample``,
whose lines are only for that reader, ends there (exit 0). Each command runs as a subprocess whose
standard output is a pipe closed before it writes anything, so its first write breaks the pipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clirun import HANG_S
from oomload.rundir import RunReader
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]


def _closed_stdout(*args: str) -> tuple[int, str]:
    """``python -m oomload ARGS`` with standard output a pipe nobody reads: (exit code, stderr). The
    pipe is made here (``os.pipe``) and both ends closed in this process before the child can write;
    a subprocess pipe closed early trips gevent's own ``communicate`` (xdist workers are patched)."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "oomload", *args],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
    finally:
        os.close(write_end)
        os.close(read_end)  # the reader went away before the first line
    try:
        _, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    args = ("--num-gpu-blocks", "400", "--block-size", "16", "--max-model-len", "2048", "--time-scale", ".02")
    with SimServer(args) as server:
        yield server


def test_a_replay_whose_reader_went_away_runs_to_its_end(sim: SimServer, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 64, 16) for i in range(20)], TraceHeader(format="test"))
    run_dir = tmp_path / "run"
    code, err = _closed_stdout(
        "replay", str(trace), "--url", sim.url, "--run-dir", str(run_dir), "--concurrency", "1,2",
        "--hold-s", "1", "--no-live", "--gpu", "none", "--no-html",
    )  # fmt: skip
    assert code == 0, err  # no gate: 0, the verdict's code, as with a reader
    assert "Traceback" not in err and "error" not in err, err
    status = json.loads((run_dir / "status.json").read_text())
    assert status["finished"] is True and status["end_reason"] == "completed", status
    assert (run_dir / "summary.json").is_file() and (run_dir / "report.md").is_file()
    ok = [r for r in RunReader(run_dir).requests() if r.outcome.value == "ok"]
    assert len(ok) >= 2  # both levels sent requests after the pipe broke


def test_a_report_command_whose_reader_went_away_exits_0_quietly() -> None:
    code, err = _closed_stdout("trace", "stats", "traces/sample-chat.jsonl")
    assert (code, err) == (0, "")


def test_sample_ends_when_the_reader_of_its_lines_goes() -> None:
    # its lines are only for that reader: it stops at once (before: the same), never samples on unread
    pid = str(os.getpid())
    code, err = _closed_stdout("sample", "--no-gpu", "--server-pid", pid, "--server-interval-s", "0.1")
    assert code == 0, err
    assert "Traceback" not in err, err
