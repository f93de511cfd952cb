"""The trace's odds (oomload.odds): the closed-loop Monte Carlo and the evidence arithmetic."""

from __future__ import annotations

import math

import pytest

from oomload.capacity import blocks_held, usable_blocks
from oomload.odds import LevelOdds, Pool, level_odds, trace_odds


def test_fixed_lengths_preempt_exactly_above_the_arithmetic_onset() -> None:
    # 100 + 155 tokens hold ceil(254 / 16) = 16 blocks; 81 blocks leave 80 usable: 5 fit, the 6th preempts
    pool = Pool(num_gpu_blocks=81, block_size=16, max_model_len=1024)
    per_request = blocks_held(255, 16)
    onset = usable_blocks(81) // per_request + 1
    assert (per_request, onset) == (16, 6)
    below = level_odds([100], [155], pool, onset - 1, requests=200)
    at = level_odds([100], [155], pool, onset, requests=200)
    assert below.preemptions == 0 and below.requests_for() is None
    assert at.preemptions > 0 and at.per_100 > 10
    needed = at.requests_for()
    assert needed is not None and needed <= 30


def test_the_odds_rise_with_concurrency_and_repeat_for_a_seed() -> None:
    prompts = [50, 400, 120, 900, 60, 300, 30, 700]
    outputs = [200, 100, 300, 150, 50, 400, 250, 100]
    pool = Pool(num_gpu_blocks=200, block_size=16, max_model_len=2048)
    odds = trace_odds(prompts, outputs, pool, [8, 2, 16], requests=400, seed=3)
    assert [o.concurrency for o in odds] == [2, 8, 16]
    assert odds[0].per_100 <= odds[1].per_100 <= odds[2].per_100
    assert odds[2].per_100 > 0
    again = trace_odds(prompts, outputs, pool, [16], requests=400, seed=3)
    assert again[0] == odds[2]


def test_prompts_over_max_model_len_are_refused_and_never_hold_blocks() -> None:
    pool = Pool(num_gpu_blocks=20, block_size=16, max_model_len=256)
    odds = level_odds([5000], [10], pool, 4, requests=50)
    assert (odds.requests, odds.preemptions) == (0, 0)


def test_evidence_arithmetic() -> None:
    odds = LevelOdds(concurrency=8, requests=1000, preemptions=80, episodes=50)
    assert odds.per_100 == pytest.approx(8.0)
    needed = odds.requests_for()
    assert needed == math.ceil(math.log(100) / 0.05) == 93
    assert odds.p_seen(needed) >= 0.99 > odds.p_seen(needed - 1)
    assert odds.p_seen(0) == 0.0
    rare = LevelOdds(concurrency=4, requests=1000, preemptions=5, episodes=5)
    assert rare.negligible and rare.requests_for() is None


def test_json_round_trip_and_malformed_lines() -> None:
    odds = LevelOdds(concurrency=8, requests=1000, preemptions=80, episodes=50)
    assert LevelOdds.from_json(odds.to_json()) == odds
    assert odds.to_json()["requests_for_evidence"] == 93
    text_level = {"concurrency": "8", "requests": 1000, "preemptions": 1, "episodes": 1}
    assert LevelOdds.from_json(text_level) is None
    assert LevelOdds.from_json({"concurrency": 8}) is None


def test_pool_from_cache_config_reads_vllm_label_strings() -> None:
    pool = Pool.from_cache_config({"num_gpu_blocks": "799", "block_size": "16"}, max_model_len=8192)
    assert pool == Pool(num_gpu_blocks=799, block_size=16, max_model_len=8192)
    assert Pool.from_cache_config({"num_gpu_blocks": "None", "block_size": "16"}) is None
    assert Pool.from_cache_config(None) is None
