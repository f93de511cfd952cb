"""The build's progress bar: on a terminal after ~2 s only; nothing more on stdout or stderr otherwise."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from oomload.cli import main
from oomload.cli.trace import ReadProgress


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_the_bar_appears_only_after_the_delay_and_shows_bytes_and_requests() -> None:
    clock = FakeClock()
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    with ReadProgress(10_000_000, "building", clock=clock, console=console) as progress:
        progress(1_000_000, 5_000)
        clock.now_s += 1.9
        progress(1_000_000, 5_000)
        assert not progress.shown  # a build of under 2 s shows nothing
        clock.now_s += 0.2
        progress(1_000_000, 5_000)
        assert progress.shown
        assert (progress.done_bytes, progress.requests) == (3_000_000, 15_000)
        progress._bar.refresh()  # type: ignore[union-attr]
    text = screen.getvalue()
    assert "building" in text and "15,000 requests" in text and "MB" in text


def test_no_terminal_no_bar() -> None:
    clock = FakeClock()
    with ReadProgress(10, "building", clock=clock, enabled=False) as progress:
        clock.now_s += 60
        progress(5, 1)
        assert not progress.shown


def test_build_output_off_a_terminal_is_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under pytest stderr is not a terminal: the build prints its usual lines and nothing else."""
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            json.dumps({"timestamp": i, "input_length": 10 + i, "output_length": 3}) + "\n" for i in range(5)
        )
    )
    out = tmp_path / "trace.jsonl"
    assert main(["trace", "build", str(log), "-o", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout == f"wrote 5 requests to {out} (format mooncake)\nskipped 0 lines\n"
    assert stderr == ""
