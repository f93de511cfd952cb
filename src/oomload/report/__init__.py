"""Reports of one run: terminal summary, ``summary.json``, ``report.md``, ``report.html``, ``junit.xml``.

``finalize_run`` is the one entry point (``oomload replay`` calls it when a run ends, ``oomload
report`` calls it on a saved run): it reads the run directory, computes the verdict and the
recommendation, evaluates the gate rules, writes the requested files into the run directory, prints
the one-screen summary and returns the exit code.

Exit code (``run_exit_code``), the first that applies wins:

1. ``INTERRUPTED`` (130) — the run ended by Ctrl-C / SIGTERM, unless ``reporting_only``
   (re-rendering a saved run is not itself interrupted): a cut run never reads as a pass;
2. ``UNREACHABLE`` (3) — nothing to judge: no measured step finished a request, or the run's requests
   mostly failed (``Verdict.failed_run``: more than half of the decided ones, an engine death's own
   failures aside) — whatever the gate rules say: a gate over an unloaded server is no gate;
3. ``GATE_FAILED`` (1) — a gate rule failed;
4. ``GATE_NOT_EVALUATED`` (4) — a gate rule lacked evidence and none failed;
5. ``OK`` (0).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from oomload.errors import ConfigError, ExitCode
from oomload.report.junit import render_junit
from oomload.report.markdown import render_markdown
from oomload.report.summary import SUMMARY_SCHEMA, build_summary, dump_summary
from oomload.report.terminal import render_terminal
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import Gate, GateResult, evaluate_gates, gate_exit_code, parse_gate
from oomload.verdict.recommend import Recommendation, recommend
from oomload.verdict.runview import RunView, load_run

FORMATS = ("terminal", "json", "md", "html", "junit")
RUN_FORMATS = ("json", "md", "html", "junit")  # the files a run directory gets
FILE_NAMES = {"json": "summary.json", "md": "report.md", "html": "report.html", "junit": "junit.xml"}

__all__ = ["FILE_NAMES", "FORMATS", "SUMMARY_SCHEMA", "finalize_run", "run_exit_code"]


def finalize_run(
    run_dir: Path,
    *,
    gates: Sequence[str | Gate] = (),
    console: Console | None = None,
    formats: Sequence[str] = RUN_FORMATS,
    terminal: bool = True,
    reporting_only: bool = False,
    now_unix_s: float | None = None,
) -> ExitCode:
    """Verdict + reports for ``run_dir``; returns the exit code (module docstring).

    ``gates`` are rule texts (``parse_gate``) or parsed ``Gate`` values; a bad rule raises
    ``ConfigError`` before anything is written. ``formats`` picks the files (``json``, ``md``,
    ``html``, ``junit``; ``terminal`` is accepted and means ``terminal=True``).
    """
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ConfigError(f"unknown report format(s) {', '.join(unknown)}; allowed: {', '.join(FORMATS)}")
    parsed = tuple(g if isinstance(g, Gate) else parse_gate(g) for g in gates)
    view = load_run(run_dir)
    verdict = build_verdict(view)
    recommendation = recommend(verdict)
    results = evaluate_gates(parsed, verdict)
    code = run_exit_code(verdict, results, reporting_only=reporting_only)
    written = write_reports(
        view,
        verdict,
        recommendation,
        results,
        exit_code=code,
        formats=formats,
        now_unix_s=time.time() if now_unix_s is None else now_unix_s,
    )
    if terminal or "terminal" in formats:
        render_terminal(console or Console(), verdict, recommendation, results, written=written)
    return code


def run_exit_code(
    verdict: Verdict, results: Sequence[GateResult], *, reporting_only: bool = False
) -> ExitCode:
    """The run's exit code: the first of 130, 3 (nothing to judge), 1, 4, 0 that applies (module
    docstring)."""
    if verdict.run.end_reason == "interrupted" and not reporting_only:
        return ExitCode.INTERRUPTED
    if not any(s.requests for s in verdict.measured_steps) or verdict.failed_run is not None:
        return ExitCode.UNREACHABLE
    return gate_exit_code(results)


def write_reports(
    view: RunView,
    verdict: Verdict,
    recommendation: Recommendation,
    results: Sequence[GateResult],
    *,
    exit_code: int,
    formats: Sequence[str],
    now_unix_s: float,
) -> list[str]:
    """Write the requested report files into the run directory; return the names written."""
    written = []
    for fmt in RUN_FORMATS:
        if fmt not in formats:
            continue
        if fmt == "json":
            text = dump_summary(
                build_summary(
                    verdict, recommendation, results, exit_code=exit_code, generated_unix_s=now_unix_s
                )
            )
        elif fmt == "md":
            text = render_markdown(verdict, recommendation, results)
        elif fmt == "html":
            from oomload.report.html import render_html

            text = render_html(view, verdict, recommendation, results)
        else:
            text = render_junit(verdict, recommendation, results)
        _write_atomic(view.path / FILE_NAMES[fmt], text)
        written.append(FILE_NAMES[fmt])
    return written


def _write_atomic(target: Path, text: str) -> None:
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
