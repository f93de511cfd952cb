"""A report file that cannot be written stops the reports there with one sentence (exit 2): which file,
why, what is kept; the files before it are written, an older copy of it is kept, nothing half-written
is left; a tune's pages likewise."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from oomload.errors import ExitCode, OutputWriteError
from oomload.report import finalize_run
from oomload.report.tune import write_tune_reports
from oomload.tune.record import TuneRecord
from runbuilder import StepSpec, write_run


def _console() -> Console:
    return Console(file=io.StringIO(), width=100, color_system=None)


def _scratch(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_report_that_cannot_be_written_keeps_the_others_and_says_what_next(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [StepSpec(1), StepSpec(2)])
    assert finalize_run(run, console=_console()) is ExitCode.OK
    old_html = (run / "report.html").read_bytes()
    (run / "junit.xml").unlink()
    (run / "junit.xml").mkdir()  # a place the file cannot take: the rename fails as a full disk's would
    with pytest.raises(OutputWriteError) as caught:
        finalize_run(run, console=_console())
    assert str(caught.value) == (
        f"cannot write junit.xml in the run directory {run} (Is a directory); the run's measurements, "
        f"summary.json, report.md and report.html are kept as they were — move away the directory in "
        f"the file's place, then `oomload report {run}` writes the reports"
    )
    assert caught.value.exit_code is ExitCode.USAGE and caught.value.path == str(run / "junit.xml")
    assert json.loads((run / "summary.json").read_text())["verdict"]["steps"]
    assert (run / "report.html").read_bytes() == old_html  # rewritten whole: the same run, the same page
    assert _scratch(run) == []


def test_a_tune_page_that_cannot_be_written_names_it_and_keeps_tune_json(tmp_path: Path) -> None:
    record = TuneRecord(
        serve_line="oomload sim serve",
        kind="sim",
        model="tiny",
        target_concurrency=4,
        trace_path="t.jsonl",
        max_starts=2,
        max_duration_s=60.0,
        slo_ttft_p99_s=None,
        candidates=(),
        status="finished",
    )
    (tmp_path / "tune.json").write_text(json.dumps(record.to_json()))
    (tmp_path / "tune.html").mkdir()
    with pytest.raises(OutputWriteError) as caught:
        write_tune_reports(tmp_path, record, _console())
    assert str(caught.value) == (
        f"cannot write tune.html in the tune directory {tmp_path} (Is a directory); tune.json, tune.md "
        f"and the candidates' files are kept as they were — move away the directory in the file's place, "
        f"then `oomload report {tmp_path}` writes tune.md and tune.html"
    )
    assert (tmp_path / "tune.md").is_file() and _scratch(tmp_path) == []
