"""The starved-client rule on laid-out figures: both halves needed, the worst process named."""

from __future__ import annotations

import pytest

from oomload.rundir.loadgenrecord import LoadgenRow, parse_loadgen
from oomload.verdict.loadgen import (
    LOOP_LAG_STARVED_MS,
    WAIT_SHARE_STARVED,
    Starvation,
    late_sends,
    live_held,
    starvation,
    starved_line,
    starved_process,
)


def _row(wait_share: float, lag_ms: float | None = 4.0, worker: int | None = None) -> LoadgenRow:
    return LoadgenRow(
        duration_s=2.0,
        cpu_s=0.1,
        cpu_wait_s=2.0 * wait_share,
        cpu_wait_share=wait_share,
        loop_lag_max_ms=lag_ms,
        loop_lag_p99_ms=lag_ms,
        worker=worker,
    )


def test_a_step_not_held_by_a_client_that_waited_for_a_cpu_is_starved() -> None:
    found = starvation(False, [_row(0.93, 210.0)])
    assert found == Starvation(0.93, 210.0, None)
    assert starved_line(3, found) == (
        "the load generator was starved in step 3 (waited 93 % of the step for a CPU; loop lag up to "
        "210 ms): more --processes, a separate load host, --workers, or a server here at nice -n 10"
    )


def test_a_held_step_is_never_starved_whatever_the_client_waited() -> None:
    assert starvation(True, [_row(0.93, 500.0)]) is None


def test_unknown_hold_is_not_starved() -> None:
    assert starvation(None, [_row(0.93, 500.0)]) is None


def test_a_step_not_held_by_a_client_that_had_its_cpu_is_the_servers() -> None:
    """The demo's figures (a few % of wait, a few ms of lag): not the client's doing."""
    assert starvation(False, [_row(0.043, 3.6)]) is None
    assert starvation(False, []) is None  # an old run directory: nothing measured, nothing claimed


@pytest.mark.parametrize(
    ("wait_share", "lag_ms", "starved"),
    [
        (WAIT_SHARE_STARVED, 1.0, True),
        (WAIT_SHARE_STARVED - 0.01, 1.0, False),
        (0.05, LOOP_LAG_STARVED_MS, True),
        (0.05, LOOP_LAG_STARVED_MS - 1.0, False),
        (0.05, None, False),
    ],
)
def test_either_threshold_is_enough(wait_share: float, lag_ms: float | None, starved: bool) -> None:
    assert (starvation(False, [_row(wait_share, lag_ms)]) is not None) is starved


def test_the_worker_that_waited_most_is_named() -> None:
    rows = [_row(0.1, 3.0, worker=0), _row(0.81, 150.0, worker=2), _row(0.62, 400.0, worker=1)]
    found = starved_process(rows)
    assert found == Starvation(0.81, 150.0, 2)
    assert found.text == "worker 2 waited 81 % of the step for a CPU; loop lag up to 150 ms"


def test_no_lag_measured_leaves_it_out_of_the_text() -> None:
    found = starvation(False, [_row(0.7, None)])
    assert found is not None and found.text == "waited 70 % of the step for a CPU"


@pytest.mark.parametrize(("achieved", "held"), [(7.9, True), (6.4, True), (6.3, False), (None, None)])
def test_the_live_line_reads_the_clients_own_mean(achieved: float | None, held: bool | None) -> None:
    assert live_held(8, achieved, min_share=0.8) is held


def test_end_line_entries_parse_and_bad_ones_are_dropped() -> None:
    good = {
        "duration_s": 4.0,
        "cpu_s": 0.16,
        "cpu_wait_s": 3.84,
        "cpu_wait_share": 0.96,
        "loop_lag_max_ms": 148.2,
        "loop_lag_p99_ms": None,
        "worker": 1,
    }
    rows = parse_loadgen([good, {**good, "cpu_wait_share": "0.9"}, {**good, "cpu_s": True}, "x"])
    assert rows == (LoadgenRow(4.0, 0.16, 3.84, 0.96, 148.2, None, 1),)
    assert parse_loadgen(None) == ()
    assert parse_loadgen({"cpu_s": 1}) == ()


def _open_loop_row(timed: int, late: int, busy: int, wait_share: float = 0.02) -> LoadgenRow:
    row = LoadgenRow.from_json(
        {
            "duration_s": 10.0,
            "cpu_s": 1.0,
            "cpu_wait_s": 10.0 * wait_share,
            "cpu_wait_share": wait_share,
            "loop_lag_max_ms": 4.0,
            "sends_timed": timed,
            "sends_late": late,
            "sends_late_busy": busy,
            "send_late_max_ms": 2300.0,
        }
    )
    assert row is not None
    return row


def test_an_open_loop_step_that_sent_late_is_named_held_or_not_with_the_advice_that_fits() -> None:
    busy = starvation(True, [_open_loop_row(100, 12, 10)])
    assert busy is not None and busy.late is not None
    assert busy.text.startswith("sent 12 % of its requests ≥ 100 ms after their arrival time (up to 2.3 s")
    assert "10 of 12 because every user was busy" in busy.text
    assert "higher user cap" in starved_line(4, busy)
    woke = starvation(None, [_open_loop_row(100, 12, 1, wait_share=0.7)])
    assert woke is not None and "quieter or separate load host" in starved_line(4, woke)
    assert "waited 70 % of the step for a CPU" in woke.text


def test_a_few_late_sends_or_a_closed_loop_are_not_an_open_loop_finding() -> None:
    assert starvation(True, [_open_loop_row(100, 4, 4)]) is None  # 4 %: below 5 %
    assert starvation(False, [_open_loop_row(100, 4, 4)]) is None  # the open loop's own rule decides
    assert late_sends([_open_loop_row(0, 0, 0)]) is None  # closed loop: no timed sends
