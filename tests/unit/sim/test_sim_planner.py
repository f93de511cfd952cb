"""The offline planner finds the arithmetic onset for fixed lengths and derives the flags to paste."""

from __future__ import annotations

from oomload.sim.build import EngineOptions, build_engine
from oomload.sim.planner import default_levels, plan


def test_fixed_lengths_onset_matches_the_formula_and_recommends_the_last_safe_level() -> None:
    opts = EngineOptions(model="tiny", num_gpu_blocks=96, block_size=32, max_model_len=2048, max_num_seqs=64)
    built = build_engine(opts)
    result = plan(built, opts, [256] * 50, [256] * 50, [1, 2, 4, 5, 6, 8], requests_per_level=30)
    assert result.onset_concurrency == 6  # floor(95 / 16) + 1
    assert result.last_safe_concurrency == 5
    assert result.recommended_max_num_seqs == 5
    assert result.arithmetic.onset_mean == 6
    assert [lv.preemptions > 0 for lv in result.levels] == [False, False, False, False, True, True]
    assert all(lv.requests_finished == 30 for lv in result.levels)
    assert "--max-num-seqs 5" in result.serve_command
    assert result.max_model_len_advice.max_model_len >= 512


def test_refused_and_clamped_requests_are_counted() -> None:
    opts = EngineOptions(model="tiny", num_gpu_blocks=64, block_size=32, max_model_len=1024)
    built = build_engine(opts)
    result = plan(built, opts, [100, 2000, 1000], [10, 10, 100], [1], requests_per_level=3)
    level = result.levels[0]
    assert (level.requests_finished, level.requests_refused, level.requests_clamped) == (2, 1, 1)


def test_oom_stops_the_sweep_and_lowers_utilization() -> None:
    opts = EngineOptions(model="llama-3.1-8b", gpu="l4", max_model_len=4096, num_gpu_blocks=3200)
    built = build_engine(opts)
    result = plan(built, opts, [3000] * 20, [10] * 20, [1, 2, 4], requests_per_level=10)
    assert result.oom_concurrency == 1 and len(result.levels) == 1
    assert result.recommended_gpu_memory_utilization < 0.92


def test_default_levels_are_powers_of_two_up_to_max_num_seqs() -> None:
    assert default_levels(48) == [1, 2, 4, 8, 16, 32]
    assert default_levels(1024)[-1] == 512


def test_advice_never_exceeds_the_pool_and_the_check_sweep_sizes_max_num_seqs() -> None:
    # 33 blocks × 32 tokens: 32 usable blocks = 1,024 tokens is the longest max_model_len vLLM starts with
    opts = EngineOptions(model="tiny", num_gpu_blocks=33, block_size=32, max_model_len=512, max_num_seqs=8)
    built = build_engine(opts)
    prompts = [300, 1900] * 50
    result = plan(built, opts, prompts, [100] * 100, [1, 2, 4], requests_per_level=20)
    adv = result.max_model_len_advice
    assert adv.capped_by_kv_cache and adv.max_model_len == 1024
    assert (result.trace_requests, result.trace_refused) == (100, 50)  # each trace request once
    assert result.levels[0].requests_issued == 20 and result.levels[0].refused_share == 0.5
    assert result.check is not None and result.check.max_model_len == 1024
    assert result.check.trace_refused == 50  # the 1,900-token prompts still do not fit
    assert f"--max-model-len 1024 --max-num-seqs {result.check.last_safe_concurrency}" in result.serve_command
    short = result.kv_shortfall
    assert short is not None
    assert short.target_max_model_len == 2304  # P99 2,000 × 1.1 rounded up to 256
    assert short.bytes_for_one == (2304 // 32 + 1) * 32 * 1024  # + the null block; 1 KiB per token
    assert short.options == []  # no GPU is modelled: nothing to scale


def test_shortfall_on_a_gpu_names_tp_and_a_bigger_gpu() -> None:
    opts = EngineOptions(model="llama-3.1-8b", gpu="l4")
    built = build_engine(opts)
    result = plan(built, opts, [100_000] * 10, [1000] * 10, [1], requests_per_level=2)
    short = result.kv_shortfall
    assert short is not None and short.target_max_model_len == 111_104
    assert short.bytes_for_one == (111_104 // 16 + 1) * 16 * 128 * 1024
    changes = [o.change.split(" (")[0] for o in short.options]
    assert changes == ["--tensor-parallel-size 2", "--gpu a100-40g"]
    assert all(o.max_concurrency >= 1 for o in short.options)
    assert result.max_model_len_advice.max_model_len == (built.layout.num_gpu_blocks - 1) * 16


def test_a_current_setting_that_covers_the_p99_is_kept_and_not_rechecked() -> None:
    opts = EngineOptions(model="tiny", num_gpu_blocks=200, block_size=32, max_model_len=2048)
    built = build_engine(opts)
    result = plan(built, opts, [1800] * 10, [100] * 10, [1, 2], requests_per_level=4)
    adv = result.max_model_len_advice
    assert adv.kept_current and adv.max_model_len == 2048
    assert result.check is None and result.kv_shortfall is None
