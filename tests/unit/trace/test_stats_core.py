from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from oomload.capacity.blocks import concurrent_fit, predict_preemption_onset
from oomload.trace.stats import percentile, recommend_max_model_len, summarize_lengths

lengths = st.lists(st.integers(min_value=0, max_value=200_000), min_size=1, max_size=300)


@given(lengths)
def test_percentiles_monotone_and_observed(values: list[int]) -> None:
    s = summarize_lengths(values)
    assert min(values) <= s.p50 <= s.p90 <= s.p95 <= s.p99 <= s.p999 <= s.max == max(values)
    assert s.p99 in values


@given(lengths, st.randoms())
def test_percentiles_permutation_invariant(values: list[int], rnd: object) -> None:
    shuffled = list(values)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert summarize_lengths(values) == summarize_lengths(shuffled)


@given(lengths)
def test_nearest_rank_covers_p_percent(values: list[int]) -> None:
    p99 = percentile(values, 99)
    assert sum(v <= p99 for v in values) >= 0.99 * len(values)


def test_equals_numpy_inverted_cdf() -> None:
    rng = np.random.default_rng(1)
    data = rng.lognormal(6, 1, 5000).astype(int)
    assert percentile(data, 99.9) == float(np.percentile(data, 99.9, method="inverted_cdf"))


@given(lengths, st.floats(min_value=0, max_value=1))
def test_recommendation_never_below_its_basis(values: list[int], margin: float) -> None:
    advice = recommend_max_model_len(values, margin=margin)
    assert advice.max_model_len >= advice.basis_tokens
    assert advice.max_model_len % 256 == 0
    assert advice.refused_share <= 0.01 + 1e-12


def test_recommendation_rounds_to_block_and_caps() -> None:
    advice = recommend_max_model_len([1000] * 100, block_size=96, model_limit=4096)
    assert advice.max_model_len == 1536  # 1100 → lcm(256, 96)=768 → 1536
    capped = recommend_max_model_len(
        [10_000] * 100, model_limit=8192, kv_cache_tokens=65536, current_max_model_len=32768
    )
    assert capped.max_model_len == 8192 and capped.capped_by_model_limit and capped.refused_share == 1.0
    assert capped.freed_concurrency == 8 - 2


def test_onset_matches_the_measured_cpu_vllm_table() -> None:
    # vllm-cpu.md §6: 96 blocks × 32 tokens, 256 + 256 tokens per request → first preemption at 6.
    prediction = predict_preemption_onset(96, 32, [512] * 10)
    assert prediction.onset_mean == prediction.onset_p50 == prediction.onset_p90 == 6
    assert concurrent_fit(96, 32, 512) == 5


def test_recommendation_keeps_a_current_setting_that_already_covers_p99() -> None:
    # Azure code trace shape: P99 7462 → 8448 would *raise* a current 8192 that fits everything.
    advice = recommend_max_model_len([7462] * 100, current_max_model_len=8192)
    assert advice.max_model_len == 8192 and advice.kept_current
    lower = recommend_max_model_len([1000] * 100, current_max_model_len=32768)
    assert lower.max_model_len == 1280 and not lower.kept_current


def test_recommendation_never_exceeds_what_the_kv_pool_holds() -> None:
    # vLLM refuses to start when one max_model_len request does not fit the KV cache.
    advice = recommend_max_model_len([100_000] * 100, kv_cache_tokens=33_392, block_size=16)
    assert advice.max_model_len == 33_392 and advice.capped_by_kv_cache
    assert advice.refused_share == 1.0


@given(lengths, st.integers(min_value=1, max_value=300_000), st.integers(min_value=1, max_value=300_000))
def test_recommendation_respects_every_limit(values: list[int], kv_tokens: int, current: int) -> None:
    advice = recommend_max_model_len(values, kv_cache_tokens=kv_tokens, current_max_model_len=current)
    assert advice.max_model_len <= kv_tokens
    if advice.kept_current:
        assert advice.max_model_len == current >= advice.basis_tokens
