"""``GuardedStdout`` (``oomload.cli``): a reader that went away is no failure, a full disk is one.

The stream under it is a fake whose writes fail as the OS's would; rich's ``Console`` writes through
``sys.stdout`` as the commands' consoles do (made without a file)."""

from __future__ import annotations

import errno
import io
import sys

import pytest
from rich.console import Console

from oomload.cli import GuardedStdout
from oomload.errors import OutputWriteError


class _Pipe(io.StringIO):
    """A standard output whose reader went away (``| head``) after ``keep`` writes, or a full disk."""

    def __init__(self, failure: OSError, keep: int = 0) -> None:
        super().__init__()
        self.failure = failure
        self.keep = keep

    def write(self, text: str) -> int:
        if self.keep <= 0:
            raise self.failure
        self.keep -= 1
        return super().write(text)

    def flush(self) -> None:
        if self.keep <= 0:
            raise self.failure

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no descriptor in a test")


def test_a_broken_pipe_is_discarded_and_the_command_goes_on() -> None:
    inner = _Pipe(BrokenPipeError(errno.EPIPE, "Broken pipe"), keep=1)
    out = GuardedStdout(inner)
    assert out.write("first\n") == len("first\n")
    assert out.write("second\n") == len("second\n")  # no BrokenPipeError: the reader went away
    out.flush()
    assert out.write("third\n") == len("third\n")  # and whatever comes later is discarded too
    assert inner.getvalue() == "first\n"


def test_rich_on_a_broken_pipe_does_not_end_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # rich's own answer to a broken pipe is SystemExit(1): a replay's status "error", no summary.json
    monkeypatch.setattr(sys, "stdout", GuardedStdout(_Pipe(BrokenPipeError(errno.EPIPE, "Broken pipe"))))
    console = Console(stderr=False)
    console.print("run directory runs/x · model m")
    console.print("step 1 · concurrency 1")  # still no SystemExit


def test_a_command_whose_lines_are_for_the_reader_stops_with_it() -> None:
    out = GuardedStdout(_Pipe(BrokenPipeError(errno.EPIPE, "Broken pipe")), stop_when_reader_goes=True)
    with pytest.raises(BrokenPipeError):
        out.write("line\n")


def test_a_full_disk_is_still_one_sentence() -> None:
    out = GuardedStdout(_Pipe(OSError(errno.ENOSPC, "No space left on device")))
    full = r"^cannot write to standard output \(No space left on device\)$"
    with pytest.raises(OutputWriteError, match=full):
        out.write("x\n")
