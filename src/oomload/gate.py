"""Pre-release gate: readable threshold rules for CI, evaluated against a verdict (pure).

Two shapes of rule (spaces around the operator are allowed; case does not matter)::

    no-preemption-below:64       no preemption at any concurrency < 64
    no-oom-up-to:128             no engine death / OOM at any concurrency ≤ 128
    p99-ttft-s@64<=2             P99 time to first token at concurrency 64 is ≤ 2 s
    error-rate<=0.1%             share of non-ok requests over the run (or ``error-rate@64<=0.001``)
    max-kv-usage@32<0.95         the highest KV-cache usage seen at concurrency 32 is < 0.95
    last-safe-concurrency>=64    the verdict's last safe concurrency

Absence rules ``no-EVENT-below:N`` / ``no-EVENT-up-to:N`` with EVENT one of ``EVENTS``. Threshold
rules ``METRIC[@CONCURRENCY] OP VALUE`` with OP one of ``<= < >= > ==``, METRIC one of ``METRICS``
(latency metrics ``{p50,p99}-{ttft,tpot,e2e}-{ms,s}``), VALUE a number, ``%`` allowed for shares.

Evidence. A rule passes only on evidence, never on its absence:

* ``no-EVENT-below:N`` fails when any measured level < N shows the event — in any step, also one cut
  short: a failure seen is a failure. It passes only when a *trusted* step (completed, not cut short,
  and holding ≥ 80 % of its concurrency: ``StepFacts.trusted``) at concurrency ≥ N-1 was measured
  with the signal observable (so the highest level the rule covers is vouched for; the event is
  assumed monotone in concurrency — the refinement pass tests the levels in between). ``up-to:N``
  likewise with N. Otherwise it is *not evaluated*, naming the untrusted steps.
* ``METRIC@C`` needs a trusted, non-warmup step at exactly C carrying the metric; with several
  (repeats) the worst one is judged. No step, only cut-short or under-held steps, a step in which no
  request was decided (all cancelled) or a missing metric → not evaluated — except that a count or
  peak (``preemptions``, ``max-kv-usage``, ``max-waiting``) that an untrusted step already shows above
  an upper bound fails (it can only grow with more time), and so does the error rate of the step the
  engine died in (the death is a failure at that level). Steps after an engine death measured a
  dead server and are no evidence either way (``Verdict.measured_steps`` leaves them out).
* A run-wide threshold (``error-rate<=0.1%``, ``max-kv-usage<0.95``, ``preemptions==0``) on a run
  that was cut short is judged on the part measured: a violation fails, a pass is *not evaluated*
  (the levels never reached could change it). ``last-safe-concurrency`` is built from trusted steps
  only and is judged as is.

Values are shown in the rule's own unit (``error-rate<=0.1%`` prints ``0.54 %``); ``observed`` in
``GateResult.to_json`` is in the metric's base unit, named by ``unit``.

``gate_exit_code``: any failure → ``GATE_FAILED`` (1); else any rule not evaluated →
``GATE_NOT_EVALUATED`` (4); else ``OK``. A missing-evidence rule never turns into a pass.

Rules also come from a scenario file (TOML): ``[gate]`` ``rules = ["no-preemption-below:64", …]``.
"""

from __future__ import annotations

import math
import operator
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from oomload.errors import ConfigError, ExitCode
from oomload.outcome import Outcome
from oomload.verdict import KV_SATURATED, StepFacts, Verdict

EVENTS: dict[str, str] = {
    "preemption": "preemption",
    "preemptions": "preemption",
    "oom": "engine_death",
    "engine-death": "engine_death",
    "death": "engine_death",
    "queueing": "queueing",
    "kv-saturation": "kv_saturation",
    "errors": "errors",
}
LATENCIES = ("ttft", "tpot", "e2e")
STATS = ("p50", "p99")
PER_STEP_METRICS = (
    "max-kv-usage",
    "preemptions",
    "req-per-s",
    "output-tokens-per-s",
    "max-waiting",
    "achieved-concurrency",
)
RUN_METRICS = ("error-rate", "last-safe-concurrency", "max-kv-usage", "preemptions")
SHARE_METRICS = ("error-rate", "max-kv-usage")
MONOTONE_METRICS = ("preemptions", "max-kv-usage", "max-waiting")  # only grow as a step goes on
UNITS = {
    "error-rate": "share",
    "max-kv-usage": "share",
    "preemptions": "count",
    "max-waiting": "requests",
    "req-per-s": "req/s",
    "output-tokens-per-s": "tokens/s",
    "achieved-concurrency": "requests",
    "last-safe-concurrency": "concurrency",
}
METRICS: tuple[str, ...] = (
    *(f"{s}-{lat}-{unit}" for s in STATS for lat in LATENCIES for unit in ("ms", "s")),
    *PER_STEP_METRICS,
    "error-rate",
    "last-safe-concurrency",
)
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "<": operator.lt,
    ">": operator.gt,
}
SYNTAX_HELP = (
    "expected 'no-EVENT-below:N', 'no-EVENT-up-to:N' "
    "(EVENT: preemption, oom, queueing, kv-saturation, errors) "
    "or 'METRIC[@CONCURRENCY] OP VALUE' (e.g. 'p99-ttft-s@64<=2', 'error-rate<=0.1%', 'max-kv-usage@32<0.95')"
)

_ABSENCE = re.compile(r"^no-(?P<event>[a-z-]+?)-(?P<bound>below|up-to):\s*(?P<n>\S+)$")
_THRESHOLD = re.compile(
    r"^(?P<metric>[a-z0-9.-]+)\s*(?:@\s*(?P<c>[^\s<>=]+))?\s*(?P<op><=|>=|==|<|>)\s*(?P<value>\S+)$"
)


class GateStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_EVALUATED = "not_evaluated"


@dataclass(frozen=True, slots=True)
class Gate:
    """One parsed rule. ``kind`` is ``"absence"`` (event/bound/concurrency) or ``"threshold"``."""

    text: str
    kind: str
    event: str | None = None  # absence: preemption | engine_death | queueing | kv_saturation | errors
    bound: str | None = None  # absence: "below" | "up-to"
    concurrency: int | None = None
    metric: str | None = None  # threshold: a name from METRICS
    op: str | None = None
    threshold: float | None = None
    percent: bool = False  # the threshold was written in % (values are shown in %)

    @property
    def unit(self) -> str | None:
        """The base unit of a threshold rule's metric (``observed`` is in it)."""
        if self.metric is None:
            return None
        return UNITS.get(self.metric, self.metric.rsplit("-", 1)[-1])

    def show(self, value: float) -> str:
        """A value in the rule's own unit: ``0.54 %`` for a rule written in %, else the number."""
        if self.percent:
            return f"{value * 100:.3g} %"
        return f"{value:.6g}"

    @property
    def highest_covered(self) -> int | None:
        """The highest concurrency an absence rule speaks for (N-1 for below:N, N for up-to:N)."""
        if self.kind != "absence" or self.concurrency is None:
            return None
        return self.concurrency - 1 if self.bound == "below" else self.concurrency


@dataclass(frozen=True, slots=True)
class GateResult:
    gate: Gate
    status: GateStatus
    reason: str
    observed: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "rule": self.gate.text,
            "status": self.status.value,
            "reason": self.reason,
            "observed": self.observed,
            "unit": self.gate.unit,
        }


def parse_gate(text: str) -> Gate:
    """Parse one rule; ``ConfigError`` names the bad text and what is allowed."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"empty gate rule {text!r}: {SYNTAX_HELP}")
    clean = text.strip()
    lowered = clean.lower()
    absence = _ABSENCE.match(lowered)
    if absence:
        event = EVENTS.get(absence["event"])
        if event is None:
            raise ConfigError(
                f"gate {clean!r}: unknown event {absence['event']!r}; "
                f"allowed: {', '.join(sorted(set(EVENTS)))}"
            )
        n = _positive_int(absence["n"], clean, "concurrency")
        if absence["bound"] == "below" and n < 2:
            raise ConfigError(f"gate {clean!r}: 'below:{n}' covers no concurrency; use a value ≥ 2")
        return Gate(text=clean, kind="absence", event=event, bound=absence["bound"], concurrency=n)
    if lowered.startswith("no-"):
        raise ConfigError(f"gate {clean!r}: an absence rule reads 'no-EVENT-below:N' or 'no-EVENT-up-to:N'")
    threshold = _THRESHOLD.match(lowered)
    if not threshold:
        raise ConfigError(f"gate {clean!r} is not a rule: {SYNTAX_HELP}")
    metric = threshold["metric"]
    if metric not in METRICS:
        raise ConfigError(f"gate {clean!r}: unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    concurrency = None if threshold["c"] is None else _positive_int(threshold["c"], clean, "concurrency")
    if concurrency is None and metric not in RUN_METRICS:
        raise ConfigError(
            f"gate {clean!r}: {metric} is measured per step; name the level, e.g. '{metric}@64'"
        )
    if concurrency is not None and metric == "last-safe-concurrency":
        raise ConfigError(
            f"gate {clean!r}: last-safe-concurrency is one number per run; drop '@{concurrency}'"
        )
    value = _number(threshold["value"], clean, percent_ok=metric in SHARE_METRICS)
    return Gate(
        text=clean,
        kind="threshold",
        metric=metric,
        op=threshold["op"],
        threshold=value,
        concurrency=concurrency,
        percent=threshold["value"].endswith("%"),
    )


def parse_gates(texts: Iterable[str]) -> tuple[Gate, ...]:
    return tuple(parse_gate(t) for t in texts)


def parse_gate_toml(text: str, *, source: str = "<gate file>") -> tuple[Gate, ...]:
    """Rules of a scenario file's ``[gate]`` table (``rules = [...]``)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source}: not valid TOML ({err})") from err
    table = doc.get("gate")
    if not isinstance(table, dict):
        raise ConfigError(
            f'{source}: no [gate] table; expected [gate] with rules = ["no-preemption-below:64", …]'
        )
    rules = table.get("rules")
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise ConfigError(f"{source}: [gate] rules must be a list of strings, got {rules!r}")
    unknown = sorted(set(table) - {"rules"})
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) in [gate]: {', '.join(unknown)}; allowed: rules")
    try:
        return parse_gates(rules)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from err


def load_gate_file(path: str | Path) -> tuple[Gate, ...]:
    """Read a scenario file's ``[gate]`` rules (``ConfigError`` when unreadable)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read gate file {path}: {err.strerror or err}") from err
    return parse_gate_toml(text, source=str(path))


def evaluate_gate(gate: Gate, verdict: Verdict) -> GateResult:
    """Judge one rule against a verdict: pass, fail, or not evaluated (missing evidence)."""
    if gate.kind == "absence":
        return _evaluate_absence(gate, verdict)
    return _evaluate_threshold(gate, verdict)


def evaluate_gates(gates: Sequence[Gate], verdict: Verdict) -> tuple[GateResult, ...]:
    return tuple(evaluate_gate(g, verdict) for g in gates)


def gate_exit_code(results: Sequence[GateResult]) -> ExitCode:
    if any(r.status is GateStatus.FAIL for r in results):
        return ExitCode.GATE_FAILED
    if any(r.status is GateStatus.NOT_EVALUATED for r in results):
        return ExitCode.GATE_NOT_EVALUATED
    return ExitCode.OK


def _evaluate_absence(gate: Gate, verdict: Verdict) -> GateResult:
    assert gate.event is not None and gate.highest_covered is not None
    top = gate.highest_covered
    covered = [s for s in verdict.measured_steps if s.concurrency <= top]
    seen = _event_seen(gate.event, verdict, covered)
    if seen is not None:
        level, detail = seen
        return GateResult(gate, GateStatus.FAIL, f"{detail} at concurrency {level}", observed=float(level))
    above = [s for s in verdict.measured_steps if s.concurrency >= top and _observable(gate.event, s)]
    vouching = [s for s in above if s.trusted]
    if vouching:
        level = min(s.concurrency for s in vouching)
        clean = not any(_step_shows(gate.event, s, verdict) for s in vouching if s.concurrency == level)
        if clean:
            return GateResult(gate, GateStatus.PASS, f"none seen up to concurrency {level} (measured)")
        return GateResult(
            gate,
            GateStatus.NOT_EVALUATED,
            f"clean up to the levels measured below {top}, but the next measured level {level} shows it; "
            f"the onset lies in between — add a step at {top} (refinement pass)",
        )
    tested = [s.concurrency for s in verdict.measured_steps if s.trusted and _observable(gate.event, s)]
    reached = (
        f"the highest trusted level with evidence was {max(tested)}"
        if tested
        else "no trusted step had evidence"
    )
    untrusted = [d for s in above if (d := s.distrust) is not None]
    if untrusted:
        return GateResult(
            gate,
            GateStatus.NOT_EVALUATED,
            f"no trusted evidence at concurrency {top}: {'; '.join(untrusted[:2])}; {reached}",
        )
    why = "the run did not reach" if not tested or max(tested) < top else "no evidence at"
    return GateResult(gate, GateStatus.NOT_EVALUATED, f"{why} concurrency {top}: {reached}")


def _event_seen(event: str, verdict: Verdict, covered: Sequence[StepFacts]) -> tuple[int, str] | None:
    hits = [s.concurrency for s in covered if _step_shows(event, s, verdict)]
    if event == "engine_death" and verdict.engine_death is not None:
        c = verdict.engine_death.concurrency
        if c is not None and covered and c <= max(s.concurrency for s in covered):
            hits.append(c)
    if not hits:
        return None
    names = {
        "preemption": "preemption",
        "engine_death": "engine death"
        + (" (CUDA OOM)" if verdict.engine_death and verdict.engine_death.real_oom else ""),
        "queueing": "queueing",
        "kv_saturation": "KV cache saturation",
        "errors": "failed requests",
    }
    return min(hits), names[event]


def _step_shows(event: str, s: StepFacts, verdict: Verdict) -> bool:
    if event == "preemption":
        return (s.preemptions or 0) > 0
    if event == "engine_death":
        death = verdict.engine_death
        return (death is not None and death.step == s.index) or s.charged(Outcome.ENGINE_DEAD) > 0
    if event == "queueing":  # sustained: two consecutive scrapes (oomload.gauges)
        return (s.waiting_sustained or 0) > 0
    if event == "kv_saturation":
        return (s.kv_usage_sustained or 0.0) >= KV_SATURATED
    return s.error_requests > 0


def _observable(event: str, s: StepFacts) -> bool:
    if s.decided_requests == 0:
        return False
    if event == "preemption":
        return s.preemptions is not None
    if event == "queueing":
        return s.waiting_sustained is not None
    if event == "kv_saturation":
        return s.kv_usage_sustained is not None
    return True


def _evaluate_threshold(gate: Gate, verdict: Verdict) -> GateResult:
    assert gate.metric is not None and gate.op is not None and gate.threshold is not None
    compare = OPERATORS[gate.op]
    if gate.concurrency is None:
        observed = _run_metric(gate.metric, verdict)
        where = "over the run"
        if observed is None:
            return GateResult(gate, GateStatus.NOT_EVALUATED, f"{gate.metric} is not available {where}")
        partial = verdict.run.cut_short and gate.metric != "last-safe-concurrency"
        if partial and compare(observed, gate.threshold):
            return GateResult(
                gate,
                GateStatus.NOT_EVALUATED,
                f"{gate.metric} = {gate.show(observed)} over the part measured, but the run was cut short "
                f"({verdict.run.cut_short_detail}): the levels it never reached could change it",
                observed=observed,
            )
    else:
        steps = verdict.steps_at(gate.concurrency)
        if not steps:
            levels = ", ".join(map(str, verdict.levels)) or "none"
            return GateResult(
                gate,
                GateStatus.NOT_EVALUATED,
                f"no step at concurrency {gate.concurrency} (measured: {levels})",
            )
        where = f"at concurrency {gate.concurrency}"
        complete = [s for s in steps if s.trusted and s.decided_requests > 0]
        if not complete:
            seen = _partial_violation(gate, steps)
            if seen is not None:
                return GateResult(
                    gate,
                    GateStatus.FAIL,
                    f"{gate.metric} = {gate.show(seen)} {where} already in an untrusted step, "
                    f"not {gate.op} {gate.show(gate.threshold)}",
                    observed=seen,
                )
            why = "; ".join(d for s in steps if (d := s.distrust) is not None) or (
                f"no request at concurrency {gate.concurrency} was answered"
            )
            return GateResult(gate, GateStatus.NOT_EVALUATED, f"no trusted step {where}: {why}")
        values = [_step_metric(gate.metric, s) for s in complete]
        if any(v is None for v in values):
            return GateResult(
                gate,
                GateStatus.NOT_EVALUATED,
                f"{gate.metric} was not measured {where} (no data: metrics or streaming off?)",
            )
        known = [v for v in values if v is not None]
        upper = gate.op in ("<", "<=", "==")
        observed = max(known) if upper else min(known)
        if gate.op == "==":
            bad = [v for v in known if not compare(v, gate.threshold)]
            observed = bad[0] if bad else known[0]
    passed = compare(observed, gate.threshold)
    shown = gate.show(observed)
    if passed:
        return GateResult(gate, GateStatus.PASS, f"{gate.metric} = {shown} {where}", observed=observed)
    return GateResult(
        gate,
        GateStatus.FAIL,
        f"{gate.metric} = {shown} {where}, not {gate.op} {gate.show(gate.threshold)}",
        observed=observed,
    )


def _partial_violation(gate: Gate, steps: Sequence[StepFacts]) -> float | None:
    """A count or peak that untrusted steps already show above an upper bound (it can only grow), or
    the error rate of the step the engine died in (the death is a failure at that level)."""
    assert gate.metric is not None and gate.op is not None and gate.threshold is not None
    if gate.op not in ("<", "<=", "=="):
        return None
    eligible = [
        s for s in steps if gate.metric in MONOTONE_METRICS or (gate.metric == "error-rate" and s.died_here)
    ]
    known = [v for s in eligible if (v := _step_metric(gate.metric, s)) is not None]
    worst = max(known, default=None)
    if worst is None:
        return None
    violated = worst > gate.threshold if gate.op == "==" else not OPERATORS[gate.op](worst, gate.threshold)
    return worst if violated else None


def _run_metric(metric: str, verdict: Verdict) -> float | None:
    if metric == "error-rate":
        return verdict.error_rate
    if metric == "last-safe-concurrency":
        return None if verdict.last_safe_concurrency is None else float(verdict.last_safe_concurrency)
    measured = [s for s in verdict.measured_steps if s.decided_requests > 0]
    if metric == "max-kv-usage":
        known = [s.kv_usage_max for s in measured if s.kv_usage_max is not None]
        return max(known) if known and len(known) == len(measured) else None
    if metric == "preemptions":
        counts = [s.preemptions for s in measured]
        return float(sum(c for c in counts if c is not None)) if counts and None not in counts else None
    return None


def _step_metric(metric: str, s: StepFacts) -> float | None:
    if metric == "error-rate":
        return s.error_rate
    if metric == "max-kv-usage":
        return s.kv_usage_max
    if metric == "preemptions":
        return None if s.preemptions is None else float(s.preemptions)
    if metric == "req-per-s":
        return s.req_per_s
    if metric == "output-tokens-per-s":
        return s.output_tokens_per_s
    if metric == "max-waiting":
        return None if s.waiting_max is None else float(s.waiting_max)
    if metric == "achieved-concurrency":
        return s.achieved_concurrency
    stat, latency, unit = metric.split("-")
    stats = {"ttft": s.ttft, "tpot": s.tpot, "e2e": s.e2e}[latency]
    value_ms = stats.p50_ms if stat == "p50" else stats.p99_ms
    if value_ms is None:
        return None
    return value_ms / 1000.0 if unit == "s" else value_ms


def _positive_int(text: str, rule: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise ConfigError(f"gate {rule!r}: {what} {text!r} is not a whole number") from err
    if value < 1:
        raise ConfigError(f"gate {rule!r}: {what} must be ≥ 1, got {value}")
    return value


def _number(text: str, rule: str, *, percent_ok: bool) -> float:
    raw = text
    scale = 1.0
    if raw.endswith("%"):
        if not percent_ok:
            raise ConfigError(f"gate {rule!r}: '%' is allowed only for {', '.join(SHARE_METRICS)}")
        raw, scale = raw[:-1], 0.01
    try:
        value = float(raw) * scale
    except ValueError as err:
        raise ConfigError(f"gate {rule!r}: threshold {text!r} is not a number") from err
    if not math.isfinite(value):
        raise ConfigError(f"gate {rule!r}: threshold {text!r} must be finite")
    return value
