"""Reports of one run: terminal summary, ``summary.json``, ``report.md``, ``report.html``, ``junit.xml``.

Renderers: ``terminal``, ``summary`` (``summary.json``), ``markdown``, ``html``, ``junit``; what they
share: ``findings`` (the verdict in words, each a ``finding``; those about the requests themselves in
``requestfindings``), ``steptable`` (the per-step table and its cell formats),
``metadata`` (the run block), ``plots`` (matplotlib).
Besides a run's reports: ``tune`` renders a tune's record, ``tracestats`` what ``trace stats`` shows,
``compare`` puts two runs side by side (``oomload compare``; each read by ``compareside``, which
also says whether they are comparable and lays out their setup) and ``comparepage`` renders that;
``history`` lays several runs out in time order (``oomload report --history``).

``finalize_run`` is the one entry point (``oomload replay`` calls it when a run ends, ``oomload
report`` calls it on a saved run): it reads the run directory, computes the verdict and the
recommendation, evaluates the gate rules (a relative latency rule also on the two runs' per-request
samples, tested as ``compare`` tests them: ``gate_latencies``), writes the requested files into the
run directory, prints the one-screen summary and returns the exit code.

Exit code (``run_exit_code``), the first that applies wins:

1. ``INTERRUPTED`` (130) — the run ended by Ctrl-C / SIGTERM, unless ``reporting_only``
   (re-rendering a saved run is not itself interrupted): a cut run never reads as a pass;
2. ``UNREACHABLE`` (3) — nothing to judge: no measured step finished a request, or the run's requests
   mostly failed (``Verdict.failed_run``: more than half of the decided ones, an engine death's own
   failures aside) — whatever the gate rules say: a gate over an unloaded server is no gate;
3. ``GATE_FAILED`` (1) — a gate rule failed;
4. ``GATE_NOT_EVALUATED`` (4) — a gate rule lacked evidence and none failed;
5. ``OK`` (0).

A file that cannot be written (a full, read-only or vanished disk, a file size limit) stops the
reports there: each file is written whole under a scratch name and renamed into place
(``oomload.outfile``), so the files written before it, an older copy of it and the run's own data stay
as they were, and ``OutputWriteError`` says which file, why, and what is kept (one sentence, exit 2);
``oomload report RUN_DIR`` writes them once there is space. A terminal summary that cannot be written
(standard output on a full disk) is the same sentence, after the files.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from oomload.errors import ConfigError, ExitCode, OutputWriteError
from oomload.outfile import reason, write_text
from oomload.report.compareside import latency_samples
from oomload.report.junit import render_junit
from oomload.report.markdown import render_markdown
from oomload.report.summary import build_summary, dump_summary
from oomload.report.terminal import render_terminal
from oomload.rundir.summary import SUMMARY_SCHEMA
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import (
    Gate,
    GateResult,
    evaluate_gates,
    gate_exit_code,
    needs_baseline,
    needs_latencies,
    parse_gate,
)
from oomload.verdict.recommend import Recommendation, recommend
from oomload.verdict.runview import RunView, load_run
from oomload.verdict.shift import LatencyShift, level_shifts

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
    baseline: Path | None = None,
) -> ExitCode:
    """Verdict + reports for ``run_dir``; returns the exit code (module docstring).

    ``gates`` are rule texts (``parse_gate``) or parsed ``Gate`` values; a bad rule raises
    ``ConfigError`` before anything is written, and so does a rule relative to a baseline run
    (``onset>=baseline``) without ``baseline`` (a run directory, judged afresh). ``formats`` picks
    the files (``json``, ``md``, ``html``, ``junit``; ``terminal`` is accepted and means
    ``terminal=True``).
    """
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ConfigError(f"unknown report format(s) {', '.join(unknown)}; allowed: {', '.join(FORMATS)}")
    parsed = tuple(g if isinstance(g, Gate) else parse_gate(g) for g in gates)
    base = load_baseline(parsed, baseline, run_dir)
    view = load_run(run_dir)
    verdict = build_verdict(view)
    recommendation = recommend(verdict)
    base_verdict = None if base is None else base[1]
    latencies = gate_latencies(parsed, base, (view, verdict))
    results = evaluate_gates(parsed, verdict, base_verdict, latencies)
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
        try:
            render_terminal(console or Console(), verdict, recommendation, results, written=written)
        except BrokenPipeError:
            raise  # a reader that went away (`| head`): not a failure (the CLI)
        except OSError as err:
            raise OutputWriteError(
                f"cannot write the terminal summary ({reason(err)}){_kept_files(written, run_dir)}"
            ) from err
        except OutputWriteError as err:  # standard output, as the CLI guards it
            raise OutputWriteError(f"{err}{_kept_files(written, run_dir)}", err.path) from err
    return code


def load_baseline(
    gates: Sequence[Gate], baseline: Path | None, run_dir: Path
) -> tuple[RunView, Verdict] | None:
    """The baseline run, read and judged, for the relative rules among ``gates`` (``None`` when there are
    none); ``ConfigError`` when such a rule has no baseline, the baseline is not a run directory, or it
    is ``run_dir`` itself (a run measured against itself passes every relative rule)."""
    relative = needs_baseline(gates)
    if not relative:
        return None
    if baseline is None:
        raise ConfigError(f"gate {relative[0]!r} compares with a baseline run: give --baseline RUN_DIR")
    if baseline.resolve() == run_dir.resolve():
        raise ConfigError(
            f"the baseline {baseline} is the run being judged: a run measured against itself passes every "
            "relative rule; give --baseline the run directory of the release before"
        )
    view = load_run(baseline)
    return view, build_verdict(view)


def gate_latencies(
    gates: Sequence[Gate], base: tuple[RunView, Verdict] | None, new: tuple[RunView, Verdict]
) -> tuple[LatencyShift, ...]:
    """The latency shifts a relative latency rule among ``gates`` is judged on: ``level_shifts`` of the
    two runs' per-request samples over the levels both measured, as ``oomload compare`` computes them;
    none without such a rule or a baseline."""
    if base is None or not needs_latencies(gates):
        return ()
    (base_view, base_verdict), (view, verdict) = base, new
    common = set(base_verdict.levels) & set(verdict.levels)
    return level_shifts(latency_samples(base_view, base_verdict), latency_samples(view, verdict), common)


def _kept_files(written: Sequence[str], run_dir: Path) -> str:
    if not written:
        return ""
    return f"; {_and(written)} {'is' if len(written) == 1 else 'are'} written in {run_dir}"


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def run_exit_code(
    verdict: Verdict, results: Sequence[GateResult], *, reporting_only: bool = False
) -> ExitCode:
    """The run's exit code: the first of 130, 3 (nothing to judge), 1, 4, 0 that applies (module
    docstring)."""
    if verdict.run.end_reason == "interrupted" and not reporting_only:
        return ExitCode.INTERRUPTED
    if verdict.failed_run is not None:  # mostly failed, or no measured step decided a request
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
    """Write the requested report files into the run directory; return the names written.

    ``OutputWriteError`` at the first that cannot be written, naming it and what is kept (module
    docstring)."""
    written: list[str] = []
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
        try:
            write_text(view.path / FILE_NAMES[fmt], text)
        except OutputWriteError as err:
            raise report_write_error(view.path, FILE_NAMES[fmt], err, written) from err
        written.append(FILE_NAMES[fmt])
    return written


def report_write_error(
    run_dir: Path, name: str, err: OutputWriteError, written: Sequence[str]
) -> OutputWriteError:
    """The sentence for a report file that could not be written: which, why, what is kept, what next."""
    why = err.reason or str(err)
    kept = _and(["the run's measurements", *written])
    advice = err.remedy
    return OutputWriteError(
        f"cannot write {name} in the run directory {run_dir} ({why}); {kept} are kept as they were — "
        f"{advice}, then `oomload report {run_dir}` writes the reports",
        run_dir / name,
        why,
        advice,
    )
