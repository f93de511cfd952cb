"""The report's plots, drawn with matplotlib's object API (no pyplot, no global state) into PNG bytes.

* ``plot_timeline`` — KV usage, preemptions per scrape, running / waiting, device memory used, over
  seconds since the run started, with each step shaded and labelled by its concurrency;
* ``plot_by_concurrency`` — TTFT / e2e latency and throughput against concurrency, onsets marked;
* ``plot_lengths`` — the trace's prompt / output / total length histograms with the P99 and the
  recommended ``max_model_len``.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

from oomload.recommend import Recommendation
from oomload.runview import RunView
from oomload.verdict import Verdict

DPI = 96
SHADES = ("#e8eef7", "#f7f0e8")


def plot_timeline(view: RunView, verdict: Verdict) -> bytes:
    fig = Figure(figsize=(11, 8.5), dpi=DPI)
    axes = fig.subplots(4, 1, sharex=True)
    t0 = _t0(view)
    ok = [m for m in view.metrics if m.get("ok")]
    t = [float(m["t_unix_s"]) - t0 for m in ok]

    def series(key: str) -> list[float]:
        return [float(m[key]) if isinstance(m.get(key), (int, float)) else float("nan") for m in ok]

    ax_kv, ax_pre, ax_q, ax_mem = axes
    ax_kv.plot(t, [v * 100 for v in series("kv_cache_usage")], color="#1f77b4", marker=".", lw=1)
    ax_kv.axhline(99, color="red", ls=":", lw=1)
    ax_kv.set_ylabel("KV usage %")
    ax_kv.set_ylim(0, 105)
    ax_pre.bar(t, series("preemptions_delta"), width=max(_spacing(t) * 0.8, 0.05), color="#d62728")
    ax_pre.set_ylabel("preemptions\n/scrape")
    ax_q.plot(t, series("num_requests_running"), label="running", color="#2ca02c", lw=1)
    ax_q.plot(t, series("num_requests_waiting"), label="waiting", color="#ff7f0e", lw=1)
    ax_q.set_ylabel("requests")
    ax_q.legend(loc="upper left", fontsize=8)
    if view.gpu:
        tg = [float(g["t_unix_s"]) - t0 for g in view.gpu]
        used = [float(g.get("used_bytes") or 0) / 2**30 for g in view.gpu]
        ax_mem.plot(tg, used, color="#9467bd", lw=1, label="used")
        totals = [
            float(g["total_bytes"]) / 2**30
            for g in view.gpu
            if isinstance(g.get("total_bytes"), (int, float))
        ]
        if totals:
            ax_mem.axhline(max(totals), color="grey", ls="--", lw=1, label="total")
        ax_mem.legend(loc="upper left", fontsize=8)
    else:
        ax_mem.text(0.5, 0.5, "no GPU samples", ha="center", va="center", transform=ax_mem.transAxes)
    ax_mem.set_ylabel("device GiB")
    ax_mem.set_xlabel("seconds since the run started")
    for ax in axes:
        _shade_steps(ax, view, verdict, t0, label=ax is ax_kv)
        ax.grid(alpha=0.3)
    if verdict.engine_death is not None and verdict.engine_death.t_unix_s is not None:
        for ax in axes:
            ax.axvline(verdict.engine_death.t_unix_s - t0, color="black", lw=1.5, ls="--")
    fig.suptitle("Memory pressure over time (steps shaded, labelled with their concurrency)")
    fig.tight_layout()
    return _png(fig)


def plot_by_concurrency(verdict: Verdict) -> bytes:
    return _png(figure_by_concurrency(verdict))


def figure_by_concurrency(verdict: Verdict) -> Figure:
    """Latency and throughput against concurrency, ticks at the measured levels, onsets marked."""
    fig = Figure(figsize=(11, 4.2), dpi=DPI)
    ax_lat, ax_thr = fig.subplots(1, 2)
    steps = sorted((s for s in verdict.measured_steps if s.requests), key=lambda s: s.concurrency)
    c = [s.concurrency for s in steps]

    def plot(ax: Axes, values: Sequence[float | None], label: str, style: str) -> None:
        pts = [(x, v) for x, v in zip(c, values, strict=True) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)

    plot(ax_lat, [None if s.ttft.p50_ms is None else s.ttft.p50_ms / 1000 for s in steps], "TTFT P50", "o-")
    plot(ax_lat, [None if s.ttft.p99_ms is None else s.ttft.p99_ms / 1000 for s in steps], "TTFT P99", "o--")
    plot(ax_lat, [None if s.e2e.p99_ms is None else s.e2e.p99_ms / 1000 for s in steps], "e2e P99", "s:")
    ax_lat.set_ylabel("seconds")
    ax_lat.set_title("Latency vs concurrency")
    plot(ax_thr, [s.req_per_s for s in steps], "req/s", "o-")
    ax_tok = ax_thr.twinx()
    plot(ax_tok, [s.output_tokens_per_s for s in steps], "output tok/s", "s--")
    ax_tok.set_ylabel("output tokens/s")
    ax_thr.set_ylabel("requests/s")
    ax_thr.set_title("Throughput vs concurrency")
    for ax in (ax_lat, ax_thr):
        ax.set_xlabel("concurrency")
        if c and min(c) > 0 and max(c) / min(c) >= 8:
            ax.set_xscale("log", base=2)
        _level_ticks(ax, sorted(set(c)))
        _mark_onsets(ax, verdict)
        ax.grid(alpha=0.3)
    for ax, extra in ((ax_lat, None), (ax_thr, ax_tok)):
        handles, labels = ax.get_legend_handles_labels()
        if extra is not None:
            more_handles, more_labels = extra.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
        if handles:
            ax.legend(handles, labels, loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


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
        ax.grid(alpha=0.3)
    recommended = recommendation.max_model_len.value
    if recommended is not None:  # a kept or KV-capped limit is no recommendation (recommend.py)
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
    fig.tight_layout()
    return _png(fig)


def _shade_steps(ax: Axes, view: RunView, verdict: Verdict, t0: float, *, label: bool) -> None:
    for i, step in enumerate(view.steps):
        b = step.boundary
        end = (
            b.end_unix_s
            if b.end_unix_s is not None
            else (view.metrics[-1]["t_unix_s"] if view.metrics else b.start_unix_s)
        )
        color = "#eeeeee" if b.phase == "warmup" else SHADES[i % 2]
        ax.axvspan(b.start_unix_s - t0, float(end) - t0, color=color, alpha=0.9, lw=0, zorder=0)
        if label:
            ax.text(
                (b.start_unix_s + float(end)) / 2 - t0, 1.0, str(b.concurrency),
                transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7,
            )  # fmt: skip
    onset = verdict.preemption_onset
    if onset is not None and onset.t_unix_s is not None:
        ax.axvline(onset.t_unix_s - t0, color="#d62728", lw=1, ls="-.")


def _level_ticks(ax: Axes, levels: Sequence[int]) -> None:
    """Plain integer ticks at the measured levels (not 2^k, no minor ticks)."""
    if not levels:
        return
    ax.xaxis.set_major_locator(FixedLocator([float(c) for c in levels]))
    ax.xaxis.set_major_formatter(FixedFormatter([str(c) for c in levels]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=8)


def _mark_onsets(ax: Axes, verdict: Verdict) -> None:
    if verdict.preemption_onset is not None:
        ax.axvline(
            verdict.preemption_onset.concurrency, color="#d62728", ls="-.", lw=1.2, label="preemption onset"
        )
    if verdict.engine_death is not None and verdict.engine_death.concurrency is not None:
        ax.axvline(verdict.engine_death.concurrency, color="black", ls="--", lw=1.2, label="engine death")
    if verdict.last_safe_concurrency is not None:
        ax.axvline(verdict.last_safe_concurrency, color="#2ca02c", ls=":", lw=1.2, label="last safe")


def _t0(view: RunView) -> float:
    starts = [s.boundary.start_unix_s for s in view.steps]
    started = view.config.get("started_unix_s")
    candidates = [*starts, *(float(m["t_unix_s"]) for m in view.metrics[:1])]
    if isinstance(started, (int, float)):
        candidates.append(float(started))
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
