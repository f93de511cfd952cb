"""Arrival statistics and the whole-trace summary (pure): properties and hand-checked values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.trace.stats import (
    burstiness,
    context_limit_shares,
    peak_rate,
    summarize_arrivals,
    summarize_trace,
)

times = st.lists(st.floats(min_value=0, max_value=10_000, allow_nan=False), min_size=1, max_size=200)


def test_peak_rate_counts_the_busiest_half_open_window() -> None:
    arrivals = [0.0, 0.2, 0.5, 0.99, 1.0, 5.0]
    assert peak_rate(arrivals, 1.0) == 4.0  # [0, 1) holds 0, 0.2, 0.5, 0.99
    assert peak_rate(arrivals, 60.0) == 6 / 60
    assert peak_rate([], 1.0) == 0.0
    with pytest.raises(ValueError):
        peak_rate(arrivals, 0)


@given(times, st.floats(min_value=0.1, max_value=100))
def test_peak_rate_bounds(values: list[float], window_s: float) -> None:
    peak = peak_rate(values, window_s)
    assert 1 / window_s <= peak <= len(values) / window_s
    assert peak == peak_rate(list(reversed(values)), window_s)
    assert peak_rate(values, window_s * 2) * 2 >= peak  # a wider window never holds fewer requests


def test_burstiness_is_zero_for_fixed_rate_and_near_one_for_poisson() -> None:
    assert burstiness(np.arange(100.0)) == 0.0
    rng = np.random.default_rng(3)
    poisson = np.cumsum(rng.exponential(1.0, 20_000))
    assert burstiness(poisson) == pytest.approx(1.0, abs=0.05)
    assert burstiness([1.0, 2.0]) is None and burstiness([3.0, 3.0, 3.0]) is None


@given(times)
def test_arrival_summary_invariants(values: list[float]) -> None:
    summary = summarize_arrivals(values)
    assert summary.count == len(values)
    assert summary.span_s == max(values) - min(values)
    if summary.mean_rps is not None:
        assert summary.mean_rps == pytest.approx((len(values) - 1) / summary.span_s)
    assert summary.peak_rps_1s >= 1.0
    assert summary.burstiness_cv is None or summary.burstiness_cv >= 0


@given(st.lists(st.integers(0, 300_000), min_size=1, max_size=200))
def test_context_limit_shares_are_monotone_and_exact(totals: list[int]) -> None:
    shares = context_limit_shares(totals)
    assert list(shares) == [4096, 8192, 16384, 32768, 131072]
    values = list(shares.values())
    assert values == sorted(values, reverse=True)
    assert shares[8192] == sum(t > 8192 for t in totals) / len(totals)


def test_summarize_trace_combines_everything() -> None:
    stats = summarize_trace(
        [0.0, 1.0, 2.0, 3.0],
        [100, 200, 5000, 9000],
        [10, 20, 30, 40],
        [True, False, True, True],
        kv_cache_tokens=100_000,
        current_max_model_len=32768,
    )
    assert stats.failed_count == 1 and stats.arrivals.mean_rps == 1.0
    assert stats.total.max == 9040 and stats.total.p50 == 220
    assert stats.above_limits[8192] == 0.25
    assert stats.advice.max_model_len == 9984  # 9040 × 1.1 = 9944 → 39 × 256
    assert stats.advice.freed_concurrency == pytest.approx(100_000 / 9984 - 100_000 / 32768)
    with pytest.raises(ValueError):
        summarize_trace([0.0], [1, 2], [1, 2])
