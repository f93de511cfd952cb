"""The rising-concurrency step schedule: which level next, when a step is done, when the run stops.

Pure decisions over the outcomes of finished steps; the Locust shape (``oomload.load.shape``) asks and obeys.

Levels
    ``"1,2,4,8"`` (an explicit list), ``"linear:START:STOP:STEP"`` (START, START+STEP, … ≤ STOP) or
    ``"geometric:START:STOP:FACTOR"`` (START·FACTOR^k rounded, duplicates dropped, ≤ STOP). Levels
    must be positive and strictly increasing: the search below assumes pressure grows with
    concurrency.

Hold
    A step ends when it has lasted ``hold_s`` seconds **and** completed ``min_requests`` requests
    (either may be 0). The run's maximum duration bounds a step that never completes enough.

Order of steps (``next_step``)
    1. an optional warm-up step at the first level (phase ``warmup``; the verdict ignores it);
    2. the ramp: each level in turn (phase ``ramp``) until a stop condition fires or the levels run out;
    3. the refinement (phase ``refine``): once some level was *bad*, bisect between the highest good
       level below the lowest bad level and that bad level — ``mid = (good + bad) // 2`` — until the
       two are adjacent. Each refinement step tightens the bracket by its own result, so with levels
       1, 2, 4, 8, 16 and an onset at 6 the steps are …, 8 (bad) → 6 (bad) → 5 (good): onset 6;
    4. the repeats (phase ``refine``): once the bracket is adjacent, its two levels are measured again,
       in turn (the bad one first), until each has ``repeats`` measurements or its majority is decided
       (two bad of three need no third). A level is bad when at
       least half of its conclusive measurements were bad (``level_is_bad``; a clean step that sent
       fewer requests than the trace's odds asked for is not conclusive), so a repeat can move the
       bracket — 6 seen bad in 1 of 3 is good — and the bisection resumes from the new bracket.
       Every level is measured at most ``repeats`` times, so the refinement ends. With a real trace
       one step is one draw (``oomload.capacity.odds``): repeating the two levels that decide the onset is
       what makes it repeatable.
    A dead server ends the run at once (nothing more can be measured).

Levels placed by the odds (``place_levels``)
    When the trace's odds on the server's pool are known before the load (``oomload.capacity.odds``), they say
    where the onset should be: the lowest level whose odds are not negligible (``odds.predicted_onset``,
    say 8). The ramp then measures that level and the one below it (7 and 8, added to the levels when
    missing), so the bisection between the ramp's 4 and 8 is not needed: the bracket is adjacent at once
    and the repeats start. Every ramp level below those two is one the odds call safe with room to spare:
    it gets a *short check* (``CHECK_HOLD_SHARE`` of the hold and ``CHECK_MIN_REQUESTS`` ended, or the
    full hold if that comes first; ``SchedulePlan.checks``) — enough to see that the server answers and
    does not preempt there, not a full hold. A check that preempts is a bad
    step like any other, and a bisection step at a checked level gets the full hold: when the odds are
    wrong the run measures what it would have measured without them.

Bad step
    A step is *bad* when the server preempted during it (``preemptions > 0``), an engine died, or its
    error rate exceeded an ``error-rate:F`` stop condition.

Stop conditions (``--stop-on``)
    ``oom`` (the default: at the first engine death — CUDA OOM text, EngineDeadError, the server
    gone — so a default run ramps past the first preemption and finds both onsets),
    ``first-preemption`` (stop ramping at the first step with preemptions), ``error-rate:F`` (a step
    whose share of failed requests exceeds F, 0 < F ≤ 1), ``never`` (ramp through every level: no
    stop on preemption or errors). A dead server always ends the run, whatever the conditions: later
    steps would measure nothing. Without a dead server, the refinement still bisects the first bad
    (preempted) level after the ramp.

No answer
    A step in which at least ``NO_ANSWER_MIN_FAILED`` requests ended and every one of them failed
    without an answer (no ``ok`` or short answer, no engine death: a 500 or 404 for everything, a
    proxy's HTML page, a gateway's 429 or 503 to every request), once the step has run
    ``NO_ANSWER_MIN_S`` and while no request has been in flight for ``NO_ANSWER_PENDING_S`` — so every
    request sent before the last second ended, and failed (one still in flight may yet be answered: a
    gateway that turns away the requests beyond its limit and serves the rest slowly, long outputs
    with refused prompts beside them; a failure takes milliseconds) — stops the ramp, whatever the
    conditions but ``never``: a higher level would send more of the same, and the run learns nothing
    from it. The step itself ends as soon as that is true (``oomload.load.shape``), not at its hold's
    end. The end reason is ``no_answer``; the refinement still bisects a bracket found below it,
    and a refinement (or warm-up) step with no answer ends the run at once — the server stopped
    answering. Fewer failures than that (one long request that broke at concurrency 1) decide nothing.

Rate limit
    A step in which at least ``RATE_LIMITED_MIN`` requests were turned away (``rate_limited``: HTTP 429,
    or a 503 not vLLM's own; a rate or concurrency limit in front of the engine, a gateway's or a proxy's)
    stops the ramp at its end, under the same conditions: the levels above it would measure that limit,
    not the engine (a gateway that admits 4 at a time lets vLLM see 4 at level 8 and at 64). The step
    keeps its hold — what reached the engine is still measured, and its in-flight mean says how much
    did — and the end reason is ``rate_limited``; as after a step with no answer, the refinement
    bisects a bracket below it, and a refinement (or warm-up) step turned away ends the run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from oomload.errors import ConfigError
from oomload.outcome import Outcome

Phase = Literal["warmup", "ramp", "refine"]
MAX_LEVELS = 1000
NO_ANSWER_MIN_FAILED = 10  # failed requests, none answered, that make a step one with no answer
NO_ANSWER_MIN_S = 2.0  # a step runs this long before it can be one with no answer
NO_ANSWER_PENDING_S = 1.0  # a request in flight this long may still be answered (a failure takes ms)
NO_ANSWER = "no_answer"  # the end reason of a run stopped by such a step (module docstring)
RATE_LIMITED_MIN = 3  # requests of a step turned away (rate_limited) that make it a rate-limited step
RATE_LIMITED = "rate_limited"  # the end reason of a run stopped by one (module docstring, "Rate limit")
MAX_CONCURRENCY = 100_000
STOP_NAMES = ("first-preemption", "oom", "error-rate", "never")
MAX_REPEATS = 9
DEFAULT_REPEATS = 3  # oomload replay's --repeats
# a short check (a ramp level the odds call safe, below the two they placed) holds this share of the hold
CHECK_HOLD_SHARE = 0.25
# ... and ends no sooner than this many requests ended in it: the verdict calls a step with fewer
# "anecdotal" (``verdict.DEFAULT_MIN_REQUESTS``)
CHECK_MIN_REQUESTS = 3


def parse_levels(spec: str) -> tuple[int, ...]:
    """Parse ``"1,2,4"``, ``"linear:START:STOP:STEP"`` or ``"geometric:START:STOP:FACTOR"``."""
    text = spec.strip()
    if text.startswith(("linear:", "geometric:")):
        kind, _, rest = text.partition(":")
        parts = rest.split(":")
        if len(parts) != 3:
            last = "STEP" if kind == "linear" else "FACTOR"
            raise ConfigError(f"ramp {spec!r} must look like {kind}:START:STOP:{last}")
        start, stop = _positive_int(parts[0], spec, "START"), _positive_int(parts[1], spec, "STOP")
        if stop < start:
            raise ConfigError(f"ramp {spec!r}: STOP ({stop}) must be ≥ START ({start})")
        if kind == "linear":
            step = _positive_int(parts[2], spec, "STEP")
            levels = tuple(range(start, stop + 1, step))
        else:
            try:
                factor = float(parts[2])
            except ValueError as err:
                raise ConfigError(f"ramp {spec!r}: FACTOR must be a number > 1, got {parts[2]!r}") from err
            if not factor > 1.0 or not math.isfinite(factor):
                raise ConfigError(f"ramp {spec!r}: FACTOR must be a number > 1, got {parts[2]!r}")
            if math.log(max(stop, 2) / start) / math.log(factor) > MAX_GEOMETRIC_STEPS:
                raise ConfigError(
                    f"ramp {spec!r}: FACTOR {parts[2]} is too close to 1 (over {MAX_GEOMETRIC_STEPS:,} steps "
                    f"from {start} to {stop}); use a larger factor or a linear ramp"
                )
            levels = _geometric(start, stop, factor)
    elif ":" in text:  # a ramp of a kind not known: its numbers are no concurrency level
        raise ConfigError(
            f"ramp {spec!r}: unknown kind {text.partition(':')[0]!r}; give linear:START:STOP:STEP, "
            "geometric:START:STOP:FACTOR or levels like 1,2,4,8"
        )
    else:
        items = [p.strip() for p in text.split(",")]
        if not any(items):
            raise ConfigError(f"concurrency list {spec!r} is empty; give levels like 1,2,4,8")
        if not all(items):  # "1,,2" or "1,2,": a level lost in typing is not silently dropped
            raise ConfigError(f"concurrency list {spec!r} has an empty item; give levels like 1,2,4,8")
        levels = tuple(_positive_int(p, spec, "level") for p in items)
        if any(b <= a for a, b in itertools.pairwise(levels)):
            raise ConfigError(f"concurrency levels {spec!r} must be strictly increasing")
    if len(levels) > MAX_LEVELS:
        raise ConfigError(f"ramp {spec!r} has {len(levels)} levels; at most {MAX_LEVELS} are allowed")
    return levels


MAX_GEOMETRIC_STEPS = 10_000  # multiplications a geometric ramp may take (each level is ≥ 1 above the last)


def _geometric(start: int, stop: int, factor: float) -> tuple[int, ...]:
    levels: list[int] = []
    value = float(start)
    while round(value) <= stop and len(levels) <= MAX_LEVELS:
        level = round(value)
        if not levels or level > levels[-1]:
            levels.append(level)
        value *= factor
    return tuple(levels)


def _positive_int(text: str, spec: str, what: str) -> int:
    """``text`` as an integer in 1..``MAX_CONCURRENCY``; else one sentence naming the concurrency spec and
    which of its numbers (``what``: a level, or a ramp's START, STOP or STEP) is wrong."""
    try:
        value = int(text.strip())
    except ValueError as err:
        raise ConfigError(f"concurrency {spec!r}: {what} {text.strip()!r} is not a positive integer") from err
    if not 1 <= value <= MAX_CONCURRENCY:
        raise ConfigError(f"concurrency {spec!r}: {what} {value} is outside 1..{MAX_CONCURRENCY:,}")
    return value


@dataclass(frozen=True, slots=True)
class StopCondition:
    """One ``--stop-on`` condition; ``error_rate`` only for ``error-rate``."""

    name: str
    error_rate: float | None = None

    def __str__(self) -> str:
        return f"error-rate:{self.error_rate:g}" if self.name == "error-rate" else self.name


def parse_stop_condition(text: str) -> StopCondition:
    """Parse ``first-preemption``, ``oom``, ``error-rate:F`` (0 < F ≤ 1) or ``never``."""
    name, sep, arg = text.strip().partition(":")
    if name == "error-rate":
        try:
            rate = float(arg)
        except ValueError as err:
            raise ConfigError(
                f"stop condition {text!r}: error-rate needs a fraction, e.g. error-rate:0.05"
            ) from err
        if not 0.0 < rate <= 1.0:
            raise ConfigError(f"stop condition {text!r}: the error rate must be within (0, 1]")
        return StopCondition("error-rate", rate)
    if name in ("first-preemption", "oom", "never") and not sep:
        return StopCondition(name)
    raise ConfigError(f"unknown stop condition {text!r}; allowed: first-preemption, oom, error-rate:F, never")


@dataclass(frozen=True, slots=True)
class Hold:
    """How long each step lasts: ``hold_s`` seconds and ``min_requests`` completed requests."""

    hold_s: float
    min_requests: int = 0

    def __post_init__(self) -> None:
        if not self.hold_s >= 0 or not math.isfinite(self.hold_s):
            raise ConfigError(f"the hold (--hold-s) must be finite seconds ≥ 0, got {self.hold_s}")
        if self.min_requests < 0:
            raise ConfigError(f"minimum requests per step must be ≥ 0, got {self.min_requests}")
        if self.hold_s == 0 and self.min_requests == 0:
            raise ConfigError("a step needs a hold time (--hold-s) or a minimum number of requests")

    def done(self, elapsed_s: float, completed: int) -> bool:
        """True once the step has lasted long enough and completed enough requests."""
        return elapsed_s >= self.hold_s and completed >= self.min_requests


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step to run: its index in the run, its target concurrency and its phase."""

    index: int
    concurrency: int
    phase: Phase


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What the schedule knows of one finished step (from request outcomes and ``/metrics`` deltas):
    enough to call it bad or good. The verdict's full account of a step is
    ``oomload.verdict.stepfacts.StepFacts``."""

    step: StepPlan
    completed: int = 0
    errors: int = 0
    preemptions: int = 0
    engine_dead: bool = False  # an engine_dead outcome (CUDA OOM, EngineDeadError, refused after answers)
    server_dead: bool = False  # the server is gone: nothing more can be measured
    evidence_short: bool = False  # clean, but it sent fewer requests than the trace's odds asked for
    no_answer: bool = False  # no request of it was answered (module docstring, "No answer")
    rate_limited: bool = False  # a limit in front of the engine turned requests away ("Rate limit")

    @property
    def error_rate(self) -> float:
        return self.errors / self.completed if self.completed else 0.0


def rate_limited_step(outcomes: Mapping[str, int]) -> bool:
    """A step in which a limit in front of the engine turned at least ``RATE_LIMITED_MIN`` requests away,
    by its requests counted by outcome value (module docstring, "Rate limit"): the one rule the schedule,
    the driver and the verdict read."""
    return outcomes.get(Outcome.RATE_LIMITED.value, 0) >= RATE_LIMITED_MIN


def no_answer(failed: int, ended: int, oldest_in_flight_s: float | None, elapsed_s: float) -> bool:
    """A step with no answer: every request that ended failed without one, enough did to say so, and
    after ``elapsed_s`` of the step none in flight has waited long enough to be served (``None``:
    unknown, so no) (module docstring, "No answer")."""
    pending = oldest_in_flight_s is None or oldest_in_flight_s >= NO_ANSWER_PENDING_S
    settled = elapsed_s >= NO_ANSWER_MIN_S and not pending
    return failed >= NO_ANSWER_MIN_FAILED and failed == ended and settled


@dataclass(frozen=True, slots=True)
class SchedulePlan:
    """Everything that decides the sequence of steps."""

    levels: tuple[int, ...]
    warmup: bool = False
    refine: bool = True
    stop_on: tuple[StopCondition, ...] = (StopCondition("oom"),)
    repeats: int = 1  # measurements of each of the two levels bracketing the onset (refinement)
    checks: frozenset[int] = frozenset()  # ramp levels that get a short check (``place_levels``)

    def __post_init__(self) -> None:
        if not self.levels:
            raise ConfigError("a schedule needs at least one concurrency level")
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise ConfigError(f"--repeats must be within 1..{MAX_REPEATS}, got {self.repeats}")
        if not self.checks <= set(self.levels):
            raise ConfigError("short checks must be at levels of the ramp")

    @property
    def stops_unloaded(self) -> bool:
        """A step that did not load the engine — no answer, or turned away by a limit in front of it —
        ends the ramp (module docstring, "No answer", "Rate limit"): under every condition but ``never``."""
        return all(c.name != "never" for c in self.stop_on)

    def check_hold(self, hold: Hold) -> Hold:
        """The hold of a short check: ``CHECK_HOLD_SHARE`` of ``hold``'s time and at least
        ``CHECK_MIN_REQUESTS`` requests ended (never more than the full ``hold``: ``StepDriver``)."""
        return Hold(hold.hold_s * CHECK_HOLD_SHARE, max(hold.min_requests, CHECK_MIN_REQUESTS))


def place_levels(levels: Sequence[int], onset: int | None) -> tuple[tuple[int, ...], frozenset[int]]:
    """The ramp's levels and its short checks, once the odds put the onset at ``onset`` (module
    docstring, "Levels placed by the odds"): ``onset`` and the level below it are measured in full
    (added when missing, never below the lowest level), every lower level gets a short check. ``None``
    (no odds, or odds that call every level safe) leaves the levels as they are, with no checks."""
    ordered = tuple(sorted(set(levels)))
    if onset is None or not ordered:
        return ordered, frozenset()
    placed = sorted(set(ordered) | {c for c in (onset - 1, onset) if c >= ordered[0]})
    return tuple(placed), frozenset(c for c in placed if c < onset - 1)


@dataclass(frozen=True, slots=True)
class Decision:
    """Either the next step to run, or the reason the run ends (``end_reason``)."""

    step: StepPlan | None
    end_reason: str | None = None


def stop_reason(stop_on: Sequence[StopCondition], facts: StepOutcome) -> str | None:
    """The first stop condition this step fires, as written on the command line, or ``None``."""
    for cond in stop_on:
        if cond.name == "first-preemption" and facts.preemptions > 0:
            return str(cond)
        if cond.name == "oom" and (facts.engine_dead or facts.server_dead):
            return str(cond)
        if cond.name == "error-rate" and cond.error_rate is not None and facts.error_rate > cond.error_rate:
            return str(cond)
    return None


def is_bad(stop_on: Sequence[StopCondition], facts: StepOutcome) -> bool:
    """Preempted, engine dead, or over an ``error-rate`` limit: the onset lies at or below this level."""
    if facts.preemptions > 0 or facts.engine_dead or facts.server_dead:
        return True
    limits = [c.error_rate for c in stop_on if c.name == "error-rate" and c.error_rate is not None]
    return any(facts.error_rate > limit for limit in limits)


def level_is_bad(stop_on: Sequence[StopCondition], measurements: Sequence[StepOutcome]) -> bool:
    """Bad in at least half of its conclusive measurements: a clean step short of the evidence the
    trace's odds asked for (``evidence_short``) is no vote that the level is good."""
    bad = sum(1 for f in measurements if is_bad(stop_on, f))
    conclusive = bad + sum(1 for f in measurements if not is_bad(stop_on, f) and not f.evidence_short)
    return bad > 0 and 2 * bad >= conclusive


def _by_level(history: Sequence[StepOutcome]) -> dict[int, list[StepOutcome]]:
    levels: dict[int, list[StepOutcome]] = {}
    for f in history:
        if f.step.phase != "warmup":
            levels.setdefault(f.step.concurrency, []).append(f)
    return levels


def refine_bracket(
    stop_on: Sequence[StopCondition], history: Sequence[StepOutcome]
) -> tuple[int, int] | None:
    """``(last good, first bad)`` levels over the non-warm-up steps, or ``None`` when no bracket exists."""
    levels = _by_level(history)
    bad = [c for c, facts in levels.items() if level_is_bad(stop_on, facts)]
    if not bad:
        return None
    first_bad = min(bad)
    good = [c for c, facts in levels.items() if c < first_bad and not level_is_bad(stop_on, facts)]
    if not good:
        return None
    return max(good), first_bad


def next_refine_level(
    stop_on: Sequence[StopCondition], history: Sequence[StepOutcome], repeats: int = 1
) -> int | None:
    """The bisection level between the last good and the first bad level; once they are adjacent, the
    one of the two with fewer measurements (the bad one on a tie) while its majority is still open
    (``_undecided``); else ``None``."""
    bracket = refine_bracket(stop_on, history)
    if bracket is None:
        return None
    good, bad = bracket
    if bad - good > 1:
        return (good + bad) // 2
    levels = _by_level(history)
    short = [c for c in (bad, good) if _undecided(stop_on, levels.get(c, []), repeats)]
    return min(short, key=lambda c: (len(levels.get(c, [])), c != bad), default=None)


def _undecided(stop_on: Sequence[StopCondition], measurements: Sequence[StepOutcome], repeats: int) -> bool:
    """Fewer than ``repeats`` steps, and the ones still to come could flip ``level_is_bad``: two bad
    of three need no third, nor do two clean ones."""
    left = repeats - len(measurements)
    if left <= 0:
        return False
    bad = sum(1 for f in measurements if is_bad(stop_on, f))
    good = sum(1 for f in measurements if not is_bad(stop_on, f) and not f.evidence_short)
    if level_is_bad(stop_on, measurements):
        return bad < good + left  # enough clean votes to come would outnumber the bad ones
    return bad + left >= good  # enough bad votes to come would reach half


def next_step(plan: SchedulePlan, history: Sequence[StepOutcome]) -> Decision:
    """Decide the step after ``history`` (the outcome of every finished step, in order)."""
    if not history:
        phase: Phase = "warmup" if plan.warmup else "ramp"
        return Decision(StepPlan(0, plan.levels[0], phase))
    last = history[-1]
    index = last.step.index + 1
    if last.server_dead:
        return Decision(None, "server_dead")
    if plan.stops_unloaded and last.step.phase != "ramp" and (last.no_answer or last.rate_limited):
        return Decision(None, unloaded_reason(last))  # bisecting would learn nothing more
    ramp = [f for f in history if f.step.phase == "ramp"]
    stopped = next((r for r in (stop_reason(plan.stop_on, f) for f in ramp) if r is not None), None)
    end_reason = "completed" if stopped is None else f"stop_condition:{stopped}"
    unloaded = next((f for f in ramp if f.no_answer or f.rate_limited), None)
    if stopped is None and plan.stops_unloaded and unloaded is not None:
        end_reason = unloaded_reason(unloaded)
    if end_reason == "completed" and len(ramp) < len(plan.levels):
        return Decision(StepPlan(index, plan.levels[len(ramp)], "ramp"))
    if plan.refine:
        level = next_refine_level(plan.stop_on, history, plan.repeats)
        if level is not None:
            return Decision(StepPlan(index, level, "refine"))
    return Decision(None, end_reason)


def unloaded_reason(outcome: StepOutcome) -> str:
    """The end reason of a run stopped by a step that did not load the engine: ``no_answer`` first (every
    request failed: whether a limit turned them away, the top error says), else ``rate_limited``."""
    return NO_ANSWER if outcome.no_answer else RATE_LIMITED


def max_duration_exceeded(elapsed_s: float, max_duration_s: float | None) -> bool:
    """True once the whole run has lasted ``max_duration_s`` (``None``: unbounded)."""
    return max_duration_s is not None and elapsed_s >= max_duration_s
