"""Files written whole (``oomload.outfile``), and the CLI's last word on a disk that refuses a write:
a file is the old one, the new one or absent, never truncated; a refusal is one sentence naming the
path and the OS's reason, exit 2; a bug stays exit 70 even when its traceback cannot be saved."""

from __future__ import annotations

import argparse
import errno
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from oomload.cli import run_command
from oomload.cli.crash import save_internal_error
from oomload.errors import ExitCode, OutputWriteError, RunDirWriteError
from oomload.outfile import is_disk_error, output_file, write_text
from oomload.rundir import RunWriter
from oomload.trace.model import TraceHeader, TraceRecord, read_trace, write_trace


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_file_is_replaced_whole_and_no_scratch_file_stays(tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    write_text(target, "old\n")
    write_text(target, "new\n" * 1000)
    assert target.read_text() == "new\n" * 1000
    assert _leftovers(tmp_path) == []


def test_a_write_that_fails_midway_keeps_the_old_file_and_says_which_and_why(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_text(target, '{"old": true}\n')
    with pytest.raises(OutputWriteError) as caught, output_file(target) as fh:
        fh.write('{"new": ')  # half a document, then the disk says no
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(caught.value) == f"cannot write {target} (No space left on device)"
    assert caught.value.path == str(target) and caught.value.reason == "No space left on device"
    assert caught.value.exit_code is ExitCode.USAGE
    assert target.read_text() == '{"old": true}\n'
    assert _leftovers(tmp_path) == []


def test_an_error_that_is_not_the_disk_also_leaves_nothing_half_written(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    with pytest.raises(ValueError, match="render"), output_file(target) as fh:
        fh.write("<html>")
        raise ValueError("render failed")
    assert not target.exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("vanished", "No such file or directory"),
        ("under-a-file", "Not a directory"),
        ("a-dir", "Is a directory"),
    ],
)
def test_a_vanished_or_impossible_place_is_one_sentence(tmp_path: Path, where: str, reason: str) -> None:
    if where == "vanished":
        target = tmp_path / "gone" / "tune.json"
    elif where == "under-a-file":
        (tmp_path / "f").write_text("x")
        target = tmp_path / "f" / "tune.json"
    else:
        target = tmp_path / "tune.json"
        target.mkdir()
    with pytest.raises(OutputWriteError, match=rf"^cannot write {target} \({reason}\)$"):
        write_text(target, "{}\n")
    assert _leftovers(tmp_path) == []


def test_the_run_writer_writes_whole_files_and_a_failed_one_stops_the_run(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run")
    stops: list[str] = []
    writer.on_write_error = lambda: stops.append("stop")
    records = [TraceRecord(f"r{i}", 0.0, 10, 5) for i in range(3)]
    writer.write_file("trace.jsonl", lambda fh: write_trace(fh, records, TraceHeader(format="test")))
    assert read_trace(writer.path / "trace.jsonl") == records

    def half_then_full(fh: Any) -> None:
        fh.write("{")
        raise OSError(errno.EFBIG, "File too large")

    with pytest.raises(RunDirWriteError, match=r"\(trace\.jsonl: File too large\); the run stopped"):
        writer.write_file("trace.jsonl", half_then_full)
    assert stops == ["stop"] and writer.write_error is not None
    assert read_trace(writer.path / "trace.jsonl") == records  # the complete one is kept
    assert _leftovers(writer.path) == []


def test_disk_errors_are_told_from_bugs() -> None:
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO):
        assert is_disk_error(OSError(code, "x"))
    assert not is_disk_error(OSError(errno.EBADF, "x"))
    assert not is_disk_error(BrokenPipeError(errno.EPIPE, "x"))
    assert not is_disk_error(ValueError("x"))


# -- the CLI ---------------------------------------------------------------------------------------


class FullStream(io.StringIO):
    """Standard output on a full disk: every flush fails with ENOSPC."""

    def isatty(self) -> bool:
        return False

    def flush(self) -> None:
        if self.getvalue():
            raise OSError(errno.ENOSPC, "No space left on device")


def _command(func: Any) -> argparse.Namespace:
    return argparse.Namespace(func=func, api_key_env="OOMLOAD_TEST_NO_SUCH_KEY")


def test_standard_output_on_a_full_disk_is_one_sentence_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    full = FullStream()
    monkeypatch.setattr("sys.stdout", full)

    def prints(args: argparse.Namespace) -> int:
        print("the table")
        return 0

    assert run_command(_command(prints)) == ExitCode.USAGE
    assert sys.stdout is full  # given back as it was
    err = capsys.readouterr().err
    assert err == "oomload: error: cannot write to standard output (No space left on device)\n"


def test_a_disk_error_that_names_no_file_is_exit_2_not_a_bug(capsys: pytest.CaptureFixture[str]) -> None:
    def fills(args: argparse.Namespace) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    assert run_command(_command(fills)) == ExitCode.USAGE
    assert capsys.readouterr().err == "oomload: error: cannot write an output (No space left on device)\n"

    def bug(args: argparse.Namespace) -> int:
        raise OSError(errno.EBADF, "Bad file descriptor")

    assert run_command(_command(bug)) == ExitCode.INTERNAL
    line = capsys.readouterr().err
    assert "internal error (OSError), a bug in oomload; traceback saved in " in line
    Path(line.rsplit("traceback saved in ", 1)[1].strip()).unlink()


def test_a_crash_file_that_cannot_be_written_falls_back_then_says_why_none_was_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "crash.txt").mkdir(parents=True)  # crash.txt cannot be a file here
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    try:
        raise RuntimeError("a bug")
    except RuntimeError as bug:
        saved = save_internal_error(bug, run_dir)
    assert saved.exit_code is ExitCode.INTERNAL and saved.report_path is not None
    assert saved.report_path.parent == temp and "RuntimeError: a bug" in saved.report_path.read_text()
    assert saved.report_path.stat().st_mode & 0o077 == 0  # the temporary folder's copy: owner only
    assert list((run_dir / "crash.txt").iterdir()) == [] and _leftovers(run_dir) == []

    (tmp_path / "f").write_text("x")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "f" / "tmp"))  # under a regular file
    try:
        raise RuntimeError("another bug")
    except RuntimeError as bug:
        unsaved = save_internal_error(bug, run_dir)
    assert unsaved.report_path is None
    message = str(unsaved)
    assert message.startswith(
        f"internal error (RuntimeError), a bug in oomload; no traceback saved: cannot write "
        f"{run_dir / 'crash.txt'} (Is a directory) nor {tmp_path / 'f' / 'tmp'}/oomload-crash-"
    )
    assert message.endswith(".txt (Not a directory)") and "\n" not in message
