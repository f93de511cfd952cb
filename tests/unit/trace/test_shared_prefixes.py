"""Every prediction counts shared prefix blocks once (capacity.SharedPrefixes, odds with the prefix cache).

The hand case is the real vLLM CPU build's (reference prefix-caching.md): 80 blocks of 32 tokens,
600-token prompts whose first 512 tokens are identical, 100 output tokens, closed loops of L streams:
preemption began at L = 11 with the shared prefix and at L = 4 with distinct prompts.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.capacity.blocks import (
    SharedPrefixes,
    blocks_held,
    blocks_over_decode,
    predict_preemption_onset,
    shared_groups,
    usable_blocks,
)
from oomload.capacity.odds import Pool, block_token_ids, level_odds, trace_prefixes
from oomload.rundir.records import CacheConfig
from oomload.trace.model import PrefixInfo, TraceRecord
from oomload.verdict.prediction import compare_prediction

HAND = 50  # requests in the hand trace


def _hand_prefixes(block_size: int = 32) -> SharedPrefixes:
    """One 512-token trace id shared by all; the second id covers a partial block (600 − 512 tokens)."""
    return SharedPrefixes.from_chains(
        [(7, 100 + i) for i in range(HAND)], [600] * HAND, block_tokens=512, block_size=block_size
    )


def test_a_trace_id_shares_the_server_blocks_whose_last_token_it_covers() -> None:
    # 512-token ids on 32-token blocks: 16 server blocks per id; the partial second id shares nothing
    assert shared_groups((7, 9), 600, block_tokens=512, block_size=32) == ((7, 16),)
    # the last prompt token is always computed: a 512-token prompt shares at most ⌊511 / 32⌋ = 15 blocks
    assert shared_groups((7,), 512, block_tokens=512, block_size=32) == ((7, 15),)
    # 16-token ids on 32-token blocks: server block 0 needs ids 0 and 1, so it belongs to id 1
    assert shared_groups((1, 2, 3), 50, block_tokens=16, block_size=32) == ((2, 1),)
    # 48-token ids on 32-token blocks: server block 1 (tokens 32..63) straddles into id 1: it is id 1's
    assert shared_groups((1, 2), 200, block_tokens=48, block_size=32) == ((1, 1), (2, 2))
    # a partial last trace block is never shared (100 tokens: one full 64-token id)
    assert shared_groups((1, 2), 100, block_tokens=64, block_size=16) == ((1, 4),)
    assert shared_groups((), 600, block_tokens=512, block_size=32) == ()
    assert shared_groups((7,), 0, block_tokens=512, block_size=32) == ()


def test_the_arithmetic_gives_the_real_engines_onsets_for_the_hand_case() -> None:
    # alone a request holds ceil(699 / 32) = 22 blocks, 16 of them the shared prefix: 6 of its own
    assert blocks_held(700, 32) == 22 and usable_blocks(80) == 79
    production = predict_preemption_onset(80, 32, [700] * HAND, _hand_prefixes())
    worst = predict_preemption_onset(80, 32, [700] * HAND)
    # 16 + 6n ≤ 79 holds up to n = 10: the 11th preempts; distinct: 22n ≤ 79 up to 3, the 4th preempts
    assert (production.onset_mean, production.onset_p50, production.onset_p90) == (11, 11, 11)
    assert (worst.onset_mean, worst.onset_p50, worst.onset_p90) == (4, 4, 4)
    assert (production.shape, worst.shape) == ("production", "worst-case")


def test_the_band_ends_where_the_hand_cases_decode_phases_are_spread() -> None:
    """The real vLLM preempted first at 11, 12 and 14 in different runs of the hand case: 11 when the
    requests peak together, 14 when their decodes are spread (every pattern overflows there)."""
    # over its decode a request holds ceil(t / 32) blocks for t = 600..699: 9×19, 32×20, 32×21, 27×22
    held = blocks_over_decode(np.array([600]), np.array([700]), 32)
    assert held[0] == (9 * 19 + 32 * 20 + 32 * 21 + 27 * 22) / 100 == 20.77
    prompts = [600] * HAND
    production = predict_preemption_onset(80, 32, [700] * HAND, _hand_prefixes(), prompt_tokens=prompts)
    worst = predict_preemption_onset(80, 32, [700] * HAND, prompt_tokens=prompts)
    # 4.77 own blocks on average: 16 + 13 × 4.77 = 78.0 ≤ 79 blocks, 16 + 14 × 4.77 = 82.8 overflows
    assert (production.onset_mean, production.onset_spread, production.band) == (11, 14, (11, 14))
    # distinct: 3 × 20.77 = 62.3 fits and 4 × 20.77 overflows, as at the peak
    assert (worst.onset_mean, worst.onset_spread, worst.band) == (4, 4, (4, 4))
    # without the prompts the band is the peak's alone
    assert predict_preemption_onset(80, 32, [700] * HAND, _hand_prefixes()).band == (11, 11)
    # CI's real vLLM run first preempted at 14 of the sweep 10, 11, 12, 14: inside the band, not 2
    # levels from it as the in-phase onset alone would say
    observed = compare_prediction(
        CacheConfig(num_gpu_blocks=80, block_size=32),
        [700] * HAND,
        prompts=prompts,
        basis="trace",
        observed_onset=14,
        levels=(10, 11, 12, 14),
        clean_levels=(10, 11, 12),
        shape="production",
        trace_totals=[700] * HAND,
        trace_prompts=prompts,
        trace_prefixes=_hand_prefixes,
    )
    assert observed is not None and observed.levels_apart == 0 and not observed.disagrees


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=3000),
    st.integers(min_value=0, max_value=700),
    st.sampled_from([1, 16, 32, 256]),
)
def test_blocks_over_decode_is_the_mean_of_each_steps_blocks(prompt: int, output: int, bs: int) -> None:
    total = prompt + output
    steps = [blocks_held(prompt + k, bs) for k in range(1, output + 1)] or [blocks_held(total, bs)]
    got = float(blocks_over_decode(np.array([prompt]), np.array([total]), bs)[0])
    assert abs(got - sum(steps) / len(steps)) < 1e-9
    assert got <= blocks_held(total, bs)


def test_a_prefix_half_the_requests_carry_is_held_once_and_counted_by_its_odds() -> None:
    # 25 requests share id 7 (16 blocks), 25 are distinct: with n requests the prefix is held with
    # probability 1 − 0.5^n, so D(n) = 6n·½ + 22n·½ + 16·(1 − 0.5^n) = 14n + 16(1 − 0.5^n) blocks
    shared = SharedPrefixes.from_chains(
        [(7, 100 + i) if i % 2 else () for i in range(HAND)],
        [600] * HAND,
        block_tokens=512,
        block_size=32,
    )
    held = np.full(HAND, 22)
    for n in (1, 3, 5):
        expected = 14 * n + 16 * (1 - 0.5**n)
        assert abs(float(shared.effective_blocks(held, n).sum()) / HAND * n - expected) < 1e-9
    # 14·5 + 15.5 = 85.5 > 79 and 14·4 + 15 = 71 ≤ 79: onset 5 (distinct: 4)
    assert predict_preemption_onset(80, 32, [700] * HAND, shared).onset_mean == 5


chains = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=3000),  # prompt tokens
        st.integers(min_value=1, max_value=600),  # output tokens
        st.integers(min_value=0, max_value=3),  # which shared system prompt (0: none)
        st.integers(min_value=0, max_value=6),  # its length in trace blocks
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(chains, st.sampled_from([16, 32, 128]), st.sampled_from([16, 64, 512]), st.integers(20, 3000))
def test_sharing_never_makes_an_onset_earlier(
    requests: list[tuple[int, int, int, int]], block_size: int, block_tokens: int, num_gpu_blocks: int
) -> None:
    ids = [
        (*(system * 100 + k for k in range(depth)), 10_000 + i) if system else ()
        for i, (_p, _o, system, depth) in enumerate(requests)
    ]
    prompts = [p for p, _o, _s, _d in requests]
    totals = [p + o for p, o, _s, _d in requests]
    shared = SharedPrefixes.from_chains(ids, prompts, block_tokens=block_tokens, block_size=block_size)
    production = predict_preemption_onset(num_gpu_blocks, block_size, totals, shared)
    worst = predict_preemption_onset(num_gpu_blocks, block_size, totals)
    assert production.onset_mean >= worst.onset_mean
    assert production.onset_p50 >= worst.onset_p50
    assert production.onset_p90 >= worst.onset_p90
    # an onset is one more than what fits, and never beyond one request per usable block
    assert 1 <= production.onset_mean <= usable_blocks(num_gpu_blocks) + 1


@settings(max_examples=30, deadline=None)
@given(chains, st.sampled_from([16, 32]), st.integers(20, 3000))
def test_without_hash_ids_both_shapes_agree(
    requests: list[tuple[int, int, int, int]], block_size: int, num_gpu_blocks: int
) -> None:
    records = [TraceRecord(f"r{i}", 0.0, p, o) for i, (p, o, _s, _d) in enumerate(requests)]
    totals = [r.total_tokens for r in records]
    shared = trace_prefixes(records, PrefixInfo(), block_size)
    assert not shared.any
    production = predict_preemption_onset(num_gpu_blocks, block_size, totals, shared)
    worst = predict_preemption_onset(num_gpu_blocks, block_size, totals)
    assert (production.onset_mean, production.onset_p50, production.onset_p90) == (
        worst.onset_mean,
        worst.onset_p50,
        worst.onset_p90,
    )


def test_without_hash_ids_the_odds_of_both_shapes_agree() -> None:
    prompts, outputs = [50, 400, 120, 900, 60, 300], [200, 100, 300, 150, 50, 400]
    records = [TraceRecord(f"r{i}", 0.0, p, o) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]
    pool = Pool(num_gpu_blocks=120, block_size=16, max_model_len=2048)
    shared = trace_prefixes(records, PrefixInfo(block_tokens=16), 16)
    for c in (4, 8):
        production = level_odds(prompts, outputs, pool, c, requests=300, shared=shared)
        worst = level_odds(prompts, outputs, pool, c, requests=300)
        assert (production.preemptions, production.episodes) == (worst.preemptions, worst.episodes)
        assert (production.shape, worst.shape) == ("production", "worst-case")


def test_the_odds_hold_the_shared_prefix_once() -> None:
    """The hand case on the simulator's V1 scheduler with its prefix cache. Distinct prompts preempt
    from 4 on at every level; with the shared prefix the odds stay negligible through 11 and rise at
    12: one level later than the real engine's 11, because the simulator caches a block only once it
    is computed, so the requests admitted together at a level's start do not share — vLLM caches a
    block when it is allocated, so they do, and they stay in step until they overflow at 11."""
    prompts, outputs = [600] * HAND, [100] * HAND
    pool = Pool(num_gpu_blocks=80, block_size=32, max_model_len=2048, max_num_seqs=48)
    shared = _hand_prefixes()
    assert level_odds(prompts, outputs, pool, 3).preemptions == 0
    assert not level_odds(prompts, outputs, pool, 4).negligible
    assert level_odds(prompts, outputs, pool, 10, shared=shared).negligible
    assert level_odds(prompts, outputs, pool, 11, shared=shared).negligible
    twelve = level_odds(prompts, outputs, pool, 12, shared=shared)
    assert not twelve.negligible and twelve.per_100 > 5


def test_block_token_ids_carry_one_value_per_server_block() -> None:
    tokens = block_token_ids(70, 16, ((7, 2), (9, 1)), tail=3)
    assert tokens == [14] * 32 + [18] * 16 + [7] * 22  # ids doubled (even), the request's own 2·3 + 1
    other = block_token_ids(70, 16, ((7, 2),), tail=4)
    assert other[:32] == tokens[:32] and other[32:48] != tokens[32:48]
    assert block_token_ids(20, 16, ((7, 2),), tail=1) == [14] * 20  # never longer than the prompt


def test_a_trace_block_a_prompt_ends_on_is_held_once_beside_the_whole_one() -> None:
    # 512-token trace blocks on a server of 32: a 512-token prompt carries 15 of id 7's 16 server blocks
    # (its last token is computed), a 600-token prompt all 16. Held at once they are 16 blocks, not 31:
    # 15 that every request carries and one that only the longer half does, held with odds 1 − 0.5^n.
    prompts = [512 if i % 2 else 600 for i in range(HAND)]
    shared = SharedPrefixes.from_chains([(7,)] * HAND, prompts, block_tokens=512, block_size=32)
    assert set(shared.groups) == {((7, 15),), ((7, 16),)}
    held = np.array([blocks_held(p + 100, 32) for p in prompts])  # 20 and 22: own blocks 5 and 6
    for n in (1, 3, 50):
        expected = 5.5 * n + 15 + (1 - 0.5**n)
        assert abs(float(shared.effective_blocks(held, n).sum()) / HAND * n - expected) < 1e-9
    # and the same with several widths of one id and other ids beside it (48-token trace blocks, 32)
    # 96 tokens: ⌊95 / 32⌋ = 2 blocks, the second id's one; 200 and 97 tokens: 3, the second id's two
    mixed = SharedPrefixes.from_chains([(1, 2)] * 3, [96, 200, 97], block_tokens=48, block_size=32)
    assert mixed.groups == (((1, 1), (2, 1)), ((1, 1), (2, 2)), ((1, 1), (2, 2)))
    big = 10**6  # every layer held: id 1's one block and id 2's two, once
    total = float(mixed.effective_blocks(np.array([3, 7, 4]), big).sum()) / 3 * big
    own = np.maximum(np.array([3, 7, 4]) - mixed.shared_blocks, 0).mean() * big
    assert abs(total - own - 3) < 1e-6
