"""A step's ``StepFacts`` from what the run directory holds of it (pure): ``summarize_step``.

One ``runview.StepData`` — the step's requests, its ``/metrics`` scrapes and GPU samples, its
``steps.jsonl`` lines — becomes one frozen ``StepFacts``. What each field means, and how the facts are
judged (trusted, held, mostly failed), is ``oomload.verdict.stepfacts``'s docstring; the arithmetic
here: the counts by outcome and the casualties, the rates (``oomload.verdict.rates``), the latency
percentiles, the preemptions (the scrapes' deltas against the counter's rise), the server's side by
Little's law, and the gauges' sustained levels.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from oomload.capacity.odds import LevelOdds
from oomload.outcome import Outcome, RequestResult
from oomload.rundir.records import MetricsRow, max_float, max_int, min_int
from oomload.rundir.serverside import (
    ServerConcurrency,
    server_concurrency,
    server_share,
)
from oomload.trace.stats import percentile
from oomload.verdict.gauges import sustained_level, waiting_sustained
from oomload.verdict.rates import achieved_concurrency, per_second, share_crossing
from oomload.verdict.runview import StepData
from oomload.verdict.stepfacts import KV_SATURATED, SHARE_MIN_ROUNDS, UNSAFE_OUTCOMES, LatencyStats, StepFacts


def summarize_step(
    step: StepData,
    all_requests: Sequence[RequestResult],
    *,
    casualty_ids: Collection[str] = frozenset(),
    died_here: bool = False,
    after_death: bool = False,
    odds: LevelOdds | None = None,
    open_loop: bool = False,
) -> StepFacts:
    """Facts of one step; requests in ``casualty_ids`` failed because the engine died (module doc)."""
    b = step.boundary
    requests = step.requests
    outcomes: dict[str, int] = {}
    casualties: dict[str, int] = {}
    for r in requests:
        outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
        if r.request_id in casualty_ids and r.outcome.is_error:
            casualties[r.outcome.value] = casualties.get(r.outcome.value, 0) + 1
    charged = [r for r in requests if r.outcome.is_error and (died_here or r.request_id not in casualty_ids)]
    decided = sum(1 for r in requests if r.outcome is not Outcome.CANCELLED)
    end = b.end_unix_s
    window_end = end if end is not None else max((r.end_unix_s for r in requests), default=b.start_unix_s)
    duration = None if end is None and not requests else window_end - b.start_unix_s
    span = duration if duration is not None and duration > 0 else None
    answered = (Outcome.OK, Outcome.TRUNCATED)
    output_tokens = sum(_output_tokens(r) for r in requests if r.outcome in answered)
    ok_metrics = [m for m in step.metrics if m.ok]
    delta_sum, counter = _preemptions(step, ok_metrics)
    known = [v for v in (delta_sum, counter) if v is not None]
    preemptions = max(known) if known else None
    mismatch = None
    if delta_sum is not None and counter is not None and delta_sum != counter:
        mismatch = (delta_sum, counter)
    ok = [r for r in requests if r.outcome is Outcome.OK]
    server, share = _server_side(step, ok_metrics, all_requests)
    waits = [(m.t_unix_s, _num(m.num_requests_waiting)) for m in ok_metrics]
    if preemptions:  # vLLM counts less of a preempted request's time than its client (seen: 0.70)
        share = None
    return StepFacts(
        index=b.index,
        concurrency=b.concurrency,
        phase=b.phase,
        start_unix_s=b.start_unix_s,
        end_unix_s=b.end_unix_s,
        end_reason=b.end_reason,
        duration_s=duration,
        cut_short=b.cut_short,
        requests=len(requests),
        outcomes=outcomes,
        error_requests=len(charged),
        unsafe_requests=sum(1 for r in charged if r.outcome in UNSAFE_OUTCOMES),
        req_per_s=per_second(b.ended, b.duration_s)
        if b.ended is not None
        else (None if span is None else decided / span),
        output_tokens_per_s=per_second(b.completion_tokens, b.duration_s)
        if b.completion_tokens is not None
        else (None if span is None else output_tokens / span),
        ttft=_latency(r.ttft_ms for r in ok),
        tpot=_latency(r.tpot_ms for r in ok),
        e2e=_latency(r.e2e_ms for r in ok),
        achieved_concurrency=achieved_concurrency(all_requests, b.start_unix_s, window_end),
        scrapes_ok=len(ok_metrics),
        scrapes_failed=len(step.metrics) - len(ok_metrics),
        kv_usage_max=max_float(m.kv_cache_usage for m in ok_metrics),
        preemptions=preemptions,
        preemptions_counter=counter,
        running_max=max_int(m.num_requests_running for m in ok_metrics),
        waiting_max=max_int(m.num_requests_waiting for m in ok_metrics),
        device_total_bytes=max_int(g.total_bytes for g in step.gpu),
        device_used_max_bytes=max_int(g.used_bytes for g in step.gpu),
        device_free_min_bytes=min_int(g.free_bytes for g in step.gpu),
        server_process_used_max_bytes=max_int(
            max_int(p.used_bytes for p in g.processes or ()) for g in step.gpu
        ),
        casualties=casualties,
        died_here=died_here,
        in_flight_at_death=len(casualty_ids) if died_here else None,
        open_loop=open_loop,
        after_death=after_death,
        counter_mismatch=mismatch,
        waiting_sustained=_int_or_none(waiting_sustained(waits, b.start_unix_s, duration)),
        kv_usage_sustained=sustained_level([m.kv_cache_usage for m in ok_metrics]),
        server=server,
        server_share=share,
        waiting_share=share_crossing([v for _, v in waits], lambda v: v > 0),
        kv_saturated_share=share_crossing(
            [m.kv_cache_usage for m in ok_metrics], lambda v: v >= KV_SATURATED
        ),
        odds=odds,
        evidence_requests=b.evidence_requests,
        extended_s=b.extended_s,
        loadgen=b.loadgen,
    )


def _server_side(
    step: StepData, ok_metrics: Sequence[MetricsRow], all_requests: Sequence[RequestResult]
) -> tuple[ServerConcurrency | None, float | None]:
    """Little's law from the scrape that opened the step to its last one, and the server's share."""
    end = step.boundary.end_unix_s
    inside = [m for m in ok_metrics if end is None or m.t_unix_s <= end]
    if not inside:
        return None, None
    server = server_concurrency(step.baseline_metric, inside[-1], inside[:-1])
    if server is None:
        return None, None
    answered = (Outcome.OK, Outcome.TRUNCATED)
    ended = [
        r.e2e_ms / 1000.0
        for r in all_requests
        if r.outcome in answered
        and r.e2e_ms is not None
        and server.start_unix_s < r.end_unix_s <= server.end_unix_s
    ]
    if len(ended) < SHARE_MIN_ROUNDS * step.boundary.concurrency:
        return server, None  # too few rounds ended: one batch on either side of a boundary moves it
    return server, server_share(server, sum(ended))


def _num(value: int | None) -> float | None:
    return None if value is None else float(value)


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _preemptions(step: StepData, ok_metrics: Sequence[MetricsRow]) -> tuple[int | None, int | None]:
    """(sum of the scrapes' deltas, rise of the counter over the step) — each ``None`` when unknown."""
    known = [m.preemptions_delta for m in ok_metrics if m.preemptions_delta is not None]
    delta_sum = sum(known) if known else None
    counters = [float(m.num_preemptions_total) for m in ok_metrics if m.num_preemptions_total is not None]
    restarted = any(m.restarted for m in ok_metrics)
    base = step.baseline_metric.num_preemptions_total if step.baseline_metric else None
    counter: int | None = None
    if counters and not restarted:
        start = float(base) if base is not None else counters[0]
        counter = max(int(counters[-1] - start), 0)
    return delta_sum, counter


def _latency(values: Iterable[float | None]) -> LatencyStats:
    known = [float(v) for v in values if v is not None]
    if not known:
        return LatencyStats()
    return LatencyStats(count=len(known), p50_ms=percentile(known, 50), p99_ms=percentile(known, 99))


def _output_tokens(r: RequestResult) -> int:
    return r.usage_completion_tokens if r.usage_completion_tokens is not None else r.output_tokens_asked
