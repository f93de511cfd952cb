"""What a gate rule can name: the events of absence rules and the metrics of threshold rules (pure).

An ``Event`` (``no-EVENT-below:N``) knows how a step shows it and whether a step could have shown it:
preemption needs a ``/metrics`` scrape and, in a clean step, the requests the trace's odds ask for
(``StepFacts.evidence_thin``); queueing and KV saturation a sustained gauge (two consecutive scrapes,
``oomload.verdict.gauges``; for queueing also vLLM's queue-time sum, ``StepFacts.queue_depth``);
engine death also counts at the verdict's death level. A ``Metric`` (``METRIC[@C] OP VALUE``) knows
its base unit, how to read it from one step and from the whole run, and how a missing or partial
measurement is judged (``monotone``: only grows as a step goes on; ``fails_where_engine_died``;
``from_trusted_steps``); a latency metric also names its latency and statistic, so a relative rule
finds the test of its requests (``oomload.verdict.shift.level_shifts``). The tables ``EVENTS`` and
``METRICS`` hold every one the syntax accepts; ``oomload.verdict.gate`` parses the rules and judges them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oomload.outcome import Outcome
from oomload.verdict.deathcause import DeathKind
from oomload.verdict.shift import LATENCIES, STATS, Stat, format_ms
from oomload.verdict.verdict import KV_SATURATED, StepFacts, Verdict

# ---------------------------------------------------------------------------------------------------
# Events (absence rules)


def _any_step(s: StepFacts) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Event:
    """Something an absence rule forbids: how a step shows it, and whether a step could have shown it
    (besides having decided a request: without one a step shows nothing)."""

    name: str  # preemption | engine_death | queueing | kv_saturation | errors
    shows: Callable[[StepFacts, Verdict], bool]
    phrase: Callable[[Verdict], str]  # as a failure names it
    observable: Callable[[StepFacts], bool] = _any_step
    at_death: bool = False  # the verdict's engine death counts as seen at its level

    def seen(self, verdict: Verdict, covered: Sequence[StepFacts]) -> tuple[int, str] | None:
        """The lowest covered level that shows the event, and its phrase; ``None`` when none does."""
        hits = [s.concurrency for s in covered if self.shows(s, verdict)]
        if self.at_death and verdict.engine_death is not None:
            c = verdict.engine_death.concurrency
            if c is not None and covered and c <= max(s.concurrency for s in covered):
                hits.append(c)
        if not hits:
            return None
        return min(hits), self.phrase(verdict)

    def observed_in(self, s: StepFacts) -> bool:
        return s.decided_requests > 0 and self.observable(s)


def _death_shown(s: StepFacts, verdict: Verdict) -> bool:
    death = verdict.engine_death
    return (death is not None and death.step == s.index) or s.charged(Outcome.ENGINE_DEAD) > 0


def _death_phrase(verdict: Verdict) -> str:
    """A memory death names its cause; any other death fails the rule too — a server that did not
    survive vouches for nothing above it — with a sentence that says it was not memory."""
    death = verdict.engine_death
    if death is None:
        return "engine death"
    cause = death.cause
    if death.memory:
        return "an OOM" + ("" if cause is None or not cause.memory else f" ({cause.sentence})")
    if cause is not None and cause.kind is not DeathKind.NO_CAUSE:
        return f"an engine death that was not of memory ({cause.sentence})"
    return "an engine death of unknown cause (give oomload the server's log: --serve or --server-log)"


PREEMPTION = Event(
    "preemption",
    shows=lambda s, v: (s.preemptions or 0) > 0,
    phrase=lambda v: "preemption",
    # a clean step short of the requests the trace's odds ask for could have missed it (``evidence_thin``)
    observable=lambda s: s.preemptions is not None and not s.evidence_thin,
)
ENGINE_DEATH = Event("engine_death", shows=_death_shown, phrase=_death_phrase, at_death=True)
QUEUEING = Event(  # sustained: two consecutive scrapes, or vLLM's queue-time sum (StepFacts.queue_depth)
    "queueing",
    shows=lambda s, v: (s.queue_depth or 0.0) > 0,
    phrase=lambda v: "queueing",
    observable=lambda s: s.queue_depth is not None,
)
KV_SATURATION = Event(
    "kv_saturation",
    shows=lambda s, v: (s.kv_usage_sustained or 0.0) >= KV_SATURATED,
    phrase=lambda v: "KV cache saturation",
    observable=lambda s: s.kv_usage_sustained is not None,
)
ERRORS = Event("errors", shows=lambda s, v: s.error_requests > 0, phrase=lambda v: "failed requests")
EVENTS: dict[str, Event] = {  # as a rule names them → the event
    "preemption": PREEMPTION,
    "preemptions": PREEMPTION,
    "oom": ENGINE_DEATH,
    "engine-death": ENGINE_DEATH,
    "death": ENGINE_DEATH,
    "queueing": QUEUEING,
    "kv-saturation": KV_SATURATION,
    "errors": ERRORS,
}


# ---------------------------------------------------------------------------------------------------
# Metrics (threshold rules)


@dataclass(frozen=True, slots=True)
class Metric:
    """A number a threshold rule bounds: its unit, and how to read it from one step or the whole run
    (``None``: not measured there; an absent reader: the metric has no value there at all)."""

    name: str
    unit: str  # the base unit of ``observed``
    of_step: Callable[[StepFacts], float | None] | None = None
    of_run: Callable[[Verdict], float | None] | None = None
    share: bool = False  # a share: the threshold may be written in %
    monotone: bool = False  # only grows as a step goes on: an untrusted step's value already fails
    fails_where_engine_died: bool = False  # the step the engine died in is judged on it, trusted or not
    from_trusted_steps: bool = False  # built from trusted steps only: a cut-short run leaves it whole
    latency: str | None = None  # a latency statistic: which latency (``ttft``, ``tpot``, ``e2e``) …
    stat: Stat | None = None  # … and which statistic of its requests (``p50``, ``p99``)

    def show(self, value: float) -> str:
        """``value`` (in ``unit``) as a reason shows it: a latency as the compare page does (``850 ms``,
        ``1.25 s``), a share in % (``0.54 %``), a rate with its unit, a count or level as a number."""
        if self.share:
            return f"{value * 100:.3g} %"
        if self.unit in ("ms", "s"):
            return format_ms(value * 1000.0 if self.unit == "s" else value)
        if "/" in self.unit:
            return f"{show_number(value)} {self.unit}"
        return show_number(value)

    def show_apart(self, value: float, bound: float) -> tuple[str, str]:
        """``value`` and its bound shown in the unit, apart (``show_apart``)."""
        unit = f" {self.unit}" if self.unit in ("ms", "s") or "/" in self.unit else ""
        return show_apart(self.show, value, bound, unit)


def show_apart(show: Callable[[float], str], value: float, bound: float, unit: str = "") -> tuple[str, str]:
    """``value`` and the bound it is judged against, shown so that two different numbers never read
    the same (``2.00 s, not <= 2.00 s``): where ``show`` would, both in six significant digits of the
    base unit."""
    value_text, bound_text = show(value), show(bound)
    if value_text == bound_text and value != bound:
        return f"{value:.6g}{unit}", f"{bound:.6g}{unit}"
    return value_text, bound_text


def show_number(value: float) -> str:
    """A count or level as a whole number, anything else in four significant digits."""
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _as_float(value: int | None) -> float | None:
    return None if value is None else float(value)


def _latency(stat: Stat, latency: str, unit: str) -> Metric:
    def of_step(s: StepFacts) -> float | None:
        stats = {"ttft": s.ttft, "tpot": s.tpot, "e2e": s.e2e}[latency]
        value_ms = stats.p50_ms if stat == "p50" else stats.p99_ms
        if value_ms is None:
            return None
        return value_ms / 1000.0 if unit == "s" else value_ms

    return Metric(f"{stat}-{latency}-{unit}", unit, of_step=of_step, latency=latency, stat=stat)


def _decided(verdict: Verdict) -> list[StepFacts]:
    return [s for s in verdict.measured_steps if s.decided_requests > 0]


def _run_kv_usage_max(verdict: Verdict) -> float | None:
    measured = _decided(verdict)
    known = [s.kv_usage_max for s in measured if s.kv_usage_max is not None]
    return max(known) if known and len(known) == len(measured) else None


def _run_preemptions(verdict: Verdict) -> float | None:
    counts = [s.preemptions for s in _decided(verdict)]
    return float(sum(c for c in counts if c is not None)) if counts and None not in counts else None


_METRICS = (
    *(_latency(s, lat, unit) for s in STATS for lat in LATENCIES for unit in ("ms", "s")),
    Metric(
        "max-kv-usage",
        "share",
        of_step=lambda s: s.kv_usage_max,
        of_run=_run_kv_usage_max,
        share=True,
        monotone=True,
    ),
    Metric(
        "preemptions",
        "count",
        of_step=lambda s: _as_float(s.preemptions),
        of_run=_run_preemptions,
        monotone=True,
    ),
    Metric("req-per-s", "req/s", of_step=lambda s: s.req_per_s),
    Metric("output-tokens-per-s", "tokens/s", of_step=lambda s: s.output_tokens_per_s),
    Metric("max-waiting", "requests", of_step=lambda s: _as_float(s.waiting_max), monotone=True),
    Metric("achieved-concurrency", "requests", of_step=lambda s: s.achieved_concurrency),
    Metric(
        "error-rate",
        "share",
        of_step=lambda s: s.error_rate,
        of_run=lambda v: v.error_rate,
        share=True,
        fails_where_engine_died=True,
    ),
    Metric(
        "last-safe-concurrency",
        "concurrency",
        of_run=lambda v: _as_float(v.last_safe_concurrency),
        from_trusted_steps=True,
    ),
)
METRICS: dict[str, Metric] = {m.name: m for m in _METRICS}
SHARE_METRICS = tuple(sorted(m.name for m in _METRICS if m.share))  # as error messages name them
