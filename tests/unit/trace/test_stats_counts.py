"""Counts per length and streamed arrivals give the numbers numpy gives on the whole arrays.

``trace stats`` keeps constant memory by summarizing counts per length (``LengthCounts``) and
arrival times batch by batch (``ArrivalCounter``); these property tests hold both to the
array definitions: nearest rank is numpy's ``inverted_cdf``, value for value.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.trace.stats import (
    DENSE_LENGTHS,
    PERCENTILES,
    ArrivalCounter,
    LengthCounts,
    nearest_rank_index,
    recommend_max_model_len,
    summarize_arrivals,
    summarize_counts,
    summarize_lengths,
)

lengths = st.lists(
    st.one_of(
        st.integers(0, 300), st.integers(0, 200_000), st.integers(DENSE_LENGTHS - 2, DENSE_LENGTHS + 2)
    ),
    min_size=1,
    max_size=400,
)
percent = st.one_of(
    st.sampled_from([0.0, 0.1, 1.0, 50.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0]),
    st.floats(0, 100, allow_nan=False),
)


@settings(max_examples=300, deadline=None)
@given(values=lengths, p=percent, splits=st.lists(st.integers(0, 400), max_size=4))
def test_counts_give_numpys_nearest_rank(values: list[int], p: float, splits: list[int]) -> None:
    counts = LengthCounts()
    for part in np.split(np.array(values, dtype=np.int64), sorted(s % (len(values) + 1) for s in splits)):
        counts.add(part)
    expected = float(np.percentile(np.array(values), p, method="inverted_cdf"))
    assert counts.percentiles([p]) == [expected]


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 10**9), p=percent)
def test_rank_index_is_numpys(count: int, p: float) -> None:
    if count <= 5000:
        assert nearest_rank_index(count, p) == int(np.percentile(np.arange(count), p, method="inverted_cdf"))
    assert 0 <= nearest_rank_index(count, p) < count


@settings(max_examples=150, deadline=None)
@given(values=lengths, halves=st.integers(0, 400))
def test_summary_and_advice_from_counts_match_the_arrays(values: list[int], halves: int) -> None:
    arr = np.array(values, dtype=np.int64)
    left, right = (
        LengthCounts.of(arr[: halves % (len(values) + 1)]),
        LengthCounts.of(arr[halves % (len(values) + 1) :]),
    )
    left.merge(right)
    assert summarize_counts(left) == summarize_lengths(arr)
    assert left.count_above(4096) == int(np.count_nonzero(arr > 4096))
    from_counts = recommend_max_model_len(left, kv_cache_tokens=50_000, block_size=16)
    basis = float(np.percentile(arr, 99.0, method="inverted_cdf"))
    assert from_counts.basis_tokens == basis
    assert from_counts.refused_count == int(np.count_nonzero(arr > from_counts.max_model_len))


def test_counts_memory_is_bounded_by_the_lengths_not_the_requests() -> None:
    counts = LengthCounts()
    for _ in range(50):
        counts.add(np.random.default_rng(0).integers(0, 32_768, 100_000))
    values, per_value = counts.distinct()
    assert counts.count == 5_000_000 and int(per_value.sum()) == 5_000_000
    assert values.size <= 32_768


times = st.lists(st.floats(0, 500, allow_nan=False), min_size=1, max_size=300).map(sorted)


@settings(max_examples=200, deadline=None)
@given(arrivals=times, splits=st.lists(st.integers(0, 300), max_size=5))
def test_streamed_arrivals_match_the_array(arrivals: list[float], splits: list[int]) -> None:
    counter = ArrivalCounter()
    for part in np.split(np.array(arrivals), sorted(s % (len(arrivals) + 1) for s in splits)):
        assert counter.add(part)
    streamed, whole = counter.result(), summarize_arrivals(arrivals)
    assert (streamed.count, streamed.span_s, streamed.mean_rps) == (whole.count, whole.span_s, whole.mean_rps)
    assert (streamed.peak_rps_1s, streamed.peak_rps_60s) == (whole.peak_rps_1s, whole.peak_rps_60s)
    if whole.burstiness_cv is None:
        assert streamed.burstiness_cv is None
    else:
        assert streamed.burstiness_cv == pytest.approx(whole.burstiness_cv, rel=1e-9, abs=1e-12)


def test_arrivals_out_of_order_are_refused() -> None:
    counter = ArrivalCounter()
    assert counter.add([1.0, 2.0])
    assert not counter.add([1.5])
    with pytest.raises(ValueError, match="backwards"):
        counter.result()


def test_percentile_list_is_the_documented_one() -> None:
    assert PERCENTILES == (50.0, 90.0, 95.0, 99.0, 99.9)
