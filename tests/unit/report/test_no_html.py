"""``oomload replay --no-html``: the run's reports without ``report.html`` (its plots cost seconds), as
the tuner's candidate replays write them."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from oomload.cli import build_parser
from oomload.cli.replay import build_config
from oomload.realvllm.servecmd import parse_serve_command
from oomload.run.runner import _finalize
from oomload.trace.model import TraceHeader, TraceRecord, write_trace
from oomload.tune.prove import _replay_argv
from oomload.tune.search import Settings
from runbuilder import CPU_CACHE, cpu_knee_steps, write_run


def test_no_html_writes_every_report_but_report_html(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord("r0", 0.0, 40, 5)], TraceHeader())
    assert build_config(build_parser().parse_args(["replay", str(trace)])).html
    assert not build_config(build_parser().parse_args(["replay", str(trace), "--no-html"])).html
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    code = _finalize(run, (), Console(file=io.StringIO()), html=False)
    assert code == 0
    assert {p.name for p in run.iterdir()} >= {"summary.json", "report.md", "junit.xml"}
    assert not (run / "report.html").exists()


def test_the_tuners_candidate_replays_write_no_report_html(tmp_path: Path) -> None:
    serve = parse_serve_command("vllm serve m --api-key sk-tune-secret")
    config = SimpleNamespace(trace_path=tmp_path / "t.jsonl", replay_max_duration_s=60.0, serve=serve)
    candidate = SimpleNamespace(settings=Settings(max_num_seqs=10))
    argv = _replay_argv(
        SimpleNamespace(config=config),  # type: ignore[arg-type]
        candidate,  # type: ignore[arg-type]
        "http://127.0.0.1:9",
        tmp_path / "run",
    )
    assert "--no-html" in argv
    # the candidate's line, its key scrubbed: a child's arguments are readable by every local user
    assert argv[argv.index("--served-with") + 1] == "vllm serve m --api-key *** --max-num-seqs 10"
    assert not any("sk-tune-secret" in a for a in argv)
