"""Starving oomload's load generator on purpose, with per-process settings only (no cgroup, no system
setting): CPU-bound neighbours pinned to the client's CPU, each ending on its own after ``max_s``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TWO_CPUS = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs to pin the client and the server apart",
)


def burn(cpu: int, max_s: float) -> subprocess.Popen[bytes]:
    """A CPU-bound process pinned to ``cpu`` for at most ``max_s`` (the caller kills it sooner)."""
    code = (
        f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nend = time.time() + {max_s}\n"
        "while time.time() < end:\n    pass\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])
