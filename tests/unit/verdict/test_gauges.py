"""Gauge findings are sustained: one momentary reading never trips queueing or KV saturation.

The case from a real run: one scrape showed ``waiting 1`` (a request that had just arrived, KV 9 %)
at concurrency 2; the verdict reported "Queueing: concurrency 2" and ``--gate no-queueing-below:4``
failed. The rule (``oomload.verdict.gauges``): at least two consecutive scrapes of the step.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.report.findings import queueing
from oomload.verdict import build_verdict
from oomload.verdict.gate import GateStatus, evaluate_gate, parse_gate
from oomload.verdict.gauges import SUSTAINED_SCRAPES, sustained_level, waiting_sustained
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run


def test_sustained_level_boundary() -> None:
    assert SUSTAINED_SCRAPES == 2
    assert sustained_level([0, 1, 0, 0]) == 0  # one reading: not sustained
    assert sustained_level([0, 1, 1, 0]) == 1  # two in a row: sustained
    assert sustained_level([0, 3, 1, 0]) == 1  # the level both reached
    assert sustained_level([1, None, 1]) == 0  # a scrape without the gauge breaks the run
    assert sustained_level([5]) == 0 and sustained_level([]) is None and sustained_level([None]) is None


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=30))
def test_sustained_never_exceeds_the_peak_and_is_seen_twice(values: list[int]) -> None:
    level = sustained_level(values)
    assert level is not None and 0 <= level <= max(values)
    if level > 0:
        assert any(min(a, b) >= level for a, b in itertools.pairwise(values))


@pytest.mark.parametrize(("peak_scrapes", "queueing_at"), [(1, None), (2, 2)])
def test_one_scrape_with_a_waiting_request_is_not_queueing(
    tmp_path: Path, peak_scrapes: int, queueing_at: int | None
) -> None:
    steps = [
        StepSpec(1, kv_max=0.05),
        StepSpec(2, kv_max=0.09, waiting_max=1, peak_scrapes=peak_scrapes),
        StepSpec(4, kv_max=0.2),
        StepSpec(8, kv_max=0.4),
    ]
    verdict = build_verdict(load_run(write_run(tmp_path / "run", steps)))
    at_two = next(s for s in verdict.steps if s.concurrency == 2)
    assert at_two.waiting_max == 1  # the peak is still reported as measured
    assert (verdict.queueing.concurrency if verdict.queueing else None) == queueing_at
    result = evaluate_gate(parse_gate("no-queueing-below:4"), verdict)
    assert result.status is (GateStatus.PASS if queueing_at is None else GateStatus.FAIL)


@pytest.mark.parametrize(("peak_scrapes", "saturated"), [(1, False), (2, True)])
def test_one_scrape_at_full_kv_is_not_saturation(tmp_path: Path, peak_scrapes: int, saturated: bool) -> None:
    steps = [StepSpec(2, kv_max=0.5), StepSpec(4, kv_max=0.995, peak_scrapes=peak_scrapes)]
    verdict = build_verdict(load_run(write_run(tmp_path / "run", steps)))
    assert (verdict.kv_saturation is not None) is saturated
    status = evaluate_gate(parse_gate("no-kv-saturation-up-to:4"), verdict).status
    assert status is (GateStatus.FAIL if saturated else GateStatus.PASS)


@pytest.mark.parametrize(
    ("queued_share", "waiting_max", "queueing_at"),
    [(0.3, 7, 8), (0.1, 7, None), (0.3, 0, None)],
    ids=["a standing queue", "under one request on average", "no scrape saw it"],
)
def test_a_queue_two_scrapes_missed_is_found_by_vllms_queue_time(
    tmp_path: Path, queued_share: float, waiting_max: int, queueing_at: int | None
) -> None:
    """A short step's scrapes read 0 then 7 waiting (not sustained) while vLLM's queue-time sum says
    requests waited throughout: at least one on average, and a scrape saw the queue, is queueing."""
    steps = [
        StepSpec(4, kv_max=0.5, server_share=1.0, requests=32),
        StepSpec(6, kv_max=0.6, server_share=1.0, requests=32),
        StepSpec(
            8,
            kv_max=0.9,
            waiting_max=waiting_max,
            peak_scrapes=1,
            server_share=1.0,
            queued_share=queued_share,
            requests=32,
        ),
    ]
    verdict = build_verdict(load_run(write_run(tmp_path / "run", steps)))
    at_eight = next(s for s in verdict.steps if s.concurrency == 8)
    assert at_eight.trusted and at_eight.waiting_sustained == 0 and at_eight.server is not None
    assert (at_eight.server.queued >= 1.0) is (queued_share == 0.3), at_eight.server.queued
    assert (verdict.queueing.concurrency if verdict.queueing else None) == queueing_at
    assert verdict.last_safe_concurrency == (6 if queueing_at else 8)
    status = evaluate_gate(parse_gate("no-queueing-below:9"), verdict).status
    assert status is (GateStatus.PASS if queueing_at is None else GateStatus.FAIL)
    if queueing_at is not None:
        mean = f"{at_eight.server.queued:.1f}"
        assert queueing(verdict).text == f"concurrency 8 ({mean} waiting on average, by vLLM's queue time)"


# the real vLLM, the first step of a ramp (6 users of 1,792-token prompts, 80 blocks of 256, a busy host):
# seconds into the 8 s step and requests waiting; 6 ran from 2.76 s on
OPENING = [(0.01, 0), (0.05, 0), (0.76, 3), (1.75, 1), (2.76, 0), (3.75, 0), (4.76, 0), (5.76, 0), (6.76, 0)]


def _sustained(readings: list[tuple[float, float | None]], duration_s: float = 8.0) -> float | None:
    return waiting_sustained([(100.0 + t, v) for t, v in readings], 100.0, duration_s)


def test_a_steps_opening_admission_is_not_queueing() -> None:
    """The opening burst of new users took two scrapes to admit: it read as "queueing at 6" and the run
    lost its last safe level 8 (the same configuration run before read 8)."""
    assert sustained_level([v for _, v in OPENING]) == 1  # what the step read before
    assert _sustained(OPENING) == 0
    # a queue that stands: it rises, it comes back later, it starts late, or it fills half the step
    assert _sustained([(0.0, 0), (0.7, 1), (1.7, 3), (2.7, 0), *OPENING[5:]]) == 1  # rises
    assert _sustained([*OPENING[:5], (3.75, 2), (4.76, 2), *OPENING[7:]]) == 2  # comes back
    assert _sustained([(0.0, 0), *[(t + 2.0, v) for t, v in OPENING[1:]]]) == 1  # starts at 2.76 s of 8
    assert _sustained([(0.0, 0), (0.7, 4), (1.7, 3), (2.7, 2), (3.7, 1), (4.7, 0), (5.7, 0)]) == 3  # half
    assert _sustained([(0.0, 0), (0.7, 3), (1.7, 1)]) == 1  # never drained within the step
    assert _sustained(OPENING, duration_s=0.0) == 1  # no duration: no opening to set apart
    assert _sustained([(0.0, None), (0.7, 3), (1.7, 1), (2.7, 0)]) == 1  # an unread gauge first
