"""The report's plots, drawn with matplotlib's object API (no pyplot, no global state) into PNG bytes.

* ``plot_timeline`` — KV usage (with the 99 % saturation line), preemptions per scrape, running /
  waiting, and memory — the device's used (and total) and the server's own host memory (its cgroup's
  usage, else its process tree's RSS, with the cgroup's limit) on one axis — over seconds since the
  run started. Steps are shaded by phase (ramp
  blue, refinement orange, warmup grey) and labelled with their concurrency; the drain before a lower
  step (its requests in flight falling to the lower level; no step runs) is hatched; the preemption
  onset and the engine's death are vertical lines; one legend names every line and shade;
* ``plot_by_concurrency`` — TTFT, TPOT and end-to-end latency, each on its own axes at P50 and P99
  with the ok requests behind each point (``n=``), and throughput (req/s and output tok/s on two
  axes in two colours) against concurrency, onsets marked and named in the legends;
* ``plot_lengths`` — the trace's prompt / output / total length histograms (requests per bin) with
  the P99 and the recommended ``max_model_len``.

Counts (preemptions, requests) get whole-number ticks. Each figure has fixed margins
(``subplots_adjust``), not ``tight_layout``: that measured every text once more before the drawing,
and was a third of the plots' time (the demo's three figures, 5 alternating runs on a busy 2-core
machine: median 3.8 s with it, 2.5 s without).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedFormatter, FixedLocator, MaxNLocator, NullLocator

from oomload.verdict import KV_SATURATED, Verdict
from oomload.verdict.recommend import Recommendation
from oomload.verdict.runview import RunView
from oomload.verdict.stepfacts import LatencyStats

DPI = 96
SHADES = {"ramp": ("#e8eef7", "#d9e3f2"), "refine": ("#f7eadb", "#f0dcc3"), "warmup": ("#eeeeee", "#e4e4e4")}
LABEL_COLORS = {"ramp": "#1f4e89", "refine": "#a35200", "warmup": "#555555"}
DRAIN_HATCH = "////"
ONSET_COLOR, DEATH_COLOR, SAFE_COLOR = "#d62728", "black", "#2ca02c"
REQ_COLOR, TOK_COLOR = "#1f77b4", "#ff7f0e"
HOST_COLOR = "#8c564b"


def plot_timeline(view: RunView, verdict: Verdict) -> bytes:
    fig = Figure(figsize=(11, 9), dpi=DPI)
    axes = fig.subplots(4, 1, sharex=True)
    t0 = _t0(view)
    ok = [m for m in view.metrics if m.ok]
    t = [m.t_unix_s - t0 for m in ok]

    def series(values: Iterable[float | None]) -> list[float]:
        return [float("nan") if v is None else float(v) for v in values]

    ax_kv, ax_pre, ax_q, ax_mem = axes
    ax_kv.plot(t, [v * 100 for v in series(m.kv_cache_usage for m in ok)], color="#1f77b4", marker=".", lw=1)
    ax_kv.axhline(KV_SATURATED * 100, color="red", ls=":", lw=1)
    ax_kv.set_ylabel("KV usage %")
    ax_kv.set_ylim(0, 105)
    ax_pre.bar(
        t, series(m.preemptions_delta for m in ok), width=max(_spacing(t) * 0.8, 0.05), color="#d62728"
    )
    ax_pre.set_ylabel("preemptions\nper scrape")
    ax_pre.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_pre.set_ylim(bottom=0)
    ax_q.plot(t, series(m.num_requests_running for m in ok), color="#2ca02c", lw=1)
    ax_q.plot(t, series(m.num_requests_waiting for m in ok), color="#ff7f0e", lw=1)
    ax_q.set_ylabel("requests")
    ax_q.yaxis.set_major_locator(MaxNLocator(integer=True))
    has_total = _plot_memory(ax_mem, view, t0)
    ax_mem.set_xlabel("seconds since the run started")
    phases: set[str] = set()
    drained = False
    for ax in axes:
        phases, drained = _shade_steps(ax, view, t0, label=ax is ax_kv)
        ax.grid(alpha=0.3)
    marks = _time_marks(verdict, t0)
    for ax in axes:
        for x, style in marks:
            ax.axvline(x, **style)
    handles: list[Artist] = [
        Line2D([], [], color="#1f77b4", marker=".", lw=1, label="KV usage"),
        Line2D([], [], color="red", ls=":", lw=1, label=f"{KV_SATURATED:.0%} KV (saturation)"),
        Patch(color="#d62728", label="preemptions"),
        Line2D([], [], color="#2ca02c", lw=1, label="running"),
        Line2D([], [], color="#ff7f0e", lw=1, label="waiting"),
    ]
    if view.gpu:
        handles.append(Line2D([], [], color="#9467bd", lw=1, label="device memory used"))
    if has_total:
        handles.append(Line2D([], [], color="grey", ls="--", lw=1, label="device total"))
    if any(h.used_bytes is not None for h in view.server_memory):
        handles.append(Line2D([], [], color=HOST_COLOR, lw=1, label="server host memory"))
    if any(h.cgroup_limit_bytes is not None for h in view.server_memory):
        handles.append(Line2D([], [], color=HOST_COLOR, ls="--", lw=1, label="server memory limit"))
    handles += [Line2D([], [], **style) for _, style in marks]
    for phase, name in (("ramp", "ramp step"), ("refine", "refinement step"), ("warmup", "warmup")):
        if phase in phases:
            handles.append(Patch(facecolor=SHADES[phase][0], edgecolor="#bbb", label=f"{name} (concurrency)"))
    if drained:
        handles.append(
            Patch(facecolor="white", edgecolor="#aaa", hatch=DRAIN_HATCH, label="drain before a lower step")
        )
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("Memory pressure over time (steps shaded and labelled with their concurrency)")
    fig.subplots_adjust(left=0.07, right=0.98, top=0.925, bottom=0.13, hspace=0.12)
    return _png(fig)


def _plot_memory(ax: Axes, view: RunView, t0: float) -> bool:
    """Device memory used (and its total) and the server's host memory (and its cgroup's limit) on
    one axis, in GiB; returns whether a device total was drawn."""
    has_total = False
    if view.gpu:
        tg = [g.t_unix_s - t0 for g in view.gpu]
        ax.plot(tg, [float(g.used_bytes or 0) / 2**30 for g in view.gpu], color="#9467bd", lw=1)
        totals = [float(g.total_bytes) / 2**30 for g in view.gpu if g.total_bytes is not None]
        if totals:
            ax.axhline(max(totals), color="grey", ls="--", lw=1)
            has_total = True
    host = [h for h in view.server_memory if h.used_bytes is not None]
    if host:
        th = [h.t_unix_s - t0 for h in host]
        ax.plot(th, [float(h.used_bytes or 0) / 2**30 for h in host], color=HOST_COLOR, lw=1)
        limits = [h.cgroup_limit_bytes for h in host if h.cgroup_limit_bytes is not None]
        if limits:
            ax.axhline(float(max(limits)) / 2**30, color=HOST_COLOR, ls="--", lw=1)
    if not view.gpu and not host:
        ax.text(0.5, 0.5, "no memory samples", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("memory GiB" if host else "device GiB")
    return has_total


def _time_marks(verdict: Verdict, t0: float) -> list[tuple[float, dict[str, Any]]]:
    """The onset and the death as (seconds since t0, line style with its legend label)."""
    marks: list[tuple[float, dict[str, Any]]] = []
    onset = verdict.preemption_onset
    if onset is not None and onset.t_unix_s is not None:
        label = f"preemption onset (concurrency {onset.concurrency})"
        marks.append((onset.t_unix_s - t0, {"color": ONSET_COLOR, "lw": 1.2, "ls": "-.", "label": label}))
    death = verdict.engine_death
    if death is not None and death.t_unix_s is not None:
        marks.append(
            (death.t_unix_s - t0, {"color": DEATH_COLOR, "lw": 1.5, "ls": "--", "label": "engine death"})
        )
    return marks


def plot_by_concurrency(verdict: Verdict) -> bytes:
    return _png(figure_by_concurrency(verdict))


def figure_by_concurrency(verdict: Verdict) -> Figure:
    """TTFT, TPOT, e2e latency (each its own axes, P50 and P99, ``n=`` per point), throughput, and the
    rates per level — preemptions per 100 requests beside the trace's odds, the share of scrapes with
    requests waiting and with a saturated KV pool — against concurrency; ticks at the measured
    levels, onsets marked."""
    fig = Figure(figsize=(11, 11), dpi=DPI)
    (ax_ttft, ax_tpot), (ax_e2e, ax_thr), (ax_pre, ax_share) = fig.subplots(3, 2)
    steps = sorted((s for s in verdict.measured_steps if s.requests), key=lambda s: s.concurrency)
    c = [s.concurrency for s in steps]
    latencies = (
        (ax_ttft, "TTFT (time to first token)", [s.ttft for s in steps], "#1f77b4"),
        (ax_tpot, "TPOT (mean inter-token latency)", [s.tpot for s in steps], "#9467bd"),
        (ax_e2e, "End-to-end latency", [s.e2e for s in steps], "#8c564b"),
    )
    for ax, title, stats, color in latencies:
        _plot_latency(ax, c, stats, color)
        ax.set_title(title, fontsize=10)
    req = [(x, s.req_per_s) for x, s in zip(c, steps, strict=True) if s.req_per_s is not None]
    tok = [
        (x, s.output_tokens_per_s) for x, s in zip(c, steps, strict=True) if s.output_tokens_per_s is not None
    ]
    if req:
        ax_thr.plot([p[0] for p in req], [p[1] for p in req], "o-", color=REQ_COLOR, label="req/s")
    ax_tok = ax_thr.twinx()
    if tok:
        ax_tok.plot([p[0] for p in tok], [p[1] for p in tok], "s--", color=TOK_COLOR, label="output tok/s")
    ax_thr.set_ylabel("requests/s", color=REQ_COLOR)
    ax_thr.tick_params(axis="y", colors=REQ_COLOR)
    ax_tok.set_ylabel("output tokens/s", color=TOK_COLOR)
    ax_tok.tick_params(axis="y", colors=TOK_COLOR)
    ax_thr.set_ylim(bottom=0)
    ax_tok.set_ylim(bottom=0)
    ax_thr.set_title("Throughput while each step held (the steps.jsonl end line)", fontsize=10)
    _plot_rates(ax_pre, ax_share, verdict)
    for ax in (ax_ttft, ax_tpot, ax_e2e, ax_thr, ax_pre, ax_share):
        ax.set_xlabel("concurrency")
        if c and min(c) > 0 and max(c) / min(c) >= 8:
            ax.set_xscale("log", base=2)
        _level_ticks(ax, sorted(set(c)))
        _mark_onsets(ax, verdict)
        ax.grid(alpha=0.3)
    axes_and_twins = ((ax_ttft, None), (ax_tpot, None), (ax_e2e, None), (ax_thr, ax_tok), (ax_pre, None))
    for ax, extra in (*axes_and_twins, (ax_share, None)):
        handles, labels = ax.get_legend_handles_labels()
        if extra is not None:
            more_handles, more_labels = extra.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
        if handles:
            ax.legend(handles, labels, loc="upper left", fontsize=7)
    fig.suptitle("Latency, throughput and preemption against concurrency (n = ok requests behind each point)")
    fig.subplots_adjust(left=0.07, right=0.92, top=0.94, bottom=0.05, hspace=0.3, wspace=0.32)
    return fig


def _plot_rates(ax_pre: Axes, ax_share: Axes, verdict: Verdict) -> None:
    """Per level: preemptions per 100 requests seen and by the trace's odds; waiting and KV ≥ 99 %."""
    levels = verdict.level_summaries
    seen = [(lv.concurrency, lv.preemptions_per_100) for lv in levels if lv.preemptions_per_100 is not None]
    odds = [(lv.concurrency, lv.odds.per_100) for lv in levels if lv.odds is not None]
    if seen:
        ax_pre.plot([x for x, _ in seen], [y for _, y in seen], "o-", color=ONSET_COLOR, label="seen")
        for lv in levels:
            if lv.preemptions_per_100 is not None and lv.steps > 1:
                ax_pre.annotate(f"{lv.steps_preempted}/{lv.steps_with_metrics}",
                                (lv.concurrency, lv.preemptions_per_100), textcoords="offset points",
                                xytext=(0, 5), ha="center", fontsize=7, color="#444")  # fmt: skip
    if odds:
        ax_pre.plot([x for x, _ in odds], [y for _, y in odds], "s--", color="#7f7f7f", label="trace's odds")
    ax_pre.set_ylabel("preemptions per 100 requests")
    ax_pre.set_ylim(bottom=0)
    ax_pre.set_title("Preemption rate (k/n: steps that preempted of those measured)", fontsize=10)
    for key, label, color in (
        ("waiting_share", "requests waiting", "#ff7f0e"),
        ("kv_saturated_share", "KV ≥ 99 %", "#2ca02c"),
    ):
        points = [(lv.concurrency, 100 * v) for lv in levels if (v := getattr(lv, key)) is not None]
        if points:
            ax_share.plot([x for x, _ in points], [y for _, y in points], "o-", color=color, label=label)
    ax_share.set_ylabel("% of scrapes")
    ax_share.set_ylim(0, 105)
    ax_share.set_title("Share of /metrics scrapes with requests waiting, and with KV ≥ 99 %", fontsize=10)


def _plot_latency(ax: Axes, levels: Sequence[int], stats: Sequence[LatencyStats], color: str) -> None:
    """P50 (solid) and P99 (dashed) of one latency, in ms or s by its size, ``n=`` over each P99."""
    known = [
        (x, s) for x, s in zip(levels, stats, strict=True) if s.p50_ms is not None and s.p99_ms is not None
    ]
    top = max((s.p99_ms or 0.0 for _, s in known), default=0.0)
    scale, unit = (1000.0, "s") if top >= 1000 else (1.0, "ms")
    xs = [x for x, _ in known]
    p50 = [(s.p50_ms or 0.0) / scale for _, s in known]
    p99 = [(s.p99_ms or 0.0) / scale for _, s in known]
    if known:
        ax.plot(xs, p50, "o-", color=color, label="P50")
        ax.plot(xs, p99, "s--", color=color, alpha=0.7, label="P99")
        for x, y, (_, s) in zip(xs, p99, known, strict=True):
            ax.annotate(f"n={s.count}", (x, y), textcoords="offset points", xytext=(0, 5),
                        ha="center", fontsize=7, color="#444")  # fmt: skip
    else:
        ax.text(0.5, 0.5, "no ok request", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0, top=(max(p99) * 1.18) if p99 and max(p99) > 0 else None)


def plot_lengths(view: RunView, verdict: Verdict, recommendation: Recommendation) -> bytes:
    fig = Figure(figsize=(11, 3.6), dpi=DPI)
    axes = fig.subplots(1, 3)
    summaries = (verdict.trace_prompt, verdict.trace_output, verdict.trace_total)
    advice = recommendation.max_model_len_advice
    samples = (view.trace_prompt_tokens, view.trace_output_tokens, view.trace_total_tokens)
    for ax, title, sample, summary in zip(
        axes, ("prompt tokens", "output tokens", "total tokens"), samples, summaries, strict=True
    ):
        if sample:
            ax.hist(sample, bins=40, color="#1f77b4", alpha=0.8)
        else:
            ax.text(0.5, 0.5, "no trace lengths", ha="center", va="center", transform=ax.transAxes)
        if summary is not None:
            ax.axvline(summary.p99, color="orange", ls="--", lw=1.2, label=f"P99 {summary.p99:.0f}")
        ax.set_title(title)
        ax.set_xlabel("tokens per request")
        ax.set_ylabel("requests")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    recommended = recommendation.max_model_len.value
    if recommended is not None:  # a kept or KV-capped limit is no recommendation (verdict/recommend.py)
        axes[2].axvline(recommended, color="red", lw=1.5, label=f"recommended max_model_len {recommended}")
    if advice is not None and advice.current_max_model_len is not None:
        axes[2].axvline(
            advice.current_max_model_len,
            color="grey",
            ls=":",
            lw=1.2,
            label=f"current {advice.current_max_model_len}",
        )
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    fig.subplots_adjust(left=0.07, right=0.99, top=0.91, bottom=0.14, wspace=0.24)
    return _png(fig)


def _shade_steps(ax: Axes, view: RunView, t0: float, *, label: bool) -> tuple[set[str], bool]:
    """Shade each step by phase, hatch the drain before the next step, label the concurrency.
    Returns the phases drawn and whether a drain was."""
    phases: set[str] = set()
    drained = False
    steps = view.steps
    last_text_x, level = None, 0
    span = max(1e-9, _t_end(view) - t0)
    for i, step in enumerate(steps):
        b = step.boundary
        end = (
            b.end_unix_s
            if b.end_unix_s is not None
            else (view.metrics[-1].t_unix_s if view.metrics else b.start_unix_s)
        )
        phase = b.phase if b.phase in SHADES else "ramp"
        phases.add(phase)
        ax.axvspan(
            b.start_unix_s - t0, float(end) - t0, color=SHADES[phase][i % 2], alpha=0.9, lw=0, zorder=0
        )
        following = steps[i + 1].boundary.start_unix_s if i + 1 < len(steps) else None
        if following is not None and following - float(end) > 1e-3:
            drained = True
            ax.axvspan(float(end) - t0, following - t0, facecolor="white", edgecolor="#bbbbbb",
                       hatch=DRAIN_HATCH, lw=0, zorder=0)  # fmt: skip
        if label:
            x = (b.start_unix_s + float(end)) / 2 - t0
            # neighbouring labels closer than 3 % of the time axis take turns on two heights
            level = 1 - level if last_text_x is not None and (x - last_text_x) / span < 0.03 else 0
            last_text_x = x
            text = str(b.concurrency) + ("r" if phase == "refine" else "w" if phase == "warmup" else "")
            ax.text(x, 1.0 + 0.09 * level, text, transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=7, color=LABEL_COLORS[phase])  # fmt: skip
    return phases, drained


def _t_end(view: RunView) -> float:
    ends = [s.boundary.end_unix_s or s.boundary.start_unix_s for s in view.steps]
    ends += [m.t_unix_s for m in view.metrics[-1:]]
    return max(ends) if ends else 0.0


def _level_ticks(ax: Axes, levels: Sequence[int]) -> None:
    """Plain integer ticks at the measured levels (not 2^k, no minor ticks)."""
    if not levels:
        return
    ax.xaxis.set_major_locator(FixedLocator([float(c) for c in levels]))
    ax.xaxis.set_major_formatter(FixedFormatter([str(c) for c in levels]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=8)


def _mark_onsets(ax: Axes, verdict: Verdict) -> None:
    onset, death, safe = verdict.preemption_onset, verdict.engine_death, verdict.last_safe_concurrency
    if onset is not None:
        ax.axvline(onset.concurrency, color=ONSET_COLOR, ls="-.", lw=1.2,
                   label=f"preemption onset ({onset.concurrency})")  # fmt: skip
    if death is not None and death.concurrency is not None:
        ax.axvline(
            death.concurrency, color=DEATH_COLOR, ls="--", lw=1.2, label=f"engine death ({death.concurrency})"
        )
    if safe is not None:
        ax.axvline(safe, color=SAFE_COLOR, ls=":", lw=1.2, label=f"last safe ({safe})")


def _t0(view: RunView) -> float:
    starts = [s.boundary.start_unix_s for s in view.steps]
    started = view.settings.started_unix_s
    candidates = [*starts, *(m.t_unix_s for m in view.metrics[:1])]
    if started is not None:
        candidates.append(started)
    return min(candidates) if candidates else 0.0


def _spacing(t: Sequence[float]) -> float:
    if len(t) < 2:
        return 1.0
    gaps = sorted(b - a for a, b in itertools.pairwise(t) if b > a)
    return gaps[len(gaps) // 2] if gaps else 1.0


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
