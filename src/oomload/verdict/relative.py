"""Gate rules relative to a baseline run: did this release cost us an onset, memory or latency? (pure)

A relative rule bounds a value of this run by the same value of a baseline run (``--baseline
RUN_DIR`` on ``replay`` and ``report``; the base run of ``compare``)::

    onset>=baseline                  the preemption onset did not fall (separated by the repeats)
    onset>=baseline-1                … by more than one level
    last-safe>=baseline-1            the last safe concurrency fell by at most one level
    kv-blocks>=baseline*0.95         the KV pool kept at least 95 % of its blocks
    p99-ttft-s@8<=baseline*1.10      P99 TTFT at concurrency 8 grew by at most 10 %
    error-rate<=baseline*2           any threshold metric of ``oomload.verdict.gatesignals``
    no-new-death                     the engine did not die where the baseline's survived

Shape: ``QUANTITY[@CONCURRENCY] OP baseline[(*|+|-)NUMBER]``; QUANTITY is ``onset``
(``preemption-onset``), ``last-safe`` (``last-safe-concurrency``), ``kv-blocks`` or a threshold
metric (per step with ``@C``, over the run without).

Evidence, as for every gate rule: a rule passes only on evidence, and missing evidence — a value
either run did not measure — is *not evaluated*, never a pass. So is every rule but ``kv-blocks`` (the
server's own pool) when the two runs replayed different traces (``RunInfo.trace_sha256``, their
``provenance.json`` digests, as ``oomload compare`` checks), or sent different traffic from their trace
(``Verdict.traffic``: shared prefixes or distinct prompts, ``--only-fitting``, ``--tail-percentile``,
``--open-loop``): the same server preempts earlier under distinct prompts, so such an onset says nothing
about the release.

* ``onset`` (``>=`` or ``>`` only: an onset is bounded from below). A run without an onset counts
  as clean up to its highest level judged for preemption (``Verdict.preemption_judged_up_to``: a
  ``/metrics`` scrape, and a trusted clean step with the odds' evidence; its onset is above it), or
  below its lowest sporadic preemption; a run with no level judged is not evaluated. A new onset
  that meets the bound passes; one that misses it **fails only when the repeats separate the two onsets**
  (``oomload.verdict.shift.onset_shift``: Fisher's exact test on the steps between them, p ≤ 0.05),
  and is not evaluated when they do not (one draw against another). A new run clean up to a level
  below the bound is not evaluated (it did not measure high enough).
* ``last-safe``, ``kv-blocks`` (``cache_config_info``'s ``num_gpu_blocks``) and metrics compare the
  two numbers. A metric over the run (no ``@C``) is compared only between two complete runs (neither
  cut short, no step whose requests mostly failed) that measured the same levels: else a total over
  other levels would pass or fail on what was not measured. A metric at ``@C`` is read from each run
  as the absolute rule reads it: its trusted steps at C that decided a request, the worst of them
  (the highest against an upper bound); a latency at ``@C`` that misses its bound is judged further
  (below). ``last-safe`` is judged over this run's range (``oomload.verdict.lastsafe``: its true last
  safe level lies between its last safe level and one below its first level that broke or queued)
  against the bound from the level the baseline proved safe: it passes when it holds whatever the
  value, fails when it holds for none (a run that broke at its lowest level ``B`` is below ``B``), and
  is not evaluated when levels in between were never judged (a run cut short, a gap not refined).
* A latency at ``@C`` (``p50|p99-ttft|tpot|e2e-ms|s``) passes on those two numbers, as any metric;
  one that misses its bound **fails only when the requests at C separate the two runs** on the side
  of the miss (slower against ``<=``/``<``, faster against ``>=``/``>``, either against ``==``), by
  the test ``oomload compare`` shows in its latency rows (``oomload.verdict.shift.level_shifts``, given
  by the caller: Mann–Whitney U on the P50, a bootstrap of the P99, over the ok requests of the
  trusted steps at C; p < ``ALPHA_LATENCY``, 0.01), and the statistic did not move both ways across
  levels (``mixed``: the host's noise, not the release's). Else it is not evaluated, saying why: too
  few requests to tell (8 a side for the P50, 100 for the P99), not separated (the test's p), moved
  both ways, the statistic over all of C's requests moved the other way (the worst step missed, the
  level did not), or no per-request samples. The P99 of 40 requests is one of its last two: 518 ms
  against 320 ms there is one draw against another until the requests say otherwise. Compare's 10 %
  floor does not apply: the bound is the effect the rule asks about.
* ``no-new-death`` fails when this run's engine died at a level where the baseline's did not (the
  baseline survived it, or died higher), and is not evaluated when the baseline never ran that
  level; it passes when neither died over the levels the baseline measured — this run reached the
  baseline's highest trusted level — or the baseline died as low.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oomload.errors import ConfigError
from oomload.verdict.gateresult import OPERATORS, UPPER_BOUNDS, GateResult, GateStatus, Op, as_op, rule_int
from oomload.verdict.gatesignals import METRICS, Metric, show_apart, show_number
from oomload.verdict.lastsafe import LastSafeRange, judge
from oomload.verdict.shift import (
    ALPHA_LATENCY,
    MIN_SAMPLES_P50,
    MIN_SAMPLES_P99,
    LatencyShift,
    find_shift,
    format_ms,
    onset_shift,
)
from oomload.verdict.verdict import Verdict

BASELINE = "baseline"
NO_NEW_DEATH = "no-new-death"
QUANTITIES = {  # as a rule names them → the quantity
    "onset": "onset",
    "preemption-onset": "onset",
    "last-safe": "last-safe",
    "last-safe-concurrency": "last-safe",
    "kv-blocks": "kv-blocks",
}
RELATIVE_HELP = (
    "a relative rule reads 'QUANTITY[@CONCURRENCY] OP baseline[*F|+N|-N]' (QUANTITY: onset, last-safe, "
    "kv-blocks or a metric, e.g. 'onset>=baseline', 'kv-blocks>=baseline*0.95', "
    "'p99-ttft-s@8<=baseline*1.10') "
    "or 'no-new-death'"
)
_RELATIVE = re.compile(
    r"^(?P<q>[a-z0-9.-]+)\s*(?:@\s*(?P<c>[^\s<>=]+))?\s*(?P<op><=|>=|==|<|>)\s*baseline\s*"
    r"(?:(?P<arith>[*+-])\s*(?P<num>\S+))?$"
)


def is_relative(lowered: str) -> bool:
    """Whether a rule's text (lower case) is relative to a baseline."""
    return lowered == NO_NEW_DEATH or re.search(r"[<>=]\s*baseline\b", lowered) is not None


def onset_steps(verdict: Verdict) -> list[tuple[int, bool]]:
    """``(level, preempted)`` of the verdict's conclusive steps (``StepFacts.conclusive``: the steps the
    onset is decided on)."""
    return [(s.concurrency, (s.preemptions or 0) > 0) for s in verdict.measured_steps if s.conclusive]


def level_value(verdict: Verdict, metric: Metric, concurrency: int, op: Op) -> float | None:
    """A metric at one level as the absolute rule reads it: the worst of the trusted steps at that
    level that decided a request (``None``: no such step, or the metric not measured)."""
    of_step = metric.of_step
    assert of_step is not None
    steps = [s for s in verdict.steps_at(concurrency) if s.trusted and s.decided_requests > 0]
    values = [of_step(s) for s in steps]
    if not values or any(v is None for v in values):
        return None
    known = [v for v in values if v is not None]
    return max(known) if op in UPPER_BOUNDS else min(known)


@dataclass(frozen=True, slots=True)
class RelativeRule:
    """``QUANTITY[@C] OP baseline[…]`` or ``no-new-death`` (module docstring)."""

    text: str
    quantity: str  # onset | last-safe | kv-blocks | metric | new-death
    op: Op = ">="
    scale: float = 1.0
    offset: float = 0.0
    concurrency: int | None = None
    metric: Metric | None = None

    @property
    def unit(self) -> str | None:
        if self.metric is not None:
            return self.metric.unit
        return {"onset": "concurrency", "last-safe": "concurrency", "kv-blocks": "blocks"}.get(self.quantity)

    @classmethod
    def parse(cls, text: str) -> RelativeRule:
        lowered = text.strip().lower()
        if lowered == NO_NEW_DEATH:
            return cls(text, "new-death")
        match = _RELATIVE.match(lowered)
        if match is None:
            raise ConfigError(f"gate {text!r} is not a rule: {RELATIVE_HELP}")
        op = as_op(match["op"])
        scale, offset = _arith(text, match["arith"], match["num"])
        concurrency = None if match["c"] is None else rule_int(match["c"], text, "concurrency")
        name = match["q"]
        quantity = QUANTITIES.get(name)
        if quantity is not None:
            if concurrency is not None:
                raise ConfigError(f"gate {text!r}: {name} is one number per run; drop '@{concurrency}'")
            if quantity == "onset" and op not in (">=", ">"):
                raise ConfigError(f"gate {text!r}: an onset is bounded from below: use >= or >")
            return cls(text, quantity, op, scale, offset)
        metric = METRICS.get(name)
        if metric is None:
            allowed = ", ".join([*QUANTITIES, *METRICS])
            raise ConfigError(f"gate {text!r}: unknown quantity {name!r}; allowed: {allowed}")
        if concurrency is None and metric.of_run is None:
            raise ConfigError(f"gate {text!r}: {name} is measured per step; name the level, e.g. '{name}@8'")
        if concurrency is not None and metric.of_step is None:
            raise ConfigError(f"gate {text!r}: {name} is one number per run; drop '@{concurrency}'")
        return cls(text, "metric", op, scale, offset, concurrency, metric)

    def bound(self, base: float) -> float:
        return base * self.scale + self.offset

    def evaluate(
        self, verdict: Verdict, baseline: Verdict | None, latencies: Sequence[LatencyShift] = ()
    ) -> GateResult:
        """Judge the rule; ``latencies``: the two runs' latency shifts (``shift.level_shifts``, baseline
        against this run), which a latency metric at ``@C`` that missed its bound is judged on."""
        if baseline is None:
            return GateResult(
                self, GateStatus.NOT_EVALUATED, "a rule relative to a baseline needs one (--baseline RUN_DIR)"
            )
        other_trace = _other_trace(verdict, baseline)
        if self.quantity != "kv-blocks" and other_trace is not None:  # the pool is the server's
            return GateResult(self, GateStatus.NOT_EVALUATED, other_trace)
        if self.quantity != "kv-blocks" and baseline.traffic != verdict.traffic:
            return GateResult(
                self,
                GateStatus.NOT_EVALUATED,
                f"the baseline sent different traffic from its trace ({baseline.traffic} against "
                f"{verdict.traffic})",
            )
        if self.quantity == "onset":
            return self._onset(verdict, baseline)
        if self.quantity == "new-death":
            return self._new_death(verdict, baseline)
        if self.quantity == "last-safe":
            return self._last_safe(verdict, baseline)
        name, new, base = self._values(verdict, baseline)
        if base is None or new is None:
            which = " and ".join(w for w, v in (("the baseline", base), ("this run", new)) if v is None)
            return GateResult(self, GateStatus.NOT_EVALUATED, f"{name} was not measured in {which}")
        bound = self.bound(base)
        show = self.metric.show if self.metric is not None else show_number
        text = f"{name} {show(new)} against the baseline's {show(base)}"
        if self.metric is not None and self.concurrency is None and not self.metric.from_trusted_steps:
            partial = _unlike_runs(verdict, baseline)
            if partial is not None:
                return GateResult(self, GateStatus.NOT_EVALUATED, f"{text}, but {partial}", observed=new)
        if OPERATORS[self.op](new, bound):
            return GateResult(self, GateStatus.PASS, text, observed=new)
        new_text, bound_text = (
            self.metric.show_apart(new, bound) if self.metric is not None else show_apart(show, new, bound)
        )
        why = (
            f"not {self.op} {bound_text}"
            if new_text == show(new)
            else f"{new_text} is not {self.op} {bound_text}"
        )
        if self.metric is not None and self.metric.latency is not None and self.concurrency is not None:
            shift = find_shift(latencies, self.metric.latency, self.metric.stat or "", self.concurrency)
            unit_ms = 1000.0 if self.metric.unit == "s" else 1.0
            status, evidence = latency_evidence(
                shift, self.op, lambda base_ms: self.bound(base_ms / unit_ms) * unit_ms
            )
            return GateResult(self, status, f"{text}, {why}{evidence}", observed=new)
        return GateResult(self, GateStatus.FAIL, f"{text}, {why}", observed=new)

    def _last_safe(self, verdict: Verdict, baseline: Verdict) -> GateResult:
        """This run's last safe range against the bound from the level the baseline proved safe
        (``oomload.verdict.lastsafe``)."""
        new, base = LastSafeRange.of(verdict), LastSafeRange.of(baseline)
        observed = _float(verdict.last_safe_concurrency)
        if base.low == 0:
            reason = f"the baseline has no last safe concurrency ({base.words()}): it bounds nothing"
            return GateResult(self, GateStatus.NOT_EVALUATED, reason, observed=observed)
        bound = self.bound(base.low)
        status = judge(new, self.op, bound)
        text = f"last safe concurrency {new.words()} against the baseline's {base.low}"
        if status is GateStatus.FAIL:
            text += f", not {self.op} {show_number(bound)}"
        elif status is GateStatus.NOT_EVALUATED:
            text += f": judge the levels that could meet {self.op} {show_number(bound)}"
        return GateResult(self, status, text, observed=observed)

    def _values(self, verdict: Verdict, baseline: Verdict) -> tuple[str, float | None, float | None]:
        if self.quantity == "kv-blocks":
            return "KV blocks", _blocks(verdict), _blocks(baseline)
        metric = self.metric
        assert metric is not None
        if self.concurrency is None:
            assert metric.of_run is not None
            return f"{metric.name} over the run", metric.of_run(verdict), metric.of_run(baseline)
        c = self.concurrency
        return (
            f"{metric.name} at concurrency {c}",
            level_value(verdict, metric, c, self.op),
            level_value(baseline, metric, c, self.op),
        )

    def _onset(self, verdict: Verdict, baseline: Verdict) -> GateResult:
        base = _onset(baseline)
        if base is not None:
            base_value, base_text = base, f"onset at concurrency {base}"
        elif (clean := _no_onset(baseline)) is not None:
            base_value, base_text = clean  # clean up to its top: above it
        else:
            return GateResult(
                self, GateStatus.NOT_EVALUATED, "the baseline has no onset and no level judged for preemption"
            )
        bound = self.bound(base_value)
        new = _onset(verdict)
        if new is not None:
            where = f"preemption onset at concurrency {new} against the baseline ({base_text})"
            if OPERATORS[self.op](new, bound):
                return GateResult(self, GateStatus.PASS, where, observed=float(new))
            shift = onset_shift(onset_steps(baseline), base, onset_steps(verdict), new)
            status = GateStatus.FAIL if shift.separated else GateStatus.NOT_EVALUATED
            return GateResult(self, status, f"{shift.sentence} (this run against the baseline)", float(new))
        clean = _no_onset(verdict)
        if clean is None:
            return GateResult(
                self, GateStatus.NOT_EVALUATED, "this run has no onset and no level judged for preemption"
            )
        new_value, new_text = clean
        if OPERATORS[self.op](new_value, bound):
            return GateResult(self, GateStatus.PASS, f"{new_text} against the baseline ({base_text})")
        todo = "repeat that level" if verdict.preempted_levels else "measure higher levels"
        return GateResult(
            self,
            GateStatus.NOT_EVALUATED,
            f"{new_text}, below the bound {show_number(bound)} from the baseline ({base_text}): {todo}",
        )

    def _new_death(self, verdict: Verdict, baseline: Verdict) -> GateResult:
        died, base_died = verdict.engine_death, baseline.engine_death
        base_at = None if base_died is None else base_died.concurrency
        if died is not None:
            at = died.concurrency
            kind = "" if died.kind is None else f" ({died.kind.value})"
            base_top = baseline.max_tested_concurrency
            if base_died is None and at is not None and base_top is not None and at > base_top:
                return GateResult(
                    self,
                    GateStatus.NOT_EVALUATED,
                    f"the engine died at concurrency {at}{kind}, above the baseline's highest trusted level "
                    f"({base_top}): the baseline never ran it",
                    observed=float(at),
                )
            if base_died is not None and (base_at is None or at is None or base_at <= at):
                return GateResult(
                    self,
                    GateStatus.PASS,
                    f"the engine died at concurrency {at}{kind}; the baseline's died too, at {base_at}",
                )
            base_text = "survived" if base_died is None else f"died only at concurrency {base_at}"
            return GateResult(
                self,
                GateStatus.FAIL,
                f"the engine died at concurrency {at}{kind}; the baseline's {base_text}",
                observed=None if at is None else float(at),
            )
        reach = base_at if base_at is not None else baseline.max_tested_concurrency
        top = verdict.max_tested_concurrency
        if reach is None:
            return GateResult(self, GateStatus.NOT_EVALUATED, "the baseline has no trusted step")
        if top is not None and top >= reach:
            return GateResult(self, GateStatus.PASS, f"no engine death up to concurrency {top}")
        return GateResult(
            self,
            GateStatus.NOT_EVALUATED,
            f"no engine death, but this run's highest trusted level ({top}) is below the "
            f"baseline's ({reach})",
        )


def relative_rules(rules: Sequence[object]) -> list[RelativeRule]:
    return [r for r in rules if isinstance(r, RelativeRule)]


def latency_evidence(
    shift: LatencyShift | None, op: Op, bound_ms: Callable[[float], float]
) -> tuple[GateStatus, str]:
    """Whether a latency that missed a bound ``op`` failed it: ``FAIL`` only when the test of the two
    runs' requests at that level separates them (``p < ALPHA_LATENCY``) on the side of the miss (slower
    against an upper bound, faster against a lower one, either against ``==``), the statistic over all
    those requests misses the bound too (``bound_ms``: the rule's bound of a baseline value, in ms) —
    a worst step can miss it where the level as a whole moved less — and it did not move both ways
    across levels; else ``NOT_EVALUATED``. With the words that follow the miss."""
    if shift is None or shift.base_ms is None or shift.new_ms is None:
        return (
            GateStatus.NOT_EVALUATED,
            ", but no per-request samples of both runs at that level to test it",
        )
    base_n, new_n = shift.base_n, shift.new_n
    if shift.p_value is None:
        need = MIN_SAMPLES_P50 if shift.stat == "p50" else MIN_SAMPLES_P99
        return GateStatus.NOT_EVALUATED, (
            f", but too few requests to tell ({shift.test} needs {need} a side; the baseline has {base_n}, "
            f"this run {new_n})"
        )
    name = f"{shift.stat.upper()} {shift.metric.upper()}"
    change = "" if shift.ratio is None else f", {shift.ratio - 1.0:+.0%}"
    values = f"{format_ms(shift.base_ms)} → {format_ms(shift.new_ms)}{change}"
    moved = f"{name} {values}"
    test = f"{shift.test} p = {shift.p_value:.2g}"
    n = f"n = {base_n}, {new_n}"
    if not shift.separated:
        apart = f"{moved}; {test} ≥ {ALPHA_LATENCY}, {n}"
        return (
            GateStatus.NOT_EVALUATED,
            f", but the requests at that level do not separate the runs ({apart})",
        )
    slower, faster = shift.new_ms > shift.base_ms, shift.new_ms < shift.base_ms
    if not (slower or faster) or (op in ("<", "<=") and not slower) or (op in (">", ">=") and not faster):
        way = "slower" if slower else "faster" if faster else "unchanged"
        return GateStatus.NOT_EVALUATED, (
            f", but over all the requests at that level {name} was {way} ({values}; {test}, {n})"
        )
    pooled_bound = bound_ms(shift.base_ms)
    if OPERATORS[op](shift.new_ms, pooled_bound):
        return GateStatus.NOT_EVALUATED, (
            f", but over all the requests at that level {name} is within the bound ({values}, against "
            f"{format_ms(pooled_bound)}; {test}, {n})"
        )
    if shift.mixed:
        return GateStatus.NOT_EVALUATED, (
            f", but {name} moved both ways across levels ({values} here; {test}, {n}): the host's "
            "run-to-run noise, not a change of the server"
        )
    return GateStatus.FAIL, f"; the requests at that level separate the runs ({moved}; {test}, {n})"


def _unlike_runs(verdict: Verdict, baseline: Verdict) -> str | None:
    """Why two runs' run-wide totals are not comparable (``None`` when they are): either run cut short or
    with a step that did not load the engine (``Verdict.unloaded_steps``), or the two measured different
    levels."""
    for who, run in (("this run", verdict), ("the baseline", baseline)):
        if run.run.cut_short:
            detail = run.run.cut_short_detail
            return f"{who} was cut short ({detail}): the levels it never reached could change it"
        if run.unloaded_steps:
            return f"in {who}, {run.unloaded_steps[0]}"
    if verdict.levels != baseline.levels:
        levels = (", ".join(map(str, v.levels)) or "none" for v in (baseline, verdict))
        return "the runs measured different levels ({} against {})".format(*levels)
    return None


def _other_trace(verdict: Verdict, baseline: Verdict) -> str | None:
    """Why the baseline's onset, levels and latencies say nothing of this run's: it replayed another trace
    (their ``provenance.json`` digests differ; ``None`` when they agree or a run has none)."""
    new, base = verdict.run.trace_sha256, baseline.run.trace_sha256
    if new is None or base is None or new == base:
        return None
    return f"the baseline replayed another trace (sha256 {base[:12]}…, this run {new[:12]}…)"


def _onset(verdict: Verdict) -> int | None:
    return None if verdict.preemption_onset is None else verdict.preemption_onset.concurrency


def _no_onset(verdict: Verdict) -> tuple[int, str] | None:
    """A run without an onset as an onset bound, with its words: one above its highest level judged for
    preemption (``Verdict.preemption_judged_up_to``), or its lowest sporadic preemption when lower;
    ``None`` when no level was judged (no ``/metrics`` scrape, or no clean step with the odds' evidence)."""
    judged = verdict.preemption_judged_up_to
    if judged is None:
        return None
    value, text = judged + 1, f"no onset up to concurrency {judged}"
    if verdict.preempted_levels:
        first = verdict.preempted_levels[0]
        value = min(value, first.concurrency)
        text += f" (sporadic preemption {first.preempted_text})"
    return value, text


def _blocks(verdict: Verdict) -> float | None:
    cache = verdict.run.cache_config or {}
    value = cache.get("num_gpu_blocks")
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)


def _arith(text: str, arith: str | None, num: str | None) -> tuple[float, float]:
    """(scale, offset) of ``baseline*F`` / ``baseline+N`` / ``baseline-N`` (``%`` allowed on F)."""
    if arith is None or num is None:
        return 1.0, 0.0
    raw, unit = (num[:-1], 0.01) if num.endswith("%") and arith == "*" else (num, 1.0)
    try:
        value = float(raw) * unit
    except ValueError as err:
        raise ConfigError(f"gate {text!r}: {num!r} is not a number") from err
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"gate {text!r}: {num!r} must be a finite number ≥ 0")
    if arith == "*":
        return value, 0.0
    return 1.0, value if arith == "+" else -value
