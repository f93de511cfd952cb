"""``oomload report --history RUN_DIR…``: one page of the runs in time order, so a team sees the
release where capacity moved.

Each run directory is judged afresh (as ``oomload report`` and ``oomload compare`` judge it:
``oomload.report.compareside.load_side``) and becomes one row:

- when it started (``provenance.json``; else its first step) and what it ran against — the server's
  own version (``/version``), else "simulated" or "not recorded" — and the trace's digest;
- the preemption onset ("none up to 16" without one: clean up to its highest level judged for
  preemption; "—" with no level judged, as with no ``/metrics`` scrape), the last safe concurrency,
  the KV pool in blocks, the engine's death (level and kind), and the P99 TTFT at one level
  (``--level``; by default the highest level at which every run answered requests in a trusted step),
  from the ok requests of its trusted steps.

Rows are sorted by start time. Between a run and the latest run before it on the same trace, sent
as the same traffic (``Verdict.traffic``: shared prefixes or distinct prompts, the trace's tail …, as
``compare`` asks), a *move* is named with the evidence ``compare`` uses
(``oomload.verdict.shift.onset_shift``): an onset that moved and is separated by the repeats of both
runs ("onset 10 → 8 at run r3 (vLLM 0.33.0), separated: Fisher p = 0.05"), one that moved without
that evidence ("not separated"), or one a run did not measure (``onset_shift``'s "not measured": no
onset, and no level judged as high as the other run's onset — "onset 8 → none up to 2 …, not
measured"); a pool that changed size; a death that appeared, went or moved, by
``compare``'s own rule (``oomload.report.compare.death_row``: a later run that survived only up to a
level below the earlier run's death, or died above every level that run tested, is *not measured*,
never a death that went or appeared). A run with
no such run before it is marked, and no move is read for it; runs of other traces between two of one
trace do not hide their move. A run with nothing to judge (``Verdict.failed_run``: its requests mostly
failed, as ``compare`` refuses it with exit 3) is marked so, shows no onset, last safe level or death
("—": not "none", which would read as clean), and is skipped as the run before another: "onset 8 →
none" across a server that answered nothing would read as a fix. Nor does it make the run after it a
run of "another trace" or "other traffic": only judged runs are looked at for that mark, so the first
judged run is marked for nothing, as the first run is. Several inputs may be run
directories or directories that hold run directories (one level down).

Outputs (``write_history``): the terminal table, ``history.json`` (schema ``oomload.history/1``),
``history.md`` and ``history.html`` (the onset, last safe level and pool per run, and the P99 TTFT,
drawn over the runs in order), written whole into ``--out`` (``oomload.outfile``).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from oomload.errors import ConfigError, OutputWriteError
from oomload.outfile import write_text
from oomload.report.compare import death_row
from oomload.report.compareside import RunSide, load_side
from oomload.report.plots import DPI, _png
from oomload.trace.stats import percentile
from oomload.verdict.relative import onset_steps
from oomload.verdict.shift import onset_cell, onset_shift

HISTORY_SCHEMA = "oomload.history/1"
HISTORY_FILES = {"json": "history.json", "md": "history.md", "html": "history.html"}


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One run of the history (module docstring)."""

    label: str
    path: str
    started_unix_s: float | None
    version: str
    trace_digest: str | None
    same_trace: bool  # the same trace as the first run
    onset: int | None
    judged_up_to: int | None  # the highest level judged for preemption: "none up to it" without an onset
    last_safe: int | None
    kv_blocks: int | None
    death: str | None  # "at 16 (cpu_oom)"
    p99_ttft_ms: float | None
    cut_short: bool
    moves: tuple[str, ...]  # what moved against the run before it (module docstring)
    nothing_to_judge: str | None = None  # the verdict's sentence when its requests mostly failed

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "path": self.path,
            "started_unix_s": self.started_unix_s,
            "version": self.version,
            "trace_sha256": self.trace_digest,
            "same_trace": self.same_trace,
            "preemption_onset": self.onset,
            "preemption_judged_up_to": self.judged_up_to,
            "last_safe_concurrency": self.last_safe,
            "kv_blocks": self.kv_blocks,
            "engine_death": self.death,
            "p99_ttft_ms": self.p99_ttft_ms,
            "cut_short": self.cut_short,
            "nothing_to_judge": self.nothing_to_judge,
            "moves": list(self.moves),
        }


@dataclass(frozen=True, slots=True)
class History:
    level: int | None  # the level of the P99 TTFT column
    rows: tuple[HistoryRow, ...]

    @property
    def moves(self) -> tuple[str, ...]:
        return tuple(m for r in self.rows for m in r.moves)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": HISTORY_SCHEMA,
            "p99_ttft_level": self.level,
            "runs": [r.to_json() for r in self.rows],
            "moves": list(self.moves),
        }


def find_runs(paths: Sequence[Path]) -> list[Path]:
    """The run directories named, or held one level down by a directory named; ``ConfigError`` with
    one sentence for a path that is neither, or when none is found."""
    runs: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise ConfigError(f"{path} is not a directory (give run directories, or a directory of them)")
        if _is_run(path):
            runs.append(path)
            continue
        held = sorted(p for p in path.iterdir() if p.is_dir() and _is_run(p))
        if not held:
            raise ConfigError(
                f"{path} is neither a run directory nor holds any (no config.json or steps.jsonl)"
            )
        runs.extend(held)
    unique = list(dict.fromkeys(p.resolve() for p in runs))
    if len(unique) < 2:
        raise ConfigError(f"a history needs at least two runs; found {len(unique)}")
    return unique


def _is_run(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "steps.jsonl").is_file()


def build_history(sides: Sequence[RunSide], level: int | None = None) -> History:
    """The rows of the runs in time order, with their moves (module docstring)."""
    ordered = sorted(sides, key=lambda s: (_started(s) or 0.0, s.label))
    if level is None:
        measured = [{c for c, by in s.samples.items() if by.get("ttft")} for s in ordered]
        common = set.intersection(*measured) if measured else set()
        level = max(common) if common else None
    first_digest = ordered[0].trace_digest if ordered else None
    rows: list[HistoryRow] = []
    for index, side in enumerate(ordered):
        same = side.trace_digest is not None and side.trace_digest == first_digest
        previous = next((p for p in reversed(ordered[:index]) if _comparable(p, side)), None)
        moves = _moves(previous, side) if previous is not None else ()
        judged_before = [p for p in ordered[:index] if p.verdict.failed_run is None]
        if side.verdict.failed_run is not None:
            moves = (f"{side.label} has nothing to judge: nothing is read from it",)
        elif previous is None and judged_before:  # the first judged run is the first, as the first run
            same_trace = any(p.trace_digest == side.trace_digest for p in judged_before)
            what = f"sent other traffic ({side.verdict.traffic})" if same_trace else "replayed another trace"
            moves = (f"{side.label} {what}: nothing is read across it",)
        s = side.summary
        ttft = side.samples.get(level, {}).get("ttft", ()) if level is not None else ()
        rows.append(
            HistoryRow(
                label=side.label,
                path=str(side.path),
                started_unix_s=_started(side),
                version=_version(side),
                trace_digest=side.trace_digest,
                same_trace=same,
                onset=None if s.preemption_onset is None else s.preemption_onset.concurrency,
                judged_up_to=side.verdict.preemption_judged_up_to,
                last_safe=s.last_safe_concurrency,
                kv_blocks=None if s.pool is None else s.pool.num_gpu_blocks,
                death=_death(side),
                p99_ttft_ms=percentile(ttft, 99) if ttft else None,
                cut_short=s.cut_short,
                moves=moves,
                nothing_to_judge=side.verdict.failed_run,
            )
        )
    return History(level, tuple(rows))


def _comparable(before: RunSide, after: RunSide) -> bool:
    """The same trace (digest) sent as the same traffic (``Verdict.traffic``), as ``compare`` asks."""
    return (
        after.trace_digest is not None
        and before.trace_digest == after.trace_digest
        and before.verdict.traffic == after.verdict.traffic
        and before.verdict.failed_run is None
    )


def _started(side: RunSide) -> float | None:
    if side.provenance is not None and side.provenance.started_unix_s is not None:
        return side.provenance.started_unix_s
    starts = [st.boundary.start_unix_s for st in side.view.steps]
    return min(starts) if starts else side.view.settings.started_unix_s


def _version(side: RunSide) -> str:
    p = side.provenance
    version = None if p is None else p.server_version
    if side.summary.simulated:  # the simulator answers /version with the version it mimics
        return "simulated" if version is None else f"simulated vLLM {version}"
    return "not recorded" if version is None else f"vLLM {version}"


def _death(side: RunSide) -> str | None:
    d = side.summary.death
    if d is None:
        return None
    where = "" if d.concurrency is None else f"at {d.concurrency} "
    return f"{where}({d.kind or 'unknown cause'})"


def _moves(before: RunSide, after: RunSide) -> tuple[str, ...]:
    """What moved from ``before`` to ``after``, with its evidence (module docstring)."""
    at = f"at {after.label} ({_version(after)})"
    moves: list[str] = []
    b_pool, a_pool = (
        None if s.summary.pool is None else s.summary.pool.num_gpu_blocks for s in (before, after)
    )
    if b_pool is not None and a_pool is not None and b_pool != a_pool:
        moves.append(f"KV pool {b_pool} → {a_pool} blocks {at}")
    b_onset, a_onset = (
        None if s.summary.preemption_onset is None else s.summary.preemption_onset.concurrency
        for s in (before, after)
    )
    if b_onset != a_onset:
        shift = onset_shift(onset_steps(before.verdict), b_onset, onset_steps(after.verdict), a_onset)
        evidence = (
            f"not measured: {shift.unmeasured_reason(before.label, after.label)}"
            if shift.direction == "not measured"
            else f"separated: Fisher p = {shift.p_value:.2g}"
            if shift.separated
            else "not separated by the repeats of both runs"
            if shift.separated is False
            else "no steps between the onsets in both runs"
        )
        b_cell, a_cell = onset_cell(b_onset, shift.base_top), onset_cell(a_onset, shift.new_top)
        moves.append(f"onset {b_cell} → {a_cell} {at}, {evidence}")
    death = death_row(before.summary, after.summary)
    if death.status != "unchanged":
        moves.append(f"engine death {death.base} → {death.new} {at}, {death.status}: {death.evidence}")
    return tuple(moves)


def _level(level: int | None) -> str:
    return "none" if level is None else str(level)


def _when(unix_s: float | None) -> str:
    if unix_s is None:
        return "—"
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _cells(r: HistoryRow) -> list[str]:
    judged = r.nothing_to_judge is None  # else no level of it is evidence: "—", never "none"
    mark = " (cut short)" if r.cut_short and judged else "" if judged else " (nothing to judge)"
    return [
        r.label + mark,
        _when(r.started_unix_s),
        r.version,
        (r.trace_digest or "—")[:12] + ("" if r.same_trace else " (other trace)"),
        onset_cell(r.onset, r.judged_up_to) if judged else "—",
        _level(r.last_safe) if judged else "—",
        _level(r.kv_blocks),
        (r.death or "none") if judged else "—",
        "—" if r.p99_ttft_ms is None else f"{r.p99_ttft_ms:.0f} ms",
    ]


def _headers(h: History) -> list[str]:
    ttft = "P99 TTFT" + ("" if h.level is None else f" @ {h.level}")
    return ["run", "started (UTC)", "server", "trace", "onset", "last safe", "KV blocks", "death", ttft]


def print_history(console: Console, h: History) -> None:
    table = Table(title="oomload history: the runs in time order")
    for name in _headers(h):
        table.add_column(name)
    for r in h.rows:
        table.add_row(*_cells(r))
    console.print(table)
    for move in h.moves or ("nothing moved between consecutive runs",):
        console.print(f"• {move}", highlight=False, markup=False)


def render_markdown(h: History) -> str:
    lines = ["# oomload history", "", "| " + " | ".join(_headers(h)) + " |", "|" + "---|" * len(_headers(h))]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |" for r in h.rows]
    lines += ["", "## What moved", ""]
    lines += [f"- {m}" for m in h.moves] or ["Nothing moved between consecutive runs."]
    return "\n".join(lines) + "\n"


def render_html(h: History) -> str:
    from oomload.report.html import CSS

    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>oomload history</title>',
        f"<style>{CSS}</style></head><body><h1>oomload history</h1>",
        '<table id="history"><tr>' + "".join(f'<th class="l">{e(x)}</th>' for x in _headers(h)) + "</tr>",
    ]
    for r in h.rows:
        out.append("<tr>" + "".join(f'<td class="l">{e(c)}</td>' for c in _cells(r)) + "</tr>")
    out.append("</table><h2>What moved</h2><ul>")
    out += [f"<li>{e(m)}</li>" for m in h.moves] or ["<li>Nothing moved between consecutive runs.</li>"]
    data = base64.b64encode(plot_history(h)).decode("ascii")
    out.append(f'</ul><img class="plot" id="plot-history" alt="history" src="data:image/png;base64,{data}">')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def plot_history(h: History) -> bytes:
    """Onset, last safe level and KV blocks per run (top), P99 TTFT per run (bottom), in run order."""
    fig = Figure(figsize=(11, 6), dpi=DPI)
    ax_cap, ax_ttft = fig.subplots(2, 1, sharex=True)
    x = list(range(len(h.rows)))
    for key, label, marker in (("onset", "preemption onset", "o-"), ("last_safe", "last safe", "s--")):
        points = [(i, getattr(r, key)) for i, r in zip(x, h.rows, strict=True) if getattr(r, key) is not None]
        ax_cap.plot([p[0] for p in points], [p[1] for p in points], marker, label=label)
    ax_cap.set_ylabel("concurrency")
    ax_blocks = ax_cap.twinx()
    blocks = [(i, r.kv_blocks) for i, r in zip(x, h.rows, strict=True) if r.kv_blocks is not None]
    ax_blocks.plot([p[0] for p in blocks], [p[1] for p in blocks], "^:", color="gray", label="KV blocks")
    ax_blocks.set_ylabel("KV blocks")
    ttft = [(i, r.p99_ttft_ms) for i, r in zip(x, h.rows, strict=True) if r.p99_ttft_ms is not None]
    ax_ttft.plot([p[0] for p in ttft], [p[1] for p in ttft], "o-", color="#d62728")
    ax_ttft.set_ylabel("P99 TTFT, ms" + ("" if h.level is None else f" @ {h.level}"))
    ax_ttft.set_xticks(x, [f"{r.label}\n{r.version}" for r in h.rows], fontsize=7)
    for ax in (ax_cap, ax_ttft):
        ax.grid(alpha=0.3)
    ax_cap.legend(loc="upper left", fontsize=7)
    ax_blocks.legend(loc="upper right", fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.93, top=0.95, bottom=0.14, hspace=0.15)
    return _png(fig)


def write_history(out_dir: Path, h: History, formats: Sequence[str] = tuple(HISTORY_FILES)) -> list[str]:
    """``history.json``, ``history.md`` and ``history.html`` (those of ``formats``) into ``out_dir``; the
    names written. ``OutputWriteError`` at the first that cannot be written, naming what was written
    before it."""
    written: list[str] = []
    for fmt, name in HISTORY_FILES.items():
        if fmt not in formats:
            continue
        if fmt == "json":
            text = json.dumps(h.to_json(), indent=2, allow_nan=False) + "\n"
        else:
            text = render_markdown(h) if fmt == "md" else render_html(h)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            write_text(out_dir / name, text)
        except (OutputWriteError, OSError) as err:
            why = err.reason if isinstance(err, OutputWriteError) else (err.strerror or type(err).__name__)
            raise OutputWriteError(
                f"cannot write {name} in {out_dir} ({why}); written before it: "
                f"{', '.join(written) or 'nothing'}; the run directories are untouched",
                out_dir / name,
                why,
            ) from err
        written.append(name)
    return written


def history_of(paths: Sequence[Path], level: int | None = None) -> History:
    """Find, judge and order the runs (``ConfigError`` with one sentence for bad input)."""
    return build_history([load_side(p) for p in find_runs(paths)], level)
