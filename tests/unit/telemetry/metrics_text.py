"""Builds small vLLM-shaped ``/metrics`` texts for the telemetry tests."""

from __future__ import annotations


def vllm_text(
    *,
    engines: tuple[str, ...] = ("0",),
    model: str = "m",
    kv: float | list[float] = 0.5,
    running: int = 3,
    waiting: int = 1,
    preemptions: int | list[int] = 0,
    prompt_tokens: int = 100,
    generation_tokens: int = 50,
    created: float = 1_700_000_000.0,
    legacy: bool = False,
    extra_models: tuple[str, ...] = (),
) -> str:
    """One server's text; per-engine values take lists, scalars apply to every engine."""
    kv_name = "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc"
    lines = [
        f"# TYPE {kv_name} gauge",
        "# TYPE vllm:num_requests_running gauge",
        "# TYPE vllm:num_requests_waiting gauge",
        "# TYPE vllm:num_preemptions counter",
        "# TYPE vllm:prompt_tokens counter",
        "# TYPE vllm:generation_tokens counter",
    ]
    for i, engine in enumerate(engines):
        for name in (model, *extra_models):
            labels = f'engine="{engine}",model_name="{name}"'
            kv_value = kv[i] if isinstance(kv, list) else kv
            pre = preemptions[i] if isinstance(preemptions, list) else preemptions
            lines += [
                f"{kv_name}{{{labels}}} {kv_value}",
                f"vllm:num_requests_running{{{labels}}} {running}.0",
                f"vllm:num_requests_waiting{{{labels}}} {waiting}.0",
                f"vllm:num_preemptions_total{{{labels}}} {pre}.0",
                f"vllm:num_preemptions_created{{{labels}}} {created}",
                f"vllm:prompt_tokens_total{{{labels}}} {prompt_tokens}.0",
                f"vllm:generation_tokens_total{{{labels}}} {generation_tokens}.0",
            ]
        lines.append(
            f'vllm:cache_config_info{{block_size="16",engine="{engine}",gpu_memory_utilization="0.9",'
            f'num_gpu_blocks="96",enable_prefix_caching="False",cache_dtype="auto"}} 1.0'
        )
    return "\n".join(lines) + "\n"
