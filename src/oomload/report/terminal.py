"""The one-screen terminal summary (rich), then the per-step table."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from oomload.report.findings import describe
from oomload.report.steptable import STEP_COLUMNS, step_row
from oomload.verdict import Verdict
from oomload.verdict.gate import GateResult, GateStatus
from oomload.verdict.recommend import Recommendation

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
    # a model name or path is text, never rich markup ("org/model[v2]" is a name, "[/]" would raise)
    title = Text(f"oomload verdict — {verdict.run.model or 'model ?'} @ {verdict.run.url or '?'}")
    parts: list[Table | Text] = [grid]
    if written:
        parts.append(Text("written: " + ", ".join(written), style="dim"))
    console.print(Panel(Group(*parts), title=title, subtitle=Text(verdict.run.path), expand=False))
    console.print(step_table(verdict))


# The terminal shows a narrower table than report.md (column name in STEP_COLUMNS → short header).
TERMINAL_COLUMNS = {
    "step": "step", "conc": "conc", "req": "req", "err": "err", "cancel": "cncl",
    "TTFT p99": "ttft99",
    "e2e p99": "e2e99", "KV max": "KV", "preempt": "pre", "pre/100": "/100", "run/wait": "run/wait",
    "achieved": "held",
    "server": "srv",
    "dev used": "dev",
}  # fmt: skip


def step_table(verdict: Verdict) -> Table:
    """The per-step table, narrow enough for an 80-column CI log.

    Columns that say nothing in this run are left out (no request cancelled, no device memory
    sampled), and device memory is shown in GiB with the unit in the header instead of every cell.
    """
    table = Table(
        title=(
            "Per step (* = cut short; † = after the engine died; cncl = cancelled; held = in flight at "
            "the client; srv = in vLLM, by its counters; /100 = preemptions per 100 requests; err +N at "
            "death = N more died with the engine in a later step)"
        ),
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=0,  # the box's one-space divider alone: 14 columns fit 80 with every cell whole
        show_edge=False,
    )
    rows = [step_row(s) for s in verdict.steps]
    columns = [
        (STEP_COLUMNS.index(name), short)
        for name, short in TERMINAL_COLUMNS.items()
        if name not in ("cancel", "server", "dev used") or _says_something(rows, STEP_COLUMNS.index(name))
    ]
    for _index, short in columns:
        # only err may wrap: "0 (+1 at death)" (requests that died with the engine in a later step)
        # would otherwise push the table past 80 columns and cut the last column
        table.add_column("dev GiB" if short == "dev" else short, justify="right", no_wrap=short != "err")
    onset = None if verdict.preemption_onset is None else verdict.preemption_onset.step
    death = None if verdict.engine_death is None else verdict.engine_death.step
    for s, row in zip(verdict.steps, rows, strict=True):
        style = "dim" if s.warmup or s.after_death else ("red" if s.index in (onset, death) else None)
        cells = [row[i].removesuffix(" GiB") if short == "dev" else row[i] for i, short in columns]
        table.add_row(*cells, style=style)
    return table


def _says_something(rows: list[list[str]], index: int) -> bool:
    """True when some row has a value other than zero or empty in that column."""
    return any(row[index].strip() not in ("", "0", "–", "—", "-") for row in rows)
