"""The one-screen terminal summary (rich), then the per-step table."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from oomload.gate import GateResult, GateStatus
from oomload.recommend import Recommendation
from oomload.report.findings import STEP_COLUMNS, describe, step_row
from oomload.verdict import Verdict

STYLES = {"ok": "green", "info": "cyan", "warn": "yellow", "bad": "bold red"}
GATE_STYLES = {GateStatus.PASS: "green", GateStatus.FAIL: "bold red", GateStatus.NOT_EVALUATED: "yellow"}
MAX_NOTES = 4


def render_terminal(
    console: Console,
    verdict: Verdict,
    recommendation: Recommendation,
    gate_results: Sequence[GateResult] = (),
    *,
    written: Sequence[str] = (),
) -> None:
    """Print the summary panel, then the per-step table."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for finding in describe(verdict, recommendation):
        if finding.key == "recommendation":
            grid.add_row(finding.label, Text(finding.text, style="bold magenta"))
            grid.add_row("", Text(recommendation.reasoning, style="dim"))
        else:
            grid.add_row(finding.label, Text(finding.text, style=STYLES[finding.severity]))
    warnings = [n for n in verdict.notes if n.severity == "warning"]
    for note in warnings[:MAX_NOTES]:
        grid.add_row("", Text(f"• {note.message}", style="yellow"))
    if len(warnings) > MAX_NOTES:
        grid.add_row("", Text(f"• … {len(warnings) - MAX_NOTES} more in report.md", style="yellow"))
    for result in gate_results:
        grid.add_row(
            "Gate",
            Text(
                f"{result.status.value.upper().replace('_', ' ')}  {result.gate.text} — {result.reason}",
                style=GATE_STYLES[result.status],
            ),
        )
    title = f"oomload verdict — {verdict.run.model or 'model ?'} @ {verdict.run.url or '?'}"
    parts: list[Table | Text] = [grid]
    if written:
        parts.append(Text("written: " + ", ".join(written), style="dim"))
    console.print(Panel(Group(*parts), title=title, subtitle=verdict.run.path, expand=False))
    console.print(step_table(verdict))


def step_table(verdict: Verdict) -> Table:
    table = Table(title="Per step (* = cut short)", header_style="bold", show_lines=False)
    for column in STEP_COLUMNS:
        table.add_column(column, justify="left" if column == "phase" else "right", no_wrap=True)
    onset = None if verdict.preemption_onset is None else verdict.preemption_onset.step
    death = None if verdict.engine_death is None else verdict.engine_death.step
    for s in verdict.steps:
        style = "dim" if s.warmup else ("red" if s.index in (onset, death) else None)
        table.add_row(*step_row(s), style=style)
    return table
