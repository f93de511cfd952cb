"""The Locust load shape: rising closed-loop concurrency steps, obeying ``oomload.capacity.schedule``.

``StepDriver`` holds the logic and imports nothing from Locust (tests drive it with fake meters and
clocks); ``make_shape`` wraps it in a ``locust.LoadTestShape`` whose ``tick()`` returns
``(users, spawn_rate)`` — users = the step's concurrency, all spawned at once — or ``None`` to end the
test. Locust calls it once a second; a step that ends between two calls would wait for the next one (a
0.5 s short check lasted 1 s), so ``tick()`` asks the driver every ``SHAPE_POLL_S`` and returns as soon
as its answer changes (or after about a second, as before): a step ends, and the next begins, within
``SHAPE_POLL_S`` of its reason. A drain to a lower step keeps Locust's one-second tick: a lower level
that began 0.2 s after a repeat ended on its preemption — the moment one request had left — inherited
that overflow (seen: concurrency 7 preempted right after 8 in 2 of 3 demo runs with the fast drain;
with the tick, ``bench_onset_repeat`` kept 7 as the last safe level in 9 of 10 runs).

On every tick the driver ends the current step when the server is dead, the run's maximum duration is spent,
the step's hold is done, or no request of it was answered (``oomload.capacity.schedule``, "No answer": at
least ``NO_ANSWER_MIN_FAILED`` ended, every one a failure without an answer, and after ``NO_ANSWER_MIN_S``
none in flight for ``NO_ANSWER_PENDING_S``: ``StepCount.oldest_in_flight_s``) — reason ``no_answer``, so a
soak of hours or a 30 s hold does not send a thousand failures a second to a server that answers none); a step
in which ``RATE_LIMITED_MIN`` requests were turned away (``rate_limited``) keeps its hold, and its
``StepOutcome`` says so (``rate_limited``: the schedule stops the ramp after it). It then writes the step's
``end`` line to ``steps.jsonl`` (``step_end_line``: the counts that step produced, its preemption delta, its
achieved concurrency and each load-generating process's own figures: ``oomload.load.selfcheck``), hands that
line to ``on_step_end`` (the progress view), asks ``oomload.capacity.schedule.next_step`` what comes next, and
writes the next ``start`` line.

Two counts, never to be confused: ``started`` — the requests the step sent; each has exactly one line
with ``"step": i`` in ``requests*.jsonl`` (whatever its outcome, cancelled included), which is how
the verdict counts a step — and ``ended_*`` — the requests that ended while the step ran, whichever
step started them (``ended`` excludes cancelled ones; it is what ``--min-requests`` counts).

Between a step's end and the next step's start the users send nothing new (``StepMeter.end``): every
request belongs to the step that sent it, so a step's ``started`` is final when its end line is
written. A step *below* the previous one settles first: Locust stops the surplus users gracefully
(they finish their request), and the new step starts — its ``start`` line, its preemption baseline,
its counters — only once the surplus users are gone and the requests in flight are down to its level
(``StepMeter.in_flight``), or ``settle_s`` has passed (the runner passes the ramp-down grace; what is
still in flight then is abandoned by Locust as ``cancelled``). So the
previous step's pressure never counts against the lower level, and the wait is bounded.

Enough evidence (``evidence``, a lookup that never blocks: asked when the step begins and again when
its hold is done, as the level's odds may arrive in between): a step that has held its hold but sent
fewer requests than the level needs to see a preemption with 99 % probability by the trace's odds
(``oomload.capacity.odds``) — and has seen none yet — is *extended*: the driver reads the boundary scrape, and
while the preemption counter has not risen since the step began it keeps the level running, reading
again every ``EXTEND_CHECK_S``, until the step has sent enough requests, ``EXTEND_MAX_FACTOR`` × the
hold has passed, or the run's maximum duration is spent. The scrape that shows a preemption (or ends
the extension) is the step's boundary. The end line says how long the step was extended and how many
requests the odds asked for.
A step in which a limit in front of the engine turned ``RATE_LIMITED_MIN`` requests away is never
extended: it is no evidence, however long it runs.
A step that already preempted needs no more evidence: it is unsafe. So an extension also ends as soon as
the poller's latest scrape (``latest_scrape``) shows the counter above the step's baseline, not at its
next ``EXTEND_CHECK_S`` read; and a *repeat* (a refinement step:
the question it answers is only whether its level preempts) ends as soon as the poller's latest
scrape (``latest_scrape``, read on every tick, no extra request) shows the counter above the step's
baseline, after ``PREEMPTED_MIN_S`` — its end line says ``"reason": "preempted"``. Ramp steps keep
their hold: they also measure the level's latencies and whether the engine survives it.

A hold counts from the tick that opened the step, not from the end of the boundary scrape read in
that tick: counting from after the scrape made every hold one tick longer than asked (a 4 s hold lasted
5.0 s when Locust's one-second tick was the driver's). The step's recorded duration still runs from the scrape
that opened it to the one that closed it — both read while the users send — so it is the hold.

The boundary scrape (``/metrics``) gives the preemption counter and the server's latency sums, from
which the end line's ``server_concurrency`` comes (``oomload.rundir.serverside``: what vLLM itself held over
the step, by Little's law). It is read **once**, and **while the users keep sending** (the read is a
``/metrics`` scrape that a loaded vLLM can take 1–3 s to answer; gevent lets the users run meanwhile).
The boundary's time is taken after the read, and the same value closes the ended step and opens the
next one. Reading it after the users were paused — and again for the next step — left every step of a
real server without load for two scrapes (seen: 1.6 s of a 4-user step with nothing sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from oomload.capacity.schedule import (
    NO_ANSWER,
    NO_ANSWER_MIN_FAILED,
    Decision,
    Hold,
    SchedulePlan,
    StepOutcome,
    StepPlan,
    max_duration_exceeded,
    next_step,
    no_answer,
    rate_limited_step,
)
from oomload.outcome import unanswered
from oomload.rundir.loadgenrecord import LoadgenLine
from oomload.rundir.records import MetricsRow, StepEndLine, StepStartLine
from oomload.rundir.serverside import ServerConcurrency, server_concurrency

SPAWN_RATE = 100.0  # users per second (Locust warns above 100); a step of c users starts within c/100 s
OPEN_LOOP_LEAD_S = 1.0  # an open loop's arrival 0: this long after its step begins, its users spawned
EXTEND_CHECK_S = 2.0  # while a step is extended for evidence, read the preemption counter this often
EXTEND_MAX_FACTOR = 12.0  # a step is extended to at most this many times its hold
PREEMPTED_MIN_S = 1.0  # a refinement step that preempted ends once it has run this long
SHAPE_POLL_S = 0.2  # between Locust's ticks, the driver is asked this often (module docstring)


def open_loop_lead_s(users: int) -> float:
    """How long after its step begins an open loop's arrival 0 comes: its ``users`` spawn first."""
    return OPEN_LOOP_LEAD_S + users / SPAWN_RATE


@dataclass(frozen=True, slots=True)
class StepCount:
    """What a meter saw during one step: requests started, and requests that ended (by outcome)."""

    completed: int  # ended during the step, cancelled excluded
    errors: int  # of those, not ok
    engine_dead: int
    completion_tokens: int = 0
    achieved_mean: float | None = None
    achieved_max: int | None = None
    cancelled: int = 0  # ended during the step as cancelled
    started: int | None = None  # sent by the step (None: unknown)
    outcomes: dict[str, int] = field(default_factory=dict)  # ended during the step, by outcome
    oldest_in_flight_s: float | None = None  # how long the oldest request in flight has been (None: unknown)
    loadgen: tuple[LoadgenLine, ...] = ()  # each load-generating process's view of itself (selfcheck)


class StepMeter(Protocol):
    """Counts the requests of the current step (in-process context, or Locust's master stats)."""

    def begin(self, step: StepPlan) -> None: ...

    def end(self) -> None:
        """The step ended: the users send no new request until the next ``begin``, and from the return
        on ``count`` holds the step's final ``started``."""

    def completed(self) -> int: ...

    def count(self) -> StepCount: ...

    def in_flight(self) -> int | None:
        """Requests in flight, or the users still alive when more (``ReplayContext.busy``)."""


class StepSink(Protocol):
    def append(self, stream: str, obj: Mapping[str, Any]) -> None: ...


class StepDriver:
    """Runs the schedule: one step after the other until the schedule, a dead server or time ends it."""

    def __init__(
        self,
        plan: SchedulePlan,
        hold: Hold,
        meter: StepMeter,
        sink: StepSink,
        *,
        warmup_hold: Hold | None = None,
        boundary_scrape: Callable[[], Mapping[str, Any] | None] = lambda: None,
        server_dead: Callable[[], bool] = lambda: False,
        max_duration_s: float | None = None,
        clock: Callable[[], float] = time.time,
        on_step: Callable[[StepPlan], None] | None = None,
        on_step_end: Callable[[StepEndLine], None] | None = None,
        step_done: Callable[[float, int], bool] | None = None,
        settle_s: float = 0.0,
        evidence: Callable[[StepPlan], int | None] = lambda _step: None,
        latest_scrape: Callable[[], Mapping[str, Any] | None] = lambda: None,
    ) -> None:
        self.plan = plan
        self.hold = hold
        self.warmup_hold = warmup_hold or hold
        self.meter = meter
        self.sink = sink
        self.boundary_scrape = boundary_scrape
        self.server_dead = server_dead
        self.max_duration_s = max_duration_s
        self.clock = clock
        self.on_step = on_step
        self.on_step_end = on_step_end
        self.step_done = step_done
        self.settle_s = settle_s
        self.evidence = evidence
        self.latest_scrape = latest_scrape
        self._needed: int | None = None  # requests the current step must send (the odds), if any
        self._extended_from_s: float | None = None  # when the hold was done and the extension began
        self._next_check_s = 0.0
        self._settling: tuple[StepPlan, float] | None = None  # (the next step, deadline)
        self.history: list[StepOutcome] = []
        self.current: StepPlan | None = None
        self.end_reason: str | None = None
        self.started_unix_s: float | None = None
        self._step_start_s = 0.0
        self._unanswered_yet = True
        self._tick_s = 0.0  # when the current tick began (Locust ticks once a second)
        self._held_from_s = 0.0  # the tick that opened the current step: its hold counts from there
        self._scrape_at_start: MetricsRow | None = None

    @property
    def finished(self) -> bool:
        return self.end_reason is not None

    @property
    def draining_to(self) -> StepPlan | None:
        """The lower step waiting for the requests in flight to drain to its level (else ``None``)."""
        return None if self._settling is None else self._settling[0]

    @property
    def step_started_unix_s(self) -> float | None:
        """When the current step began (``None`` before the first)."""
        return None if self.current is None else self._step_start_s

    def hold_for(self, step: StepPlan) -> Hold:
        """The hold a step runs for (warmup steps have their own; a ramp step at a level the odds call
        safe, below the two they placed, is a short check: ``SchedulePlan.checks``)."""
        if step.phase == "warmup":
            return self.warmup_hold
        if self._is_check(step):
            return self.plan.check_hold(self.hold)
        return self.hold

    def _is_check(self, step: StepPlan) -> bool:
        return step.phase == "ramp" and step.concurrency in self.plan.checks

    def tick(self) -> tuple[int, float] | None:
        """Locust's shape contract: ``(users, spawn_rate)`` for now, or ``None`` to stop."""
        if self.finished:
            return None
        now = self._tick_s = self.clock()
        if self.current is None:
            self.started_unix_s = now
            return self._follow(next_step(self.plan, []), now)
        if self._settling is not None:
            return self._settle(now)
        reason = self._step_end_reason(now)
        if reason is None:
            return self.current.concurrency, SPAWN_RATE
        boundary = self._scrape()  # users keep sending while this scrape runs
        now = self.clock()
        if reason == "hold_done" and self._extend(now, boundary):
            return self.current.concurrency, SPAWN_RATE
        self._end_step(reason, now, boundary)
        if reason in ("server_dead", "max_duration"):
            self.end_reason = reason
            return None
        return self._follow(next_step(self.plan, self.history), now, boundary)

    def interrupt(self, reason: str = "interrupted") -> None:
        """End the current step and the run now (Ctrl-C, SIGTERM, an error elsewhere)."""
        if self.finished:
            return
        if self.current is not None and self._settling is None:
            self._end_step(reason, self.clock(), self._scrape())
        self._settling = None
        self.end_reason = reason

    def _settle(self, now: float) -> tuple[int, float] | None:
        assert self._settling is not None and self.started_unix_s is not None
        step, deadline = self._settling
        if self.server_dead() or max_duration_exceeded(now - self.started_unix_s, self.max_duration_s):
            self._settling = None
            self.end_reason = "server_dead" if self.server_dead() else "max_duration"
            return None
        in_flight = self.meter.in_flight()
        if now < deadline and (in_flight is None or in_flight > step.concurrency):
            return step.concurrency, SPAWN_RATE
        baseline = self._scrape()  # the users are idle while settling: a fresh baseline
        self._settling = None  # after the scrape: until the step begins, the run still reads "draining"
        return self._begin(step, self.clock(), baseline)

    def _scrape(self) -> MetricsRow | None:
        """The boundary scrape, read as ``metrics.jsonl`` readers read it (its record is the edge)."""
        record = self.boundary_scrape()
        return None if record is None else MetricsRow.from_json(record)

    def _step_end_reason(self, now: float) -> str | None:
        assert self.current is not None and self.started_unix_s is not None
        if self.server_dead():
            return "server_dead"
        if max_duration_exceeded(now - self.started_unix_s, self.max_duration_s):
            return "max_duration"
        elapsed = now - self._held_from_s
        completed = self.meter.completed()
        if completed >= NO_ANSWER_MIN_FAILED and self.plan.stops_unloaded and self._unanswered_yet:
            count = self.meter.count()
            failed, ended = unanswered(count.outcomes)
            self._unanswered_yet = failed == ended  # an answer stays: no more counts for this step
            if no_answer(failed, ended, count.oldest_in_flight_s, now - self._step_start_s):
                return NO_ANSWER
        if self.current.phase == "refine" and elapsed >= PREEMPTED_MIN_S and self._preempted_since_start():
            return "preempted"
        if self._extended_from_s is not None and now < self._next_check_s:
            # extended for evidence: a preemption the poller saw ends it now (unsafe: no more needed)
            return "hold_done" if self._preempted_since_start() else None
        if self.step_done is not None:
            return "hold_done" if self.step_done(elapsed, completed) else None
        hold = self.hold_for(self.current)
        if hold.done(elapsed, completed):
            return "hold_done"
        if self._is_check(self.current) and self.hold.done(elapsed, completed):
            return "hold_done"  # a short check short of its requests ends at the full hold at the latest
        return None

    def _preempted_since_start(self) -> bool:
        """The poller's latest scrape shows the preemption counter above the step's baseline."""
        record = self.latest_scrape()
        latest = None if record is None else _preemptions(MetricsRow.from_json(record))
        before = _preemptions(self._scrape_at_start)
        return before is not None and latest is not None and latest > before

    def _extend(self, now: float, boundary: MetricsRow | None) -> bool:
        """Keep the step running for evidence (module docstring)? Starts or continues an extension."""
        assert self.current is not None
        if self.current.phase == "warmup":
            return False
        if self._needed is None:  # the level's odds may have arrived since the step began
            self._needed = self.evidence(self.current)
        needed = self._needed
        if needed is None:
            return False
        before, after = _preemptions(self._scrape_at_start), _preemptions(boundary)
        if before is None or after is None or after > before:
            return False  # preempted (unsafe: no more evidence needed), or the counter is unreadable
        count = self.meter.count()
        if count.started is not None and count.started >= needed:
            return False
        if rate_limited_step(count.outcomes):
            return False  # no evidence however long it runs, and the ramp ends after it
        hold_s = self.hold_for(self.current).hold_s
        if now - self._step_start_s >= max(hold_s, EXTEND_CHECK_S) * EXTEND_MAX_FACTOR:
            return False
        if self._extended_from_s is None:
            self._extended_from_s = now
        self._next_check_s = self._tick_s + EXTEND_CHECK_S  # on the tick grid, as the hold
        return True

    def _follow(
        self, decision: Decision, now: float, boundary: MetricsRow | None = None
    ) -> tuple[int, float] | None:
        if decision.step is None:
            self.end_reason = decision.end_reason or "completed"
            return None
        step = decision.step
        previous = self.current
        if previous is not None and step.concurrency < previous.concurrency and self.settle_s > 0:
            self._settling = (step, now + self.settle_s)
            return step.concurrency, SPAWN_RATE
        if previous is None:  # the first step: its baseline is read now, before any load
            boundary = self._scrape()
        return self._begin(step, now, boundary)

    def _begin(self, step: StepPlan, now: float, scrape: MetricsRow | None) -> tuple[int, float]:
        """Open ``step`` at ``now`` with the scrape read at this boundary."""
        self.current = step
        self._step_start_s = now
        self._unanswered_yet = True  # no request of this step answered so far (``_step_end_reason``)
        self._held_from_s = min(self._tick_s, now)
        self._scrape_at_start = scrape
        self._needed = None if step.phase == "warmup" else self.evidence(step)
        self._extended_from_s = None
        self.meter.begin(step)
        start: StepStartLine = {
            "event": "start",
            "step": step.index,
            "concurrency": step.concurrency,
            "phase": step.phase,
            "t_unix_s": now,
        }
        self.sink.append("steps", start)
        if self.on_step is not None:
            self.on_step(step)
        return step.concurrency, SPAWN_RATE

    def _end_step(self, reason: str, now: float, scrape: MetricsRow | None) -> None:
        """Close the current step at ``now``; ``scrape`` is the one read at this boundary."""
        step = self.current
        assert step is not None
        self.meter.end()  # nothing more is sent in this step: its counts are final from here on
        count = self.meter.count()
        before, after = _preemptions(self._scrape_at_start), _preemptions(scrape)
        preemptions = max(0, after - before) if after is not None and before is not None else None
        dead = reason == "server_dead" or self.server_dead()
        self.history.append(
            StepOutcome(
                step=step,
                completed=count.completed,
                errors=count.errors,
                preemptions=preemptions or 0,
                engine_dead=count.engine_dead > 0,
                server_dead=dead,
                evidence_short=not preemptions
                and self._needed is not None
                and (count.started or 0) < self._needed,
                no_answer=reason == NO_ANSWER,
                rate_limited=rate_limited_step(count.outcomes),
            )
        )
        server = server_concurrency(self._scrape_at_start, scrape)
        line = step_end_line(step, count, reason, now, now - self._step_start_s, preemptions, server)
        if self._needed is not None:
            line["evidence_requests"] = self._needed
        if self._extended_from_s is not None:
            line["extended_s"] = round(now - self._extended_from_s, 3)
        self.sink.append("steps", line)
        if self.on_step_end is not None:
            self.on_step_end(line)


def step_end_line(
    step: StepPlan,
    count: StepCount,
    reason: str,
    now: float,
    duration_s: float,
    preemptions: int | None,
    server: ServerConcurrency | None = None,
) -> StepEndLine:
    """The ``end`` line of ``steps.jsonl`` (docs/replay.md, "The run directory"; the reader parses the
    same ``rundir.records.StepEndLine`` into a ``StepBoundary``)."""
    line: StepEndLine = {
        "event": "end",
        "step": step.index,
        "concurrency": step.concurrency,
        "phase": step.phase,
        "t_unix_s": now,
        "duration_s": round(duration_s, 3),
        "reason": reason,
        "started": count.started,
        "ended": count.completed,
        "ended_ok": count.completed - count.errors,
        "ended_errors": count.errors,
        "ended_cancelled": count.cancelled,
        "ended_outcomes": dict(sorted(count.outcomes.items())),
        "completion_tokens": count.completion_tokens,
        "preemptions": preemptions,
    }
    if count.achieved_mean is not None:
        line["achieved_concurrency_mean"] = round(count.achieved_mean, 3)
        line["achieved_concurrency_max"] = count.achieved_max
    if server is not None:
        line["server_concurrency"] = server.to_json()
    if count.loadgen:
        line["loadgen"] = list(count.loadgen)
    return line


def _preemptions(scrape: MetricsRow | None) -> int | None:
    return None if scrape is None or not scrape.ok else scrape.num_preemptions_total


def make_shape(driver: StepDriver, *, keep_open: bool = False) -> Any:
    """A ``locust.LoadTestShape`` instance whose ``tick`` is the driver's (imports Locust).

    ``keep_open``: once the schedule is done, keep returning the last ``(users, spawn_rate)`` instead of
    ``None`` — the runner then drains the requests in flight and quits Locust itself (Locust's own stop
    would make each worker process sleep ``stop_timeout`` before it reads another message).
    """
    import gevent
    from locust import LoadTestShape

    class StepShape(LoadTestShape):
        last: tuple[int, float] | None = None

        def tick(self) -> tuple[int, float] | None:
            # Locust calls this once a second: ask the driver every SHAPE_POLL_S until its answer
            # changes, so a step ends within SHAPE_POLL_S of its reason (module docstring)
            polls = max(int(1.0 / SHAPE_POLL_S) - 1, 0)
            now = driver.tick()
            while polls > 0 and now is not None and now == self.last and driver.draining_to is None:
                gevent.sleep(SHAPE_POLL_S)
                polls -= 1
                now = driver.tick()
            if now is not None:
                self.last = now
                return now
            return self.last if keep_open else None

    return StepShape()  # type: ignore[no-untyped-call]
