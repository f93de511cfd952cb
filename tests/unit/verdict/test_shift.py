"""The statistics of ``oomload compare`` and the relative gate rules (``oomload.verdict.shift``)."""

from __future__ import annotations

import numpy as np
import pytest

from oomload.verdict.shift import (
    ALPHA_ONSET,
    across_levels,
    fisher_greater,
    latency_shift,
    level_shifts,
    mann_whitney_p,
    onset_cell,
    onset_shift,
)

SEEDS = range(20)


def _latencies(seed: int, n: int = 200, scale: float = 1.0) -> list[float]:
    """Per-request latencies (ms) with the spread of a loaded server: log-normal, sigma 0.4."""
    return list(np.random.default_rng(seed).lognormal(np.log(100.0), 0.4, n) * scale)


@pytest.mark.parametrize("stat", ["p50", "p99"])
def test_identical_samples_never_flag(stat: str) -> None:
    for seed in SEEDS:
        sample = _latencies(seed)
        shift = latency_shift("ttft", stat, 8, sample, list(sample))  # type: ignore[arg-type]
        assert shift.p_value == 1.0 and shift.ratio == 1.0
        assert not shift.moved and shift.judgement == "no change"


def test_two_draws_of_one_distribution_do_not_flag() -> None:
    flagged = [s for s in SEEDS if latency_shift("ttft", "p50", 8, _latencies(s), _latencies(s + 100)).moved]
    assert flagged == []


def test_a_20_percent_shift_on_200_requests_flags() -> None:
    for seed in SEEDS:
        shift = latency_shift("e2e", "p50", 8, _latencies(seed), _latencies(seed + 100, scale=1.2))
        assert shift.moved and shift.regression, shift.sentence
        assert shift.p_value is not None and shift.p_value < 0.01
        assert "slower" in shift.sentence and "Mann–Whitney U" in shift.sentence


def test_a_small_shift_is_not_a_regression_however_significant() -> None:
    """The effect floor: 5 % on 5000 requests is real (p tiny) but below 10 %."""
    shift = latency_shift("ttft", "p50", 8, _latencies(1, 5000), _latencies(2, 5000, scale=1.05))
    assert shift.p_value is not None and shift.p_value < 0.01
    assert not shift.moved and "within noise" in shift.sentence


def test_too_few_requests_are_not_tested() -> None:
    shift = latency_shift("ttft", "p99", 8, _latencies(1, 50), _latencies(2, 50, scale=2.0))
    assert shift.p_value is None and shift.judgement == "too few samples"
    assert "too few requests" in shift.sentence


def test_a_p99_shift_of_half_on_400_requests_flags_by_the_bootstrap() -> None:
    shift = latency_shift("ttft", "p99", 8, _latencies(1, 400), _latencies(2, 400, scale=1.5))
    assert shift.moved and shift.test == "bootstrap", shift.sentence


def test_mann_whitney_matches_the_normal_approximation_by_hand() -> None:
    # U = 0, mean 12.5, sd sqrt(25 * 11 / 12): z = (12.5 - 0.5) / 4.787 = 2.507, p = 0.0122
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.01219, abs=2e-4)
    assert mann_whitney_p([3.0] * 10, [3.0] * 10) == 1.0  # every value ties


def test_fisher_exact_by_hand() -> None:
    assert fisher_greater(1, 1, 0, 1) == pytest.approx(0.5)
    assert fisher_greater(3, 3, 0, 3) == pytest.approx(1 / 20)
    assert fisher_greater(0, 3, 3, 3) == pytest.approx(1.0)


def test_an_onset_decided_by_one_draw_each_is_not_separated() -> None:
    base = [(4, False), (6, False), (8, True)]
    new = [(4, False), (6, True), (8, True)]
    shift = onset_shift(base, 8, new, 6)
    assert shift.direction == "lower" and shift.separated is False and not shift.regression
    assert shift.p_value == pytest.approx(0.5)
    assert "not separated" in shift.sentence and "one draw against another" in shift.sentence


def test_an_onset_the_repeats_separate() -> None:
    base = [(8, False), (9, False), (9, False), (9, False), (10, True), (10, True), (10, True)]
    new = [(8, True), (8, True), (8, True), (9, True)]
    shift = onset_shift(base, 10, new, 8)
    assert shift.separated is True and shift.regression
    assert shift.p_value is not None and shift.p_value <= ALPHA_ONSET
    assert (shift.low_hits, shift.low_steps, shift.high_hits, shift.high_steps) == (4, 4, 0, 4)
    assert "fell from concurrency 10 to concurrency 8, separated" in shift.sentence


def test_an_onset_that_rose_or_stayed() -> None:
    assert onset_shift([(4, True)], 4, [(4, True)], 4).direction == "same"
    rose = onset_shift([(4, True)] * 3, 4, [(4, False)] * 3, None)
    assert rose.direction == "higher" and rose.separated is True and not rose.regression


def test_no_evidence_when_a_run_did_not_measure_between_the_onsets() -> None:
    shift = onset_shift([(10, True)], 10, [(4, True)], 4)  # the base never measured 4..9
    assert shift.separated is None and "no evidence either way" in shift.sentence


def test_a_latency_that_moved_both_ways_across_levels_is_noise_not_a_regression() -> None:
    """Seen on the real vLLM, one configuration run twice: P50 TPOT +21 % at 6, −12 % at 4."""
    rng = np.random.default_rng(7)
    sample = rng.normal(100.0, 5.0, 200)
    base, slow, fast = list(sample), list(sample * 1.21), list(sample * 0.88)
    slower = latency_shift("tpot", "p50", 6, base, slow)
    faster = latency_shift("tpot", "p50", 4, base, fast)
    other = latency_shift("ttft", "p50", 6, base, slow)  # another metric: its own verdict
    marked = across_levels([slower, faster, other])
    assert [s.moved for s in marked] == [True, True, True]
    assert [s.mixed for s in marked] == [True, True, False]
    assert not marked[0].regression and marked[2].regression
    assert marked[0].judgement == "moved both ways across levels"
    assert "run-to-run noise" in marked[0].sentence
    one_way = across_levels([slower, latency_shift("tpot", "p50", 4, base, base)])
    assert one_way[0].regression  # slower at 6, unchanged at 4: a regression


def test_a_large_move_beside_a_small_opposite_one_is_a_change_not_noise() -> None:
    """A review found +700 % P99 TTFT at 8 beside −15 % at 2 read as noise at both levels."""
    rng = np.random.default_rng(7)
    sample = rng.normal(100.0, 5.0, 200)
    base = list(sample)
    huge = latency_shift("ttft", "p50", 8, base, list(sample * 8.0))
    small = latency_shift("ttft", "p50", 2, base, list(sample * 0.85))
    marked = across_levels([huge, small])
    assert [s.moved for s in marked] == [True, True]
    assert [s.mixed for s in marked] == [False, True]  # the −15 % is within twice +700 %'s opposite
    assert marked[0].regression and marked[0].judgement == "slower"
    assert marked[1].judgement == "moved both ways across levels"


def test_an_onset_a_run_did_not_look_for_is_not_measured() -> None:
    """No onset is "clean" only up to the highest level judged: below the other run's onset, or with no
    level judged (no /metrics scrape), it is no rise and no fall."""
    base = [(4, False), (6, False), (8, True), (8, True)]
    cut = onset_shift(base, 8, [(2, False), (4, False)], None)
    assert cut.direction == "not measured" and cut.unmeasured == ("new",) and cut.separated is None
    assert cut.sentence.endswith(
        "the new run judged preemption only up to concurrency 4, below the base run's onset at 8 "
        "(measure higher)"
    )
    blind = onset_shift([], None, base, 8)
    assert blind.direction == "not measured" and blind.unmeasured == ("base",) and not blind.regression
    assert onset_shift([], None, [], None).unmeasured == ("base", "new")
    reached = onset_shift(base, 8, [(4, False), (8, False), (16, False)], None)
    assert reached.direction == "higher" and reached.new_top == 16
    assert [onset_cell(8, 8), onset_cell(None, 16), onset_cell(None, None)] == ["8", "none up to 16", "—"]


def test_level_shifts_test_every_statistic_at_the_levels_both_runs_measured() -> None:
    """The one computation behind compare's latency rows and the relative latency rules: by default the
    levels both runs hold samples for, each latency's P50 and P99, marked across levels."""
    base = {
        c: {"ttft": _latencies(c), "tpot": _latencies(c + 1), "e2e": _latencies(c + 2)} for c in (4, 8, 16)
    }
    new = {
        4: {**base[4], "ttft": [v * 2.0 for v in base[4]["ttft"]]},
        8: {**base[8], "ttft": [v * 0.5 for v in base[8]["ttft"]]},
        32: base[16],
    }
    shifts = level_shifts(base, new)
    assert [(s.concurrency, s.metric, s.stat) for s in shifts[:6]] == [
        (4, m, st) for m in ("ttft", "tpot", "e2e") for st in ("p50", "p99")
    ]
    assert {s.concurrency for s in shifts} == {4, 8} and len(shifts) == 12
    ttft_p50 = {s.concurrency: s for s in shifts if (s.metric, s.stat) == ("ttft", "p50")}
    assert ttft_p50[4].moved and ttft_p50[8].moved and ttft_p50[4].mixed and ttft_p50[8].mixed
    wider = level_shifts(base, new, (4, 8, 16))  # a level only one run measured: not measured
    assert [s.base_ms is not None and s.new_ms is None for s in wider if s.concurrency == 16] == [True] * 6
