"""``report.md``: the verdict for a pull-request comment or a CI step summary (GitHub-flavoured)."""

from __future__ import annotations

from collections.abc import Sequence

from oomload.report.findings import STEP_COLUMNS, STEP_LEGEND, describe, step_row
from oomload.verdict import Verdict
from oomload.verdict.gate import GateResult, GateStatus
from oomload.verdict.recommend import Recommendation

ICONS = {"ok": "✅", "info": "ℹ️", "warn": "⚠️", "bad": "❌"}
GATE_ICONS = {
    GateStatus.PASS: "✅ pass",
    GateStatus.FAIL: "❌ fail",
    GateStatus.NOT_EVALUATED: "⚠️ not evaluated",
}


def render_markdown(
    verdict: Verdict, recommendation: Recommendation, gate_results: Sequence[GateResult] = ()
) -> str:
    lines = [f"## oomload verdict — {_esc(verdict.run.model or 'model ?')}", ""]
    if verdict.run.cut_short:
        lines += [f"> **⚠️ This run was cut short:** {_esc(verdict.run.cut_short_detail or '')}", ""]
    lines += ["| | Finding | |", "|---|---|---|"]
    for f in describe(verdict, recommendation):
        if f.key == "recommendation":
            continue
        lines.append(f"| {ICONS[f.severity]} | **{f.label}** | {_esc(f.text)} |")
    lines += [
        "",
        "### Recommendation",
        "",
        "```sh",
        recommendation.flag_line,
        "```",
        "",
        recommendation.reasoning,
        "",
    ]
    settings = [s for s in recommendation.settings]
    lines += ["| flag | recommended | current | why |", "|---|---|---|---|"]
    for setting in settings:
        value = _esc(setting.shown)
        current = "—" if setting.current is None else setting.current
        lines.append(f"| `{setting.flag}` | {value} | {current} | {_esc(setting.reason)} |")
    if gate_results:
        lines += ["", "### Gate", "", "| rule | result | reason |", "|---|---|---|"]
        for r in gate_results:
            lines.append(f"| `{_esc(r.gate.text)}` | {GATE_ICONS[r.status]} | {_esc(r.reason)} |")
    if verdict.notes:
        lines += ["", f"### Confidence: {verdict.confidence}", ""]
        lines += [f"- {'⚠️' if n.severity == 'warning' else 'ℹ️'} {_esc(n.message)}" for n in verdict.notes]
    lines += [
        "",
        "### Per step",
        "",
        "| " + " | ".join(STEP_COLUMNS) + " |",
        "|" + "---|" * len(STEP_COLUMNS),
    ]
    for s in verdict.steps:
        lines.append("| " + " | ".join(_esc(c) for c in step_row(s)) + " |")
    lines += ["", f"<sub>run directory `{_esc(verdict.run.path)}` · {_esc(STEP_LEGEND)}</sub>", ""]
    return "\n".join(lines)


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
