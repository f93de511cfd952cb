"""The Locust user that replays trace requests: one request at a time, no wait (closed loop).

Each user takes the next request from the process's ``ReplayContext``, sends it with
``oomload.load.http.send`` (a fresh connection per request; see that module for why), writes the
``RequestResult`` to the run directory and reports it to Locust's statistics so its UI, CSV and HTML
show the run: one entry per request, ``POST <endpoint path>`` — response time = end-to-end ms,
response length = completion tokens (from ``usage``), failure = ``"<outcome>: <reason>"`` for any
outcome but ok. TTFT is not a request, so it stays out of Locust's statistics (a second entry doubled
the header's RPS and mixed TTFT into the Response Times chart): it is in the ``RequestResult``, and
the web UI's oomload tab and the report show it as its own metric.

Nothing sent is lost. A user stopped by Locust mid-request is written as a ``cancelled`` result (its
start time, lengths, and the TTFT and token events seen so far). The runner makes that rare: a step
that lowers the user count lets the stopped users finish their request (Locust's ``stop_timeout``,
capped), and only the end of the run or Ctrl-C abandons what is still in flight.

A request belongs to the step that sends it, and a step sends nothing after its end
(``ReplayContext.end_step``): a user may pause between taking a request and sending it (the open loop's
wait for the arrival time, a chat prompt's ``/tokenize`` calls), so after the pause it asks
``ReplayContext.may_send`` again, with no yield point between that answer and counting the request as
started. A step that ended during the pause leaves the request with the user (``held``), which sends it
first once the next step begins; a run that ended drops it (it was never sent). The same holds in each
worker of ``--processes N`` / ``--workers``, whose step ends when the master's message arrives.

A dead server is not hammered: after a refused connection or an ``engine_dead`` outcome the user
sleeps ``DEAD_BACKOFF_S`` before its next request, so a killed server sees a handful of requests per
user before the monitor declares it dead and the users go idle (``ReplayContext.stopping``). Once
it is declared dead no request is sent, in any process: a user takes its start time, then asks
``ReplayContext.may_send`` (the workers of ``--processes N`` see the master's marker file in the run
directory before its stop message arrives).

A limit is not hammered either: after a ``rate_limited`` outcome (HTTP 429, or a 503 not vLLM's own: a
gateway's or proxy's rate or concurrency limit), or vLLM's own ``admission_rejected`` ("try again later": its
queue limit), the user waits ``TURNED_AWAY_BACKOFF_S`` before its next request, as a client of that gateway or
of vLLM would. Without the wait a user turned away in a millisecond sent about 500 requests a second to a
gateway that admits 4 at a time (seen: 2,490 requests in a 5 s step at concurrency 8, 2,485 of them 429s);
with it, a turned-away user sends one a second, and the step's in-flight mean says how much of the level
reached the engine. vLLM's own queue limit was stormed alike: at ``--max-num-seqs 2 --max-num-queued-reqs 2``
a step at concurrency 4 sent 2,399 requests in 10 s, 2,361 of them rejected. The server's ``Retry-After`` is
not read: the step, not the gateway, decides when the load ends (``oomload.capacity.schedule``, "Rate limit").

A failing server is not hammered either: after a user's second request in a row that the server failed
(``server_failed``: an error status not named above — a 500, a 404, a proxy's 502 — or a stream it broke),
the user waits ``FAILING_BACKOFF_FIRST_S``, doubled after each next one up to ``FAILING_BACKOFF_MAX_S``
(``oomload.load.backoff``); any other ending starts the count again, so a lone failure among answers
costs no wait. An endpoint that answered every request with a 500 in a millisecond got 2,466 requests
from one user in the 2 s the no-answer rule waits (``capacity.schedule``); now it gets about a dozen, and
the ten failures that rule needs still come within its 2 s.

A chat prompt that could not be built (its ``/tokenize`` failed mid-run: ``PromptBuildError``) is
recorded as a send that got no answer (``http.unsent_exchange``: ``transport_error`` "tokenize
failed", or ``engine_dead`` when refused after the server had answered), and the user sleeps
``DEAD_BACKOFF_S`` too: before, each attempt raised in the Locust task and printed a traceback.

Conversations: a user sends a conversation's turns one after the other (``ReplayContext.next_request``
keyed by the user), so turn k goes out after turn k − 1 ended and from the same user; a user stopped by
a lower step drops the rest of its conversation (``on_stop``).

Open loop: when the context carries an ``ArrivalClock``, a user first waits until its request's
scheduled arrival (the trace's ``arrival_s`` × scale) and only then sends it; the users are then a
pool of senders and their number caps the in-flight requests.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gevent
from gevent import GreenletExit
from locust import User, constant, task

from oomload.load.backoff import failing_backoff_s
from oomload.load.context import ReplayContext
from oomload.load.http import (
    Endpoint,
    Exchange,
    ExchangeProgress,
    cancelled_exchange,
    send,
    unsent_exchange,
)
from oomload.load.payload import PreparedRequest, PromptBuildError
from oomload.outcome import USAGE_DISAGREES, Outcome, RequestResult

DEAD_BACKOFF_S = 0.5  # pause after a refused connection / engine_dead outcome
TURNED_AWAY_BACKOFF_S = 1.0  # pause after a rate_limited or admission_rejected outcome
TURNED_AWAY = frozenset({Outcome.RATE_LIMITED, Outcome.ADMISSION_REJECTED})
IDLE_S = 0.1  # how often an idle user (between steps, stopping, open loop done) looks again


class OutcomeError(Exception):
    """How Locust's statistics see a request that did not end ok (``"<outcome>: <reason>"``)."""


class ReplayUser(User):
    """Replays trace requests against an OpenAI-compatible endpoint with exact lengths."""

    abstract = True  # the runner / scenario makes a concrete subclass bound to its context
    wait_time = constant(0)
    replay: ClassVar[ReplayContext | None] = None
    endpoint: ClassVar[Endpoint | None] = None
    request_timeout_s: ClassVar[float] = 600.0
    stream: ClassVar[bool] = True
    exact_output: ClassVar[bool] = True
    failures_in_a_row = 0  # this user's requests the server failed, one after the other (``server_failed``)
    held: PreparedRequest | PromptBuildError | None = None  # taken, then its step ended before the send

    @task
    def replay_one(self) -> None:
        ctx, endpoint = self.replay, self.endpoint
        if ctx is None or endpoint is None:
            raise RuntimeError("ReplayUser needs a context and an endpoint (see oomload.run.runner)")
        if ctx.stopping or ctx.between_steps:
            gevent.sleep(IDLE_S)
            return
        request, self.held = self.held, None  # taken as a step ended: sent first in the next one
        if request is None:
            try:
                picked = ctx.next_request(id(self))  # may pause: a chat prompt's /tokenize calls
            except PromptBuildError as err:  # /tokenize failed: recorded as a send that got no answer
                self._unsent(ctx, err)
                return
            if picked is None:  # open loop: the trace has been sent once
                gevent.sleep(IDLE_S)
                return
            request, delay_s = picked
            if delay_s > 0:
                gevent.sleep(delay_s)
        if isinstance(request, PromptBuildError):
            self._unsent(ctx, request)
            return
        step, concurrency = ctx.step, ctx.concurrency
        start = ctx.clock()
        if not self._step_open(ctx, request):  # no yield point from here to ``started``
            return
        ctx.started(request, start)
        progress = ExchangeProgress()
        try:
            ex = send(
                endpoint,
                request,
                timeout_s=self.request_timeout_s,
                stream=self.stream,
                exact_output=self.exact_output,
                server_answered_before=ctx.server_answered,
                progress=progress,
            )
        except GreenletExit:
            ctx.finished(_result(request, step, concurrency, cancelled_exchange(progress)))
            raise
        except BaseException as err:  # a bug or an interrupt: still recorded, then re-raised
            reason = f"client error ({type(err).__name__})"
            ctx.finished(_result(request, step, concurrency, cancelled_exchange(progress, reason)))
            raise
        if ex.http_status is not None:
            ctx.server_answered = True
        ctx.finished(_result(request, step, concurrency, ex))
        self._report(request, ex)
        self.failures_in_a_row = self.failures_in_a_row + 1 if server_failed(ex) else 0
        if needs_backoff(ex):
            ctx.death_suspected = True
            gevent.sleep(DEAD_BACKOFF_S)
        elif ex.outcome in TURNED_AWAY:
            gevent.sleep(TURNED_AWAY_BACKOFF_S)
        elif self.failures_in_a_row > 1:
            gevent.sleep(failing_backoff_s(self.failures_in_a_row))

    def _step_open(self, ctx: ReplayContext, picked: PreparedRequest | PromptBuildError) -> bool:
        """May ``picked`` be sent now, in the current step (``ReplayContext.may_send``)? Asked after every
        pause (the arrival sleep, the /tokenize calls) and just before it counts as started: a step that
        ended during the pause keeps it for the next step (``held``); a run that ends drops it."""
        if ctx.may_send():
            return True
        if not ctx.stopping:
            self.held = picked
        return False

    def _unsent(self, ctx: ReplayContext, err: PromptBuildError) -> None:
        if not self._step_open(ctx, err):
            return
        failed = err.tokenize
        answered = ctx.server_answered
        ex = unsent_exchange(
            "tokenize failed", failed.short, refused=failed.refused, server_answered_before=answered
        )
        ctx.started(err.request, ex.start_unix_s)
        ctx.finished(_result(err.request, ctx.step, ctx.concurrency, ex))
        self._report(err.request, ex)
        if failed.refused:  # as after a refused send: the monitor checks /health now
            ctx.death_suspected = True
        gevent.sleep(DEAD_BACKOFF_S)  # never a tight loop of failing /tokenize calls

    def on_stop(self) -> None:
        self.held = None  # as the rest of its conversation: a lower step does not send it
        if self.replay is not None:
            self.replay.forget(id(self))

    def _report(self, request: PreparedRequest, ex: Exchange) -> None:
        fire = self.environment.events.request.fire
        failure: Any = None if ex.reason is None else OutcomeError(f"{ex.outcome.value}: {ex.reason}")
        fire(
            request_type="POST",
            name=request.path,
            response_time=ex.e2e_ms,
            response_length=ex.usage_completion_tokens or 0,
            exception=failure,
            context={},
        )


def needs_backoff(ex: Exchange) -> bool:
    """A dead or dying server: engine_dead, or no HTTP answer at all (refused, connect failed)."""
    if ex.outcome is Outcome.ENGINE_DEAD:
        return True
    return ex.outcome is Outcome.TRANSPORT_ERROR and ex.http_status is None


def server_failed(ex: Exchange) -> bool:
    """The server answered and failed the request: an error status (``server_error``, but for a 200 whose
    usage disagrees: that request ran), or a stream it broke (``transport_error`` after its head). Not a
    prompt over ``max_model_len`` (``context_overflow``): that is the trace's request, and the next may
    fit — with the wait, a trace of 19 overflowing prompts to one long answer reached its answers only
    after the no-answer rule had ended the step (e2e ``test_overflow.py``)."""
    if ex.outcome is Outcome.SERVER_ERROR:
        return ex.reason != USAGE_DISAGREES
    return ex.outcome is Outcome.TRANSPORT_ERROR and ex.http_status is not None


def _result(request: PreparedRequest, step: int, concurrency: int, ex: Exchange) -> RequestResult:
    return RequestResult(
        request_id=request.request_id,
        step=step,
        concurrency=concurrency,
        start_unix_s=ex.start_unix_s,
        end_unix_s=ex.end_unix_s,
        outcome=ex.outcome,
        prompt_tokens_asked=request.prompt_tokens,
        output_tokens_asked=request.output_tokens,
        usage_prompt_tokens=ex.usage_prompt_tokens,
        usage_completion_tokens=ex.usage_completion_tokens,
        ttft_ms=_round(ex.ttft_ms),
        tpot_ms=_round(ex.tpot_ms),
        itl_max_ms=_round(ex.itl_max_ms),
        e2e_ms=_round(ex.e2e_ms),
        http_status=ex.http_status,
        error=ex.reason if ex.detail is None else f"{ex.reason}: {ex.detail}",
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
