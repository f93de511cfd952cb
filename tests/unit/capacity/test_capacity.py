"""One rule for the blocks a request holds, ``ceil((P + O − 1) / block_size)``, used by every prediction.

vLLM V1 never writes the KV of the last sampled token. Measured on the real vLLM 0.32 (reference
vllm-cpu.md, "Later observations"): 129 + 128 tokens with 12 blocks of 256 (11 usable) did not preempt
at 6, 8, 10 or 12 concurrent requests: one block each.
"""

from __future__ import annotations

import math

from hypothesis import given
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
    assert predict_preemption_onset(799, 16, [1000 + 10], prompt_tokens=[1000]).grows  # 1009: a 64th block
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
