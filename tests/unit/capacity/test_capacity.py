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


def _queue_on(num_gpu_blocks: int, prompts: np.ndarray, outputs: np.ndarray, max_num_seqs: int) -> int:
    """Every request queued at once (in a shuffled order) on the simulator's V1 scheduler, blocks of 16,
    at most ``max_num_seqs`` running: the preemptions until all finished."""
    sched = Scheduler(SchedulerConfig(num_gpu_blocks, 16, max_num_seqs, 2048, num_gpu_blocks * 16))
    for i in np.random.default_rng(1).permutation(len(prompts)):
        sched.add(SimRequest(str(i), int(prompts[i]), int(outputs[i])))
    while sched.has_work:
        sched.step()
    return sched.num_preemptions


def test_a_cap_below_the_band_expects_no_onset_only_when_the_largest_requests_fit() -> None:
    """95 % short requests and 5 % of 6,000–8,000 tokens on 823 blocks of 16: the band is 13–18, and a
    server capped at 12 was called safe ("12 fit the pool at their peak": P90-length ones do). The
    scheduler capped at 12 preempts whenever two long requests run together; one long one fits alone."""
    rng = np.random.default_rng(0)
    prompts = np.concatenate([rng.integers(100, 801, 380), rng.integers(6000, 7001, 20)])
    outputs = np.concatenate([rng.integers(50, 401, 380), rng.integers(500, 1001, 20)])
    p = predict_preemption_onset(823, 16, prompts + outputs, prompt_tokens=prompts)
    assert p.band == (13, 18) and p.largest_fit == 1
    assert p.capped_at(12) is None and _queue_on(823, prompts, outputs, 12) > 0
    assert p.capped_at(1) == 1 and _queue_on(823, prompts, outputs, 1) == 0
    # identical requests: the largest are the P90 ones, and a cap below the band holds
    fixed = predict_preemption_onset(823, 16, [200 + 3000], prompt_tokens=[200])
    assert fixed.largest_fit == fixed.band[0] - 1 and fixed.capped_at(fixed.band[0] - 1) == fixed.band[0] - 1


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=2000),
    st.integers(min_value=1, max_value=2000),
    st.integers(min_value=1, max_value=8000),
    st.integers(min_value=1, max_value=3000),
    st.integers(min_value=1, max_value=10),
    st.integers(min_value=1, max_value=40),
)
def test_wherever_a_cap_expects_no_onset_the_scheduler_preempts_none(
    short_prompt: int, short_output: int, long_prompt: int, long_output: int, long_every: int, cap: int
) -> None:
    """A two-length mix (one long request in ``long_every``) on 823 blocks of 16: where ``capped_at`` says
    the cap keeps the server from preempting, the scheduler capped there preempts nothing."""
    assume(long_prompt + long_output <= 822 * 16)
    count = 60
    is_long = np.arange(count) % long_every == 0
    prompts = np.where(is_long, long_prompt, short_prompt)
    outputs = np.where(is_long, long_output, short_output)
    p = predict_preemption_onset(823, 16, prompts + outputs, prompt_tokens=prompts)
    if p.capped_at(cap) is not None:
        assert _queue_on(823, prompts, outputs, cap) == 0
