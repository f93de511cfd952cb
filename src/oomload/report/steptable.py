"""The per-step table every renderer shows (``STEP_COLUMNS``, one ``step_row`` a step, ``STEP_LEGEND``)
and the cell formats it and the findings share: milliseconds, numbers, GiB, "–" for what is not known."""

from __future__ import annotations

from oomload.verdict import StepFacts, kv_percent

STEP_COLUMNS = (
    "step", "conc", "phase", "req", "ok", "err", "cancel", "req/s", "out tok/s", "TTFT p50", "TTFT p99",
    "TPOT p50", "e2e p99", "KV max", "preempt", "pre/100", "odds/100", "wait %", "run/wait", "achieved",
    "server", "dev used",
)  # fmt: skip


STEP_LEGEND = (
    "* = step cut short (no end, or ended by Ctrl-C, --max-duration-s, an error or the server's death; "
    "not trusted as safe) · † = started after the engine died (left out of the verdict) · "
    "err (+N at death) = N more requests of this step died with the engine in a later step, "
    "charged to that step · achieved = requests in flight at the client (time-weighted mean) · "
    "server = requests in vLLM during the step, by its own latency counters (the client's figure "
    "× vLLM's share of the same requests' time; docs/report.md)"
)


def step_row(s: StepFacts) -> list[str]:
    """One row of the per-step table, in ``STEP_COLUMNS`` order."""
    run_wait = (
        "–"
        if s.running_max is None
        else f"{s.running_max}/{s.waiting_max if s.waiting_max is not None else '–'}"
    )
    casualties = sum(s.casualties.values())
    excused = "" if not casualties or s.died_here else f" (+{casualties} at death)"
    return [
        str(s.index) + ("*" if s.cut_short else "") + ("†" if s.after_death else ""),
        str(s.concurrency),
        s.phase,
        str(s.requests),
        str(s.ok_requests),
        f"{s.error_requests}{excused}",
        str(s.cancelled_requests),
        fmt_num(s.req_per_s, ".2f"),
        fmt_num(s.output_tokens_per_s, ".0f"),
        fmt_ms(s.ttft.p50_ms),
        fmt_ms(s.ttft.p99_ms),
        fmt_ms(s.tpot.p50_ms),
        fmt_ms(s.e2e.p99_ms),
        "–" if s.kv_usage_max is None else kv_percent(s.kv_usage_max),
        fmt_num(s.preemptions, "d"),
        fmt_num(s.preemptions_per_100, ".1f"),
        "–" if s.odds is None else f"{s.odds.per_100:.1f}",
        "–" if s.waiting_share is None else f"{100 * s.waiting_share:.0f}",
        run_wait,
        fmt_num(s.achieved_concurrency, ".1f"),
        "–" if s.server_share is None else fmt_num(s.delivered_concurrency, ".1f"),
        fmt_bytes(s.device_used_max_bytes),
    ]


def fmt_ms(value: float | None) -> str:
    """Milliseconds for a table cell: ``1.25s``, ``250ms``, ``4.2ms``, ``0.35ms`` — never a bare 0."""
    if value is None:
        return "–"
    if value >= 1000:
        return f"{value / 1000:.2f}s"
    if value >= 10:
        return f"{value:.0f}ms"
    if value >= 1:
        return f"{value:.1f}ms"
    return f"{value:.2f}ms" if value >= 0.01 else f"{value * 1000:.0f}µs"


def fmt_num(value: float | int | None, spec: str = ".1f") -> str:
    return "–" if value is None else format(value, spec)


def fmt_bytes(value: int | None) -> str:
    """Bytes as GiB with two decimals (``1.25 GiB``)."""
    return "–" if value is None else f"{value / 2**30:.2f} GiB"
