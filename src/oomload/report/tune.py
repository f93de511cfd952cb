"""A tune's reports: the terminal table, ``tune.md``, ``tune.html`` (with a plot of the candidates).

Every output shows the same things, from one ``TuneRecord`` (``tune.json``): the winning
``vllm serve …`` line (shell-quoted), the ready ``--gate`` rules, and one row per candidate — its
flags, the rule that chose it, started or why not (the server's own words), the free device memory
before its start, the KV blocks it got, the odds' predicted onsets — production-shaped (the trace's
shared prefixes held once; "no shared prefixes" when the trace carries none) and worst case (every
prompt distinct) — and the replay's observed one,
throughput and TTFT p99 at the target, and the evidence (requests sent, preemptions seen). The plot:
per candidate, the KV pool (bars), ``max_num_seqs`` and the predicted / observed onsets against the
target; a candidate that did not start is labelled so.

``oomload report TUNE_DIR`` re-renders them from ``tune.json`` (``render_tune_dir``); each started
candidate's ``candidates/NN/run`` is an ordinary run directory that ``oomload report`` re-renders too.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from oomload.errors import ConfigError, OutputWriteError
from oomload.outfile import write_text
from oomload.tune.record import TuneRecord
from oomload.tune.search import Candidate, Proof

NO_SHARING = " (no shared prefixes)"  # the production-shaped onset of a trace without hash_ids
TUNE_JSON = "tune.json"
TUNE_MD = "tune.md"
TUNE_HTML = "tune.html"
COLUMNS = (
    "#",
    "flags",
    "started",
    "why not / rule",
    "free GiB",
    "KV blocks",
    "predicted onset (production)",
    "predicted onset (worst case)",
    "observed onset",
    "tok/s",
    "TTFT p99",
    "evidence",
)


def is_tune_dir(path: Path) -> bool:
    return (path / TUNE_JSON).is_file()


def lost_tune_json(path: Path) -> bool:
    """A tune directory without its ``tune.json`` (deleted, never written): ``candidates/`` and no
    ``config.json`` of a replay's run directory."""
    return not is_tune_dir(path) and (path / "candidates").is_dir() and not (path / "config.json").exists()


def load_tune_record(path: Path) -> TuneRecord:
    """The tune directory's record; ``ConfigError`` with one sentence naming ``tune.json`` and what is
    wrong with it when it cannot be read, is not JSON or is damaged (``TuneRecord.from_json``)."""
    file = path / TUNE_JSON
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{file} is not UTF-8 text (byte {err.start}): a damaged tune record") from err
    except OSError as err:
        raise ConfigError(f"cannot read {file}: {err.strerror or err}") from err
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{file} is not JSON ({err.msg} at line {err.lineno}, column {err.colno}): a damaged tune record"
        ) from err
    try:
        return TuneRecord.from_json(doc)
    except (ValueError, RecursionError) as err:
        raise ConfigError(f"{file} is a damaged tune record: {err}") from err


def render_tune_dir(path: Path, console: Console) -> int:
    """``oomload report TUNE_DIR``: re-render the tune's reports; exit as the record proves
    (``TuneRecord.verdict_exit_code``): 0 a winner, 1 a search that ended with none, 4 one that did not
    end (interrupted, stopped by an error, its process killed) or stopped without evidence."""
    record = load_tune_record(path)
    write_tune_reports(path, record, console)
    return record.verdict_exit_code()


def write_tune_reports(path: Path, record: TuneRecord, console: Console) -> None:
    """Terminal table, ``tune.md`` and ``tune.html`` (``tune.json`` is the runner's). Each file is
    written whole (``oomload.outfile``); one that cannot be is ``OutputWriteError`` naming it and what
    is kept (one sentence, exit 2)."""
    print_tune(record, console)
    kept = [TUNE_JSON]
    for name, render in ((TUNE_MD, render_markdown), (TUNE_HTML, render_html)):
        try:
            write_text(path / name, render(record))
        except OutputWriteError as err:
            raise OutputWriteError(
                f"cannot write {name} in the tune directory {path} ({err.reason}); {', '.join(kept)} "
                f"and the candidates' files are kept as they were — {err.remedy}, then "
                f"`oomload report {path}` writes {TUNE_MD} and {TUNE_HTML}",
                err.path,
                err.reason,
                err.remedy,
            ) from err
        kept.append(name)
    console.print(f"wrote {TUNE_JSON}, {TUNE_MD}, {TUNE_HTML} in {path}")


def rows(record: TuneRecord) -> list[list[str]]:
    return [_row(c, record.target_concurrency) for c in record.candidates]


def _row(c: Candidate, goal: int | None) -> list[str]:
    target = goal or c.settings.max_num_seqs or 1
    free = "—" if c.free_device_bytes is None else f"{c.free_device_bytes / 1024**3:.1f}"
    if not c.started:
        why = "" if c.failure is None else f"{c.failure.reason}: {c.failure.message}"
        return [
            str(c.index),
            c.settings.label(),
            "no",
            f"{why} [rule: {c.rule}]",
            free,
            "—",
            "—",
            "—",
            "—",
            "—",
            "—",
            "—",
        ]
    p = c.proof
    if p is None:  # interrupted, or a rate that measured nothing: its pool, when it was read
        blocks = "—" if c.num_gpu_blocks is None else f"{c.num_gpu_blocks} × {c.block_size}"
        return [str(c.index), c.settings.label(), "yes", c.rule, free, blocks, *("—",) * 5, "not proved"]
    predicted = _onset(p.predicted_onset, target)
    if p.prompts != "production":
        predicted += NO_SHARING
    observed = "none" if p.observed_onset is None else str(p.observed_onset)
    verdict = _verdict(p)
    return [
        str(c.index),
        c.settings.label(),
        "yes",
        c.rule,
        free,
        "?" if p.num_gpu_blocks is None else f"{p.num_gpu_blocks} × {p.block_size}",
        predicted,
        _onset(p.predicted_onset_worst_case, target),
        observed,
        "—" if p.throughput_tokens_per_s is None else f"{p.throughput_tokens_per_s:.0f}",
        "—" if p.ttft_p99_ms is None else f"{p.ttft_p99_ms:.0f} ms",
        f"{verdict}: {p.evidence}",
    ]


STARVED_MARK = "*"  # the terminal's short "(the load host limits)", explained under its table


def _verdict(p: Proof, *, short: bool = False) -> str:
    """``carries``, ``rejected`` (preempted, died, SLO, overflow) or ``no evidence`` (the step held
    neither the target nor its cap: no verdict, search rule 5), with the load host when it limited
    (``short``: marked ``STARVED_MARK``, for an 80-column table)."""
    if p.no_evidence:
        if not p.starved:
            return "no evidence"
        return f"no evidence{STARVED_MARK}" if short else "no evidence (the load host limits)"
    return "carries" if p.carries else "rejected"


def _onset(value: int | None, target: int) -> str:
    return f"none ≤ {2 * target}" if value is None else str(value)


def _headline(record: TuneRecord) -> list[str]:
    rate = record.rate
    lines = [] if rate is None else [f"Target rate {rate.sentence()}"]
    lines += [
        f"{_goal(record)} · {len(record.candidates)} of at most "
        f"{record.max_starts} starts · status {record.status}"
    ]
    if record.winner_line is not None:
        lines.append(f"Winner (candidate {record.winner_index}): {record.winner_line}")
        lines.append("Gate: " + " ".join(f"--gate '{g}'" for g in record.gate_rules()))
    else:
        lines.append(
            "No winner: the tune stopped without evidence (the last note says why)."
            if record.status == "no_evidence"
            else _no_carrier(record)
        )
    lines.extend(record.notes)
    return lines


# The terminal table's columns: (header, may wrap). Every header fits on one line; only the flags and the
# verdict wrap, so the table fits an 80-column CI log (the pages keep COLUMNS' full names).
TERMINAL_COLUMNS = (
    ("#", False),
    ("flags", True),
    ("started", False),
    ("KV blocks", False),
    ("prod.", False),
    ("worst", False),
    ("seen", False),
    ("tok/s", False),
    ("TTFT p99", False),
    ("verdict", True),
)


def print_tune(record: TuneRecord, console: Console) -> None:
    """A compact table (one line per candidate), then each candidate's rule and evidence in words."""
    table = Table(
        title="oomload tune: candidates (onsets: prod. = predicted with the trace's shared prefixes, "
        "worst = predicted with nothing shared, seen = observed)",
        box=box.SIMPLE_HEAD,
        padding=0,  # the box's one-space divider alone
        show_edge=False,
    )
    for name, wraps in TERMINAL_COLUMNS:
        words = name in ("flags", "started", "verdict")  # the rest are numbers: right-justified
        table.add_column(name, no_wrap=not wraps, min_width=len(name), justify="left" if words else "right")
    for c, row in zip(record.candidates, rows(record), strict=True):
        verdict = (
            "no start"
            if not c.started
            else "not proved"
            if c.proof is None
            else _verdict(c.proof, short=True)
        )
        cells = [cell.replace(NO_SHARING, "") for cell in row[5:11]]
        table.add_row(*(escape(cell) for cell in (row[0], _short(c), row[2], *cells, verdict)))
    console.print(table)
    if any(NO_SHARING in row[6] for row in rows(record)):
        console.print("  prod.: the trace carries no shared prefixes (= worst case)")
    if any(c.proof is not None and c.proof.no_evidence and c.proof.starved for c in record.candidates):
        console.print(f"  {STARVED_MARK}: the load host limits, not the server (its line below says how)")
    for c in record.candidates:
        why = c.failure.message if c.failure is not None else (c.proof.evidence if c.proof else "not proved")
        console.print(f"  #{c.index} {escape(c.rule)}: {escape(why)}", soft_wrap=True)
    for line in _headline(record):
        console.print(escape(line), soft_wrap=True)


def render_markdown(record: TuneRecord) -> str:
    out = ["# oomload tune", ""]
    out.append(f"Served: `{_md(record.serve_line)}` · trace `{_md(record.trace_path)}`")
    out.append("")
    if record.winner_line is not None:
        out += [
            "## Winner",
            "",
            "```sh",
            record.winner_line,
            "```",
            "",
            "Gate rules that keep it true in CI:",
            "",
        ]
        out += ["```sh", " ".join(f"--gate '{g}'" for g in record.gate_rules()), "```", ""]
    out += ["## Summary", ""] + [f"- {_md(line)}" for line in _headline(record)] + [""]
    out += ["## Candidates", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows(record):
        out.append("| " + " | ".join(_md(cell) for cell in row) + " |")
    return "\n".join(out) + "\n"


def render_html(record: TuneRecord) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows(record)
    )
    winner = (
        f"<h2>Winner</h2><pre>{html.escape(record.winner_line)}</pre><h3>Gate rules</h3><pre>"
        + html.escape(" ".join(f"--gate '{g}'" for g in record.gate_rules()))
        + "</pre>"
        if record.winner_line is not None
        else ""
    )
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in _headline(record))
    png = base64.b64encode(plot_candidates(record)).decode("ascii")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>oomload tune</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 6px;font-size:13px;vertical-align:top}</style></head><body>"
        f"<h1>oomload tune</h1><p>Served: <code>{html.escape(record.serve_line)}</code></p>{winner}"
        f"<ul>{summary}</ul><h2>Candidates</h2><table><tr>{head}</tr>{body}</table>"
        f"<h2>Plot</h2><img alt='candidates' src='data:image/png;base64,{png}'></body></html>\n"
    )


def plot_candidates(record: TuneRecord) -> bytes:
    """KV blocks per candidate (bars), its max_num_seqs, predicted and observed onsets, the target."""
    fig = Figure(figsize=(8, 3.6), dpi=96)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = [c.index for c in record.candidates]
    blocks = [(c.proof.num_gpu_blocks if c.proof else c.num_gpu_blocks) or 0 for c in record.candidates]
    colors = [
        "#c44"
        if not c.started
        else ("#4a4" if c.carries else ("#999" if c.proof is not None and c.proof.no_evidence else "#e90"))
        for c in record.candidates
    ]
    ax.bar(
        xs,
        blocks,
        color=colors,
        alpha=0.5,
        label="KV blocks (green carries, orange rejected, grey no evidence)",
    )
    for c in record.candidates:
        if not c.started:
            ax.annotate("did not\nstart", (c.index, 0), ha="center", va="bottom", color="#c44", fontsize=8)
    ax.set_xlabel("candidate")
    ax.set_ylabel("KV blocks")
    ax.set_xticks(xs or [0])
    ax2 = ax.twinx()
    pred = [
        (c.index, c.proof.predicted_onset) for c in record.candidates if c.proof and c.proof.predicted_onset
    ]
    obs = [(c.index, c.proof.observed_onset) for c in record.candidates if c.proof and c.proof.observed_onset]
    worst = [
        (c.index, c.proof.predicted_onset_worst_case)
        for c in record.candidates
        if c.proof and c.proof.prompts == "production" and c.proof.predicted_onset_worst_case
    ]
    if pred:
        ax2.plot(*zip(*pred, strict=True), "o", color="#15a", label="predicted onset (odds, production)")
    if worst:
        ax2.plot(*zip(*worst, strict=True), "v", color="#79c", label="predicted onset (worst case)")
    seqs = [(c.index, c.settings.max_num_seqs) for c in record.candidates if c.settings.max_num_seqs]
    if seqs:
        ax2.plot(*zip(*seqs, strict=True), "_", color="#333", markersize=18, label="max_num_seqs")
    if obs:
        ax2.plot(*zip(*obs, strict=True), "x", color="#a00", markersize=10, label="observed onset")
    if record.target_concurrency is not None:
        ax2.axhline(record.target_concurrency, color="#555", linestyle="--", label="target concurrency")
    ax2.set_ylabel("concurrency")
    top = [2 * (record.target_concurrency or 1), *[v for _, v in pred + worst + obs + seqs]]
    ax2.set_ylim(0, max(top) + 1)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(handles, labels, fontsize=7, loc="upper right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


SHORT = {
    "--gpu-memory-utilization": "util",
    "--num-gpu-blocks-override": "blocks",
    "--kv-cache-memory-bytes": "kv-bytes",
    "--max-model-len": "len",
    "--max-num-seqs": "seqs",
    "--max-num-batched-tokens": "batched",
    "--enforce-eager": "eager",
    "--enable-prefix-caching": "prefix-cache",
    "--no-enable-prefix-caching": "no-prefix-cache",
}


def _short(c: Candidate) -> str:
    """The flags in a few characters, for the terminal table (the pages keep vLLM's names)."""
    return " ".join(
        SHORT.get(flag, flag) if value is None else f"{SHORT.get(flag, flag)} {value}"
        for flag, value in c.settings.flags()
    )


def _goal(record: TuneRecord) -> str:
    if record.target_rate_rps is not None:
        measured = "" if record.target_concurrency is None else f" (concurrency {record.target_concurrency})"
        return f"Target rate {record.target_rate_rps:g} req/s{measured}"
    if record.target_concurrency is None:
        return "No target: each candidate proved at its own max_num_seqs"
    return f"Target concurrency {record.target_concurrency}"


def _no_carrier(record: TuneRecord) -> str:
    """The headline when nothing carried: the goal inside a sentence (without a target each candidate
    was proved at its own max_num_seqs), and, for a tune interrupted, that it did not finish."""
    if record.target_concurrency is None and record.target_rate_rps is None:
        goal = "its own max_num_seqs (no target)"
    else:
        goal = f"the {_lower_first(_goal(record))}"
    if record.status == "interrupted":
        return f"No winner yet: the tune was interrupted before a candidate carried {goal}."
    return f"No candidate carried {goal}."


def _lower_first(text: str) -> str:
    """``Target concurrency 8`` as it reads inside a sentence: ``target concurrency 8``."""
    return text[:1].lower() + text[1:]


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
