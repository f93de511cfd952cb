"""Every write path fails closed (issue 34, item 3): a disk that fills up after the run itself fit — the
reports, ``oomload report``, a tune's records and pages, a tune candidate's replay, the crash file, a
remote worker's own ``--results``, ``oomload trace`` outputs — is one sentence naming the file and the
OS's reason, exit 2 (70 stays a bug's code, also when its traceback cannot be saved); what was written
before stays readable and no half-written file is left for a later ``oomload report`` to trip on.

Before: the reports of a run on a 200 KB tmpfs ended in ``internal error (OSError), a bug in oomload``,
exit 70, with a truncated ``report.html.tmp`` left behind; a worker whose ``--results`` filled up went
on loading the server.

The full disk is ``RLIMIT_FSIZE`` in the child process, as in ``test_disk_full.py`` (writes past it fail
with ``EFBIG`` as a full disk's fail with ``ENOSPC``; no root, no mount). It holds for every file of
that process, so each limit sits between the sizes of what must fit and of what must not (measured:
``report.html`` ≈ 350 KB against ``requests.jsonl`` ≈ 40 KB; ``tune.html`` ≈ 29 KB against ``tune.md``
≈ 1.2 KB). Standard output on a full disk is ``/dev/full``.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from onsetload import SIM, fixed_trace, free_port
from oomload.errors import ExitCode
from oomload.rundir import RunReader
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

pytestmark = pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="no RLIMIT_FSIZE here")

REPO = Path(__file__).resolve().parents[2]
FIXED = REPO / "traces" / "sample-fixed.jsonl"  # 64 requests of 256 + 256 tokens, 4.9 KB
HANG_S = 180.0  # a hang detector, not a timing assertion
SIM_ARGS = ("--model", "tiny", "--num-gpu-blocks", "128", "--block-size", "32", "--max-model-len", "2048")
REPORT_LIMIT = 150_000  # the run's files fit (requests.jsonl ≈ 40 KB); report.html (≈ 350 KB) does not
TUNE_SIM = "oomload sim serve --model llama-3.1-8b --gpu l4 --max-model-len 2048 --time-scale 0.05"
FILE_TOO_LARGE = "File too large"
RAISE_FSIZE = "raise the file size limit (ulimit -f)"  # EFBIG's advice (oomload.outfile.remedy)
DEV_FULL = Path("/dev/full")


def limited(limit_bytes: int) -> Callable[[], None]:
    """A ``preexec_fn``: no file of the child grows past ``limit_bytes`` (EFBIG, not SIGXFSZ)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def oomload(
    *args: str,
    limit_bytes: int | None = None,
    stdout: Any = subprocess.PIPE,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomload", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=HANG_S,
        preexec_fn=None if limit_bytes is None else limited(limit_bytes),
        env={**os.environ, **(env or {})},
        cwd=REPO,
        check=False,
    )


def one_sentence(proc: subprocess.CompletedProcess[str], code: int = ExitCode.USAGE) -> str:
    """The one ``oomload: error:`` line of a run that exited ``code``, without its prefix."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr + (proc.stdout or "")
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oomload: error: "), lines
    return lines[0].removeprefix("oomload: error: ")


def scratch_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.name.endswith(".tmp")]


# -- a run that fit, reports that do not ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(SIM_ARGS) as server:
        yield server


@pytest.fixture(scope="module")
def full_run(sim: SimServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """A two-step replay whose reports do not fit: (run directory, its sentence, the requests kept)."""
    base = tmp_path_factory.mktemp("full-run")
    trace = base / "t.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 32, 8) for i in range(60)], TraceHeader(format="test"))
    run_dir = base / "run"
    proc = oomload(
        *("replay", str(trace), "--url", sim.url, "--run-dir", str(run_dir), "--gpu", "none", "--no-live"),
        *("--concurrency", "1,2", "--hold-s", "1", "--warmup-s", "0", "--no-refine", "--no-evidence"),
        limit_bytes=REPORT_LIMIT,
    )
    return run_dir, one_sentence(proc), len(RunReader(run_dir).requests())


def test_reports_that_do_not_fit_after_a_run_that_did_are_one_sentence_and_keep_the_run(
    full_run: tuple[Path, str, int],
) -> None:
    run_dir, sentence, kept = full_run
    assert sentence == (
        f"cannot write report.html in the run directory {run_dir} ({FILE_TOO_LARGE}); the run's "
        f"measurements, summary.json and report.md are kept as they were — {RAISE_FSIZE}, then "
        f"`oomload report {run_dir}` writes the reports"
    )
    assert kept >= 20  # two steps of requests, every line readable
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [s["concurrency"] for s in summary["verdict"]["steps"]] == [1, 2]
    assert (run_dir / "report.md").read_text().startswith("#")
    assert json.loads((run_dir / "status.json").read_text())["finished"] is True
    assert not (run_dir / "report.html").exists() and not (run_dir / "junit.xml").exists()
    assert not (run_dir / "crash.txt").exists() and scratch_files(run_dir) == []


def test_oomload_report_on_a_full_disk_is_one_sentence_and_keeps_the_older_reports(
    full_run: tuple[Path, str, int], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(full_run[0], run_dir)
    again = oomload("report", str(run_dir), limit_bytes=REPORT_LIMIT)
    assert one_sentence(again) == (
        f"cannot write report.html in the run directory {run_dir} ({FILE_TOO_LARGE}); the run's "
        f"measurements, summary.json and report.md are kept as they were — {RAISE_FSIZE}, then "
        f"`oomload report {run_dir}` writes the reports"
    )
    # space again: the sentence's advice works, and nothing the failed writes left trips it
    freed = oomload("report", str(run_dir))
    assert freed.returncode == ExitCode.OK, freed.stderr[-2000:]
    html = (run_dir / "report.html").read_bytes()
    assert len(html) > REPORT_LIMIT and (run_dir / "junit.xml").is_file()
    assert len(RunReader(run_dir).requests()) == full_run[2]
    # full once more: the complete report.html of before is kept, not cut off at the limit
    assert one_sentence(oomload("report", str(run_dir), limit_bytes=REPORT_LIMIT)).startswith(
        "cannot write report.html"
    )
    assert (run_dir / "report.html").read_bytes() == html and scratch_files(run_dir) == []
    # what fits is written: the small formats alone
    small = oomload("report", str(run_dir), "--format", "json,md,junit", limit_bytes=REPORT_LIMIT)
    assert small.returncode == ExitCode.OK and "wrote summary.json, report.md, junit.xml" in small.stdout


@pytest.mark.skipif(not DEV_FULL.exists(), reason="needs /dev/full (a device whose writes fail: disk full)")
def test_standard_output_on_a_full_disk_is_one_sentence_after_the_files(
    full_run: tuple[Path, str, int], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(full_run[0], run_dir)
    with open(DEV_FULL, "w") as full:
        terminal = oomload("report", str(run_dir), "--format", "terminal", stdout=full)
        everything = oomload("report", str(run_dir), stdout=full)
        as_json = oomload("report", str(run_dir), "--json", stdout=full)
        stats = oomload("trace", "stats", str(FIXED), stdout=full)
    why = "cannot write to standard output (No space left on device)"
    assert one_sentence(terminal) == why
    assert one_sentence(everything) == (
        f"{why}; summary.json, report.md, report.html and junit.xml are written in {run_dir}"
    )
    assert one_sentence(as_json) == why and one_sentence(stats) == why
    assert json.loads((run_dir / "summary.json").read_text())["verdict"]


# -- the crash file ------------------------------------------------------------------------------------

BROKEN = (
    "import sys; sys.modules['oomload.report'] = None; from oomload.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


def test_a_bug_whose_traceback_cannot_be_saved_is_still_one_line_and_exit_70(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", BROKEN, "report", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=HANG_S, check=False, preexec_fn=limited(64),
        env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    sentence = one_sentence(proc, ExitCode.INTERNAL)
    assert re.fullmatch(
        rf"internal error \(ModuleNotFoundError\), a bug in oomload; no traceback saved: cannot write "
        rf"{re.escape(str(temp))}/oomload-crash-[0-9a-f]{{8}}\.txt \({FILE_TOO_LARGE}\)",
        sentence,
    ), sentence
    assert list(temp.iterdir()) == []  # no truncated crash file left


# -- a tune ----------------------------------------------------------------------------------------------


def _served(name: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "sim serve" in line and name in line]


def _tune(out: Path, serve: str, *flags: str, limit_bytes: int) -> subprocess.CompletedProcess[str]:
    return oomload(
        "tune", str(FIXED), "--serve", serve, "--target-concurrency", "8", "--run-dir", str(out), *flags,
        limit_bytes=limit_bytes,
    )  # fmt: skip


def test_tune_pages_that_do_not_fit_are_one_sentence_and_tune_json_stays_readable(tmp_path: Path) -> None:
    name = f"tune-pages-{uuid.uuid4().hex[:12]}"
    out = tmp_path / "t"
    serve = f"{TUNE_SIM} --other-process-gib 20 --served-model-name {name}"  # nothing starts: one cheap start
    proc = _tune(out, serve, "--utilization", "0.9", limit_bytes=10_000)
    assert one_sentence(proc) == (
        f"cannot write tune.html in the tune directory {out} ({FILE_TOO_LARGE}); tune.json, tune.md and "
        f"the candidates' files are kept as they were — {RAISE_FSIZE}, then `oomload report {out}` "
        f"writes tune.md and tune.html"
    )
    record = json.loads((out / "tune.json").read_text())
    assert record["status"] == "finished" and [c["started"] for c in record["candidates"]] == [False]
    assert (out / "tune.md").is_file() and not (out / "tune.html").exists() and scratch_files(out) == []
    assert _served(name) == []
    freed = oomload("report", str(out))
    assert freed.returncode == 1 and (out / "tune.html").stat().st_size > 10_000  # no winner: exit 1


def test_a_tune_json_that_does_not_fit_stops_the_tune_before_any_server_starts(tmp_path: Path) -> None:
    out = tmp_path / "t"
    proc = _tune(out, TUNE_SIM, "--utilization", "0.9", limit_bytes=300)
    assert one_sentence(proc) == (
        f"cannot write tune.json in the tune directory {out} ({FILE_TOO_LARGE}); the tune stopped with no "
        f"server left running, and what it wrote before is kept as it was"
    )
    assert sorted(p.name for p in out.iterdir()) == []  # no candidate, no half-written tune.json


def test_a_candidate_replay_that_cannot_write_stops_the_tune_instead_of_judging_the_candidate(
    tmp_path: Path,
) -> None:
    name = f"tune-replay-{uuid.uuid4().hex[:12]}"
    out = tmp_path / "t"
    serve = f"{TUNE_SIM} --served-model-name {name}"
    flags = ("--utilization", "0.8", "--max-num-seqs", "8", "--hold-s", "1", "--max-requests", "32")
    proc = _tune(out, serve, *flags, limit_bytes=6_000)  # the trace copy (4.9 KB) fits, requests do not
    run_dir = out / "candidates" / "01" / "run"
    sentence = one_sentence(proc)
    assert re.fullmatch(
        rf"the replay in {re.escape(str(run_dir.parent))} stopped with exit 2: cannot write to the run "
        rf"directory {re.escape(str(run_dir))} \([a-z_.]+\.jsonl: {FILE_TOO_LARGE}\); the run stopped and "
        rf"kept what it wrote before that — {re.escape(RAISE_FSIZE)}, then "
        rf"`oomload report {re.escape(str(run_dir))}` judges it — the tune stopped with no server left "
        rf"running",
        sentence,
    ), sentence
    record = json.loads((out / "tune.json").read_text())
    assert record["status"] == "stopped" and record["candidates"] == []  # no verdict on what was not measured
    assert record["notes"][-1] == f"stopped: {sentence}"
    assert RunReader(run_dir).requests()  # what the replay wrote is readable
    assert _served(name) == []


# -- trace outputs (they were fail-closed already: kept so) ------------------------------------------


def test_trace_outputs_that_do_not_fit_leave_the_older_file_and_no_partial_one(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    assert oomload("trace", "synth", "--count", "10", "-o", str(out)).returncode == 0
    older = out.read_bytes()
    synth = oomload("trace", "synth", "--count", "2000", "-o", str(out), limit_bytes=10_000)
    assert one_sentence(synth) == f"cannot write to {out}: {FILE_TOO_LARGE}"
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(f'{{"timestamp": {i * 1000}, "input_length": 700, "output_length": 3}}\n' for i in range(400))
    )
    build = oomload("trace", "build", str(log), "-o", str(out), limit_bytes=1_000)  # reads are not limited
    assert one_sentence(build) == f"cannot write to {out}: {FILE_TOO_LARGE}"
    assert out.read_bytes() == older
    plot = tmp_path / "lengths.png"
    stats = oomload("trace", "stats", str(FIXED), "--plot", str(plot), limit_bytes=2_000)
    assert one_sentence(stats) == f"cannot write the plot to {plot} ({FILE_TOO_LARGE})"
    assert not plot.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "out.jsonl"]  # no scratch file


# -- a remote worker's own --results ---------------------------------------------------------------------

TOKEN = "oomload-test-worker-token-disk-full-abcdefghijklmnopqrstuvwxyz"


@pytest.mark.slow  # master, worker and simulator as separate processes: `make test-slow`
def test_a_worker_whose_results_file_fills_up_leaves_its_master_and_exits_2(tmp_path: Path) -> None:
    trace = fixed_trace(tmp_path / "t.jsonl")
    results = tmp_path / "w0.jsonl"
    port = free_port()
    env = {**os.environ, "OOMLOAD_WORKER_TOKEN": TOKEN}
    run_dir = tmp_path / "run"
    with SimServer(SIM.split()) as sim:
        worker = subprocess.Popen(
            [sys.executable, "-m", "oomload", "worker", "--master", f"127.0.0.1:{port}", "--url", sim.url,
             "--connect-timeout-s", "60", "--results", str(results)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
            preexec_fn=limited(3_000),  # about ten rows
        )  # fmt: skip
        try:
            master = subprocess.run(
                [sys.executable, "-m", "oomload", "replay", str(trace), "--url", sim.url, "--workers", "1",
                 "--master-bind-port", str(port), "--concurrency", "2,4", "--hold-s", "3", "--no-refine",
                 "--stop-on", "never", "--gpu", "none", "--no-live", "--max-duration-s", "60",
                 "--run-dir", str(run_dir)],
                capture_output=True, text=True, timeout=HANG_S, env=env, cwd=REPO, check=False,
            )  # fmt: skip
            _, worker_err = worker.communicate(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.communicate(timeout=30)
    assert worker.returncode == ExitCode.USAGE, worker_err[-3000:]
    errors = [line for line in worker_err.splitlines() if line.startswith("oomload: error: ")]
    assert len(errors) == 1 and "Traceback" not in worker_err, worker_err[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]  # whole rows only
    assert rows and results.read_bytes().endswith(b"\n") and results.stat().st_size <= 3_000
    assert errors[0] == (
        f"oomload: error: --results {results} could not be written ({FILE_TOO_LARGE}); this worker stopped "
        f"and left its master after {len(rows)} rows, which the file holds whole — every result it had "
        "still went to the master"
    )
    # the master got every row the worker kept, and saw the worker go
    at_master = {r.request_id: r.to_json() for r in RunReader(run_dir).requests()}
    assert all(at_master.get(row["request_id"]) == row for row in rows)
    assert len(at_master) > len(rows)  # and the ones the file could not take
    lost = [e for e in RunReader(run_dir).stream("events") if e["kind"] == "worker_lost"]
    assert len(lost) == 1, master.stdout[-2000:] + master.stderr[-2000:]
    assert json.loads((run_dir / "status.json").read_text())["end_reason"] == "workers_lost"
