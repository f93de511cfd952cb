"""The pages of ``oomload compare``: terminal, ``compare.md``, ``compare.html``, ``compare.json``,
``junit.xml``, written into one output directory.

Every page holds the same three parts: the headline (the regressions found, or none), the setup
rows (what changed in how the runs were made) and the result rows (what changed in what they
measured, each with its status and evidence: ``oomload.report.compare``), then the gate results.
``compare.html`` adds two figures drawn on shared axes — latency (TTFT, TPOT, end-to-end, P50 solid
and P99 dashed) and throughput against concurrency, both runs on each panel with their onsets marked;
and KV usage and device memory over seconds since each run started, both runs on each panel.

``junit.xml``: with gate rules one test case per rule (pass, ``<failure type="gate_failed">``, ``<error
type="gate_not_evaluated">``), as ``oomload report`` writes it; without rules one passing test case per
result row, its sentence in ``<system-out>`` (informational: add ``--gate`` to fail CI).

Files are written whole or not at all (``oomload.outfile``); the first that cannot be written stops
the writing with one sentence naming it, what is kept, and the exit code 2.
"""

from __future__ import annotations

import base64
import html
import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from oomload.errors import OutputWriteError
from oomload.outfile import write_failure, write_text
from oomload.report.compare import Comparison
from oomload.report.plots import DPI, _level_ticks, _png, _t0
from oomload.verdict.gate import GateResult, GateStatus

COMPARE_FILES = {"json": "compare.json", "md": "compare.md", "html": "compare.html", "junit": "junit.xml"}
COMPARE_FORMATS = ("terminal", *COMPARE_FILES)
STATUS_STYLES = {
    "regression": "bold red",
    "improvement": "green",
    "not separated": "yellow",
    "changed": "cyan",
    "unchanged": "dim",
    "not measured": "dim",
}
STATUS_CLASS = {
    "regression": "bad",
    "improvement": "ok",
    "not separated": "warn",
    "changed": "info",
    "unchanged": "dim",
    "not measured": "dim",
}
GATE_STYLES = {GateStatus.PASS: "green", GateStatus.FAIL: "bold red", GateStatus.NOT_EVALUATED: "yellow"}
BASE_COLOR, NEW_COLOR = "#1f77b4", "#d62728"


def render_compare_terminal(console: Console, cmp: Comparison, gates: Sequence[GateResult] = ()) -> None:
    style = "bold red" if cmp.regressions else "green"
    console.print(Text(f"oomload compare — {cmp.headline}", style=style))
    console.print(Text(f"base {cmp.base.path}  ·  new {cmp.new.path}", style="dim"))
    for caveat in cmp.caveats:
        console.print(Text(f"• {caveat}", style="yellow"))
    setup = Table(title="Setup", box=box.SIMPLE_HEAD, show_edge=False)
    setup.add_column("", no_wrap=True)
    for col in ("base", "new"):
        setup.add_column(col, overflow="fold")  # a long model name folds: never cut to "…"
    for row in cmp.setup:
        setup.add_row(row.label, row.base, Text(row.new, style="bold yellow" if row.changed else ""))
    console.print(setup)
    # The evidence goes in a table of its own, under the result: as a fifth column it wrapped to a word
    # or two a line in an 80-column log.
    # per-level rows without news are left to compare.md
    shown = [r for r in cmp.results if not (r.status in ("not measured", "unchanged") and "@" in r.key)]
    result = Table(title="Result", box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("", "base", "new", "status"):
        result.add_column(col, no_wrap=col in ("", "status"))
    for r in shown:
        result.add_row(r.label, r.base, r.new, Text(r.status, style=STATUS_STYLES[r.status]))
    console.print(result)
    evidence = Table(title="Evidence", box=None, show_header=False, padding=(0, 1))
    evidence.add_column(no_wrap=True, style="bold")
    evidence.add_column()
    for r in shown:
        evidence.add_row(r.label, Text(r.evidence, style="bold red" if r.status == "regression" else ""))
    console.print(evidence)
    for g in gates:
        text = f"{g.status.value.upper().replace('_', ' ')}  {g.gate.text} — {g.reason}"
        console.print(Text(f"Gate  {text}", style=GATE_STYLES[g.status]))


def render_compare_markdown(cmp: Comparison, gates: Sequence[GateResult] = ()) -> str:
    out = [
        f"# oomload compare: {_md(cmp.headline)}",
        "",
        f"base `{cmp.base.path}` · new `{cmp.new.path}`",
        "",
    ]
    out += [f"- {_md(c)}" for c in cmp.caveats]
    out += ["", "## Setup", "", "| | base | new | |", "|---|---|---|---|"]
    for row in cmp.setup:
        out.append(
            f"| {row.label} | {_md(row.base)} | {_md(row.new)} | {'**changed**' if row.changed else ''} |"
        )
    out += ["", "## Result", "", "| | base | new | status | evidence |", "|---|---|---|---|---|"]
    for r in cmp.results:
        status = f"**{r.status}**" if r.status == "regression" else r.status
        out.append(f"| {r.label} | {_md(r.base)} | {_md(r.new)} | {status} | {_md(r.evidence)} |")
    if gates:
        out += ["", "## Gate", "", "| rule | result | reason |", "|---|---|---|"]
        for g in gates:
            out.append(f"| `{g.gate.text}` | {g.status.value.replace('_', ' ')} | {_md(g.reason)} |")
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_compare_html(cmp: Comparison, gates: Sequence[GateResult] = ()) -> str:
    from oomload.report.html import CSS, DECODE_SCRIPT

    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>oomload compare — {e(cmp.new.label)} against {e(cmp.base.label)}</title>",
        f"<style>{CSS}td.dim{{color:#777}}</style></head><body>",
        f'<h1 class="{"bad" if cmp.regressions else "ok"}" id="headline">'
        f"oomload compare: {e(cmp.headline)}</h1>",
        f"<p>base <code>{e(str(cmp.base.path))}</code> · new <code>{e(str(cmp.new.path))}</code></p>",
    ]
    if cmp.caveats:
        out.append("<ul>" + "".join(f'<li class="warn">{e(c)}</li>' for c in cmp.caveats) + "</ul>")
    out.append(
        '<h2>Setup</h2><table id="setup"><tr><th class="l"></th>'
        '<th class="l">base</th><th class="l">new</th></tr>'
    )
    for row in cmp.setup:
        cls = ' class="l warn"' if row.changed else ' class="l"'
        out.append(
            f'<tr><th class="l">{e(row.label)}</th><td class="l">{e(row.base)}</td>'
            f"<td{cls}>{e(row.new)}</td></tr>"
        )
    out.append("</table>")
    out.append(
        '<h2>Result</h2><table id="result"><tr><th class="l"></th><th>base</th><th>new</th>'
        '<th class="l">status</th><th class="l">evidence</th></tr>'
    )
    for r in cmp.results:
        out.append(
            f'<tr data-key="{e(r.key)}"><th class="l">{e(r.label)}</th>'
            f"<td>{e(r.base)}</td><td>{e(r.new)}</td>"
            f'<td class="l {STATUS_CLASS[r.status]}">{e(r.status)}</td>'
            f'<td class="l">{e(r.evidence)}</td></tr>'
        )
    out.append("</table>")
    if gates:
        out.append(
            '<h2>Gate</h2><table><tr><th class="l">rule</th><th class="l">result</th>'
            '<th class="l">reason</th></tr>'
        )
        gate_class = {GateStatus.PASS: "ok", GateStatus.FAIL: "bad", GateStatus.NOT_EVALUATED: "warn"}
        for g in gates:
            out.append(
                f'<tr><td class="l"><code>{e(g.gate.text)}</code></td><td class="l {gate_class[g.status]}">'
                f'{g.status.value.replace("_", " ")}</td><td class="l">{e(g.reason)}</td></tr>'
            )
        out.append("</table>")
    for key, caption, png in (
        ("by-concurrency", "Latency and throughput against concurrency, both runs", plot_compare_levels(cmp)),
        ("timeline", "KV usage and device memory over time, both runs", plot_compare_timeline(cmp)),
    ):
        data = base64.b64encode(png).decode("ascii")
        out.append(f"<h2>{e(caption)}</h2>")
        out.append(
            f'<img class="plot" id="plot-{key}" alt="{e(caption)}" src="data:image/png;base64,{data}">'
        )
    out.append(f"<script>{DECODE_SCRIPT}</script></body></html>")
    return "\n".join(out) + "\n"


def plot_compare_levels(cmp: Comparison) -> bytes:
    """TTFT, TPOT, E2E (P50 solid, P99 dashed) and output tok/s against concurrency; both runs on each
    panel (shared x), onsets as vertical lines in each run's colour."""
    fig = Figure(figsize=(11, 8), dpi=DPI)
    axes = fig.subplots(2, 2, sharex=True)
    panels = (
        (axes[0][0], "ttft", "TTFT (time to first token)"),
        (axes[0][1], "tpot", "TPOT (mean inter-token latency)"),
        (axes[1][0], "e2e", "End-to-end latency"),
    )
    levels = sorted(set(cmp.base.summary.levels) | set(cmp.new.summary.levels))
    for ax, metric, title in panels:
        top = 0.0
        for side, color, name in ((cmp.base, BASE_COLOR, "base"), (cmp.new, NEW_COLOR, "new")):
            points = []
            for c in sorted(side.samples):
                values = side.samples[c].get(metric, ())
                if values:
                    ordered = sorted(values)
                    p50 = ordered[max(0, -(-len(ordered) * 50 // 100) - 1)]
                    p99 = ordered[max(0, -(-len(ordered) * 99 // 100) - 1)]
                    points.append((c, p50, p99))
                    top = max(top, p99)
            if points:
                ax.plot(
                    [p[0] for p in points], [p[1] for p in points], "o-", color=color, label=f"{name} P50"
                )
                ax.plot(
                    [p[0] for p in points],
                    [p[2] for p in points],
                    "s--",
                    color=color,
                    alpha=0.6,
                    label=f"{name} P99",
                )
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("ms")
        ax.set_ylim(bottom=0, top=top * 1.15 if top > 0 else None)
    ax_thr = axes[1][1]
    for side, color, name in ((cmp.base, BASE_COLOR, "base"), (cmp.new, NEW_COLOR, "new")):
        steps = sorted(
            (s for s in side.summary.measured_steps if s.output_tokens_per_s is not None),
            key=lambda s: s.concurrency,
        )
        ax_thr.plot(
            [s.concurrency for s in steps],
            [s.output_tokens_per_s for s in steps],
            "o",
            color=color,
            label=name,
        )
    ax_thr.set_title("Output tokens/s per step", fontsize=10)
    ax_thr.set_ylim(bottom=0)
    for row in axes:
        for ax in row:
            _mark(ax, cmp)
            _level_ticks(ax, levels)
            ax.set_xlabel("concurrency")
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left", fontsize=7)
    fig.suptitle(f"base {cmp.base.label} (blue) against new {cmp.new.label} (red)")
    fig.subplots_adjust(left=0.07, right=0.97, top=0.92, bottom=0.07, hspace=0.3, wspace=0.22)
    return _png(fig)


def _mark(ax: Axes, cmp: Comparison) -> None:
    for side, color, name in ((cmp.base, BASE_COLOR, "base"), (cmp.new, NEW_COLOR, "new")):
        onset = side.summary.preemption_onset
        if onset is not None:
            ax.axvline(
                onset.concurrency, color=color, ls="-.", lw=1.2, label=f"{name} onset ({onset.concurrency})"
            )
        death = side.summary.death
        if death is not None and death.concurrency is not None:
            ax.axvline(
                death.concurrency, color=color, ls="--", lw=1.5, label=f"{name} death ({death.concurrency})"
            )


def plot_compare_timeline(cmp: Comparison) -> bytes:
    """KV usage and device memory over seconds since each run started: both runs on shared axes."""
    fig = Figure(figsize=(11, 6), dpi=DPI)
    ax_kv, ax_mem = fig.subplots(2, 1, sharex=True)
    any_memory = False
    for side, color, name in ((cmp.base, BASE_COLOR, "base"), (cmp.new, NEW_COLOR, "new")):
        t0 = _t0(side.view)
        ok = [m for m in side.view.metrics if m.ok and m.kv_cache_usage is not None]
        ax_kv.plot(
            [m.t_unix_s - t0 for m in ok],
            [100 * (m.kv_cache_usage or 0.0) for m in ok],
            color=color,
            lw=1,
            label=name,
        )
        gpu = [g for g in side.view.gpu if g.used_bytes is not None]
        if gpu:
            any_memory = True
            ax_mem.plot(
                [g.t_unix_s - t0 for g in gpu],
                [(g.used_bytes or 0) / 2**30 for g in gpu],
                color=color,
                lw=1,
                label=name,
            )
    ax_kv.set_ylabel("KV usage %")
    ax_kv.set_ylim(0, 105)
    ax_mem.set_ylabel("device memory used, GiB")
    if not any_memory:
        ax_mem.text(
            0.5, 0.5, "no device memory sampled", ha="center", va="center", transform=ax_mem.transAxes
        )
    ax_mem.set_xlabel("seconds since the run started")
    for ax in (ax_kv, ax_mem):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.97, top=0.95, bottom=0.09, hspace=0.15)
    return _png(fig)


def render_compare_junit(cmp: Comparison, gates: Sequence[GateResult] = ()) -> str:
    suites = ET.Element("testsuites", name="oomload")
    failures = errors = 0
    if gates:
        suite = ET.SubElement(suites, "testsuite", name="oomload.compare.gate")
        for g in gates:
            case = ET.SubElement(suite, "testcase", classname="oomload.compare.gate", name=g.gate.text)
            if g.status is GateStatus.FAIL:
                ET.SubElement(case, "failure", message=g.reason, type="gate_failed").text = g.reason
                failures += 1
            elif g.status is GateStatus.NOT_EVALUATED:
                ET.SubElement(case, "error", message=g.reason, type="gate_not_evaluated").text = g.reason
                errors += 1
            else:
                ET.SubElement(case, "system-out").text = g.reason
        tests = len(gates)
    else:
        suite = ET.SubElement(suites, "testsuite", name="oomload.compare")
        for r in cmp.results:
            case = ET.SubElement(suite, "testcase", classname="oomload.compare", name=r.key)
            ET.SubElement(
                case, "system-out"
            ).text = f"{r.label}: {r.base} → {r.new}, {r.status}: {r.evidence}"
        tests = len(cmp.results)
    for element in (suite, suites):
        element.set("tests", str(tests))
        element.set("failures", str(failures))
        element.set("errors", str(errors))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_compare(
    out_dir: Path, cmp: Comparison, gates: Sequence[GateResult], formats: Sequence[str], *, exit_code: int
) -> list[str]:
    """Write the requested files into ``out_dir``; the names written. ``OutputWriteError`` at the first
    that cannot be written, with what is kept."""
    written: list[str] = []
    for fmt, name in COMPARE_FILES.items():
        if fmt not in formats:
            continue
        if fmt == "json":
            doc = cmp.to_json()
            doc["gates"] = [g.to_json() for g in gates]
            doc["exit_code"] = exit_code
            text = json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n"
        elif fmt == "md":
            text = render_compare_markdown(cmp, gates)
        elif fmt == "html":
            text = render_compare_html(cmp, gates)
        else:
            text = render_compare_junit(cmp, gates)
        try:
            if not out_dir.is_dir():
                out_dir.mkdir(parents=True, exist_ok=True)
            write_text(out_dir / name, text)
        except (OutputWriteError, OSError) as err:
            failure = err if isinstance(err, OutputWriteError) else write_failure(out_dir, err)
            kept = ", ".join(written) if written else "nothing"
            raise OutputWriteError(
                f"cannot write {name} in {out_dir} ({failure.reason}); written before it: {kept}; the two "
                f"run directories are untouched — {failure.remedy}, then run the compare again",
                out_dir / name,
                failure.reason,
                failure.remedy,
            ) from err
        written.append(name)
    return written
