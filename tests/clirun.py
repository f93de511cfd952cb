"""Running the ``oomload`` CLI from tests: as a user would (``oomload``, a subprocess of this
checkout's interpreter) or in this process with its output captured (``run``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from oomload.cli import main

HANG_S = 300.0  # a hang detector, not a timing assertion: a replay on the shared 2-core box takes minutes


def oomload(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout_s: float = HANG_S
) -> subprocess.CompletedProcess[str]:
    """``python -m oomload ARGS`` in ``cwd``, with ``env`` added to this environment; output as text."""
    return subprocess.run(
        [sys.executable, "-m", "oomload", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        check=False,
    )


def run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``oomload ARGV`` in this process: (exit code, stdout, stderr); never a traceback."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def default_sigint() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT: a job started with ``cmd &`` by a shell
    without job control inherits SIGINT *ignored*, and Python keeps it so; a terminal's program gets it
    at its default. The child starts with the terminal's disposition, whoever runs the tests."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
