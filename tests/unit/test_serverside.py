"""What the server held: Little's law on vLLM's latency sums, the server's share, the delivered load."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.rundir.records import MetricsRow
from oomload.rundir.serverside import delivered_concurrency, server_concurrency, server_share


def scrape(t: float, e2e: float | None, *, ok: bool = True, restarted: bool = False) -> MetricsRow:
    """A ``metrics.jsonl`` line as written, parsed as the verdict reads it."""
    line: dict[str, Any] = {"t_unix_s": t, "ok": ok, "restarted": restarted}
    if e2e is not None:
        line.update(
            e2e_latency_seconds_sum=e2e, inference_seconds_sum=e2e * 0.75, queue_seconds_sum=e2e * 0.25
        )
    row = MetricsRow.from_json(line)
    assert row is not None
    return row


def test_littles_law_between_two_scrapes() -> None:
    server = server_concurrency(scrape(100.0, 50.0), scrape(110.0, 90.0))
    assert server is not None
    assert server.in_server == pytest.approx(4.0)  # 40 s of requests in 10 s: 4 on average
    assert server.in_engine == pytest.approx(3.0)
    assert server.queued == pytest.approx(1.0)
    assert server.to_json() == {
        "in_server": 4.0,
        "in_engine": 3.0,
        "queued": 1.0,
        "window_s": 10.0,
        "from_unix_s": 100.0,
        "to_unix_s": 110.0,
    }


@pytest.mark.parametrize(
    ("first", "last", "between"),
    [
        (None, scrape(110.0, 90.0), ()),  # no scrape opened the window
        (scrape(100.0, 50.0, ok=False), scrape(110.0, 90.0), ()),  # a failed scrape
        (scrape(100.0, None), scrape(110.0, None), ()),  # no latency sums: not vLLM, or too old
        (scrape(100.0, 50.0), scrape(100.4, 90.0), ()),  # a window shorter than MIN_WINDOW_S
        (scrape(100.0, 50.0), scrape(110.0, 10.0), ()),  # the sums went back: a restart
        (scrape(100.0, 50.0), scrape(110.0, 90.0), (scrape(105.0, 1.0, restarted=True),)),
    ],
)
def test_no_figure_when_the_counters_cannot_tell(first: Any, last: Any, between: Any) -> None:
    assert server_concurrency(first, last, between) is None


def test_share_and_delivered() -> None:
    server = server_concurrency(scrape(100.0, 0.0), scrape(110.0, 20.0))
    assert server is not None
    assert server_share(server, 40.0) == pytest.approx(0.5)
    assert server_share(server, 0.0) is None
    assert delivered_concurrency(3.9, 0.5) == pytest.approx(1.95)
    assert delivered_concurrency(3.9, 1.2) == pytest.approx(3.9)  # the server never holds more
    assert delivered_concurrency(3.9, None) == pytest.approx(3.9)
    assert delivered_concurrency(None, 0.5) is None


@given(st.floats(0.0, 100.0), st.floats(0.0, 1e4), st.floats(1.0, 1e4))
def test_delivered_never_exceeds_achieved(achieved: float, server_s: float, client_s: float) -> None:
    server = server_concurrency(scrape(0.0, 0.0), scrape(10.0, server_s))
    assert server is not None
    delivered = delivered_concurrency(achieved, server_share(server, client_s))
    assert delivered is not None and 0.0 <= delivered <= achieved


def test_a_one_second_step_has_its_mean_whichever_side_of_a_second_it_ended() -> None:
    """A short check's scrapes were 0.998 s apart in one run and 1.003 s in the next: both are told."""
    for window_s in (0.998, 1.003):
        server = server_concurrency(scrape(100.0, 0.0), scrape(100.0 + window_s, 8.0))
        assert server is not None and server.in_server == pytest.approx(8.0 / window_s)
