"""Ctrl-C or SIGTERM in the middle of a parallel ``trace build``: one line, exit 130, nothing left behind.

A terminal's Ctrl-C goes to the whole foreground process group — the build and its pool's workers —
and so does a CI runner's SIGTERM at a timeout. The test starts the build in a session of its own
and signals that group once the pool's scratch directory (hidden, beside the output) exists or holds
rows in flight, then checks: exit 130 with ``oomload: interrupted`` and no traceback, the older
trace at ``-o`` untouched, no scratch file or directory beside it or in ``TMPDIR``, and no process
of the group still alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from clirun import default_sigint

REPO = Path(__file__).resolve().parents[2]


def _gateway_log(path: Path, requests: int = 120_000) -> Path:
    """An OpenAI-style log of ~250 MB, no ids (every row's id is generated: the two-task render path)."""
    text = "lorem ipsum " * 170
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(requests):
            fh.write(
                f'{{"timestamp": {1_717_000_000 + i * 0.01:.2f}, "request": {{"model": "m", '
                f'"messages": [{{"role": "user", "content": "{text}"}}]}}, "response": {{"choices": '
                f'[{{"message": {{"content": "{text}"}}}}], "usage": {{"prompt_tokens": {100 + i % 900}, '
                f'"completion_tokens": {1 + i % 300}}}}}}}\n'
            )
    return path


@pytest.fixture(scope="module")
def gateway_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gateway_log(tmp_path_factory.mktemp("log") / "gateway.jsonl")


def _pool_started(out_dir: Path) -> bool:
    return any(out_dir.glob(".oomload-read-*"))


def _rows_in_flight(out_dir: Path) -> bool:
    """Rows stored by a worker, or rendered by a second task, are waiting in the scratch directory."""
    return any(out_dir.glob(".oomload-read-*/*"))


def _start_build(log: Path, out: Path, scratch_root: Path, output: int | None) -> subprocess.Popen[str]:
    """``trace build LOG -o OUT --workers 2`` in a session (a process group) of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "oomload", "trace", "build", str(log), "-o", str(out), "--workers", "2"],
        stdout=output,
        stderr=output,
        text=True,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(scratch_root)},
        start_new_session=True,
        preexec_fn=default_sigint,
    )


def _wait_for(proc: subprocess.Popen[str], ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not ready() and proc.poll() is None:
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.002)
    assert proc.poll() is None, f"the build ended before it could be stopped ({what})"


def _group_empties(pgid: int, what: str) -> None:
    """Every process of the group is gone within 10 s (the build's pool workers included)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("when", "sig"),
    [
        (_pool_started, signal.SIGINT),
        pytest.param(_rows_in_flight, signal.SIGINT, marks=pytest.mark.slow),
        # kill, a CI job's timeout: the same clean end as Ctrl-C
        pytest.param(_rows_in_flight, signal.SIGTERM, marks=pytest.mark.slow),
    ],
    ids=["ctrl-c-pool-started", "ctrl-c-rows-in-flight", "sigterm-rows-in-flight"],
)
def test_ctrl_c_mid_build_leaves_the_old_trace_and_no_scratch(
    tmp_path: Path, gateway_log: Path, when: Callable[[Path], bool], sig: signal.Signals
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "trace.jsonl"
    out.write_text("an older trace\n")
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    proc = _start_build(gateway_log, out, scratch_root, subprocess.PIPE)
    try:
        _wait_for(proc, lambda: when(out_dir), when.__name__)
        os.killpg(proc.pid, sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, (stdout, stderr)
    assert stderr.strip() == "oomload: interrupted", stderr
    assert out.read_text() == "an older trace\n"
    assert sorted(p.name for p in out_dir.iterdir()) == ["trace.jsonl"]
    assert list(scratch_root.iterdir()) == []  # nothing went to the temporary directory either
    _group_empties(proc.pid, "a worker of the interrupted build is still running")


@pytest.mark.slow
def test_workers_exit_when_the_build_is_killed(tmp_path: Path, gateway_log: Path) -> None:
    """SIGKILL (or the kernel's out-of-memory killer) to the build alone: nothing can clean up, but its
    pool's workers notice their main process is gone and exit instead of waiting forever."""
    proc = _start_build(gateway_log, tmp_path / "t.jsonl", tmp_path, subprocess.DEVNULL)
    try:
        _wait_for(proc, lambda: _rows_in_flight(tmp_path), "rows in flight")
        proc.kill()  # the build only: its workers get no signal
        proc.wait(timeout=30)
        _group_empties(proc.pid, "a worker outlived its killed build")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_ctrl_c_that_python_dropped_still_stops_the_build_before_its_trace_is_in_place(
    tmp_path: Path,
) -> None:
    """Python drops an exception raised inside a weakref callback ("Exception ignored in …"): a Ctrl-C
    landing there once let a build finish and replace the older trace (exit 0, seen under load). The
    handler latches the signal too, and the build checks the latch before it puts its trace in place."""
    from oomload.cli.trace import interrupts_latched
    from oomload.ingest import build_trace
    from oomload.ingest.writer import INTERRUPTED

    log = _gateway_log(tmp_path / "gateway.jsonl", requests=50)
    out = tmp_path / "trace.jsonl"
    out.write_text("an older trace\n")
    # Python's own handler, as under a terminal (a `cmd &` job of a shell without job control inherits
    # SIGINT ignored, and interrupts_latched rightly leaves an ignored signal alone)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupts_latched():
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # the latching one
            INTERRUPTED.set()  # what the handler does before raising: here the raise was "dropped"
            with pytest.raises(KeyboardInterrupt):
                build_trace([log], out, workers=1)
        assert out.read_text() == "an older trace\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["gateway.jsonl", "trace.jsonl"]
        assert not INTERRUPTED.is_set() and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
