"""The step driver (no Locust): a lower step settles before it starts, bounded by ``settle_s``."""

from __future__ import annotations

from typing import Any

import pytest

from oomload.capacity.schedule import Hold, SchedulePlan, StepPlan, StopCondition
from oomload.load.shape import StepCount, StepDriver


class FakeMeter:
    def __init__(self) -> None:
        self.in_flight_now = 0
        self.begun: list[int] = []
        self.ended = 0

    def begin(self, step: StepPlan) -> None:
        self.begun.append(step.concurrency)

    def end(self) -> None:
        self.ended += 1

    def completed(self) -> int:
        return 10

    def count(self) -> StepCount:
        return StepCount(completed=10, errors=0, engine_dead=0)

    def in_flight(self) -> int | None:
        return self.in_flight_now


class Lines:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def append(self, stream: str, obj: dict[str, Any]) -> None:
        assert stream == "steps"
        self.lines.append(obj)


def _driver(meter: FakeMeter, sink: Lines, clock: list[float], preempt_at: int) -> StepDriver:
    plan = SchedulePlan(levels=(2, 8), stop_on=(StopCondition("first-preemption"),))
    current: dict[str, int] = {"total": 0}

    def scrape() -> dict[str, Any]:  # the server preempts while a step at or above preempt_at runs
        return {"ok": True, "t_unix_s": clock[0], "num_preemptions_total": current["total"]}

    driver = StepDriver(plan, Hold(1.0), meter, sink, boundary_scrape=scrape,
                        clock=lambda: clock[0], settle_s=5.0)  # fmt: skip

    def on_step(step: StepPlan) -> None:
        current["total"] += int(step.concurrency >= preempt_at)

    driver.on_step = on_step
    return driver


def test_a_lower_step_starts_once_the_surplus_has_drained() -> None:
    meter, sink, clock = FakeMeter(), Lines(), [100.0]
    driver = _driver(meter, sink, clock, preempt_at=8)
    assert driver.tick() == (2, 100.0)
    clock[0] += 1.0
    assert driver.tick() == (8, 100.0)  # step 1 at 8 (preempts)
    clock[0] += 1.0
    meter.in_flight_now = 8
    assert driver.tick() == (5, 100.0)  # the refinement asks for 5 users …
    assert [line["event"] for line in sink.lines] == ["start", "end", "start", "end"]  # … not started yet
    clock[0] += 1.0
    assert driver.tick() == (5, 100.0)  # still 8 in flight: settling
    assert meter.begun == [2, 8]
    # the web UI says "draining to concurrency 5" meanwhile, not the old step as if it still ran
    assert driver.draining_to is not None and driver.draining_to.concurrency == 5
    meter.in_flight_now = 5
    clock[0] += 0.5
    assert driver.tick() == (5, 100.0)
    assert meter.begun == [2, 8, 5]
    assert driver.draining_to is None and driver.step_started_unix_s == 103.5
    start = sink.lines[-1]
    assert (start["event"], start["concurrency"], start["t_unix_s"]) == ("start", 5, 103.5)


def test_settling_is_bounded() -> None:
    meter, sink, clock = FakeMeter(), Lines(), [0.0]
    driver = _driver(meter, sink, clock, preempt_at=8)
    driver.tick()
    clock[0] += 1.0
    driver.tick()
    clock[0] += 1.0
    meter.in_flight_now = 8  # never drains (requests longer than the grace)
    driver.tick()
    for _ in range(4):
        clock[0] += 1.0
        driver.tick()
        assert meter.begun == [2, 8]
    clock[0] += 1.0  # settle_s = 5 s after the decision
    driver.tick()
    assert meter.begun == [2, 8, 5] and sink.lines[-1]["t_unix_s"] == 7.0


def test_a_step_is_closed_before_it_is_counted_and_its_end_line_is_handed_on() -> None:
    meter, sink, clock = FakeMeter(), Lines(), [0.0]
    closed_when_counted: list[int] = []
    count = meter.count

    def counting() -> StepCount:
        closed_when_counted.append(meter.ended)
        return StepCount(completed=7, errors=1, engine_dead=0, started=9, outcomes={"ok": 6, "timeout": 1})

    meter.count = counting  # type: ignore[method-assign]
    del count
    ended: list[dict[str, Any]] = []
    plan = SchedulePlan(levels=(2, 4), refine=False, stop_on=(StopCondition("never"),))
    driver = StepDriver(plan, Hold(1.0), meter, sink, clock=lambda: clock[0], on_step_end=ended.append)
    driver.tick()
    clock[0] = 1.5
    driver.tick()
    assert closed_when_counted == [1]  # step 0 was closed (no new request) before its counts were read
    assert ended == [sink.lines[1]]
    line = ended[0]
    assert {k: line[k] for k in ("step", "duration_s", "started", "ended", "ended_ok", "ended_errors")} == {
        "step": 0,
        "duration_s": 1.5,
        "started": 9,
        "ended": 7,
        "ended_ok": 6,
        "ended_errors": 1,
    }
    assert line["ended_outcomes"] == {"ok": 6, "timeout": 1} and "completed" not in line


def test_the_boundary_counter_is_read_once_while_the_users_still_send() -> None:
    """A loaded vLLM takes seconds to answer /metrics: the read must not leave a step without load."""
    meter, sink, clock = FakeMeter(), Lines(), [100.0]
    reads: list[int] = []  # meter.ended at each read: 0 before the first step ends, …

    def scrape() -> dict[str, Any]:
        reads.append(meter.ended)
        clock[0] += 2.0  # the scrape takes 2 s
        return {"ok": True, "t_unix_s": clock[0], "num_preemptions_total": 3 * len(reads)}

    plan = SchedulePlan(levels=(2, 4, 8), stop_on=())
    driver = StepDriver(plan, Hold(1.0), meter, sink, boundary_scrape=scrape, clock=lambda: clock[0])
    driver.tick()  # step 0 begins: baseline read before any load
    for _ in range(2):
        clock[0] += 1.0
        driver.tick()  # a boundary: one read, taken while the ended step's users were still sending
    assert reads == [0, 0, 1]  # one read per boundary, each before that boundary's meter.end()
    starts = [line for line in sink.lines if line["event"] == "start"]
    ends = [line for line in sink.lines if line["event"] == "end"]
    # the boundary time is taken after the read, and the next step starts at that same moment
    assert [e["t_unix_s"] for e in ends] == [s["t_unix_s"] for s in starts[1:]]
    assert [e["preemptions"] for e in ends] == [3, 3]


def test_the_end_line_says_what_the_server_held_between_the_boundary_scrapes() -> None:
    """Little's law on vLLM's latency sums read at the two boundaries of the step."""
    meter, sink, clock = FakeMeter(), Lines(), [100.0]
    sums = iter([0.0, 30.0, 45.0])  # e2e latency sum at each boundary: 30 s of requests in step 0

    def scrape() -> dict[str, Any]:
        e2e = next(sums)
        sums_now = {"e2e_latency_seconds_sum": e2e, "inference_seconds_sum": e2e / 2, "queue_seconds_sum": 0}
        return {"ok": True, "t_unix_s": clock[0], "num_preemptions_total": 0, **sums_now}

    plan = SchedulePlan(levels=(4, 8), stop_on=())
    driver = StepDriver(plan, Hold(10.0), meter, sink, boundary_scrape=scrape, clock=lambda: clock[0])
    driver.tick()
    clock[0] += 10.0
    driver.tick()
    end = next(line for line in sink.lines if line["event"] == "end")
    assert end["server_concurrency"] == {"in_server": 3.0, "in_engine": 1.5, "queued": 0.0, "window_s": 10.0,
                                         "from_unix_s": 100.0, "to_unix_s": 110.0}  # fmt: skip


class SendingMeter(FakeMeter):
    """Counts the requests a step sent: ``rate`` per second of the fake clock since it began."""

    def __init__(self, clock: list[float], rate: float, limited: int = 0) -> None:
        super().__init__()
        self.clock, self.rate, self.began_at = clock, rate, 0.0
        self.limited = limited  # of them, turned away with HTTP 429

    def begin(self, step: StepPlan) -> None:
        super().begin(step)
        self.began_at = self.clock[0]

    def count(self) -> StepCount:
        sent = int((self.clock[0] - self.began_at) * self.rate)
        limited = min(self.limited, sent)
        outcomes = {"ok": sent - limited, "rate_limited": limited}
        return StepCount(completed=sent, errors=limited, engine_dead=0, started=sent, outcomes=outcomes)


def _evidence_run(
    preempt_after_s: float | None,
    needed: int = 40,
    history: list[Any] | None = None,
    *,
    poller: bool = False,
    limited: int = 0,
) -> tuple[list[dict[str, Any]], list[float]]:
    """One 4-user step held 2 s at 5 requests/s (``limited`` of them turned away with HTTP 429); the odds
    ask for ``needed`` requests."""
    clock = [100.0]
    meter, sink = SendingMeter(clock, rate=5.0, limited=limited), Lines()
    scrapes: list[float] = []

    def scrape() -> dict[str, Any]:
        scrapes.append(clock[0])
        elapsed = clock[0] - 100.0
        total = int(preempt_after_s is not None and elapsed >= preempt_after_s)
        return {"ok": True, "t_unix_s": clock[0], "num_preemptions_total": total}

    plan = SchedulePlan(levels=(4,), refine=False, stop_on=())

    def latest() -> dict[str, Any]:  # the poller's last scrape (not a boundary read)
        elapsed = clock[0] - 100.0
        total = int(preempt_after_s is not None and elapsed >= preempt_after_s)
        return {"ok": True, "t_unix_s": clock[0], "num_preemptions_total": total}

    polled = latest if poller else lambda: None
    driver = StepDriver(plan, Hold(2.0), meter, sink, boundary_scrape=scrape, clock=lambda: clock[0],
                        evidence=lambda _step: needed, latest_scrape=polled)  # fmt: skip
    for _ in range(200):
        if driver.tick() is None:
            break
        clock[0] += 0.5
    if history is not None:
        history.extend(driver.history)
    return sink.lines, scrapes


def test_a_clean_step_is_extended_until_it_sent_what_the_odds_ask() -> None:
    history: list[Any] = []
    lines, scrapes = _evidence_run(preempt_after_s=None, history=history)
    assert not history[0].evidence_short
    end = next(line for line in lines if line["event"] == "end")
    assert end["duration_s"] >= 8.0  # 40 requests at 5/s
    assert end["evidence_requests"] == 40 and end["extended_s"] >= 5.5
    assert len(scrapes) <= 2 + 8 / 2.0 + 1  # a baseline, then about one read per EXTEND_CHECK_S


def test_an_extension_ends_at_the_first_preemption() -> None:
    lines, _ = _evidence_run(preempt_after_s=4.0)
    end = next(line for line in lines if line["event"] == "end")
    assert 4.0 <= end["duration_s"] < 8.0 and end["preemptions"] == 1


def test_an_extension_ends_when_the_poller_sees_the_preemption() -> None:
    """Between two reads of the extension (every EXTEND_CHECK_S from the 2 s hold: 4, 6, …), the
    poller's scrape at 4.5 s shows the counter risen: the step ends on that tick, not at 6 s."""
    lines, _ = _evidence_run(preempt_after_s=4.5, poller=True)
    end = next(line for line in lines if line["event"] == "end")
    assert end["duration_s"] == 4.5 and end["preemptions"] == 1 and end["reason"] == "hold_done"
    lines, _ = _evidence_run(preempt_after_s=4.5)  # no poller: the next read ends it
    assert next(line for line in lines if line["event"] == "end")["duration_s"] == 6.0


def test_a_step_a_limit_turned_requests_away_is_not_extended() -> None:
    """Three requests turned away with HTTP 429 make the step no evidence (``capacity.schedule``, "Rate
    limit"): running it on for the odds' 40 requests would only send more to the gateway."""
    lines, _ = _evidence_run(preempt_after_s=None, limited=3)
    end = next(line for line in lines if line["event"] == "end")
    assert end["duration_s"] == 2.0 and "extended_s" not in end
    lines, _ = _evidence_run(preempt_after_s=None, limited=2)  # two are not a limit: extended as before
    assert next(line for line in lines if line["event"] == "end")["duration_s"] >= 8.0


def test_an_extension_is_bounded() -> None:
    history: list[Any] = []
    lines, _ = _evidence_run(preempt_after_s=None, needed=10_000, history=history)
    assert history[0].evidence_short  # the schedule does not count it as a vote for a clean level
    end = next(line for line in lines if line["event"] == "end")
    assert end["duration_s"] <= 2.0 * 12 + 2.5  # EXTEND_MAX_FACTOR × the hold, plus one check interval


def test_a_short_check_ends_at_its_share_of_the_hold_and_a_refinement_there_holds_in_full() -> None:
    """Ramp levels the odds call safe (``SchedulePlan.checks``) get a short check; when the run comes
    back to such a level to bisect (the odds were wrong), that step gets the whole hold."""
    meter, sink, clock = FakeMeter(), Lines(), [100.0]
    preempting = {"total": 0}
    plan = SchedulePlan(
        levels=(1, 2, 8), stop_on=(StopCondition("first-preemption"),), checks=frozenset({1, 2})
    )

    def scrape() -> dict[str, Any]:
        return {"ok": True, "t_unix_s": clock[0], "num_preemptions_total": preempting["total"]}

    driver = StepDriver(plan, Hold(4.0), meter, sink, boundary_scrape=scrape, clock=lambda: clock[0])
    driver.on_step = lambda step: preempting.__setitem__(
        "total", preempting["total"] + int(step.concurrency >= 2)
    )
    for _ in range(400):
        if driver.tick() is None:
            break
        clock[0] += 0.25
    ends = [
        (line["concurrency"], line["phase"], line["duration_s"])
        for line in sink.lines
        if line["event"] == "end"
    ]
    assert [(c, phase) for c, phase, _ in ends] == [(1, "ramp"), (2, "ramp")]  # 2 preempted: bracket (1, 2)
    assert all(d < 1.5 for _, _, d in ends)  # a quarter of the 4 s hold, read on 0.25 s ticks
    plan = SchedulePlan(levels=(1, 2, 8), stop_on=(StopCondition("first-preemption"),), checks=frozenset({1}))
    assert StepDriver(plan, Hold(4.0), meter, sink).hold_for(StepPlan(5, 1, "refine")) == Hold(4.0)
    assert StepDriver(plan, Hold(4.0), meter, sink).hold_for(StepPlan(0, 1, "ramp")) == Hold(1.0, 3)


class SlowMeter(FakeMeter):
    """Requests that take long: ``ended`` of them have ended in the step so far."""

    ended_now = 0

    def completed(self) -> int:
        return self.ended_now


@pytest.mark.parametrize(("ended", "duration_s"), [(3, 1.0), (2, 4.0)])
def test_a_short_check_waits_for_three_ended_requests_up_to_the_full_hold(
    ended: int, duration_s: float
) -> None:
    """Fewer than 3 ended requests make a step "anecdotal" in the verdict: a check waits for them,
    but never longer than the full hold (a server that does not answer does not stall the run)."""
    meter, sink, clock = SlowMeter(), Lines(), [100.0]
    meter.ended_now = ended
    plan = SchedulePlan(levels=(1, 8), stop_on=(StopCondition("never"),), checks=frozenset({1}))
    driver = StepDriver(plan, Hold(4.0), meter, sink, clock=lambda: clock[0])
    for tick in range(1, 20):
        if driver.tick() is None:
            break
        clock[0] = 100.0 + tick
    assert next(line["duration_s"] for line in sink.lines if line["event"] == "end") == duration_s


def test_a_repeat_ends_at_its_preemption_and_a_ramp_step_holds_in_full() -> None:
    """The poller's latest scrape shows the counter rising 1.5 s into each step at 8: the ramp step
    holds its 4 s anyway, the refinement step at 8 ends on the next tick with ``preempted``."""
    meter, sink, clock = FakeMeter(), Lines(), [100.0]
    state = {"total": 0, "since": 0.0, "level": 0}
    plan = SchedulePlan(levels=(7, 8), stop_on=(StopCondition("oom"),), repeats=3)

    def counter() -> int:
        rising = state["level"] >= 8 and clock[0] - state["since"] >= 1.5
        return int(state["total"] + rising)

    def scrape() -> dict[str, Any]:
        return {"ok": True, "t_unix_s": clock[0], "num_preemptions_total": counter()}

    def on_step(step: StepPlan) -> None:
        state["total"], state["since"], state["level"] = counter(), clock[0], step.concurrency

    driver = StepDriver(plan, Hold(4.0), meter, sink, boundary_scrape=scrape, clock=lambda: clock[0],
                        latest_scrape=scrape)  # fmt: skip
    driver.on_step = on_step
    for _ in range(400):
        if driver.tick() is None:
            break
        clock[0] += 0.5
    ends = [(line["concurrency"], line["phase"], line["reason"], line["duration_s"]) for line in sink.lines
            if line["event"] == "end"]  # fmt: skip
    assert ends[:2] == [(7, "ramp", "hold_done", 4.0), (8, "ramp", "hold_done", 4.0)]
    repeats_at_8 = [e for e in ends[2:] if e[0] == 8]
    assert repeats_at_8 and all(reason == "preempted" and 1.5 <= d < 4.0 for _, _, reason, d in repeats_at_8)
    assert all(e[2] == "hold_done" for e in ends[2:] if e[0] == 7)  # a clean repeat holds in full


def test_a_hold_counts_from_the_tick_that_opened_the_step() -> None:
    """Locust ticks once a second and the boundary scrape takes time within a tick: a 4 s hold is
    done on the fourth tick after the step opened (it lasted 5 s when counted from after the scrape)."""
    meter, sink, clock = FakeMeter(), Lines(), [100.0]

    def scrape() -> dict[str, Any]:
        clock[0] += 0.2  # a /metrics read takes 0.2 s
        return {"ok": True, "t_unix_s": clock[0], "num_preemptions_total": 0}

    plan = SchedulePlan(levels=(2, 4), stop_on=(StopCondition("never"),))
    driver = StepDriver(plan, Hold(4.0), meter, sink, boundary_scrape=scrape, clock=lambda: clock[0])
    for tick in range(1, 40):
        if driver.tick() is None:
            break
        clock[0] = 100.0 + tick  # the next tick, a second after the last one began
    durations = [line["duration_s"] for line in sink.lines if line["event"] == "end"]
    # the first step opens before its baseline scrape, so it also counts the closing scrape's 0.2 s
    assert durations == [pytest.approx(4.2), pytest.approx(4.0)]


def test_the_locust_shape_returns_as_soon_as_the_driver_changes_its_answer() -> None:
    """Locust asks the shape once a second; between its calls the shape asks the driver every
    ``SHAPE_POLL_S`` and hands on a new step at once (a step ended between two Locust ticks used to
    wait for the next one)."""
    from oomload.load.shape import SHAPE_POLL_S, make_shape

    answers = [(1, 100.0), (1, 100.0), (1, 100.0), (4, 100.0), None]

    class Driver:
        calls = 0
        draining_to = None

        def tick(self) -> tuple[int, float] | None:
            self.calls += 1
            return answers[min(self.calls - 1, len(answers) - 1)]

    driver = Driver()
    shape = make_shape(driver, keep_open=True)  # type: ignore[arg-type]
    assert shape.tick() == (1, 100.0) and driver.calls == 1  # a new answer: no wait
    assert shape.tick() == (4, 100.0) and driver.calls == 4  # polled twice more, every SHAPE_POLL_S
    assert shape.tick() == (4, 100.0) and driver.calls == 5  # over: the last answer, kept open
    assert 0 < SHAPE_POLL_S <= 0.25
    answers[:] = [(4, 100.0)] * 3
    driver.calls, driver.draining_to = 0, StepPlan(3, 4, "refine")  # type: ignore[assignment]
    assert shape.tick() == (4, 100.0) and driver.calls == 1  # a drain keeps Locust's own tick


class FailingMeter(FakeMeter):
    """Every request the server answers nothing to: ``failed`` of them ended so far, none answered."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0
        self.oldest_s = 0.01  # the requests on the wire were just sent: failures come in milliseconds

    def completed(self) -> int:
        return self.failed

    def count(self) -> StepCount:
        outcomes = {"server_error": self.failed}
        return StepCount(
            completed=self.failed,
            errors=self.failed,
            engine_dead=0,
            outcomes=outcomes,
            oldest_in_flight_s=self.oldest_s,
        )


@pytest.mark.parametrize("never", [False, True])
def test_a_step_that_answers_nothing_ends_at_once_and_ends_the_run(never: bool) -> None:
    """A 30 s hold (a soak: hours) against a server that answers nothing ends once 10 requests failed
    and none was answered (``capacity.schedule``, "No answer"); ``--stop-on never`` holds it."""
    meter, sink, clock = FailingMeter(), Lines(), [0.0]
    stop_on = (StopCondition("never" if never else "oom"),)
    driver = StepDriver(SchedulePlan(levels=(1, 2), stop_on=stop_on), Hold(30.0), meter, sink,
                        boundary_scrape=lambda: None, clock=lambda: clock[0])  # fmt: skip
    assert driver.tick() == (1, 100.0)
    meter.failed = 30  # before the step ran 2 s: a long request sent with them may not show yet
    clock[0] += 1.0
    assert driver.tick() == (1, 100.0)
    meter.failed = 9  # too few to say
    clock[0] += 1.2
    assert driver.tick() == (1, 100.0)
    meter.failed, meter.oldest_s = 10, 1.1  # one request has waited 1.1 s: it may yet be answered
    clock[0] += 0.2
    assert driver.tick() == (1, 100.0)
    meter.oldest_s = 0.01  # it failed too
    clock[0] += 0.2
    if never:
        assert driver.tick() == (1, 100.0) and not driver.finished
        return
    assert driver.tick() is None
    assert driver.end_reason == "no_answer"
    end = sink.lines[-1]
    assert (end["event"], end["reason"], end["duration_s"]) == ("end", "no_answer", 2.6)


class LimitedMeter(FailingMeter):
    """Every step: 20 answers, and ``limited`` requests a gateway turned away with HTTP 429."""

    limited = 0

    def count(self) -> StepCount:
        outcomes = {"ok": 20, "rate_limited": self.limited}
        return StepCount(completed=20 + self.limited, errors=self.limited, engine_dead=0, outcomes=outcomes)


@pytest.mark.parametrize(
    ("limited", "levels", "end_reason"), [(3, [1], "rate_limited"), (2, [1, 2], "completed")]
)
def test_a_step_a_limit_turned_requests_away_keeps_its_hold_then_ends_the_ramp(
    limited: int, levels: list[int], end_reason: str
) -> None:
    """Three 429s make the step one the gateway limited (``capacity.schedule``, "Rate limit"): it holds its
    5 s — what reached the engine is measured — and no level above it is sent; two do not."""
    meter, sink, clock = LimitedMeter(), Lines(), [0.0]
    meter.limited = limited
    driver = StepDriver(SchedulePlan(levels=(1, 2)), Hold(5.0), meter, sink,
                        boundary_scrape=lambda: None, clock=lambda: clock[0])  # fmt: skip
    assert driver.tick() == (1, 100.0)
    clock[0] += 4.9
    assert driver.tick() == (1, 100.0)  # the hold is kept
    for _ in range(3):
        clock[0] += 5.0
        if driver.tick() is None:
            break
    assert driver.end_reason == end_reason
    assert [line["concurrency"] for line in sink.lines if line["event"] == "end"] == levels
