"""``--only-fitting`` on the simulator: a trace half of whose requests exceed the server's max_model_len
is replayed with the fitting half only, and the report says how many were left out. Without the flag
the same trace is sent whole (the server refuses the long half) and the warning names the flag."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomload.rundir import RunReader
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(("--max-model-len", str(MAX_MODEL_LEN), "--time-scale", "0.02")) as server:
        yield server


def _trace(path: Path, lengths: list[tuple[int, int]]) -> Path:
    records = [TraceRecord(f"r{i}", 0.0, p, o) for i, (p, o) in enumerate(lengths)]
    write_trace(path, records, TraceHeader(format="test"))
    return path


def _replay(sim: SimServer, trace: Path, run_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [
        *(sys.executable, "-m", "oomload", "replay", str(trace), "--url", sim.url, "--no-live"),
        *("--concurrency", "2", "--hold-s", "1", "--no-refine", "--no-evidence", "--gpu", "none"),
        *("--no-html", "--run-dir", str(run_dir), *flags),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_only_the_fitting_requests_are_sent(sim: SimServer, tmp_path: Path) -> None:
    # alternating: 300 + 50 tokens fit 2048, 3000 + 50 do not
    trace = _trace(tmp_path / "t.jsonl", [(300, 50), (3000, 50)] * 20)
    run_dir = tmp_path / "fit"
    proc = _replay(sim, trace, run_dir, "--only-fitting")
    out = " ".join((proc.stdout + proc.stderr).split())  # the console wraps at 80 columns
    assert proc.returncode == 0, out
    assert "20 of 40 trace requests need more than max_model_len=2048 tokens" in out
    assert "left out (--only-fitting); 20 replayed" in out
    results = RunReader(run_dir).requests()
    assert results and {r.prompt_tokens_asked for r in results} == {300}
    assert Counter(r.outcome.value for r in results)["context_overflow"] == 0
    assert json.loads((run_dir / "config.json").read_text())["only_fitting"] is True
    report = (run_dir / "report.md").read_text()
    assert "20 of 40 trace requests exceed max\\_model\\_len 2048: left out of the replay" in report

    # the same trace sent whole: the long half is refused, and the warning names the flag
    whole = _replay(sim, trace, tmp_path / "whole")
    assert whole.returncode in (0, 3), whole.stdout + whole.stderr
    assert "(--only-fitting replays only the ones that fit)" in " ".join(whole.stdout.split())
    refused = Counter(r.outcome.value for r in RunReader(tmp_path / "whole").requests())
    assert refused["context_overflow"] > 0, refused


def test_a_trace_none_of_whose_requests_fits_is_one_sentence(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(3000, 50)] * 5)
    proc = _replay(sim, trace, tmp_path / "run", "--only-fitting")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "with --only-fitting nothing is left to replay" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_zero_token_lengths_are_said_to_be_sent_as_one(sim: SimServer, tmp_path: Path) -> None:
    """A log's 0-token prompt or output (a cancelled request, say) was sent as 1 token without a word."""
    trace = _trace(tmp_path / "t.jsonl", [(0, 50), (300, 0), (300, 0), (300, 50)] * 5)
    run_dir = tmp_path / "zero"
    proc = _replay(sim, trace, run_dir)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, out
    assert (
        "note: 5 of 20 trace requests have a prompt of 0 tokens and 10 an output of 0: each is sent with 1 "
        "token instead (servers refuse 0)"
    ) in out
    assert {(r.prompt_tokens_asked, r.output_tokens_asked) for r in RunReader(run_dir).requests()} >= {
        (1, 50)
    }
