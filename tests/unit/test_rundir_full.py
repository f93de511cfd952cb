"""A run directory whose disk fills up mid-run: the writer records the first failed write, tells the
session once, drops the rest without trying, and keeps every line written before (issue 24, #5)."""

from __future__ import annotations

import errno
import io
from pathlib import Path
from typing import IO

import pytest

from oomload.errors import ExitCode, RunDirWriteError
from oomload.rundir import RunReader, RunWriter

FREE_WRITES = 5


class FillingFile(io.StringIO):
    """A stream file that takes ``free`` writes (passed on to the real file), then raises ENOSPC."""

    attempts = 0

    def __init__(self, path: Path, free: int) -> None:
        super().__init__()
        self.real = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed with this file)
        self.free = free

    def write(self, text: str) -> int:
        FillingFile.attempts += 1
        if self.free <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.free -= 1
        return self.real.write(text)

    def flush(self) -> None:
        self.real.flush()

    def close(self) -> None:
        self.real.close()
        super().close()


def _writer(tmp_path: Path) -> tuple[RunWriter, list[str]]:
    FillingFile.attempts = 0

    def open_file(path: Path) -> IO[str]:
        return FillingFile(path, FREE_WRITES)

    writer = RunWriter(tmp_path / "run", open_file=open_file)
    calls: list[str] = []
    writer.on_write_error = lambda: calls.append("stop")
    return writer, calls


def test_a_full_disk_stops_writing_once_tells_the_session_once_and_keeps_what_was_written(
    tmp_path: Path,
) -> None:
    writer, calls = _writer(tmp_path)
    writer.write_json("config.json", {"schema": 1})
    for i in range(100):  # a busy run: many more lines than fit
        writer.append("requests", {"i": i})
    assert writer.write_error is not None and writer.write_error.errno == errno.ENOSPC
    assert calls == ["stop"]  # once, however many lines came after
    assert FillingFile.attempts == FREE_WRITES + 1  # nothing tried after the first failure
    assert [obj["i"] for obj in RunReader(writer.path).stream("requests")] == list(range(FREE_WRITES))
    writer.close()
    failure = writer.write_failure()
    assert isinstance(failure, RunDirWriteError) and failure.exit_code is ExitCode.USAGE
    assert str(failure) == (
        f"cannot write to the run directory {writer.path} (requests.jsonl: No space left on device); "
        f"the run stopped and kept what it wrote before that — free the space, then "
        f"`oomload report {writer.path}` judges it"
    )
    assert "\n" not in str(failure)


def test_a_whole_document_that_cannot_be_written_is_one_sentence_and_leaves_no_temp_file(
    tmp_path: Path,
) -> None:
    writer, calls = _writer(tmp_path)
    (writer.path / "status.json").mkdir()  # os.replace onto a directory fails like a full disk would
    with pytest.raises(RunDirWriteError, match=r"\(status\.json: Is a directory\)"):
        writer.write_status(finished=False, end_reason="error")
    assert calls == ["stop"]
    assert not (writer.path / "status.json.tmp").exists()
    writer.close()


def test_a_writer_that_never_fails_says_nothing(tmp_path: Path) -> None:
    with RunWriter(tmp_path / "run") as writer:
        writer.append("steps", {"event": "start"})
    assert writer.write_error is None and writer.write_failure() is None


def test_out_of_file_descriptors_says_raise_ulimit_not_free_the_space(tmp_path: Path) -> None:
    def open_file(path: Path) -> IO[str]:
        raise OSError(errno.EMFILE, "Too many open files")

    writer = RunWriter(tmp_path / "run", open_file=open_file)
    writer.append("events", {"kind": "x"})
    writer.close()
    failure = str(writer.write_failure())
    assert "(events.jsonl: too many open files (raise ulimit -n))" in failure, failure
    assert "raise the limit, then `oomload report" in failure and "free the space" not in failure
