"""A last-safe gate rule fails only on a level that broke, never on levels the run did not judge.

Found by a new user: a replay stopped with Ctrl-C in its third step (2 and 4 clean, 8 cut short) failed
``last-safe>=baseline-1`` against a baseline whose last safe level was 6 ("last safe concurrency 4
against the baseline's 6, not >= 5", exit 1) while ``onset>=baseline`` on the same pair read "not
evaluated: measure higher levels". The run showed 4 safe and nothing broken: its true last safe level is
4 or more, so the gate lacks evidence (exit 4), it has no regression (exit 1). Each assertion below
failed before ``oomload.verdict.lastsafe``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import GateStatus, evaluate_gate, parse_gate
from oomload.verdict.gateresult import Op
from oomload.verdict.lastsafe import LastSafeRange, judge
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run

POOL = {"num_gpu_blocks": 1000, "block_size": 16}
PASS, FAIL, NOT_EVALUATED = GateStatus.PASS, GateStatus.FAIL, GateStatus.NOT_EVALUATED


def _step(concurrency: int, **kwargs: object) -> StepSpec:
    return StepSpec(concurrency, requests=4 * concurrency, **kwargs)  # type: ignore[arg-type]


def _verdict(path: Path, steps: list[StepSpec]) -> Verdict:
    return build_verdict(load_run(write_run(path, steps, cache_config=POOL)))


def _gate(rule: str, verdict: Verdict, baseline: Verdict | None = None) -> tuple[GateStatus, str]:
    result = evaluate_gate(parse_gate(rule), verdict, baseline)
    return result.status, result.reason


@pytest.fixture
def baseline(tmp_path: Path) -> Verdict:
    """Refined: 6 clean, 7 preempted: its last safe level is exactly 6."""
    steps = [_step(2), _step(4), _step(8, preemptions=5), _step(6), _step(7, preemptions=3)]
    return _verdict(tmp_path / "base", steps)


def test_a_run_stopped_before_any_level_broke_lacks_evidence(tmp_path: Path, baseline: Verdict) -> None:
    cut = StepSpec(8, cut_short=True, requests=5, end_reason="interrupted")  # Ctrl-C in its third step
    stopped = _verdict(tmp_path / "new", [_step(2), _step(4), cut])
    assert stopped.last_safe_concurrency == 4 and stopped.run.cut_short
    assert LastSafeRange.of(stopped) == LastSafeRange(4, None)
    status, reason = _gate("last-safe>=baseline-1", stopped, baseline)
    assert status is NOT_EVALUATED
    assert reason == (
        "last safe concurrency 4, and no level above it broke or queued (none judged there) against the "
        "baseline's 6: judge the levels that could meet >= 5"
    )
    assert _gate("last-safe-concurrency>=6", stopped)[0] is NOT_EVALUATED
    assert _gate("last-safe-concurrency>=4", stopped)[0] is PASS
    assert _gate("last-safe>=baseline-2", stopped, baseline)[0] is PASS  # 4 proven, the bound 4


def test_a_run_that_broke_below_the_bound_fails(tmp_path: Path, baseline: Verdict) -> None:
    broke = _verdict(tmp_path / "new", [_step(2), _step(4), _step(5, preemptions=2)])
    assert LastSafeRange.of(broke) == LastSafeRange(4, 4)
    status, reason = _gate("last-safe>=baseline-1", broke, baseline)
    assert status is FAIL and reason == "last safe concurrency 4 against the baseline's 6, not >= 5"
    status, reason = _gate("last-safe-concurrency>=6", broke)
    assert status is FAIL and reason == "last-safe-concurrency = 4, not >= 6"


def test_a_gap_never_measured_between_safe_and_queueing_is_not_judged(tmp_path: Path) -> None:
    """2, 4 clean and 8 queued, 5–7 never run: the true last safe level is 4 to 7."""
    v = _verdict(tmp_path / "r", [_step(2), _step(4), _step(8, waiting_max=3)])
    assert v.last_safe_concurrency == 4 and v.queueing is not None and v.queueing.concurrency == 8
    assert LastSafeRange.of(v) == LastSafeRange(4, 7)
    status, reason = _gate("last-safe-concurrency>=6", v)
    assert status is NOT_EVALUATED
    assert reason.startswith("last-safe-concurrency = 4, but 5–7 not judged (8 broke or queued)")
    assert _gate("last-safe-concurrency>=8", v)[0] is FAIL


def test_two_runs_clean_to_the_same_top_pass_and_a_run_broken_at_its_lowest_fails(tmp_path: Path) -> None:
    clean = _verdict(tmp_path / "a", [_step(c) for c in (2, 4, 8)])
    again = _verdict(tmp_path / "b", [_step(c) for c in (2, 4, 8)])
    assert _gate("last-safe>=baseline", again, clean)[0] is PASS
    broke = _verdict(tmp_path / "c", [_step(4, preemptions=9), _step(8, preemptions=9)])
    assert LastSafeRange.of(broke) == LastSafeRange(0, 3)
    status, reason = _gate("last-safe>=baseline-1", broke, clean)
    assert status is FAIL and reason.startswith("last safe concurrency none (4 broke or queued)")
    status, reason = _gate("last-safe>=baseline", clean, broke)  # a baseline that proved nothing
    assert status is NOT_EVALUATED and "the baseline has no last safe concurrency" in reason


@pytest.mark.parametrize(
    ("value", "op", "bound", "status"),
    [
        (LastSafeRange(4, None), ">=", 4, PASS),
        (LastSafeRange(4, None), ">", 4, NOT_EVALUATED),
        (LastSafeRange(4, 7), ">=", 8, FAIL),
        (LastSafeRange(4, 7), ">=", 7, NOT_EVALUATED),
        (LastSafeRange(4, 7), "<=", 7, PASS),
        (LastSafeRange(4, 7), "<=", 3, FAIL),
        (LastSafeRange(4, None), "<=", 16, NOT_EVALUATED),
        (LastSafeRange(6, 6), "==", 6, PASS),
        (LastSafeRange(4, 7), "==", 6, NOT_EVALUATED),
        (LastSafeRange(4, 7), "==", 9, FAIL),
        (LastSafeRange(0, None), ">=", 1, NOT_EVALUATED),
    ],
)
def test_a_rule_holds_for_every_value_the_range_allows_or_for_none(
    value: LastSafeRange, op: Op, bound: float, status: GateStatus
) -> None:
    assert judge(value, op, bound) is status
