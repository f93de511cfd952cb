"""An internal error (a bug in oomload) never reads as success or as a gate result.

The runner and the CLI used to fall back when one of oomload's own modules failed to import: without
``oomload.report`` a run printed a step table and exited 0 — with ``--gate no-preemption-below:64``
and preemptions seen — and without ``oomload.verdict.gate`` the gate rules were silently dropped. Here the
module is made unimportable in a subprocess (``sys.modules[name] = None``): the run must exit 70
with one line on stderr, and the traceback must be saved (in the run directory once there is one).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomload.errors import ExitCode
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

SIM_PREEMPTING = ("--num-gpu-blocks", "40", "--block-size", "16", "--max-model-len", "600")
BROKEN = (
    "import sys; sys.modules[{module!r}] = None; from oomload.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer((*SIM_PREEMPTING, "--time-scale", "0.05")) as server:
        yield server


def _run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BROKEN.format(module=module), *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
    )  # fmt: skip


def test_a_run_whose_report_module_is_broken_exits_70_with_the_traceback_in_the_run_dir(
    sim: SimServer, tmp_path: Path
) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 200, 200) for i in range(40)], TraceHeader(format="test"))
    run_dir = tmp_path / "run"
    proc = _run(
        "oomload.report",
        *("replay", str(trace), "--url", sim.url, "--concurrency", "1,8", "--hold-s", "1", "--no-refine"),
        *("--gpu", "none", "--no-live", "--run-dir", str(run_dir), "--gate", "no-preemption-below:64"),
        cwd=tmp_path,
    )
    assert proc.returncode == ExitCode.INTERNAL == 70, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    crash = run_dir / "crash.txt"
    assert str(crash) in lines[0]
    assert "oomload.report" in crash.read_text() and "Traceback" in crash.read_text()
    assert (run_dir / "status.json").exists()  # what was measured is kept


def test_a_broken_gate_module_is_not_a_run_without_gates(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord("r0", 0.0, 10, 5)], TraceHeader(format="test"))
    proc = _run(
        "oomload.verdict.gate",
        *("replay", str(trace), "--url", "http://127.0.0.1:1", "--gate", "no-preemption-below:64"),
        cwd=tmp_path,
    )
    assert proc.returncode == 70, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error (ModuleNotFoundError)" in lines[0], proc.stderr
    saved = Path(lines[0].rsplit("traceback saved in ", 1)[1])
    try:
        assert "oomload.verdict.gate" in saved.read_text()
    finally:
        saved.unlink()
