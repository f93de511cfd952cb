"""The state one load-generating process shares between its users and the shape (no I/O of its own).

``ReplayContext`` hands each user its next request (``next_request``), tracks what is in flight
(for the achieved concurrency and the repro traces), counts outcomes and tokens per step, and passes
every ``RequestResult`` to the run directory. All users of a process run as gevent greenlets in one
thread, so plain attributes need no locks.

A process that measures itself (``oomload.load.selfcheck``) sets ``selfcheck``: its figures restart with
every step and travel with the step's counts (``ContextMeter.count``, ``step_report``), with, in an
open loop, how late the step's requests left against the trace's arrival times (``loadgen_report``):
a request is *late* when it is sent ``LATE_SEND_S`` (100 ms) or more after its arrival time, and late
*because every user was busy* when no user was free to take it until that long after (the replay's
user cap was reached: a user sends one request at a time); otherwise the user took it in time and
woke late from its sleep (the process did not get a CPU in time).

Achieved concurrency is the time-weighted mean of the in-flight count over a step: the integral of
``in_flight(t)`` divided by the step's duration, updated at every start and end of a request.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from oomload.load.payload import PreparedRequest, RequestOrder
from oomload.outcome import Outcome, RequestResult
from oomload.trace.model import TraceRecord

LATE_SEND_S = 0.1  # an open-loop request sent this long after its arrival time is late

if TYPE_CHECKING:
    from oomload.capacity.schedule import StepPlan as StepPlanLike
    from oomload.load.shape import StepCount as StepCountLike
    from oomload.rundir.loadgenrecord import LoadgenLine


class PayloadBuilder(Protocol):
    def build(self, record: TraceRecord, sequence: int) -> PreparedRequest: ...


class ResultSink(Protocol):
    def request(self, result: RequestResult) -> None: ...


class SelfMeasure(Protocol):
    """``oomload.load.selfcheck.SelfCheck``: the process's own CPU, CPU wait and loop lag per step."""

    def begin(self) -> None: ...

    def report(self) -> LoadgenLine: ...


@dataclass(slots=True)
class InFlight:
    """One request on the wire."""

    request_id: str
    start_unix_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(slots=True)
class StepCounters:
    """The current step's requests: how many it started, and the outcomes and tokens of those that
    ended during it (whichever step started them)."""

    started: int = 0
    outcomes: Counter[Outcome] = field(default_factory=Counter)  # ended, cancelled included
    completed: int = 0  # ended, cancelled excluded
    errors: int = 0
    engine_dead: int = 0
    completion_tokens: int = 0
    cancelled: int = 0
    in_flight_area: float = 0.0  # ∫ in_flight dt over the step
    in_flight_max: int = 0
    started_unix_s: float = 0.0
    sends_timed: int = 0  # open loop: requests sent with an arrival time (module docstring)
    sends_late: int = 0
    sends_late_busy: int = 0
    send_late_max_s: float = 0.0


class ReplayContext:
    """Shared by the users and the shape of one process."""

    def __init__(
        self,
        *,
        order: RequestOrder,
        payloads: PayloadBuilder,
        sink: ResultSink | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.order = order
        self.payloads = payloads
        self.sink = sink
        self.clock = clock
        self.step = -1
        self.concurrency = 0
        self.phase = "ramp"
        self.in_flight: dict[str, InFlight] = {}
        self.server_answered = False
        self.outcomes: Counter[Outcome] = Counter()
        self.completion_tokens = 0
        self.counters = StepCounters(started_unix_s=clock())
        self._last_change_s = self.counters.started_unix_s
        self.stopping = False  # no new requests: the run is ending or the server is dead
        self.between_steps = False  # no new requests: a step ended and the next has not begun
        self.death_suspected = False  # a user saw engine_dead / a refused connect: check /health now
        self.open_loop_start_s: float | None = None  # open loop: when arrival 0 happens
        self.arrival_scale = 1.0
        self.exhausted = False
        self.live_users: Callable[[], int] | None = None  # Locust's running users, stopping ones too
        # another process declared the server dead (a worker asks the run directory's marker)
        self.declared_dead: Callable[[], bool] | None = None
        self._turns: dict[int, list[tuple[TraceRecord, int]]] = {}  # per user: its conversation's rest
        self.selfcheck: SelfMeasure | None = None  # this process measuring itself (module docstring)
        self._due: dict[str, tuple[float, float]] = {}  # open loop: request id → (arrival time, taken at)

    def may_send(self) -> bool:
        """False while no request may be sent: the run is ending, or the server was declared dead — in
        this process (``stopping``) or by the master of ``--processes N`` (``declared_dead``), whose
        stop message reaches the workers a little later — or the step ended and the next has not begun
        (``between_steps``). Called after the request's start time is taken, with no yield point until
        it counts as started, so no request recorded as started after the declaration is ever sent, and
        none is sent after its step's ``started`` was read as final."""
        if self.stopping:
            return False
        if self.declared_dead is not None and self.declared_dead():
            self.stopping = True
            return False
        return not self.between_steps

    def start_open_loop(self, start_unix_s: float, arrival_scale: float) -> None:
        """Replay arrival times from now on: request ``i`` is sent at ``start + arrival_s × scale``."""
        self.open_loop_start_s = start_unix_s
        self.arrival_scale = arrival_scale

    def next_request(self, user: int = 0) -> tuple[PreparedRequest, float] | None:
        """The next request for ``user`` and how long to wait before sending it; ``None`` once an
        open-loop replay has sent every request of the trace once.

        Closed loop: a user first finishes the conversation it began (``RequestOrder.next_unit``: the
        session's next turn, sent only after the previous one ended, since a user sends one request
        at a time), then takes the next unit. A user stopped by a lower step leaves the rest of its
        conversation unsent (``forget``): the level counts conversations in flight, as chat clients."""
        if self.open_loop_start_s is None:
            pending = self._turns.get(user)
            if not pending:
                pending = self._turns[user] = self.order.next_unit()
            record, sequence = pending.pop(0)
            if not pending:
                del self._turns[user]
            return self.payloads.build(record, sequence), 0.0
        if self.order.offset + self.order.sent * self.order.stride >= len(self.order.records):
            self.exhausted = True
            return None
        record, sequence = self.order.next()
        due = self.open_loop_start_s + record.arrival_s * self.arrival_scale
        request, now = self.payloads.build(record, sequence), self.clock()
        self._due[request.request_id] = (due, now)
        return request, max(0.0, due - now)

    @property
    def open_loop_done(self) -> bool:
        """An open loop has sent the trace once: every request taken, none waiting for its arrival
        time (taken by a sleeping user), none in flight."""
        return self.exhausted and not self._due and not self.in_flight

    def forget(self, user: int) -> None:
        """A user stopped: the rest of its conversation is not sent."""
        self._turns.pop(user, None)

    def begin_step(self, index: int, concurrency: int, phase: str) -> StepCounters:
        """Start counting a new step; returns the counters of the step that just ended."""
        now = self.clock()
        self._integrate(now)
        ended = self.counters
        self.step, self.concurrency, self.phase = index, concurrency, phase
        self.between_steps = False
        self.counters = StepCounters(started_unix_s=now, in_flight_max=len(self.in_flight))
        if self.selfcheck is not None:
            self.selfcheck.begin()
        return ended

    def end_step(self) -> None:
        """The step ended: no new request until the next one begins (``begin_step``), so every request
        belongs to the step that sent it and a step's ``started`` count is final at its end."""
        self.between_steps = True

    def achieved_concurrency(self, now_unix_s: float | None = None) -> float:
        """Time-weighted mean in-flight count over the current step so far."""
        now = self.clock() if now_unix_s is None else now_unix_s
        self._integrate(now)
        elapsed = now - self.counters.started_unix_s
        return self.counters.in_flight_area / elapsed if elapsed > 0 else float(len(self.in_flight))

    def busy(self) -> int:
        """What a lower step waits for before it begins: the requests in flight, or the users still
        alive when more (a user Locust is stopping may be finishing a request, and one that is not may
        be idle between steps; the lower step begins once the surplus users are gone)."""
        users = self.live_users() if self.live_users is not None else 0
        return max(len(self.in_flight), users)

    def oldest_in_flight_s(self) -> float:
        """How long the oldest request on the wire has been (0 when none is): one that has waited long
        may still be answered, a failure takes milliseconds (``capacity.schedule``, "No answer")."""
        oldest = min((f.start_unix_s for f in self.in_flight.values()), default=None)
        return 0.0 if oldest is None else max(0.0, self.clock() - oldest)

    def step_report(self) -> dict[str, object]:
        """This process's view of the current step, for the master (a Locust worker's report)."""
        now = self.clock()
        report: dict[str, object] = {
            "step": self.step,
            "mean": round(self.achieved_concurrency(now), 4),
            "elapsed_s": round(now - self.counters.started_unix_s, 3),
            "max": self.counters.in_flight_max,
            "in_flight": self.busy(),
            "oldest_s": round(self.oldest_in_flight_s(), 3),
            "started": self.counters.started,
            "outcomes": {o.value: n for o, n in self.counters.outcomes.items()},
        }
        loadgen = self.loadgen_report()
        if loadgen is not None:
            report["loadgen"] = loadgen
        return report

    def started(self, request: PreparedRequest, start_unix_s: float) -> None:
        self._integrate(start_unix_s)
        self.in_flight[request.request_id] = InFlight(
            request.request_id, start_unix_s, request.prompt_tokens, request.output_tokens
        )
        self.counters.in_flight_max = max(self.counters.in_flight_max, len(self.in_flight))
        self.counters.started += 1
        timed = self._due.pop(request.request_id, None)
        if timed is not None:
            self._count_lateness(start_unix_s, *timed)

    def _count_lateness(self, sent_unix_s: float, due_unix_s: float, taken_unix_s: float) -> None:
        """An open-loop send against its arrival time (module docstring)."""
        c = self.counters
        c.sends_timed += 1
        late_s = sent_unix_s - due_unix_s
        c.send_late_max_s = max(c.send_late_max_s, late_s)
        if late_s >= LATE_SEND_S:
            c.sends_late += 1
            if taken_unix_s - due_unix_s >= LATE_SEND_S:
                c.sends_late_busy += 1

    def loadgen_report(self) -> LoadgenLine | None:
        """This process's view of itself over the step so far (``selfcheck``), with the open loop's
        lateness when the step sent timed requests; ``None`` when the process does not measure itself."""
        if self.selfcheck is None:
            return None
        line = self.selfcheck.report()
        c = self.counters
        if c.sends_timed:
            line["sends_timed"] = c.sends_timed
            line["sends_late"] = c.sends_late
            line["sends_late_busy"] = c.sends_late_busy
            line["send_late_max_ms"] = round(1000.0 * max(0.0, c.send_late_max_s), 1)
        return line

    def finished(self, result: RequestResult) -> None:
        """A request ended (``cancelled`` included: counted apart, written like every other)."""
        self._integrate(result.end_unix_s)
        self.in_flight.pop(result.request_id, None)
        self.outcomes[result.outcome] += 1
        if self.sink is not None:
            self.sink.request(result)
        c = self.counters
        c.outcomes[result.outcome] += 1
        if result.outcome is Outcome.CANCELLED:
            c.cancelled += 1
            return
        tokens = result.usage_completion_tokens or 0
        self.completion_tokens += tokens
        c.completed += 1
        c.completion_tokens += tokens
        if result.outcome is not Outcome.OK:
            c.errors += 1
        if result.outcome is Outcome.ENGINE_DEAD:
            c.engine_dead += 1

    def _integrate(self, now: float) -> None:
        if now > self._last_change_s:
            self.counters.in_flight_area += len(self.in_flight) * (now - self._last_change_s)
            self._last_change_s = now


class ContextMeter:
    """``StepMeter`` over this process's own ``ReplayContext`` (in-process runs)."""

    def __init__(self, context: ReplayContext) -> None:
        self.context = context

    def begin(self, step: StepPlanLike) -> None:
        self.context.begin_step(step.index, step.concurrency, step.phase)

    def end(self) -> None:
        self.context.end_step()

    def completed(self) -> int:
        return self.context.counters.completed

    def in_flight(self) -> int:
        return self.context.busy()

    def count(self) -> StepCountLike:
        from oomload.load.shape import StepCount

        mean = self.context.achieved_concurrency()
        c = self.context.counters
        return StepCount(
            completed=c.completed,
            errors=c.errors,
            engine_dead=c.engine_dead,
            completion_tokens=c.completion_tokens,
            achieved_mean=mean,
            achieved_max=c.in_flight_max,
            cancelled=c.cancelled,
            started=c.started,
            outcomes={o.value: n for o, n in c.outcomes.items()},
            oldest_in_flight_s=self.context.oldest_in_flight_s(),
            loadgen=() if (line := self.context.loadgen_report()) is None else (line,),
        )
