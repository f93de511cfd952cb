"""The open-file limit: raised toward the hard one, a level it cannot carry refused in one sentence,
and the sentence for an ``EMFILE`` that still happens (``oomload.load.fdlimit``)."""

from __future__ import annotations

import resource
import subprocess
import sys

from oomload.load.fdlimit import RESERVE_FDS, OpenFiles, fds_needed, open_files_problem
from oomload.load.http import Ending, _Wire
from oomload.outfile import TOO_MANY_OPEN_FILES

RAISE = "from oomload.load.fdlimit import raise_open_files; print(raise_open_files().soft_limit)"


def _under(soft: int, hard: int, code: str) -> str:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit, check=True, timeout=60
    )
    return proc.stdout.strip()


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    assert _under(120, top, RAISE) == str(top)
    assert _under(top, top, RAISE) == str(top)  # never lowered, nothing to raise


def test_a_level_the_limit_cannot_carry_is_one_sentence() -> None:
    files = OpenFiles(soft_limit=120, open_now=20)
    assert fds_needed(150, 20) == 20 + RESERVE_FDS + 165
    problem = open_files_problem(files, 150, "concurrency 150")
    assert problem is not None and "\n" not in problem
    assert problem.startswith(
        "concurrency 150 needs about 249 open files in one process, but the limit is 120"
    )
    assert "ulimit -n" in problem
    assert open_files_problem(files, 30, "concurrency 30") is None  # 20 + 64 + 33 = 117 fit
    assert open_files_problem(OpenFiles(None, 20), 10**6, "x") is None  # unlimited


def test_a_connect_out_of_file_descriptors_says_so() -> None:
    for name in ("EMFILE", "ENFILE"):
        wire = _Wire(ending=Ending.CONNECT_FAILED, socket_error=name)
        assert wire.transport_error == f"connect failed ({name}): {TOO_MANY_OPEN_FILES}"
    assert _Wire(ending=Ending.CONNECT_FAILED, socket_error="EHOSTUNREACH").transport_error == (
        "connect failed (EHOSTUNREACH)"
    )
