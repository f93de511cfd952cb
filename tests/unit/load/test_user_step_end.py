"""A user that pauses between taking a request and sending it sends nothing once its step ended
(``oomload.load.user``, ``ReplayContext.may_send``): the step's ``started`` stays final.

The pause is made deterministic: the step ends in a greenlet that runs during the user's arrival sleep,
or inside the payload builder (where a chat prompt's ``/tokenize`` calls yield). The endpoint refuses
the connection (127.0.0.1:1), so a request that is sent ends at once, recorded.

``oomload.load.user`` imports Locust, which monkey-patches the process with gevent: imported inside the
tests, never at collection (``tests/xdistgevent.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oomload.load.context import ReplayContext
from oomload.load.payload import PreparedRequest, RequestOrder
from oomload.outcome import RequestResult
from oomload.trace.model import TraceRecord

REFUSED = "http://127.0.0.1:1"
ARRIVAL_WAIT_S = 0.2  # the open-loop user's sleep, during which the step ends


class Results:
    def __init__(self) -> None:
        self.rows: list[RequestResult] = []

    def request(self, result: RequestResult) -> None:
        self.rows.append(result)


class Payloads:
    """Builds an empty request; ``during_build`` runs inside ``build`` (a /tokenize call's pause)."""

    def __init__(self) -> None:
        self.during_build: Callable[[], None] = lambda: None
        self.fail = False

    def build(self, record: TraceRecord, sequence: int) -> PreparedRequest:
        from oomload.load.payload import PromptBuildError, TokenizeError

        self.during_build()
        request = PreparedRequest(f"{record.id}#{sequence}", "/v1/completions", b"{}", 5, 3)
        if self.fail:
            raise PromptBuildError(request, TokenizeError("/tokenize failed", "http 500", refused=False))
        return request


def _user(ctx: ReplayContext, *, open_loop: bool = False) -> Any:
    """A user of ``ctx``; with ``open_loop``, the open loop starts once the user is built (the
    ``Environment`` takes a while on a busy host), so that its first arrival is ARRIVAL_WAIT_S away."""
    import time

    from locust.env import Environment

    from oomload.load.http import Endpoint
    from oomload.load.user import ReplayUser

    endpoint = Endpoint.from_url(REFUSED)
    user_class = type("U", (ReplayUser,), {"abstract": False, "replay": ctx, "endpoint": endpoint})
    user = user_class(Environment(user_classes=[user_class]))
    if open_loop:  # every arrival is ARRIVAL_WAIT_S from now: the user sleeps that long first
        ctx.start_open_loop(time.time() + ARRIVAL_WAIT_S, 1.0)
    return user


def _context(payloads: Payloads) -> tuple[ReplayContext, Results]:
    results = Results()
    records = [TraceRecord(f"r{i}", 0.0, 5, 3) for i in range(4)]
    ctx = ReplayContext(order=RequestOrder(records), payloads=payloads, sink=results)
    ctx.begin_step(0, 1, "ramp")
    return ctx, results


def test_no_request_may_be_sent_between_a_steps_end_and_the_next_steps_start() -> None:
    ctx, _ = _context(Payloads())
    assert ctx.may_send()
    ctx.end_step()
    assert not ctx.may_send() and not ctx.stopping
    ctx.begin_step(1, 2, "ramp")
    assert ctx.may_send()


def test_a_step_that_ends_during_the_arrival_wait_keeps_the_request_for_the_next_step() -> None:
    """The open loop: the user took its request, slept to its arrival time, and the step ended meanwhile.
    It is not sent in the ended step (whose ``started`` was read as final) but first in the next one."""
    import gevent

    ctx, results = _context(Payloads())
    user = _user(ctx, open_loop=True)
    gevent.spawn(ctx.end_step)  # runs while the user sleeps to the arrival time
    user.replay_one()
    ended = ctx.begin_step(1, 1, "ramp")
    assert (ended.started, results.rows, ctx.in_flight) == (0, [], {})
    user.replay_one()
    assert [(r.request_id, r.step) for r in results.rows] == [("r0#0", 1)]
    assert ctx.counters.started == 1 and ctx.order.sent == 1  # the same request, taken once


def test_a_run_that_ends_during_the_arrival_wait_sends_nothing_more() -> None:
    """The run's last step ends (``--max-duration-s``), then the run stops: the request the user took
    before the end is never sent, and the step's ``started`` stays what its end line said."""
    import gevent

    ctx, results = _context(Payloads())
    user = _user(ctx, open_loop=True)
    gevent.spawn(ctx.end_step)
    user.replay_one()
    started_at_end = ctx.counters.started
    ctx.stopping = True  # the run drains
    user.replay_one()
    assert (started_at_end, ctx.counters.started, results.rows) == (0, 0, [])


def test_a_step_that_ends_while_the_prompt_is_built_keeps_the_request_for_the_next_step() -> None:
    """The closed loop: a chat prompt's /tokenize calls pause the user after its between-steps check."""
    ctx, results = _context(payloads := Payloads())
    user = _user(ctx)
    payloads.during_build = ctx.end_step
    user.replay_one()
    payloads.during_build = lambda: None
    ended = ctx.begin_step(1, 1, "ramp")
    assert (ended.started, results.rows) == (0, [])
    user.replay_one()
    assert [(r.request_id, r.step) for r in results.rows] == [("r0#0", 1)]


def test_a_prompt_that_failed_as_its_step_ended_is_recorded_in_the_next_step() -> None:
    """A /tokenize that failed is recorded as a send without an answer: in the step that records it."""
    ctx, results = _context(payloads := Payloads())
    payloads.fail = True
    user = _user(ctx)
    payloads.during_build = ctx.end_step
    user.replay_one()
    ended = ctx.begin_step(1, 1, "ramp")
    assert (ended.started, results.rows) == (0, [])
    user.replay_one()
    assert [(r.request_id, r.step, r.error) for r in results.rows] == [
        ("r0#0", 1, "tokenize failed: http 500")
    ]
