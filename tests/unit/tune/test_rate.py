"""``--target-rate``: the open-loop replay's measurement turned into the target concurrency (tune.rate),
and its record in tune.json."""

from __future__ import annotations

import math

import pytest

from oomload.rundir.summary import SUMMARY_SCHEMA, Summary, summary_from_doc
from oomload.trace.model import TraceRecord
from oomload.tune.rate import (
    MIN_CALIBRATION_REQUESTS,
    RateTarget,
    arrival_scale,
    calibration_requests,
    rate_target_from_summary,
)
from oomload.tune.record import candidate_from_json, candidate_to_json
from oomload.tune.search import Candidate, Settings


def _records(arrivals: list[float]) -> list[TraceRecord]:
    return [TraceRecord(f"r{i}", a, 100, 50) for i, a in enumerate(arrivals)]


def test_the_arrival_scale_makes_the_trace_arrive_at_the_asked_rate() -> None:
    records = _records([0.0, 0.5, 1.0, 1.5, 2.0])  # 2 req/s of its own
    assert arrival_scale(records, 2.0) == pytest.approx(1.0)
    assert arrival_scale(records, 8.0) == pytest.approx(0.25)  # four times as fast: arrivals × 0.25
    assert arrival_scale(records, 0.5) == pytest.approx(4.0)
    assert arrival_scale(_records([3.0, 3.0, 3.0]), 5.0) == 1.0  # no spacing to scale


def test_the_open_loop_replay_sends_about_twenty_seconds_of_the_rate_within_the_bounds() -> None:
    assert calibration_requests(10.0, 1000, 400) == 200
    assert calibration_requests(0.1, 1000, 400) == MIN_CALIBRATION_REQUESTS
    assert calibration_requests(100.0, 1000, 400) == 400  # --max-requests
    assert calibration_requests(10.0, 30, 400) == 30  # the trace's size


def _summary(achieved: float | None, rate: float = 4.0) -> Summary:
    step = {"concurrency": 40, "warmup": False, "requests": 80, "req_per_s": rate, "preemptions": 2}
    if achieved is not None:
        step["achieved_concurrency"] = achieved
    return summary_from_doc({"schema": SUMMARY_SCHEMA, "verdict": {"steps": [step]}})


def test_littles_law_the_measured_mean_in_flight_rounds_up_to_the_target() -> None:
    rate = rate_target_from_summary(_summary(5.2), rate_rps=4.0, run_dir="r")
    assert rate is not None
    assert rate.concurrency == 6 and rate.in_flight_mean == 5.2
    assert rate.latency_s == pytest.approx(1.3)  # W = L / R
    assert (rate.requests, rate.preemptions) == (80, 2)
    assert "4 req/s → concurrency 6" in rate.sentence() and "4.00 req/s × 1.30 s" in rate.sentence()
    exact = rate_target_from_summary(_summary(3.0), rate_rps=4.0, run_dir="r")
    assert exact is not None and exact.concurrency == 3
    tiny = rate_target_from_summary(_summary(0.2), rate_rps=0.5, run_dir="r")
    assert tiny is not None and tiny.concurrency == 1


def test_nothing_measured_is_no_target() -> None:
    assert rate_target_from_summary(None, rate_rps=4.0, run_dir="r") is None
    assert rate_target_from_summary(_summary(None), rate_rps=4.0, run_dir="r") is None
    empty = summary_from_doc({"schema": SUMMARY_SCHEMA, "verdict": {"steps": []}})
    assert rate_target_from_summary(empty, rate_rps=4.0, run_dir="r") is None


def test_a_candidate_keeps_its_rate_measurement_in_tune_json() -> None:
    rate = RateTarget(4.0, 6, 5.2, 4.0, 80, 2, "candidates/01/rate/run")
    cand = Candidate(1, Settings(max_num_seqs=256), "first", started=True, rate=rate)
    obj = candidate_to_json(cand)
    assert obj["rate"]["concurrency"] == 6 and math.isclose(obj["rate"]["latency_s"], 1.3)
    assert candidate_from_json(obj).rate == rate
