"""``report.md``: the verdict for a pull-request comment or a CI step summary (GitHub-flavoured).

Text that came from outside — the model name and error texts from the server, ids and numbers from
the trace, the run path — is escaped before it reaches the Markdown (``escape_md``): ``&``, ``<`` and ``>``
become entities, so no raw HTML survives to be rendered by the places that show Markdown (GitHub, CI
summaries); Markdown's control characters (``\\ ` * _ [ ] |``) are backslash-escaped, so no text
opens a code span, a link or emphasis, or splits a table cell; a newline becomes a space. Inside a
code span (``_code``) or the recommendation's code block (``_fenced``) nothing is interpreted, so only
what would end the span or the block is taken care of: the fence is longer than any run of backticks
in the text.
"""

from __future__ import annotations

from collections.abc import Sequence

from oomload.report.findings import describe
from oomload.report.steptable import STEP_COLUMNS, STEP_LEGEND, step_row
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
    lines = [f"## oomload verdict — {escape_md(verdict.run.model or 'model ?')}", ""]
    if verdict.run.cut_short:
        lines += [f"> **⚠️ This run was cut short:** {escape_md(verdict.run.cut_short_detail or '')}", ""]
    lines += ["| | Finding | |", "|---|---|---|"]
    for f in describe(verdict, recommendation):
        if f.key == "recommendation":
            continue
        lines.append(f"| {ICONS[f.severity]} | **{f.label}** | {escape_md(f.text)} |")
    lines += [
        "",
        "### Recommendation",
        "",
        *_fenced(recommendation.flag_line, "sh"),
        "",
        escape_md(recommendation.reasoning),
        "",
    ]
    settings = [s for s in recommendation.settings]
    lines += ["| flag | recommended | current | why |", "|---|---|---|---|"]
    for setting in settings:
        value = escape_md(setting.shown)
        current = "—" if setting.current is None else setting.current
        lines.append(f"| {_code(setting.flag)} | {value} | {current} | {escape_md(setting.reason)} |")
    if gate_results:
        lines += ["", "### Gate", "", "| rule | result | reason |", "|---|---|---|"]
        for r in gate_results:
            lines.append(f"| {_code(r.gate.text)} | {GATE_ICONS[r.status]} | {escape_md(r.reason)} |")
    if verdict.notes:
        lines += ["", f"### Confidence: {verdict.confidence}", ""]
        lines += [
            f"- {'⚠️' if n.severity == 'warning' else 'ℹ️'} {escape_md(n.message)}" for n in verdict.notes
        ]
    lines += [
        "",
        "### Per step",
        "",
        "| " + " | ".join(STEP_COLUMNS) + " |",
        "|" + "---|" * len(STEP_COLUMNS),
    ]
    for s in verdict.steps:
        lines.append("| " + " | ".join(escape_md(c) for c in step_row(s)) + " |")
    lines += ["", f"<sub>run directory {_code(verdict.run.path)} · {escape_md(STEP_LEGEND)}</sub>", ""]
    return "\n".join(lines)


_MARKDOWN_SPECIAL = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        **{c: "\\" + c for c in "\\`*_[]|"},
        "\n": " ",
        "\r": " ",
    }
)


def escape_md(text: str) -> str:
    """Outside text as literal Markdown text (module docstring)."""
    return text.translate(_MARKDOWN_SPECIAL)


def _code(text: str) -> str:
    """Outside text as one inline code span that nothing in it can end (a table cell stays one cell)."""
    flat = text.replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    fence = "`" * (_longest_backtick_run(flat) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def _fenced(text: str, info: str) -> list[str]:
    """A fenced code block holding ``text`` that no line of it can close."""
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return [f"{fence}{info}", text, fence]


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return longest
