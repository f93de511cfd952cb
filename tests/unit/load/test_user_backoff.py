"""A user failed again and again by the server waits between its requests (``oomload.load.user``, its
pauses ``oomload.load.backoff``).

``oomload.load.user`` imports Locust, which monkey-patches the process with gevent: imported inside the
tests, never at collection, where an xdist worker not yet running its tests would crash on it
(``tests/xdistgevent.py``). ``backoff`` is pure: it is imported at the top, as other tests import it."""

from __future__ import annotations

from typing import Any

import pytest

from oomload.capacity.schedule import NO_ANSWER_MIN_FAILED, NO_ANSWER_MIN_S
from oomload.load.backoff import FAILING_BACKOFF_MAX_S, failing_backoff_s
from oomload.outcome import USAGE_DISAGREES, Outcome


def _exchange(outcome: Outcome, reason: str | None, status: int | None) -> Any:
    from oomload.load.http import Exchange

    return Exchange(outcome, reason, None, 0.0, 0.001, status, None, None, None, None, None, 1.0)


@pytest.mark.parametrize(
    ("outcome", "reason", "status", "failed"),
    [
        (Outcome.SERVER_ERROR, "http 500", 500, True),
        (Outcome.SERVER_ERROR, "http 502", 502, True),  # a proxy whose upstream is gone
        (Outcome.SERVER_ERROR, "400 inside a 200 stream", 200, True),
        (Outcome.TRANSPORT_ERROR, "stream broke", 200, True),  # the server closed the stream it began
        (Outcome.SERVER_ERROR, USAGE_DISAGREES, 200, False),  # the request ran: its usage is off
        (Outcome.TRANSPORT_ERROR, "connection refused", None, False),  # the dead server's wait
        (Outcome.RATE_LIMITED, "http 429", 429, False),  # the turned-away wait
        (Outcome.CONTEXT_OVERFLOW, "maximum context length", 400, False),  # the trace's, not the server's
        (Outcome.TIMEOUT, "request timeout", None, False),
        (Outcome.OK, None, 200, False),
    ],
)
def test_what_counts_as_the_server_failing_a_request(
    outcome: Outcome, reason: str | None, status: int | None, failed: bool
) -> None:
    from oomload.load.user import needs_backoff, server_failed

    ex = _exchange(outcome, reason, status)
    assert server_failed(ex) is failed
    assert not (failed and needs_backoff(ex))  # never two waits for one request


def test_the_wait_starts_at_the_second_failure_in_a_row_and_doubles_to_its_cap() -> None:
    waits = [failing_backoff_s(n) for n in range(1, 9)]
    assert waits == [0.0, 0.05, 0.1, 0.2, 0.25, 0.25, 0.25, 0.25]
    assert failing_backoff_s(10_000) == FAILING_BACKOFF_MAX_S


def test_a_lone_user_still_fails_enough_for_the_no_answer_rule_in_its_time() -> None:
    """At concurrency 1 the failures that make a step one with no answer (``capacity.schedule``) still
    end within the time the rule waits anyway: the wait does not lengthen a failing run."""

    waited_s = sum(failing_backoff_s(n) for n in range(1, NO_ANSWER_MIN_FAILED + 1))
    assert waited_s < NO_ANSWER_MIN_S
