"""KV geometry and the start-up budget against the numbers in reference vllm-facts.md §3 / vllm-cpu.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.errors import ConfigError
from oomload.sim.geometry import (
    GIB,
    EngineConfig,
    default_batch_limits,
    model_from_hf_config,
    plan_kv_cache,
    resolve_gpu,
    resolve_model,
)


def test_llama_8b_is_128_kib_per_token_and_2_mib_per_16_token_block() -> None:
    model = resolve_model("llama-3.1-8b")
    assert model.kv_bytes_per_token() == 131_072
    assert model.kv_bytes_per_token() * 16 == 2 * 1024 * 1024


def test_tiny_e2e_model_is_1_kib_per_token() -> None:
    assert resolve_model("tiny").kv_bytes_per_token() == 1024


def test_tensor_parallel_splits_kv_heads_and_replicates_below_one() -> None:
    model = resolve_model("llama-3.1-70b")  # 8 KV heads
    assert model.kv_bytes_per_token(tp=2) == model.kv_bytes_per_token() // 2
    assert model.kv_bytes_per_token(tp=16) == model.kv_bytes_per_token(tp=8)  # max(1, 8 // 16) = 1 head


def test_mla_uses_one_latent_not_divided_by_tp() -> None:
    cfg = {
        "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
        "vocab_size": 129280, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "max_position_embeddings": 163840,
        "intermediate_size": 18432, "torch_dtype": "bfloat16",
    }  # fmt: skip
    model = model_from_hf_config(cfg, name="deepseek-v3")
    assert model.is_mla
    assert model.kv_bytes_per_token() == 61 * 576 * 2
    assert model.kv_bytes_per_token(tp=8) == model.kv_bytes_per_token()


def test_sliding_window_shorter_than_context_is_refused(tmp_path: Path) -> None:
    cfg = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 1000,
           "sliding_window": 1024, "max_position_embeddings": 8192}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = resolve_model(tmp_path)
    with pytest.raises(ConfigError, match="sliding-window"):
        plan_kv_cache(model, None, EngineConfig(max_model_len=4096, num_gpu_blocks_override=100))
    layout = plan_kv_cache(model, None, EngineConfig(max_model_len=1024, num_gpu_blocks_override=100))
    assert layout.num_gpu_blocks == 100


def test_cpu_override_reproduces_the_real_servers_figures() -> None:
    # vllm-cpu.md: 96 blocks × 32 tokens, max_model_len 2048 → "3,072 tokens … 1.50x"
    layout = plan_kv_cache(
        resolve_model("tiny"),
        None,
        EngineConfig(max_model_len=2048, block_size=32, num_gpu_blocks_override=96),
    )
    assert layout.kv_cache_size_tokens == 3072
    assert layout.max_concurrency == 1.5
    assert layout.usable_blocks == 95
    # 4 MiB of KV at 128 KiB blocks → 32 blocks, 4,096 tokens, 2.00x
    layout = plan_kv_cache(
        resolve_model("tiny"),
        None,
        EngineConfig(max_model_len=2048, block_size=128, kv_cache_memory_bytes=4 << 20),
    )
    assert (layout.num_gpu_blocks, layout.kv_cache_size_tokens, layout.max_concurrency) == (32, 4096, 2.0)


def test_kv_smaller_than_one_request_gives_vllms_estimated_max_model_len() -> None:
    with pytest.raises(ConfigError) as err:
        plan_kv_cache(
            resolve_model("tiny"),
            None,
            EngineConfig(max_model_len=2048, block_size=128, kv_cache_memory_bytes=1 << 20),
        )
    text = str(err.value)
    assert text.startswith("To serve at least one request with the model's max seq len (2048)")
    assert "the estimated maximum model length is 896." in text


def test_max_concurrency_example_from_facts() -> None:
    layout = plan_kv_cache(
        resolve_model("llama-3.1-8b"), None, EngineConfig(max_model_len=8192, num_gpu_blocks_override=7063)
    )
    assert round(layout.max_concurrency, 2) == 13.79
    assert layout.kv_cache_size_tokens == 113_008


def test_budget_on_a_gpu_leaves_kv_after_weights_and_activations() -> None:
    model = resolve_model("llama-3.1-8b")
    gpu = resolve_gpu("h100")
    assert gpu is not None
    layout = plan_kv_cache(
        model, gpu, EngineConfig(max_model_len=8192, max_num_batched_tokens=8192, max_num_seqs=1024)
    )
    expected = layout.requested_bytes - layout.weights_bytes - layout.activation_peak_bytes
    expected -= layout.non_torch_bytes + layout.cuda_graph_bytes
    assert layout.available_kv_bytes == expected
    assert layout.num_gpu_blocks == expected // (131_072 * 16)
    assert 50 * GIB < layout.kv_cache_bytes < 60 * GIB
    assert layout.static_used_bytes + layout.activation_peak_bytes <= layout.requested_bytes


def test_weights_that_do_not_fit_and_no_memory_for_cache_blocks() -> None:
    with pytest.raises(ConfigError, match="Failed to load model - not enough GPU memory"):
        plan_kv_cache(resolve_model("llama-3.1-70b"), resolve_gpu("l4"), EngineConfig(max_model_len=4096))
    with pytest.raises(ConfigError, match="No available memory for the cache blocks"):
        plan_kv_cache(
            resolve_model("llama-3.1-8b"),
            resolve_gpu("l4"),
            EngineConfig(max_model_len=4096, gpu_memory_utilization=0.6),
        )


def test_presets_resolve_and_unknown_names_are_config_errors() -> None:
    assert resolve_gpu("H200") is not None
    gpu = resolve_gpu(None, 48.0)
    assert gpu is not None and gpu.memory_bytes == 48 * GIB
    with pytest.raises(ConfigError, match="unknown GPU"):
        resolve_gpu("tpu")
    with pytest.raises(ConfigError, match="unknown model"):
        resolve_model("no-such-model")
    assert default_batch_limits(resolve_gpu("h200")) == (8192, 1024)
    assert default_batch_limits(resolve_gpu("a100-80g")) == (2048, 256)


def test_block_sizes_the_cpu_backend_takes_are_accepted() -> None:
    # The real CPU vLLM served 12 blocks of 256 tokens (tests/e2e); 7 is nobody's choice.
    layout = plan_kv_cache(
        resolve_model("tiny"),
        None,
        EngineConfig(max_model_len=2048, block_size=256, num_gpu_blocks_override=12),
    )
    assert layout.num_gpu_blocks == 12 and layout.kv_cache_size_tokens == 3072
    with pytest.raises(ConfigError, match="multiple of 32"):
        plan_kv_cache(resolve_model("tiny"), None, EngineConfig(max_model_len=2048, block_size=7))


def test_other_processes_on_the_device_fail_the_start_with_vllms_free_memory_words() -> None:
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("l4")
    config = EngineConfig(max_model_len=8192, gpu_memory_utilization=0.9)
    assert plan_kv_cache(model, gpu, config).num_gpu_blocks > 0  # alone on the device it starts
    crowded = EngineConfig(max_model_len=8192, gpu_memory_utilization=0.9, other_process_bytes=4 * GIB)
    with pytest.raises(
        ConfigError, match=r"Free memory on device cuda:0 \(18.49/22.49 GiB\) on startup is less"
    ):
        plan_kv_cache(model, gpu, crowded)
    # the same neighbours leave room for a lower utilization: 22.49 - 4 = 18.49 GiB free >= 0.8 x 22.49
    lower = EngineConfig(max_model_len=8192, gpu_memory_utilization=0.8, other_process_bytes=4 * GIB)
    assert plan_kv_cache(model, gpu, lower).num_gpu_blocks > 0


def test_cuda_graph_capture_that_does_not_fit_is_a_cuda_oom_and_eager_mode_starts() -> None:
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("l4")
    big = EngineConfig(max_model_len=8192, gpu_memory_utilization=0.98, cuda_graph_capture_bytes=2 * GIB)
    with pytest.raises(ConfigError, match=r"CUDA out of memory\. Tried to allocate 2048 MiB"):
        plan_kv_cache(model, gpu, big)
    eager = EngineConfig(
        max_model_len=8192, gpu_memory_utilization=0.98, cuda_graph_capture_bytes=2 * GIB, enforce_eager=True
    )
    assert plan_kv_cache(model, gpu, eager).num_gpu_blocks > 0
