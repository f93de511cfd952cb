"""The advice after a write that failed follows the errno (``oomload.outfile.remedy``), for every
caller: ``compare --out``, a run's reports, a tune's pages, the run directory mid-run. Only a full
disk is told to free the space."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from clirun import run
from oomload.errors import OutputWriteError
from oomload.outfile import remedy, write_failure
from oomload.report import report_write_error
from runbuilder import StepSpec, write_run


@pytest.mark.parametrize(
    ("code", "advice"),
    [
        (errno.ENOSPC, "free the space"),
        (errno.EDQUOT, "free the space (or raise the quota)"),
        (errno.EFBIG, "raise the file size limit (ulimit -f)"),
        (errno.EROFS, "write to a writable file system (this one is read-only)"),
        (errno.EACCES, "write where you have permission (or fix the permissions)"),
        (errno.EPERM, "write where you have permission (or fix the permissions)"),
        (errno.ENOENT, "name a directory that exists or can be created"),
        (errno.ENOTDIR, "name a directory (a part of that path is a file)"),
        (errno.EEXIST, "name a directory (that path is a file)"),
        (errno.EISDIR, "move away the directory in the file's place"),
        (errno.EMFILE, "raise the limit"),
        (errno.EIO, "check the disk (it failed or went away)"),
    ],
)
def test_the_advice_follows_the_errno(code: int, advice: str) -> None:
    err = OSError(code, "the OS's words")
    assert remedy(err) == advice
    assert write_failure("f", err).remedy == advice


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return write_run(tmp_path / "base", [StepSpec(1), StepSpec(2)]), write_run(
        tmp_path / "new", [StepSpec(1)]
    )


@pytest.mark.parametrize(
    ("out", "why", "advice"),
    [
        ("a-file", "File exists", "name a directory (that path is a file)"),
        ("a-file/sub", "Not a directory", "name a directory (a part of that path is a file)"),
    ],
)
def test_compare_out_that_is_no_directory_says_so_not_free_the_space(
    runs: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    out: str,
    why: str,
    advice: str,
) -> None:
    (tmp_path / "a-file").write_text("mine\n")
    base, new = runs
    code, _, err = run(["compare", str(base), str(new), "--out", str(tmp_path / out)], capsys)
    assert code == 2
    assert err == (
        f"oomload: error: cannot write compare.json in {tmp_path / out} ({why}); written before it: nothing; "
        f"the two run directories are untouched — {advice}, then run the compare again\n"
    )
    assert (tmp_path / "a-file").read_text() == "mine\n"


def test_a_report_on_a_read_only_disk_is_not_told_to_free_the_space(tmp_path: Path) -> None:
    failed = write_failure(tmp_path / "run" / "report.md", OSError(errno.EROFS, "Read-only file system"))
    sentence = str(report_write_error(tmp_path / "run", "report.md", failed, ["summary.json"]))
    assert "free the space" not in sentence
    assert (
        "(Read-only file system); the run's measurements and summary.json are kept as they were — write to a "
        in (sentence)
    )


def test_the_advice_travels_with_the_error() -> None:
    err = OutputWriteError("cannot write x", "x", "Permission denied", "write where you have permission")
    assert err.remedy == "write where you have permission"


def test_a_run_directory_that_turned_read_only_mid_run_is_not_told_to_free_the_space(tmp_path: Path) -> None:
    from oomload.rundir import RunWriter

    def open_file(path: Path) -> Any:
        raise OSError(errno.EROFS, "Read-only file system")

    writer = RunWriter(tmp_path / "run", open_file=open_file)
    writer.append("events", {"kind": "x"})
    writer.close()
    failure = writer.write_failure()
    assert failure is not None and failure.remedy == "write to a writable file system (this one is read-only)"
    assert "— write to a writable file system (this one is read-only), then `oomload report" in str(failure)
