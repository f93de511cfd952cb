"""``Scheduler.skip_decode``: steps that only decode, done at once, leave exactly the state ``step()``
leaves — on closed loops of mixed lengths, tight and roomy pools, with and without the prefix cache."""

from __future__ import annotations

import random
from typing import Any

import pytest

from oomload.capacity.odds import Pool, level_odds
from oomload.capacity.scheduler import Scheduler, SchedulerConfig, SimRequest


def _state(sched: Scheduler, requests: list[SimRequest]) -> tuple[Any, ...]:
    return (
        sched.free_blocks,
        sched.num_preemptions,
        [r.request_id for r in sched.running],
        [r.request_id for r in sched.waiting],
        [
            (r.num_computed_tokens, r.num_output_tokens, r.num_blocks, r.status, r.num_preemptions)
            for r in requests
        ],
        sorted(sched._cache_refs.items()),
        list(sched._evictable),
    )


def _closed_loop(seed: int, *, skip: bool, caching: bool) -> list[tuple[Any, ...]]:
    """A closed loop of c clients; the state after every step that finished or preempted a request."""
    rng = random.Random(seed)
    bs = rng.choice([4, 16])
    config = SchedulerConfig(
        num_gpu_blocks=rng.randint(20, 120),
        block_size=bs,
        max_num_seqs=rng.choice([3, 64]),
        max_num_batched_tokens=rng.choice([64, 2048]),
        max_model_len=rng.choice([200, 1000]),
        enable_prefix_caching=caching,
    )
    sched = Scheduler(config)
    clients = rng.randint(1, 10)
    shapes = [(rng.randint(1, 400), rng.randint(1, 300)) for _ in range(40)]
    requests: list[SimRequest] = []
    seen: list[tuple[Any, ...]] = []

    def send() -> None:
        if len(requests) >= 30:
            return
        p, o = shapes[rng.randrange(len(shapes))]
        fits = (config.num_gpu_blocks - 2) * bs  # every request fits the pool alone (else it waits forever)
        p = min(p, config.max_model_len - 1, fits - 1)
        o = min(o, fits - p)
        ids = None
        if caching:  # a shared head of 0..3 blocks, then the request's own tokens
            head = rng.randint(0, 3) * bs
            ids = [7] * min(head, p) + [1000 + len(requests)] * max(p - head, 0)
        req = SimRequest(str(len(requests)), p, min(o, config.max_model_len - p), prompt_ids=ids)
        requests.append(req)
        sched.add(req)

    for _ in range(clients):
        send()
    steps = 0
    while sched.has_work:
        if skip:
            steps += sched.skip_decode()
        result = sched.step()
        steps += 1
        if result.finished or result.preempted:
            seen.append((steps, _state(sched, requests)))
        for _ in result.finished:
            send()
    seen.append((steps, _state(sched, requests)))
    return seen


@pytest.mark.parametrize("caching", [False, True], ids=["distinct", "prefix-cache"])
def test_skipped_decode_steps_leave_the_state_step_leaves(caching: bool) -> None:
    skipped_any = False
    for seed in range(30):
        stepped = _closed_loop(seed, skip=False, caching=caching)
        skipped = _closed_loop(seed, skip=True, caching=caching)
        assert skipped == stepped, f"seed {seed}"
        skipped_any = skipped_any or len(stepped) > 1
    assert skipped_any


def test_a_run_of_decode_steps_is_one_call_and_stops_before_the_pool_runs_short() -> None:
    # two requests decoding on 10 usable blocks of 4: 2 + 2 blocks held, 6 free
    sched = Scheduler(SchedulerConfig(11, 4, 8, 64, 10_000))
    a, b = SimRequest("a", 8, 100), SimRequest("b", 8, 5)
    sched.add(a)
    sched.add(b)
    sched.step()  # prefill both: one token sampled each, 8 computed, 2 blocks each
    assert (a.num_computed_tokens, a.num_blocks, sched.free_blocks) == (8, 2, 6)
    # b finishes at its 5th token, 4 steps on; the 3 steps before it take 1 block each: no shortage
    assert sched.skip_decode() == 3
    assert (a.num_output_tokens, b.num_output_tokens, sched.free_blocks) == (4, 4, 4)
    assert sched.skip_decode() == 0  # the next step finishes b
    sched.step()
    assert b.finished
    # a alone, 12 tokens computed in 3 blocks: the 7 free blocks hold 28 more; the step that needs an
    # 11th block (10 usable) runs through step() and preempts a itself
    assert (a.num_computed_tokens, sched.free_blocks) == (12, 7)
    assert sched.skip_decode() == 28
    assert (a.num_computed_tokens, a.num_blocks, sched.free_blocks) == (40, 10, 0)
    assert sched.skip_decode() == 0
    assert sched.step().preempted == [a]


def test_the_odds_need_few_engine_steps_when_requests_only_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    # one client, 50 requests of 100 + 400 tokens: 20,000 decode steps one by one, ~2 calls a request now
    calls = 0
    step = Scheduler.step

    def counted(self: Scheduler, now_s: float = 0.0) -> Any:
        nonlocal calls
        calls += 1
        return step(self, now_s)

    monkeypatch.setattr(Scheduler, "step", counted)
    odds = level_odds([100], [400], Pool(num_gpu_blocks=100, block_size=16), 1, requests=50)
    assert (odds.requests, odds.preemptions) == (50, 0)
    assert calls <= 3 * 50
