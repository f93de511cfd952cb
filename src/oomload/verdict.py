"""The verdict: per-step facts, the onsets, the last safe concurrency and how far to trust them (pure).

Input is a ``RunView`` (``oomload.runview``); output a frozen ``Verdict`` tree with ``to_json()``.

Per step (warmup steps are measured but never used for a finding): requests by outcome, req/s and
output tokens/s over the step's duration, nearest-rank P50/P99 of TTFT, TPOT (mean inter-token
latency) and end-to-end latency (``stats.percentile``), the KV usage / running / waiting maxima of the
``/metrics`` scrapes in the step's window, preemptions in the step, device memory from the GPU samples,
and the *achieved* concurrency: the time-weighted mean number of requests in flight during the step
(from the requests' own start/end times), to compare with the target.

Preemptions in a step = the sum of the scrapes' ``preemptions_delta``; cross-checked against the
counter (``num_preemptions_total`` of the step's last scrape minus the last scrape before the step).
When they disagree (a lost scrape, a restart) the larger is used and a confidence note says so.

Onsets, each reported as the *lowest concurrency* at which it was seen (a refinement pass runs
lower levels after higher ones, so "first in time" and "first in concurrency" differ):

* preemption onset — a step whose preemptions > 0, with that step's request count and the KV usage
  of the scrape that first showed the preemption;
* KV saturation — a step whose max KV usage ≥ 0.99; queueing — a step whose max waiting > 0;
* engine death — the earliest evidence among: ``engine_dead`` request outcomes, CUDA OOM text in
  request errors or event details, ``server_dead`` / ``health_failed`` events, a step or the run ending
  with reason ``server_dead``, and the server's process vanishing from the GPU samples. ``real_oom`` is
  true only when OOM text was seen (then ``gpu_memory_utilization`` advice applies).

Last safe concurrency: the highest level ``c`` such that every measured level ≤ ``c`` is safe (no
preemption, no engine death, no admission rejection, server error or timeout) and some completed,
non-warmup step at ``c`` exists. Context overflow, truncation and client transport errors do not make
a level unsafe; they are reported separately.

Arithmetic check: ``capacity.predict_preemption_onset`` on the trace's total lengths and the pool from
``cache_config.json`` gives a band of plausible onsets; each end is placed on the measured grid (the
lowest measured level ≥ it) and the observed onset's distance from the band, in grid levels, is
reported. More than one level apart is flagged — the measured knee moves 1–2 levels between repeats
on real vLLM, so one level is noise, more is a finding in itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from oomload.capacity import predict_preemption_onset
from oomload.outcome import Outcome, RequestResult
from oomload.runview import RunView, StepData
from oomload.stats import LengthSummary, percentile, summarize_lengths

KV_SATURATED = 0.99
ACHIEVED_CONCURRENCY_MIN_SHARE = 0.8
DEFAULT_MIN_REQUESTS = 3
UNSAFE_OUTCOMES = frozenset(
    {Outcome.ENGINE_DEAD, Outcome.ADMISSION_REJECTED, Outcome.SERVER_ERROR, Outcome.TIMEOUT}
)
OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda oom", "cuda error: out of memory")


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Nearest-rank P50 / P99 of one latency in one step (``None`` when no request carried it)."""

    count: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What one step measured."""

    index: int
    concurrency: int
    phase: str
    start_unix_s: float
    end_unix_s: float | None
    end_reason: str | None
    duration_s: float | None
    cut_short: bool
    requests: int
    outcomes: Mapping[str, int]
    error_requests: int
    req_per_s: float | None
    output_tokens_per_s: float | None
    ttft: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    achieved_concurrency: float | None
    scrapes_ok: int
    scrapes_failed: int
    kv_usage_max: float | None
    preemptions: int | None  # None: no metrics covered the step
    preemptions_counter: int | None  # counter(last in step) - counter(before step)
    running_max: int | None
    waiting_max: int | None
    device_total_bytes: int | None
    device_used_max_bytes: int | None
    device_free_min_bytes: int | None
    server_process_used_max_bytes: int | None

    @property
    def warmup(self) -> bool:
        return self.phase == "warmup"

    @property
    def error_rate(self) -> float | None:
        return None if self.requests == 0 else self.error_requests / self.requests

    def count(self, outcome: Outcome) -> int:
        return int(self.outcomes.get(outcome.value, 0))

    @property
    def unsafe_requests(self) -> int:
        return sum(self.count(o) for o in UNSAFE_OUTCOMES)


@dataclass(frozen=True, slots=True)
class PreemptionOnset:
    step: int
    concurrency: int
    t_unix_s: float | None
    requests_in_step: int
    preemptions_in_step: int
    kv_usage_at_onset: float | None
    kv_usage_max: float | None


@dataclass(frozen=True, slots=True)
class LevelOnset:
    """The lowest level at which a gauge crossed its line (KV saturation, queueing)."""

    step: int
    concurrency: int
    value: float


@dataclass(frozen=True, slots=True)
class EngineDeath:
    step: int | None
    concurrency: int | None
    t_unix_s: float | None
    real_oom: bool
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContextOverflow:
    refused: int
    clamped: int
    refused_total_tokens_min: int | None
    refused_total_tokens_max: int | None
    clamped_total_tokens_min: int | None
    clamped_total_tokens_max: int | None
    model_limit: int | None
    trace_over_limit: int  # trace requests whose total length exceeds the model limit
    trace_count: int


@dataclass(frozen=True, slots=True)
class Prediction:
    """The arithmetic onset from the KV pool beside the observed one."""

    num_gpu_blocks: int
    block_size: int
    kv_cache_tokens: int
    onset_mean: int
    onset_p50: int
    onset_p90: int
    band_low: int
    band_high: int
    observed_onset: int | None
    levels_apart: int | None
    disagrees: bool
    basis: str  # "trace" or "requests"


@dataclass(frozen=True, slots=True)
class ConfidenceNote:
    kind: str
    message: str
    step: int | None = None
    severity: str = "warning"  # "warning" or "info"


@dataclass(frozen=True, slots=True)
class RunInfo:
    path: str
    model: str | None
    url: str | None
    simulated: bool | None
    trace_path: str | None
    started_unix_s: float | None
    finished: bool
    end_reason: str | None
    cut_short: bool
    cut_short_detail: str | None
    cache_config: Mapping[str, Any] | None
    max_model_len: int | None


@dataclass(frozen=True, slots=True)
class Verdict:
    run: RunInfo
    steps: tuple[StepFacts, ...]
    levels: tuple[int, ...]  # measured non-warmup concurrency levels, ascending
    preemption_onset: PreemptionOnset | None
    kv_saturation: LevelOnset | None
    queueing: LevelOnset | None
    engine_death: EngineDeath | None
    context_overflow: ContextOverflow
    last_safe_concurrency: int | None
    max_tested_concurrency: int | None
    prediction: Prediction | None
    confidence: str  # "high" | "medium" | "low"
    notes: tuple[ConfidenceNote, ...]
    trace_total: LengthSummary | None
    trace_prompt: LengthSummary | None
    trace_output: LengthSummary | None
    trace_total_tokens: tuple[int, ...] = field(default=(), repr=False)
    requests_total: int = 0
    requests_ok: int = 0

    @property
    def measured_steps(self) -> tuple[StepFacts, ...]:
        return tuple(s for s in self.steps if not s.warmup)

    @property
    def error_rate(self) -> float | None:
        total = sum(s.requests for s in self.measured_steps)
        return None if total == 0 else sum(s.error_requests for s in self.measured_steps) / total

    def steps_at(self, concurrency: int) -> tuple[StepFacts, ...]:
        return tuple(s for s in self.measured_steps if s.concurrency == concurrency)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (the ``verdict`` part of ``summary.json``; see docs/report.md)."""
        steps = []
        for s in self.steps:
            obj = asdict(s)
            obj["outcomes"] = dict(s.outcomes)
            obj["warmup"] = s.warmup
            obj["error_rate"] = s.error_rate
            steps.append(obj)
        return {
            "run": {**asdict(self.run), "cache_config": _plain(self.run.cache_config)},
            "levels": list(self.levels),
            "steps": steps,
            "onsets": {
                "preemption": _opt_asdict(self.preemption_onset),
                "kv_saturation": _opt_asdict(self.kv_saturation),
                "queueing": _opt_asdict(self.queueing),
                "engine_death": _opt_asdict(self.engine_death),
            },
            "context_overflow": asdict(self.context_overflow),
            "last_safe_concurrency": self.last_safe_concurrency,
            "max_tested_concurrency": self.max_tested_concurrency,
            "prediction": _opt_asdict(self.prediction),
            "confidence": {"level": self.confidence, "notes": [asdict(n) for n in self.notes]},
            "requests": {"total": self.requests_total, "ok": self.requests_ok, "error_rate": self.error_rate},
            "trace": None
            if self.trace_total is None or self.trace_prompt is None or self.trace_output is None
            else {
                "total_tokens": self.trace_total.as_dict(),
                "prompt_tokens": self.trace_prompt.as_dict(),
                "output_tokens": self.trace_output.as_dict(),
            },
        }


def build_verdict(view: RunView, *, min_requests: int | None = None) -> Verdict:
    """Compute the verdict of one run (see the module docstring for every rule)."""
    schedule = view.config.get("schedule") or {}
    if min_requests is None:
        configured = schedule.get("min_requests") if isinstance(schedule, Mapping) else None
        min_requests = (
            int(configured) if isinstance(configured, int) and configured > 0 else DEFAULT_MIN_REQUESTS
        )
    notes: list[ConfidenceNote] = []
    steps = tuple(summarize_step(step, view.requests, notes) for step in view.steps)
    measured = [s for s in steps if not s.warmup]
    levels = tuple(sorted({s.concurrency for s in measured}))

    onset = _preemption_onset(view, measured)
    kv_sat = _level_onset(measured, lambda s: s.kv_usage_max, lambda v: v >= KV_SATURATED)
    queueing = _level_onset(measured, lambda s: s.waiting_max, lambda v: v > 0)
    death = detect_engine_death(view, steps)
    last_safe = last_safe_concurrency(measured, death)
    completed = [s.concurrency for s in measured if not s.cut_short]
    max_tested = max(completed) if completed else None

    totals = view.trace_total_tokens
    basis = "trace"
    if not totals:
        totals = tuple(r.prompt_tokens_asked + r.output_tokens_asked for r in view.requests)
        basis = "requests"
    prediction = _prediction(view.cache_config, totals, basis, onset, levels, max_tested, measured)
    run = _run_info(view, steps)
    overflow = _context_overflow(view, run.max_model_len)
    _confidence_notes(view, measured, onset, prediction, min_requests, notes, run)
    level = _confidence_level(notes, onset, last_safe, levels, measured)
    all_requests = [r for s in view.steps if s.boundary.phase != "warmup" for r in s.requests]
    return Verdict(
        run=run,
        steps=steps,
        levels=levels,
        preemption_onset=onset,
        kv_saturation=kv_sat,
        queueing=queueing,
        engine_death=death,
        context_overflow=overflow,
        last_safe_concurrency=last_safe,
        max_tested_concurrency=max_tested,
        prediction=prediction,
        confidence=level,
        notes=tuple(notes),
        trace_total=_summary(view.trace_total_tokens),
        trace_prompt=_summary(view.trace_prompt_tokens),
        trace_output=_summary(view.trace_output_tokens),
        trace_total_tokens=view.trace_total_tokens,
        requests_total=len(all_requests),
        requests_ok=sum(1 for r in all_requests if r.outcome is Outcome.OK),
    )


def summarize_step(
    step: StepData, all_requests: Sequence[RequestResult], notes: list[ConfidenceNote]
) -> StepFacts:
    """Facts of one step; appends a note when the preemption delta and counter disagree."""
    b = step.boundary
    requests = step.requests
    outcomes: dict[str, int] = {}
    for r in requests:
        outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
    end = b.end_unix_s
    duration: float | None
    if end is None and requests:
        end_of_data = max(r.end_unix_s for r in requests)
        duration = end_of_data - b.start_unix_s
    else:
        duration = None if end is None else end - b.start_unix_s
    span = duration if duration is not None and duration > 0 else None
    output_tokens = sum(
        _output_tokens(r) for r in requests if r.outcome is Outcome.OK or r.outcome is Outcome.TRUNCATED
    )
    ok_metrics = [m for m in step.metrics if m.get("ok")]
    delta_sum, counter = _preemptions(step, ok_metrics)
    preemptions: int | None
    if delta_sum is None and counter is None:
        preemptions = None
    else:
        preemptions = max(v for v in (delta_sum, counter) if v is not None)
        if delta_sum is not None and counter is not None and delta_sum != counter:
            notes.append(
                ConfidenceNote(
                    "preemption_counter_mismatch",
                    f"step {b.index} (concurrency {b.concurrency}): preemption deltas sum to {delta_sum} "
                    "but the "
                    f"counter rose by {counter}; using {preemptions}",
                    step=b.index,
                    severity="info",
                )
            )
    window_end = end if end is not None else (max((r.end_unix_s for r in requests), default=b.start_unix_s))
    device_total = _max_int(g.get("total_bytes") for g in step.gpu)
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
        error_requests=sum(1 for r in requests if r.outcome is not Outcome.OK),
        req_per_s=None if span is None else len(requests) / span,
        output_tokens_per_s=None if span is None else output_tokens / span,
        ttft=_latency(r.ttft_ms for r in requests if r.outcome is Outcome.OK),
        tpot=_latency(r.tpot_ms for r in requests if r.outcome is Outcome.OK),
        e2e=_latency(r.e2e_ms for r in requests if r.outcome is Outcome.OK),
        achieved_concurrency=achieved_concurrency(all_requests, b.start_unix_s, window_end),
        scrapes_ok=len(ok_metrics),
        scrapes_failed=len(step.metrics) - len(ok_metrics),
        kv_usage_max=_max_float(m.get("kv_cache_usage") for m in ok_metrics),
        preemptions=preemptions,
        preemptions_counter=counter,
        running_max=_max_int(m.get("num_requests_running") for m in ok_metrics),
        waiting_max=_max_int(m.get("num_requests_waiting") for m in ok_metrics),
        device_total_bytes=device_total,
        device_used_max_bytes=_max_int(g.get("used_bytes") for g in step.gpu),
        device_free_min_bytes=_min_int(g.get("free_bytes") for g in step.gpu),
        server_process_used_max_bytes=_max_int(
            max(
                (p.get("used_bytes") or 0 for p in (g.get("processes") or []) if isinstance(p, Mapping)),
                default=None,
            )
            for g in step.gpu
        ),
    )


def achieved_concurrency(
    requests: Sequence[RequestResult], start_unix_s: float, end_unix_s: float
) -> float | None:
    """Time-weighted mean number of requests in flight within ``[start, end]`` (None for an empty window)."""
    span = end_unix_s - start_unix_s
    if not span > 0 or math.isinf(span):
        return None
    busy = 0.0
    for r in requests:
        lo = max(r.start_unix_s, start_unix_s)
        hi = min(r.end_unix_s, end_unix_s)
        if hi > lo:
            busy += hi - lo
    return busy / span


def last_safe_concurrency(measured: Sequence[StepFacts], death: EngineDeath | None) -> int | None:
    """Highest level with every level at or below it safe, backed by a completed step (module doc)."""
    unsafe_levels = {s.concurrency for s in measured if _unsafe(s)}
    if death is not None and death.concurrency is not None:
        unsafe_levels.add(death.concurrency)
    first_unsafe = min(unsafe_levels) if unsafe_levels else math.inf
    safe = [
        s.concurrency for s in measured if not s.cut_short and s.concurrency < first_unsafe and s.requests > 0
    ]
    return max(safe) if safe else None


def detect_engine_death(view: RunView, steps: Sequence[StepFacts]) -> EngineDeath | None:
    """The earliest evidence that the server died, with every piece of evidence found."""
    found: list[tuple[float, str]] = []
    real_oom = False
    for r in view.requests:
        text = (r.error or "").lower()
        is_oom = any(m in text for m in OOM_MARKERS)
        real_oom = real_oom or is_oom
        if r.outcome is Outcome.ENGINE_DEAD or is_oom:
            detail = f": {r.error}" if r.error else ""
            status = f" (HTTP {r.http_status})" if r.http_status else ""
            found.append((r.end_unix_s, f"request {r.request_id} ended engine_dead{status}{detail}"))
    for e in view.events:
        kind = e.get("kind")
        text = " ".join(str(e.get(k, "")) for k in ("evidence", "detail", "reason", "error")).strip()
        if kind in ("server_dead", "health_failed"):
            found.append((float(e["t_unix_s"]), f"{kind} event{': ' + text if text else ''}"))
        if any(m in text.lower() for m in OOM_MARKERS):
            real_oom = True
    for s in steps:
        if s.end_reason == "server_dead" and s.end_unix_s is not None:
            found.append((s.end_unix_s, f"step {s.index} ended with reason server_dead"))
    end_reason = (view.status or {}).get("end_reason")
    if end_reason == "server_dead":
        t = (view.status or {}).get("ended_unix_s")
        found.append(
            (float(t) if isinstance(t, (int, float)) else math.inf, "run ended with reason server_dead")
        )
    vanished = _vanished_process(view.gpu)
    if vanished is not None:
        found.append(vanished)
    if not found:
        return None
    found.sort(key=lambda item: item[0])
    t_first = found[0][0]
    step = _step_at(steps, t_first)
    evidence = tuple(dict.fromkeys(text for _, text in found))
    return EngineDeath(
        step=None if step is None else step.index,
        concurrency=None if step is None else step.concurrency,
        t_unix_s=None if math.isinf(t_first) else t_first,
        real_oom=real_oom,
        evidence=evidence[:12] + ((f"… and {len(evidence) - 12} more",) if len(evidence) > 12 else ()),
    )


def _vanished_process(gpu: Sequence[Mapping[str, Any]]) -> tuple[float, str] | None:
    """The biggest GPU process (the server) disappearing from later samples."""
    biggest: dict[int, int] = {}
    for g in gpu:
        for p in g.get("processes") or []:
            if isinstance(p, Mapping) and isinstance(p.get("pid"), int):
                biggest[p["pid"]] = max(biggest.get(p["pid"], 0), int(p.get("used_bytes") or 0))
    if not biggest:
        return None
    server_pid = max(biggest, key=lambda pid: biggest[pid])
    seen = False
    for g in gpu:
        pids = {p.get("pid") for p in g.get("processes") or [] if isinstance(p, Mapping)}
        if server_pid in pids:
            seen = True
        elif seen and "processes" in g:
            return float(g["t_unix_s"]), f"server process {server_pid} vanished from the GPU samples"
    return None


def _step_at(steps: Sequence[StepFacts], t: float) -> StepFacts | None:
    if math.isinf(t):
        return steps[-1] if steps else None
    candidates = [s for s in steps if s.start_unix_s <= t]
    return max(candidates, key=lambda s: s.start_unix_s) if candidates else (steps[0] if steps else None)


def _unsafe(s: StepFacts) -> bool:
    return (s.preemptions or 0) > 0 or s.unsafe_requests > 0


def _preemption_onset(view: RunView, measured: Sequence[StepFacts]) -> PreemptionOnset | None:
    preempting = [s for s in measured if (s.preemptions or 0) > 0]
    if not preempting:
        return None
    first = min(preempting, key=lambda s: (s.concurrency, s.start_unix_s))
    data = next(d for d in view.steps if d.boundary.index == first.index)
    hit = next((m for m in data.metrics if m.get("ok") and (m.get("preemptions_delta") or 0) > 0), None)
    return PreemptionOnset(
        step=first.index,
        concurrency=first.concurrency,
        t_unix_s=None if hit is None else float(hit["t_unix_s"]),
        requests_in_step=first.requests,
        preemptions_in_step=first.preemptions or 0,
        kv_usage_at_onset=None if hit is None else _float(hit.get("kv_cache_usage")),
        kv_usage_max=first.kv_usage_max,
    )


def _level_onset(measured: Sequence[StepFacts], value_of: Any, crossed: Any) -> LevelOnset | None:
    hits = [(s, value_of(s)) for s in measured if value_of(s) is not None and crossed(value_of(s))]
    if not hits:
        return None
    step, value = min(hits, key=lambda h: (h[0].concurrency, h[0].start_unix_s))
    return LevelOnset(step=step.index, concurrency=step.concurrency, value=float(value))


def _preemptions(step: StepData, ok_metrics: Sequence[Mapping[str, Any]]) -> tuple[int | None, int | None]:
    deltas = [m.get("preemptions_delta") for m in ok_metrics]
    known = [int(d) for d in deltas if isinstance(d, (int, float))]
    delta_sum = sum(known) if known else None
    counters = [
        float(m["num_preemptions_total"])
        for m in ok_metrics
        if isinstance(m.get("num_preemptions_total"), (int, float))
    ]
    restarted = any(m.get("restarted") for m in ok_metrics)
    base = step.baseline_metric.get("num_preemptions_total") if step.baseline_metric else None
    counter: int | None = None
    if counters and not restarted:
        start = float(base) if isinstance(base, (int, float)) else counters[0]
        counter = max(int(counters[-1] - start), 0)
    return delta_sum, counter


def _prediction(
    cache_config: Mapping[str, Any] | None,
    totals: Sequence[int],
    basis: str,
    onset: PreemptionOnset | None,
    levels: Sequence[int],
    max_tested: int | None,
    measured: Sequence[StepFacts],
) -> Prediction | None:
    if not cache_config or not totals:
        return None
    blocks = _int(cache_config.get("num_gpu_blocks"))
    block_size = _int(cache_config.get("block_size"))
    if not blocks or not block_size:
        return None
    p = predict_preemption_onset(blocks, block_size, list(totals))
    low, high = p.band
    observed = None if onset is None else onset.concurrency
    apart: int | None = None
    if levels:
        lo_i, hi_i = _grid_index(levels, low), _grid_index(levels, high)
        if observed is not None:
            i = levels.index(observed)
            apart = 0 if lo_i <= i <= hi_i else min(abs(i - lo_i), abs(i - hi_i))
        elif any(s.preemptions is not None for s in measured) and max_tested is not None:
            # no preemption seen: how many measured levels above the band stayed clean
            clean_above = [c for c in levels if c > high and c <= max_tested]
            apart = len(clean_above) if clean_above else 0
    return Prediction(
        num_gpu_blocks=blocks,
        block_size=block_size,
        kv_cache_tokens=p.kv_cache_tokens,
        onset_mean=p.onset_mean,
        onset_p50=p.onset_p50,
        onset_p90=p.onset_p90,
        band_low=low,
        band_high=high,
        observed_onset=observed,
        levels_apart=apart,
        disagrees=apart is not None and apart > 1,
        basis=basis,
    )


def _grid_index(levels: Sequence[int], value: int) -> int:
    """Index of the lowest measured level ≥ value (one past the end when none is)."""
    for i, level in enumerate(levels):
        if level >= value:
            return i
    return len(levels)


def _run_info(view: RunView, steps: Sequence[StepFacts]) -> RunInfo:
    config = view.config
    status = view.status
    finished = bool(status and status.get("finished"))
    end_reason = None if status is None else _str(status.get("end_reason"))
    open_steps = [s for s in steps if s.cut_short]
    cut_short = status is None or not finished or bool(open_steps)
    detail: str | None = None
    if cut_short:
        parts = []
        if status is None:
            parts.append("no status.json (oomload itself stopped before writing it)")
        elif not finished:
            parts.append(f"the run ended with reason {end_reason or 'unknown'}")
        if open_steps:
            s = open_steps[0]
            parts.append(f"step {s.index} (concurrency {s.concurrency}) started but never ended")
        elif steps:
            last = max(steps, key=lambda s: s.start_unix_s)
            parts.append(f"last step {last.index} (concurrency {last.concurrency}) ended: {last.end_reason}")
        detail = "; ".join(parts)
    limit = _int(config.get("max_model_len"))
    if limit is None and view.cache_config is not None:
        limit = _int(view.cache_config.get("max_model_len"))
    return RunInfo(
        path=str(view.path),
        model=_str(config.get("model")),
        url=_str(config.get("url")),
        simulated=config.get("simulated") if isinstance(config.get("simulated"), bool) else None,
        trace_path=_str(config.get("trace_path")),
        started_unix_s=_float(config.get("started_unix_s")),
        finished=finished,
        end_reason=end_reason,
        cut_short=cut_short,
        cut_short_detail=detail,
        cache_config=view.cache_config,
        max_model_len=limit,
    )


def _context_overflow(view: RunView, limit: int | None) -> ContextOverflow:
    refused = [r for r in view.requests if r.outcome is Outcome.CONTEXT_OVERFLOW]
    clamped = [r for r in view.requests if r.outcome is Outcome.TRUNCATED]

    def total(r: RequestResult) -> int:
        return r.prompt_tokens_asked + r.output_tokens_asked

    totals = view.trace_total_tokens
    return ContextOverflow(
        refused=len(refused),
        clamped=len(clamped),
        refused_total_tokens_min=min((total(r) for r in refused), default=None),
        refused_total_tokens_max=max((total(r) for r in refused), default=None),
        clamped_total_tokens_min=min((total(r) for r in clamped), default=None),
        clamped_total_tokens_max=max((total(r) for r in clamped), default=None),
        model_limit=limit,
        trace_over_limit=0 if limit is None else sum(1 for t in totals if t > limit),
        trace_count=len(totals),
    )


def _confidence_notes(
    view: RunView,
    measured: Sequence[StepFacts],
    onset: PreemptionOnset | None,
    prediction: Prediction | None,
    min_requests: int,
    notes: list[ConfidenceNote],
    run: RunInfo,
) -> None:
    if not measured:
        notes.append(ConfidenceNote("no_steps", "no measured (non-warmup) step: there is nothing to judge"))
    if run.cut_short:
        notes.append(ConfidenceNote("cut_short", f"the run was cut short: {run.cut_short_detail}"))
    for s in measured:
        if s.requests < min_requests:
            notes.append(
                ConfidenceNote(
                    "few_requests",
                    f"step {s.index} (concurrency {s.concurrency}) finished only {s.requests} request(s) "
                    f"(< {min_requests}); its numbers are anecdotal",
                    step=s.index,
                )
            )
        if (
            s.achieved_concurrency is not None
            and s.achieved_concurrency < ACHIEVED_CONCURRENCY_MIN_SHARE * s.concurrency
        ):
            notes.append(
                ConfidenceNote(
                    "concurrency_not_held",
                    f"step {s.index}: the load generator held {s.achieved_concurrency:.1f} requests "
                    "in flight "
                    f"on average, far below the target {s.concurrency}",
                    step=s.index,
                )
            )
        transport = s.count(Outcome.TRANSPORT_ERROR)
        if transport:
            notes.append(
                ConfidenceNote(
                    "transport_errors",
                    f"step {s.index}: {transport} client-side transport error(s) (connection reset before an "
                    "answer) — not counted against the server",
                    step=s.index,
                    severity="info",
                )
            )
    with_metrics = [s for s in measured if s.preemptions is not None]
    if measured and not with_metrics:
        notes.append(
            ConfidenceNote(
                "metrics_missing",
                "no /metrics scrape reported preemptions: preemption and KV usage are unobserved",
            )
        )
    else:
        for s in measured:
            if s.preemptions is None:
                notes.append(
                    ConfidenceNote(
                        "metrics_missing",
                        f"step {s.index} (concurrency {s.concurrency}) has no successful /metrics scrape",
                        step=s.index,
                    )
                )
    if onset is not None:
        clean_above = sorted(
            {s.concurrency for s in with_metrics if s.concurrency > onset.concurrency and s.preemptions == 0}
        )
        if clean_above:
            notes.append(
                ConfidenceNote(
                    "non_monotone",
                    f"preemption appeared at concurrency {onset.concurrency} but not at "
                    f"{', '.join(map(str, clean_above))}: the knee is noisy (real vLLM moves it 1–2 levels "
                    "between repeats)",
                )
            )
    by_level: dict[int, set[bool]] = {}
    for s in with_metrics:
        by_level.setdefault(s.concurrency, set()).add((s.preemptions or 0) > 0)
    for level, outcomes in sorted(by_level.items()):
        if len(outcomes) > 1:
            notes.append(
                ConfidenceNote(
                    "noisy_repeat", f"repeats at concurrency {level} disagree on whether it preempts"
                )
            )
    if not view.cache_config:
        notes.append(
            ConfidenceNote(
                "no_cache_config",
                "vllm:cache_config_info was not read: no arithmetic prediction to check the onset against",
                severity="info",
            )
        )
    if prediction is not None and prediction.disagrees:
        observed = "no onset" if prediction.observed_onset is None else f"onset {prediction.observed_onset}"
        notes.append(
            ConfidenceNote(
                "prediction_disagrees",
                f"observed {observed} is {prediction.levels_apart} levels from the arithmetic band "
                f"{prediction.band_low}–{prediction.band_high} ({prediction.num_gpu_blocks} blocks × "
                f"{prediction.block_size} tokens): lengths replayed differently, or the server is not what "
                "cache_config_info says",
            )
        )
    if view.unassigned_requests:
        notes.append(
            ConfidenceNote(
                "unassigned_requests",
                f"{view.unassigned_requests} request(s) could not be placed in any step",
                severity="info",
            )
        )
    if view.trace_note and not view.trace_total_tokens:
        notes.append(
            ConfidenceNote("no_trace", f"{view.trace_note}; lengths come from the requests", severity="info")
        )


def _confidence_level(
    notes: Sequence[ConfidenceNote],
    onset: PreemptionOnset | None,
    last_safe: int | None,
    levels: Sequence[int],
    measured: Sequence[StepFacts],
) -> str:
    warnings = [n for n in notes if n.severity == "warning"]
    if not warnings:
        return "high"
    critical_kinds = {"no_steps", "non_monotone", "noisy_repeat", "prediction_disagrees"}
    if any(n.kind in critical_kinds or (n.kind == "metrics_missing" and n.step is None) for n in warnings):
        return "low"
    key_levels = {c for c in (last_safe, None if onset is None else onset.concurrency) if c is not None}
    key_steps = {s.index for s in measured if s.concurrency in key_levels}
    if any(n.step in key_steps for n in warnings):
        return "low"
    return "medium"


def _latency(values: Iterable[float | None]) -> LatencyStats:
    known = [float(v) for v in values if v is not None]
    if not known:
        return LatencyStats()
    return LatencyStats(count=len(known), p50_ms=percentile(known, 50), p99_ms=percentile(known, 99))


def _output_tokens(r: RequestResult) -> int:
    return r.usage_completion_tokens if r.usage_completion_tokens is not None else r.output_tokens_asked


def _summary(values: Sequence[int]) -> LengthSummary | None:
    return summarize_lengths(values) if values else None


def _max_float(values: Iterable[Any]) -> float | None:
    known = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(known) if known else None


def _max_int(values: Iterable[Any]) -> int | None:
    known = [int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(known) if known else None


def _min_int(values: Iterable[Any]) -> int | None:
    known = [int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return min(known) if known else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value)


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_asdict(obj: Any) -> dict[str, Any] | None:
    return None if obj is None else asdict(obj)


def _plain(obj: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if obj is None else dict(obj)
