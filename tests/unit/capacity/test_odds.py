"""The trace's odds (oomload.capacity.odds): the closed-loop Monte Carlo and the evidence arithmetic."""

from __future__ import annotations

import math

import pytest

from oomload.capacity.blocks import blocks_held, usable_blocks
from oomload.capacity.odds import LevelOdds, Pool, level_odds, predicted_onset, requests_at, trace_odds


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


def test_without_max_model_len_a_request_longer_than_the_pool_is_cut_to_it_and_ends() -> None:
    """60 blocks (59 usable, 944 tokens): a server of this pool cannot start with a longer max_model_len,
    so a 900 + 60 request is cut to 944 tokens and runs alone, where it was readmitted for ever."""
    pool = Pool(num_gpu_blocks=60, block_size=16)
    odds = level_odds([900], [60], pool, 1, requests=3)
    assert (odds.requests, odds.preemptions) == (3, 0)
    assert level_odds([944], [1], pool, 1, requests=3).requests == 0  # refused, as max_model_len would
    assert odds == level_odds([900], [60], Pool(60, 16, max_model_len=944), 1, requests=3)


def test_evidence_arithmetic() -> None:
    odds = LevelOdds(concurrency=8, requests=1000, preemptions=80, episodes=50)
    assert odds.per_100 == pytest.approx(8.0)
    needed = odds.requests_for()
    assert needed == math.ceil(math.log(100) / 0.05) == 93
    assert odds.p_seen(needed) >= 0.99 > odds.p_seen(needed - 1)
    assert odds.p_seen(0) == 0.0
    rare = LevelOdds(concurrency=4, requests=1000, preemptions=5, episodes=5)
    assert rare.negligible and rare.requests_for() is None


def test_a_level_is_negligible_by_its_preemptions_not_its_bursts() -> None:
    # short requests admitted together preempt once a round: 9 bursts of 240 preemptions in 1,000 requests
    clumped = LevelOdds(concurrency=128, requests=1000, preemptions=240, episodes=9)
    assert not clumped.negligible
    assert clumped.requests_for() == math.ceil(math.log(100) / 0.009) == 512
    assert LevelOdds(concurrency=4, requests=1000, preemptions=9, episodes=1).negligible
    assert not LevelOdds(concurrency=4, requests=1000, preemptions=10, episodes=1).negligible
    assert LevelOdds(concurrency=4, requests=0, preemptions=0, episodes=0).negligible


def test_short_requests_admitted_together_preempt_above_the_pool() -> None:
    # 10 + 20 tokens hold 2 blocks of 16: 200 usable blocks carry 100 requests, and 128 thrash in rounds
    pool = Pool(num_gpu_blocks=201, block_size=16, max_num_seqs=256)
    assert level_odds([10], [20], pool, 100).preemptions == 0
    odds = level_odds([10], [20], pool, 128)
    assert odds.per_100 > 10 and odds.episodes < odds.requests // 100
    assert not odds.negligible
    # at 101 the one request over the pool preempts once a round: 9 in 1,000 requests, under 1 per 100
    assert predicted_onset([64, 128], lambda c: level_odds([10], [20], pool, c)) == 102


def test_a_level_above_the_default_requests_still_refills_its_clients() -> None:
    # 1,200 clients of 2 blocks on 2,200 usable: 1,000 requests would never fill the loop (0 preemptions)
    pool = Pool(num_gpu_blocks=2201, block_size=16, max_num_seqs=4096)
    assert requests_at(250) == 1000 and requests_at(1200) == 4800
    odds = level_odds([10], [20], pool, 1200)
    assert odds.requests == 4800 and odds.preemptions > 0 and not odds.negligible
    assert level_odds([10], [20], pool, 1200, requests=1000).preemptions == 0


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


def _odds_rising_from(onset: int, asked: list[int]) -> object:
    """Odds that call every level below ``onset`` safe (no episode) and rise from it; records each ask."""

    def odds_at(c: int) -> LevelOdds:
        asked.append(c)
        return (
            LevelOdds(c, 1000, 30 * (c - onset + 1), 20 * (c - onset + 1))
            if c >= onset
            else LevelOdds(c, 1000, 0, 0)
        )

    return odds_at


@pytest.mark.parametrize("onset", [3, 5, 6, 7, 8, 9, 12, 16])
def test_the_predicted_onset_is_the_lowest_level_the_odds_do_not_call_safe(onset: int) -> None:
    asked: list[int] = []
    assert predicted_onset((1, 2, 4, 8, 16), _odds_rising_from(onset, asked)) == onset  # type: ignore[arg-type]
    # the ramp's levels up to the first unsafe one, then a bisection of the gap below it: few asks
    assert len(set(asked)) <= 5 + 3 and max(asked) <= 16


def test_the_predicted_onset_stays_within_the_levels() -> None:
    asked: list[int] = []
    assert predicted_onset((4, 8, 16), _odds_rising_from(2, asked)) == 4  # type: ignore[arg-type]
    assert min(asked) == 4  # nothing below the lowest level is asked
    assert predicted_onset((1, 2, 4), _odds_rising_from(9, [])) is None  # type: ignore[arg-type]


def test_the_predicted_onset_on_mixed_lengths_is_where_the_odds_first_ask_for_evidence() -> None:
    """On a real trace's lengths the search lands on the lowest level whose ``requests_for`` is not
    ``None`` among every integer level, computed one by one."""
    lengths = [(40 + 97 * k % 600, 5 + 31 * k % 60) for k in range(200)]
    prompts, outputs = [p for p, _ in lengths], [o for _, o in lengths]
    pool = Pool(num_gpu_blocks=160, block_size=16, max_model_len=1024)
    cache: dict[int, LevelOdds] = {}

    def odds_at(c: int) -> LevelOdds:
        if c not in cache:
            cache[c] = level_odds(prompts, outputs, pool, c, requests=400)
        return cache[c]

    onset = predicted_onset((1, 2, 4, 8, 12), odds_at)
    every = [c for c in range(1, 13) if odds_at(c).requests_for() is not None]
    assert onset == min(every) == 6  # 4 is safe, 8 is not, 6 is the first between them
