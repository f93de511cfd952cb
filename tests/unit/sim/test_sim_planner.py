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
