"""``oomload report --history``: the runs in time order, and what moved between them, with evidence
(``oomload.report.history``; run directories written by ``runbuilder``: the real verdict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.cli import main
from oomload.errors import ConfigError
from oomload.outcome import Outcome
from oomload.report.history import history_of, render_markdown
from oomload.rundir.provenance import Provenance
from runbuilder import StepSpec, write_run

POOL = {"block_size": 16, "gpu_memory_utilization": 0.9}
DAY_S = 86_400.0


def _run(
    path: Path,
    *,
    onset: int,
    blocks: int,
    version: str,
    day: int,
    simulated: bool = False,
    failed: bool = False,
) -> Path:
    """Levels 2, 4, 6, 8, preempting from ``onset``; the level below it and the onset three times (with
    ``failed``, every request a 500 instead)."""
    steps = []
    for c in (2, 4, 6, 8):
        times = 3 if c in (onset - 2, onset) else 1
        steps += [StepSpec(c, preemptions=3 if c >= onset else 0) for _ in range(times)]
    if failed:
        steps = [StepSpec(c, failures={Outcome.SERVER_ERROR: 12}, error_text="http 500") for c in (2, 4)]
    write_run(path, steps, cache_config={**POOL, "num_gpu_blocks": blocks}, config={"simulated": simulated})
    provenance = Provenance(
        oomload_version="0.1.0",
        trace_path="prod.jsonl",
        trace_sha256="ab" * 32,
        trace_requests=20,
        levels=(2, 4, 6, 8),
        repeats=3,
        server_version=version,
        started_unix_s=1_790_000_000.0 + day * DAY_S,
    )
    (path / "provenance.json").write_text(json.dumps(provenance.to_json()))
    return path


@pytest.fixture
def releases(tmp_path: Path) -> Path:
    """Three releases, written out of order: 0.33.0 shrank the pool and moved the onset."""
    runs = tmp_path / "runs"
    _run(runs / "c-late", onset=6, blocks=80, version="0.33.0", day=30)
    _run(runs / "a-first", onset=8, blocks=100, version="0.31.0", day=1)
    _run(runs / "b-mid", onset=8, blocks=100, version="0.32.0", day=12)
    return runs


def test_a_simulated_run_says_so_beside_the_version_it_mimics(tmp_path: Path) -> None:
    # the simulator answers /version with the vLLM version it mimics
    sim = _run(tmp_path / "sim", onset=8, blocks=100, version="0.32.0", day=1, simulated=True)
    real = _run(tmp_path / "real", onset=8, blocks=100, version="0.32.0", day=2)
    assert [r.version for r in history_of([sim, real]).rows] == ["simulated vLLM 0.32.0", "vLLM 0.32.0"]


def test_the_runs_are_in_time_order_and_the_release_that_moved_is_named(releases: Path) -> None:
    history = history_of([releases / "c-late", releases / "a-first", releases / "b-mid"])
    assert [r.version for r in history.rows] == ["vLLM 0.31.0", "vLLM 0.32.0", "vLLM 0.33.0"]
    assert [(r.onset, r.kv_blocks) for r in history.rows] == [(8, 100), (8, 100), (6, 80)]
    assert history.rows[1].moves == ()  # 0.32.0 moved nothing
    assert history.rows[2].moves[0] == "KV pool 100 → 80 blocks at c-late (vLLM 0.33.0)"
    assert (
        history.rows[2].moves[1].startswith("onset 8 → 6 at c-late (vLLM 0.33.0), separated: Fisher p = 0.05")
    )
    assert history.level == 6  # the highest level at which every run answered in a trusted step
    assert all(r.p99_ttft_ms is not None and r.p99_ttft_ms > 0 for r in history.rows)


def test_the_cli_writes_the_page_from_a_directory_of_runs(
    releases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "page"
    assert main(["report", "--history", str(releases), "--out", str(out)]) == 0
    doc = json.loads((out / "history.json").read_text())
    assert doc["schema"] == "oomload.history/1" and len(doc["runs"]) == 3
    assert any("onset 8 → 6" in m for m in doc["moves"])
    assert "onset 8 → 6" in (out / "history.md").read_text()
    assert 'id="plot-history"' in (out / "history.html").read_text()
    assert "vLLM 0.33.0" in capsys.readouterr().out


def test_format_picks_the_history_files_as_it_picks_a_reports(
    releases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report --history RUNS --format md` wrote history.json, .md and .html and printed the table: the
    flag was silently ignored. Now it picks the outputs (terminal, json, md, html), and one that a
    history has not (junit) is exit 2."""
    out = tmp_path / "page"
    assert main(["report", "--history", str(releases), "--out", str(out), "--format", "md"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["history.md"]
    assert capsys.readouterr().out == f"oomload: wrote history.md in {out}\n"
    assert main(["report", "--history", str(releases), "--out", str(out), "--format", "junit"]) == 2
    assert "--format 'junit': allowed values are terminal, json, md, html" in capsys.readouterr().err


def test_another_trace_is_marked_and_nothing_is_read_across_it(releases: Path) -> None:
    other = releases / "d-other"
    _run(other, onset=4, blocks=50, version="0.34.0", day=40)
    doc = json.loads((other / "provenance.json").read_text())
    doc["trace"]["sha256"] = "cd" * 32
    (other / "provenance.json").write_text(json.dumps(doc))
    last = history_of([releases]).rows[-1]
    assert not last.same_trace and last.moves == (
        "d-other replayed another trace: nothing is read across it",
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--history", "{one}"], "a history needs at least two runs; found 1"),
        (["--history", "{missing}", "{one}"], "is not a directory"),
        (["{one}", "--level", "4"], "--level and --out go with --history"),
        (["{one}", "{one}"], "give one RUN_DIR (got 2)"),
        (["--history", "{one}", "{one}", "--gate", "onset>=baseline"], "--history takes no --gate"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(
    releases: Path, tmp_path: Path, argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = {"one": str(releases / "a-first"), "missing": str(tmp_path / "nowhere")}
    assert main(["report", *(a.format(**paths) for a in argv)]) == 2
    assert words in capsys.readouterr().err


def test_a_directory_with_no_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither a run directory nor holds any"):
        history_of([tmp_path / "empty"])


def test_a_run_with_nothing_to_judge_is_marked_and_never_read_as_a_fix(releases: Path) -> None:
    """A release whose server answered nothing (every request a 500) showed "onset none, last safe
    none, death none" like a clean run, and the next release's onset was read against it. It is
    marked, shows "—", and the run after it is compared with the last run that judged something."""
    _run(releases / "b2-broken", onset=8, blocks=100, version="0.32.1", day=20, failed=True)
    history = history_of([releases])
    broken, late = history.rows[2], history.rows[3]
    assert broken.nothing_to_judge is not None and broken.moves == (
        "b2-broken has nothing to judge: nothing is read from it",
    )
    page = render_markdown(history)
    assert "| b2-broken (nothing to judge) |" in page and "| — | — | 100 | — |" in page
    # the release after it is read against 0.32.0 (onset 8), not against the run that judged nothing
    assert late.moves[1].startswith("onset 8 → 6 at c-late (vLLM 0.33.0)")


def test_a_run_with_nothing_to_judge_before_the_first_judged_run_marks_nothing(releases: Path) -> None:
    """A run that judged nothing, then runs of one trace and traffic: the first judged run read "a-first
    sent other traffic (distinct prompts): nothing is read across it" — the run before it was passed
    over, and the only one left on its trace. A run with nothing to judge is no run before another: the
    first judged run is the first, and is marked for nothing."""
    _run(releases / "a0-broken", onset=8, blocks=100, version="0.30.0", day=0, failed=True)
    rows = history_of([releases]).rows
    assert [r.label for r in rows] == ["a0-broken", "a-first", "b-mid", "c-late"]
    assert rows[0].moves == ("a0-broken has nothing to judge: nothing is read from it",)
    assert rows[1].moves == () and rows[2].moves == ()
    assert rows[3].moves[1].startswith("onset 8 → 6 at c-late (vLLM 0.33.0)")
    assert not any("other traffic" in m or "another trace" in m for r in rows for m in r.moves)
