"""Pre-release gate: readable threshold rules for CI, evaluated against a verdict (pure).

Two shapes of rule (spaces around the operator are allowed; case does not matter)::

    no-preemption-below:64       no preemption at any concurrency < 64
    no-oom-up-to:128             no engine death / OOM at any concurrency ≤ 128
    p99-ttft-s@64<=2             P99 time to first token at concurrency 64 is ≤ 2 s
    error-rate<=0.1%             share of non-ok requests over the run (or ``error-rate@64<=0.001``)
    max-kv-usage@32<0.95         the highest KV-cache usage seen at concurrency 32 is < 0.95
    last-safe-concurrency>=64    the verdict's last safe concurrency

Rules relative to a baseline run (``onset>=baseline``, ``kv-blocks>=baseline*0.95``,
``p99-ttft-s@8<=baseline*1.10``, ``no-new-death``, …) are parsed here too and judged by
``oomload.verdict.relative`` against the baseline's verdict (``--baseline RUN_DIR``).

Absence rules ``no-EVENT-below:N`` / ``no-EVENT-up-to:N`` with EVENT one of ``EVENTS``. Threshold
rules ``METRIC[@CONCURRENCY] OP VALUE`` with OP one of ``<= < >= > ==``, METRIC one of ``METRICS``
(latency metrics ``{p50,p99}-{ttft,tpot,e2e}-{ms,s}``), VALUE a number, ``%`` allowed for shares.

Evidence. A rule passes only on evidence, never on its absence. A step whose requests mostly failed
(``StepFacts.mostly_failed``: transport errors, timeouts, vLLM's 503, 500, malformed answers — more than
half of its decided requests, an engine death's own failures aside) is untrusted: it loaded nothing, so
it vouches for no "no preemption", "no OOM" or latency. Whatever the rules say, a run whose requests
mostly failed exits 3 (``oomload.report.run_exit_code``):

* ``no-EVENT-below:N`` fails when any measured level < N shows the event — in any step, also one cut
  short: a failure seen is a failure. It passes only when a *trusted* step (completed, not cut short,
  and holding ≥ 80 % of its concurrency: ``StepFacts.trusted``) at concurrency ≥ N-1 was measured
  with the signal observable (so the highest level the rule covers is vouched for; the event is
  assumed monotone in concurrency — the refinement pass tests the levels in between; preemption is
  observable in a step with a ``/metrics`` scrape that preempted, or ran clean with the requests the
  trace's odds ask for, ``StepFacts.evidence_thin``). ``up-to:N``
  likewise with N. Otherwise it is *not evaluated*, naming the untrusted steps.
* ``METRIC@C`` needs a trusted, non-warmup step at exactly C carrying the metric; with several
  (repeats) the worst one is judged. No step, only cut-short or under-held steps, a step in which no
  request was decided (all cancelled) or a missing metric → not evaluated — except that a count or
  peak (``preemptions``, ``max-kv-usage``, ``max-waiting``) that an untrusted step already shows above
  an upper bound fails (it can only grow with more time), and so does the error rate of the step the
  engine died in (the death is a failure at that level) or of a step whose requests mostly failed.
  Steps after an engine death measured a dead server and are no evidence either way
  (``Verdict.measured_steps`` leaves them out).
* A run-wide threshold (``error-rate<=0.1%``, ``max-kv-usage<0.95``, ``preemptions==0``) on a run
  that was cut short, or with a step whose requests mostly failed, is judged on the part measured: a
  violation fails, a pass is *not evaluated* (the levels never reached, or never loaded, could change
  it). ``last-safe-concurrency`` is judged over the range the measurements put the true last safe
  level in (``oomload.verdict.lastsafe``: from the last safe level found to one below the first level
  that broke or queued): it passes when every value there meets the bound, fails when none does, and
  is not evaluated when the levels in between were never judged.

Values are shown in their unit (``Metric.show``): latencies as ``850 ms`` or ``5.33 s``, shares in %
(``0.54 %``, however the rule wrote its bound), rates with their unit; a failing value and its bound
never read the same. ``observed`` in ``GateResult.to_json`` is in the metric's base unit, named by
``unit``.

``gate_exit_code``: any failure → ``GATE_FAILED`` (1); else any rule not evaluated →
``GATE_NOT_EVALUATED`` (4); else ``OK``. A missing-evidence rule never turns into a pass.

Rules also come from a scenario file (TOML): ``[gate]`` ``rules = ["no-preemption-below:64", …]``.

Types. A parsed rule is one of four frozen values (``Gate`` is their union), each with its own
``parse`` and ``evaluate``: ``AbsenceRule`` (an ``Event``, a bound and a level), ``RunThreshold``
(a ``Metric`` over the run), ``LevelThreshold`` (a ``Metric`` at one level) and ``RelativeRule``
(a value bounded by the baseline's). An ``Event`` knows how
a step shows it and when a step could have; a ``Metric`` knows its unit and how to read it from a step
or from the whole run. The tables ``EVENTS`` and ``METRICS`` (``oomload.verdict.gatesignals``) hold
every one the syntax accepts.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

from oomload.errors import ConfigError, ExitCode
from oomload.verdict.gateresult import OPERATORS, UPPER_BOUNDS, Op, rule_int
from oomload.verdict.gateresult import GateResult as GateResult  # re-exported
from oomload.verdict.gateresult import GateStatus as GateStatus  # re-exported
from oomload.verdict.gatesignals import EVENTS, METRICS, PREEMPTION, SHARE_METRICS, Event, Metric
from oomload.verdict.lastsafe import LastSafeRange, judge
from oomload.verdict.relative import QUANTITIES, RELATIVE_HELP, RelativeRule, is_relative
from oomload.verdict.shift import LatencyShift
from oomload.verdict.verdict import StepFacts, Verdict

Bound = Literal["below", "up-to"]
SYNTAX_HELP = (
    "expected 'no-EVENT-below:N', 'no-EVENT-up-to:N' "
    "(EVENT: preemption, oom, queueing, kv-saturation, errors) "
    "or 'METRIC[@CONCURRENCY] OP VALUE' "
    "(e.g. 'p99-ttft-s@64<=2', 'error-rate<=0.1%', 'max-kv-usage@32<0.95'), "
    "or relative to a baseline run ('onset>=baseline', 'kv-blocks>=baseline*0.95', 'no-new-death')"
)

_ABSENCE = re.compile(r"^no-(?P<event>[a-z-]+?)-(?P<bound>below|up-to):\s*(?P<n>\S+)$")
_THRESHOLD = re.compile(
    r"^(?P<metric>[a-z0-9.-]+)\s*(?:@\s*(?P<c>[^\s<>=]+))?\s*(?P<op><=|>=|==|<|>)\s*(?P<value>\S+)$"
)


# ---------------------------------------------------------------------------------------------------
# Rules


@dataclass(frozen=True, slots=True)
class AbsenceRule:
    """``no-EVENT-below:N`` / ``no-EVENT-up-to:N``: the event at no level the bound covers."""

    text: str
    event: Event
    bound: Bound
    concurrency: int

    unit = None  # no observed value but the level an event was seen at

    @classmethod
    def parse(cls, text: str, match: re.Match[str]) -> AbsenceRule:
        event = EVENTS.get(match["event"])
        if event is None:
            raise ConfigError(
                f"gate {text!r}: unknown event {match['event']!r}; allowed: {', '.join(sorted(EVENTS))}"
            )
        n = rule_int(match["n"], text, "concurrency")
        bound: Bound = "below" if match["bound"] == "below" else "up-to"
        if bound == "below" and n < 2:
            raise ConfigError(f"gate {text!r}: 'below:{n}' covers no concurrency; use a value ≥ 2")
        return cls(text, event, bound, n)

    @property
    def highest_covered(self) -> int:
        """The highest concurrency the rule speaks for (N-1 for below:N, N for up-to:N)."""
        return self.concurrency - 1 if self.bound == "below" else self.concurrency

    def evaluate(self, verdict: Verdict) -> GateResult:
        top = self.highest_covered
        event = self.event
        covered = [s for s in verdict.measured_steps if s.concurrency <= top]
        seen = event.seen(verdict, covered)
        if seen is not None:
            level, detail = seen
            return GateResult(
                self, GateStatus.FAIL, f"{detail} at concurrency {level}", observed=float(level)
            )
        above = [s for s in verdict.measured_steps if s.concurrency >= top and event.observed_in(s)]
        vouching = [s for s in above if s.trusted]
        if vouching:
            level = min(s.concurrency for s in vouching)
            clean = not any(event.shows(s, verdict) for s in vouching if s.concurrency == level)
            if clean:
                return GateResult(self, GateStatus.PASS, f"none seen up to concurrency {level} (measured)")
            return GateResult(
                self,
                GateStatus.NOT_EVALUATED,
                f"clean up to the levels measured below {top}, but the next measured level {level} shows "
                f"it; the onset lies in between — add a step at {top} (refinement pass)",
            )
        tested = [s.concurrency for s in verdict.measured_steps if s.trusted and event.observed_in(s)]
        reached = (
            f"the highest trusted level with evidence was {max(tested)}"
            if tested
            else "no trusted step had evidence"
        )
        untrusted = [d for s in above if (d := s.distrust) is not None]
        if untrusted:
            return GateResult(
                self,
                GateStatus.NOT_EVALUATED,
                f"no trusted evidence at concurrency {top}: {'; '.join(untrusted[:2])}; {reached}",
            )
        thin = [s for s in verdict.measured_steps if s.concurrency >= top and s.trusted and s.evidence_thin]
        if event is PREEMPTION and thin:
            s = min(thin, key=lambda s: s.concurrency)
            return GateResult(
                self,
                GateStatus.NOT_EVALUATED,
                f"not enough evidence at concurrency {s.concurrency}: {s.requests} request(s) without a "
                f"preemption, and the trace's odds ask for {s.evidence_needed}; {reached}",
            )
        why = "the run did not reach" if not tested or max(tested) < top else "no evidence at"
        return GateResult(self, GateStatus.NOT_EVALUATED, f"{why} concurrency {top}: {reached}")


@dataclass(frozen=True, slots=True)
class _Threshold:
    """What both threshold rules share: ``METRIC OP VALUE`` and the final comparison."""

    text: str
    metric: Metric
    op: Op
    threshold: float

    @property
    def unit(self) -> str:
        """The base unit of the metric (``observed`` is in it)."""
        return self.metric.unit

    def show(self, value: float) -> str:
        """A value in the metric's unit (``Metric.show``): ``5.33 s``, ``0.54 %``, ``12``."""
        return self.metric.show(value)

    def holds(self, value: float) -> bool:
        return OPERATORS[self.op](value, self.threshold)

    def _judged(self, observed: float, where: str) -> tuple[GateStatus, str]:
        """Pass or fail on a value measured ``where``, and the reason."""
        if self.holds(observed):
            return GateStatus.PASS, f"{self.metric.name} = {self.show(observed)} {where}"
        shown, bound = self.metric.show_apart(observed, self.threshold)
        return GateStatus.FAIL, f"{self.metric.name} = {shown} {where}, not {self.op} {bound}"


@dataclass(frozen=True, slots=True)
class RunThreshold(_Threshold):
    """``METRIC OP VALUE`` over the whole run."""

    concurrency = None  # no level: the whole run

    def evaluate(self, verdict: Verdict) -> GateResult:
        assert self.metric.of_run is not None  # parse_gate accepts run-wide metrics only
        name = self.metric.name
        if name == LAST_SAFE:
            return self._last_safe(verdict)
        where = "over the run"
        observed = self.metric.of_run(verdict)
        if observed is None:
            return GateResult(self, GateStatus.NOT_EVALUATED, f"{name} is not available {where}")
        if self.metric.from_trusted_steps or not self.holds(observed):
            return GateResult(self, *self._judged(observed, where), observed=observed)
        if verdict.run.cut_short:
            return GateResult(
                self,
                GateStatus.NOT_EVALUATED,
                f"{name} = {self.show(observed)} over the part measured, but the run was cut short "
                f"({verdict.run.cut_short_detail}): the levels it never reached could change it",
                observed=observed,
            )
        failed = verdict.unloaded_steps
        if failed:
            return GateResult(
                self,
                GateStatus.NOT_EVALUATED,
                f"{name} = {self.show(observed)} over the run, but {'; '.join(failed[:2])}",
                observed=observed,
            )
        return GateResult(self, *self._judged(observed, where), observed=observed)

    def _last_safe(self, verdict: Verdict) -> GateResult:
        """The last safe level judged over its range (``oomload.verdict.lastsafe``)."""
        value = LastSafeRange.of(verdict)
        status = judge(value, self.op, self.threshold)
        text = f"{self.metric.name} = {value.words()}"
        if status is GateStatus.FAIL:
            text += f", not {self.op} {self.show(self.threshold)}"
        elif status is GateStatus.NOT_EVALUATED:
            text += f": judge the levels that could meet {self.op} {self.show(self.threshold)}"
        observed = None if verdict.last_safe_concurrency is None else float(verdict.last_safe_concurrency)
        return GateResult(self, status, text, observed=observed)


LAST_SAFE = "last-safe-concurrency"


@dataclass(frozen=True, slots=True)
class LevelThreshold(_Threshold):
    """``METRIC@CONCURRENCY OP VALUE``: judged on the worst trusted step at that level."""

    concurrency: int

    def evaluate(self, verdict: Verdict) -> GateResult:
        of_step = self.metric.of_step
        assert of_step is not None  # parse_gate accepts per-step metrics only
        steps = verdict.steps_at(self.concurrency)
        if not steps:
            levels = ", ".join(map(str, verdict.levels)) or "none"
            return GateResult(
                self,
                GateStatus.NOT_EVALUATED,
                f"no step at concurrency {self.concurrency} (measured: {levels})",
            )
        where = f"at concurrency {self.concurrency}"
        complete = [s for s in steps if s.trusted and s.decided_requests > 0]
        if not complete:
            seen = self._partial_violation(steps)
            if seen is not None:
                shown, bound = self.metric.show_apart(seen, self.threshold)
                return GateResult(
                    self,
                    GateStatus.FAIL,
                    f"{self.metric.name} = {shown} {where} already in an untrusted step, "
                    f"not {self.op} {bound}",
                    observed=seen,
                )
            why = "; ".join(d for s in steps if (d := s.distrust) is not None) or (
                f"no request at concurrency {self.concurrency} was answered"
            )
            return GateResult(self, GateStatus.NOT_EVALUATED, f"no trusted step {where}: {why}")
        values = [of_step(s) for s in complete]
        if any(v is None for v in values):
            return GateResult(
                self,
                GateStatus.NOT_EVALUATED,
                f"{self.metric.name} was not measured {where} (no data: metrics or streaming off?)",
            )
        known = [v for v in values if v is not None]
        observed = max(known) if self.op in UPPER_BOUNDS else min(known)
        if self.op == "==":
            bad = [v for v in known if not self.holds(v)]
            observed = bad[0] if bad else known[0]
        return GateResult(self, *self._judged(observed, where), observed=observed)

    def _partial_violation(self, steps: Sequence[StepFacts]) -> float | None:
        """A count or peak that untrusted steps already show above an upper bound (it can only grow),
        or the error rate of the step the engine died in or whose requests mostly failed (a failure
        seen is a failure)."""
        of_step = self.metric.of_step
        if self.op not in UPPER_BOUNDS or of_step is None:
            return None
        eligible = [
            s
            for s in steps
            if self.metric.monotone
            or (self.metric.fails_where_engine_died and (s.died_here or s.mostly_failed))
        ]
        known = [v for s in eligible if (v := of_step(s)) is not None]
        worst = max(known, default=None)
        if worst is None:
            return None
        violated = worst > self.threshold if self.op == "==" else not self.holds(worst)
        return worst if violated else None


Gate: TypeAlias = AbsenceRule | RunThreshold | LevelThreshold | RelativeRule


def parse_threshold(text: str, match: re.Match[str]) -> RunThreshold | LevelThreshold:
    """A ``METRIC[@CONCURRENCY] OP VALUE`` rule: run-wide without a level, else at that level."""
    metric = METRICS.get(match["metric"])
    if metric is None and match["metric"] in QUANTITIES:  # 'onset>=baselin': a relative rule mistyped
        name = match["metric"]
        raise ConfigError(f"gate {text!r}: {name} is compared with a baseline run; {RELATIVE_HELP}")
    if metric is None:
        raise ConfigError(f"gate {text!r}: unknown metric {match['metric']!r}; allowed: {', '.join(METRICS)}")
    concurrency = None if match["c"] is None else rule_int(match["c"], text, "concurrency")
    if concurrency is None and metric.of_run is None:
        raise ConfigError(
            f"gate {text!r}: {metric.name} is measured per step; name the level, e.g. '{metric.name}@64'"
        )
    if concurrency is not None and metric.of_step is None:
        raise ConfigError(f"gate {text!r}: {metric.name} is one number per run; drop '@{concurrency}'")
    value = _number(match["value"], text, percent_ok=metric.share)
    if value < 0:  # a rule no run can pass (or every run passes)
        raise ConfigError(f"gate {text!r}: {metric.name} is never below 0; give a threshold ≥ 0")
    if metric.share and value > 1:
        raise ConfigError(
            f"gate {text!r}: {metric.name} is a share, at most 100 %; give a threshold to 100 %"
        )
    op = _op(match["op"])
    if concurrency is None:
        return RunThreshold(text, metric, op, value)
    return LevelThreshold(text, metric, op, value, concurrency)


def parse_gate(text: str) -> Gate:
    """Parse one rule; ``ConfigError`` names the bad text and what is allowed."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"empty gate rule {text!r}: {SYNTAX_HELP}")
    clean = text.strip()
    lowered = clean.lower()
    if is_relative(lowered):
        return RelativeRule.parse(clean)
    absence = _ABSENCE.match(lowered)
    if absence:
        return AbsenceRule.parse(clean, absence)
    if lowered.startswith("no-"):
        raise ConfigError(f"gate {clean!r}: an absence rule reads 'no-EVENT-below:N' or 'no-EVENT-up-to:N'")
    threshold = _THRESHOLD.match(lowered)
    if not threshold:
        raise ConfigError(f"gate {clean!r} is not a rule: {SYNTAX_HELP}")
    return parse_threshold(clean, threshold)


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
    if rules is None:
        found = f" (it has {', '.join(repr(k) for k in sorted(table))})" if table else ""
        expected = 'rules = ["no-preemption-below:64", …]'
        raise ConfigError(f"{source}: [gate] has no rules{found}; expected {expected}")
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
    except UnicodeDecodeError as err:  # TOML is UTF-8 (a UTF-16 file from an editor, a binary file)
        raise ConfigError(
            f"{path}: not a TOML file (byte {err.start} is not UTF-8; TOML files are UTF-8)"
        ) from err
    return parse_gate_toml(text, source=str(path))


def evaluate_gate(
    gate: Gate,
    verdict: Verdict,
    baseline: Verdict | None = None,
    latencies: Sequence[LatencyShift] = (),
) -> GateResult:
    """Judge one rule against a verdict (and, for a relative rule, the baseline's, with the two runs'
    latency shifts: ``shift.level_shifts``, baseline against this run; without them a relative latency
    rule that missed its bound is not evaluated): pass, fail, or not evaluated (missing evidence). On a
    run whose prefix-cache behaviour was not what its prompt shape claims (``Verdict.prefix.problem``) a
    pass is not evaluated: the run measured other traffic than it says; a failure seen is still a
    failure. A relative rule checks the baseline's the same way."""
    if isinstance(gate, RelativeRule):
        result = gate.evaluate(verdict, baseline, latencies)
        judged = (verdict, baseline)
    else:
        result = gate.evaluate(verdict)
        judged = (verdict, None)
    for which, v in zip(("", "the baseline: "), judged, strict=True):
        problem = None if v is None or v.prefix is None else v.prefix.problem
        if problem is not None and result.status is GateStatus.PASS:
            return GateResult(gate, GateStatus.NOT_EVALUATED, which + problem, result.observed)
    return result


def evaluate_gates(
    gates: Sequence[Gate],
    verdict: Verdict,
    baseline: Verdict | None = None,
    latencies: Sequence[LatencyShift] = (),
) -> tuple[GateResult, ...]:
    return tuple(evaluate_gate(g, verdict, baseline, latencies) for g in gates)


def needs_latencies(gates: Sequence[Gate]) -> bool:
    """Whether a relative rule among ``gates`` bounds a latency at a level: it is judged on the two runs'
    latency shifts (``shift.level_shifts``), which only such a rule needs computed."""
    return any(
        isinstance(g, RelativeRule) and g.metric is not None and g.metric.latency is not None for g in gates
    )


def needs_baseline(gates: Sequence[Gate]) -> list[str]:
    """The texts of the rules that are relative to a baseline run."""
    return [g.text for g in gates if isinstance(g, RelativeRule)]


def gate_exit_code(results: Sequence[GateResult]) -> ExitCode:
    if any(r.status is GateStatus.FAIL for r in results):
        return ExitCode.GATE_FAILED
    if any(r.status is GateStatus.NOT_EVALUATED for r in results):
        return ExitCode.GATE_NOT_EVALUATED
    return ExitCode.OK


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


def _op(text: str) -> Op:
    for op in ("<=", ">=", "==", "<", ">"):
        if text == op:
            return op
    raise ConfigError(f"unknown operator {text!r}; allowed: {', '.join(OPERATORS)}")
