"""KV-cache geometry and the vLLM start-up memory budget (pure).

Bytes of KV cache per token for a standard decoder with full attention (grouped-query or not)::

    kv_bytes_per_token = 2 (K and V) × layers × max(1, kv_heads // tp) × head_dim × dtype_bytes

(vLLM ``kv_cache_interface.py``; KV heads are replicated when ``kv_heads < tp``). A block holds
``block_size`` tokens of every layer, so ``block_bytes = kv_bytes_per_token × block_size``.

MLA models (DeepSeek V2/V3: ``kv_lora_rank`` in the config) store one latent of
``kv_lora_rank + qk_rope_head_dim`` values per layer and token, not divided by tensor parallelism:
``layers × (kv_lora_rank + qk_rope_head_dim) × dtype_bytes``. Sliding-window models whose window is
shorter than ``max_model_len`` would need vLLM's hybrid allocator (a window-capped footprint per
layer group); that is not modelled and is refused with a ``ConfigError`` unless the window covers the
whole context (then the layers behave as full attention).

The memory budget follows vLLM V1's profiling (reference ``vllm-facts.md`` §3.1)::

    requested  = total_gpu_bytes × gpu_memory_utilization
    non_kv     = weights/tp + activation_peak(max_num_batched_tokens, max_num_seqs)
                 + non_torch (CUDA context, NCCL) + cuda_graph_reserve
    available  = requested − non_kv                (or --kv-cache-memory-bytes, profiling skipped)
    num_gpu_blocks = available // block_bytes      (or --num-gpu-blocks-override)

The activation peak is an estimate of what the profile run allocates for
``max_num_batched_tokens`` tokens: ``tokens × (12·hidden + 6·intermediate) × dtype_bytes / tp``
(hidden states, attention and MLP intermediates) plus fp32 logits for
``min(max_num_seqs, max_num_batched_tokens) × vocab`` rows twice (logits and sampler).
Start-up refusals reproduce vLLM's messages: weights that do not fit, "No available memory for the
cache blocks", and a pool that cannot hold one ``max_model_len`` request (with the "estimated maximum
model length", ``(num_gpu_blocks − 1) × block_size`` after the null block, as the real server prints).

Memory held by other processes on the device (``other_process_bytes``, the simulator's
``--other-process-gib``) enters twice, as on a real GPU: vLLM V1 first refuses to start when the free
memory is below what it is asked to take ("Free memory on device cuda:0 (free/total GiB) on startup is
less than desired GPU memory utilization (util, requested GiB)…", checked before anything is loaded);
and CUDA-graph capture, which runs after the KV pool is allocated, needs ``cuda_graph_bytes`` of what is
then really free on the device::

    free_at_capture = total − other − (weights + non_torch + kv_pool)

(the profile run's activations are back in PyTorch's cache by then, so they count as free). A capture
that needs more (``--cuda-graph-gib`` above the reserve, other processes that grew) fails with PyTorch's
"CUDA out of memory. Tried to allocate …" as the real start-up does; ``--enforce-eager`` skips it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from oomload.capacity.blocks import blocks_for_tokens, usable_blocks
from oomload.errors import ConfigError

GIB = 1024**3
MIB = 1024**2
NON_TORCH_BYTES = int(0.4 * GIB)
NCCL_BYTES_PER_EXTRA_RANK = int(0.25 * GIB)
CUDA_GRAPH_BYTES = int(0.5 * GIB)
DOCS_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
# vLLM 0.10.2 CacheConfig's choices (reference vllm-facts.md §3.3); CUDA backends take ≤ 32 except some.
ALLOWED_BLOCK_SIZES: tuple[int, ...] = (1, 8, 16, 32, 64, 128)
# vLLM's CPU attention backend takes any multiple of 32, 256 included (the real CPU vLLM 0.32 served
# 12 blocks of 256 in the end-to-end tests; reference vllm-cpu.md "later observations").
CPU_BLOCK_MULTIPLE = 32
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "float8": 1}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The parts of a Hugging Face config that decide KV size, weight size and step cost."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    num_params: int
    dtype_bytes: int = 2
    kv_lora_rank: int | None = None  # MLA latent width (DeepSeek); None for standard attention
    qk_rope_head_dim: int = 0
    sliding_window: int | None = None
    num_experts: int = 1  # MoE experts per layer (weights); compute uses active params
    num_active_params: int | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: int | None = None) -> int:
        """KV bytes one token occupies on one GPU, summed over layers."""
        dtype = kv_dtype_bytes or self.dtype_bytes
        if self.kv_lora_rank is not None:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * dtype
        kv_heads = max(1, self.num_kv_heads // max(tp, 1))
        return 2 * self.num_layers * kv_heads * self.head_dim * dtype

    def weights_bytes(self, tp: int = 1) -> int:
        """Weight bytes held by one GPU (weights split evenly over tensor-parallel ranks)."""
        return self.num_params * self.dtype_bytes // max(tp, 1)

    @property
    def active_params(self) -> int:
        return self.num_active_params or self.num_params


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """A GPU's memory (bytes, as NVML reports it), HBM bandwidth and dense bf16 throughput."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    bf16_flops: float


def _model(name: str, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, **kw)


MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama-3.1-8b": _model(
        "meta-llama/Llama-3.1-8B-Instruct",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
        num_params=8_030_261_248,
    ),
    "llama-3.1-70b": _model(
        "meta-llama/Llama-3.1-70B-Instruct",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        max_position_embeddings=131072,
        num_params=70_553_706_496,
    ),
    "qwen2.5-7b": _model(
        "Qwen/Qwen2.5-7B-Instruct",
        num_layers=28,
        hidden_size=3584,
        num_attention_heads=28,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=18944,
        vocab_size=152064,
        max_position_embeddings=32768,
        num_params=7_615_616_512,
    ),
    "qwen2.5-72b": _model(
        "Qwen/Qwen2.5-72B-Instruct",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=29568,
        vocab_size=152064,
        max_position_embeddings=32768,
        num_params=72_706_203_648,
    ),
    "mistral-7b": _model(
        "mistralai/Mistral-7B-Instruct-v0.3",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32768,
        max_position_embeddings=32768,
        num_params=7_248_023_552,
    ),
    # The tiny random-weight Llama the end-to-end tests build (reference vllm-cpu.md §2): 1 KiB/token.
    "tiny": _model(
        "tiny-model",
        num_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        num_kv_heads=4,
        head_dim=32,
        intermediate_size=256,
        vocab_size=2048,
        max_position_embeddings=4096,
        num_params=590_080,
    ),
}

GPU_PRESETS: dict[str, GpuSpec] = {
    "a10g": GpuSpec("NVIDIA A10G", 23028 * MIB, 600e9, 70e12),
    "l4": GpuSpec("NVIDIA L4", 23034 * MIB, 300e9, 121e12),
    "a100-40g": GpuSpec("NVIDIA A100-SXM4-40GB", 40960 * MIB, 1555e9, 312e12),
    "a100-80g": GpuSpec("NVIDIA A100-SXM4-80GB", 81920 * MIB, 2039e9, 312e12),
    "h100": GpuSpec("NVIDIA H100 80GB HBM3", 81559 * MIB, 3350e9, 989e12),
    "h200": GpuSpec("NVIDIA H200", 143771 * MIB, 4800e9, 989e12),
}
GPU_ALIASES = {"a100": "a100-80g", "h100-80g": "h100", "h200-141g": "h200", "a10": "a10g", "l4-24g": "l4"}
MODEL_ALIASES = {"tiny-model": "tiny", "llama-8b": "llama-3.1-8b", "llama-70b": "llama-3.1-70b"}


def resolve_model(name_or_path: str | Path) -> ModelSpec:
    """A preset by name (case-insensitive) or a Hugging Face ``config.json`` (file or its folder)."""
    key = str(name_or_path).lower()
    key = MODEL_ALIASES.get(key, key)
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        known = ", ".join(sorted(MODEL_PRESETS))
        raise ConfigError(
            f"unknown model {str(name_or_path)!r}: give a preset ({known}) or a config.json path"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read model config {path}: {err}") from err
    if not isinstance(config, dict):
        raise ConfigError(f"model config {path} is not a JSON object")
    return model_from_hf_config(config, name=str(path.parent.name or path))


def model_from_hf_config(config: dict[str, Any], *, name: str = "model") -> ModelSpec:
    """Build a ``ModelSpec`` from a Hugging Face ``config.json`` dict (text config of multimodal ones)."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(cfg, dict)

    def need(*keys: str) -> int:
        for key in keys:
            value = cfg.get(key)
            if isinstance(value, int) and value > 0:
                return value
        raise ConfigError(f"model config {name!r} lacks a positive integer {' / '.join(keys)}")

    layers = need("num_hidden_layers", "n_layer", "num_layers")
    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter = int(cfg.get("intermediate_size") or cfg.get("moe_intermediate_size") or 4 * hidden)
    vocab = need("vocab_size")
    max_pos = int(cfg.get("max_position_embeddings") or cfg.get("n_positions") or 4096)
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    dtype = DTYPE_BYTES.get(dtype_name.replace("torch.", ""), 2)
    kv_lora = cfg.get("kv_lora_rank")
    rope_dim = int(cfg.get("qk_rope_head_dim") or 0)
    experts = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 1)
    active = int(cfg.get("num_experts_per_tok") or 1)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    attn = layers * (hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2)
    mlp_one = 3 * hidden * inter
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    params = attn + layers * mlp_one * experts + embed
    active_params = attn + layers * mlp_one * min(active, experts) + embed
    return ModelSpec(
        name=str(cfg.get("_name_or_path") or name),
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        num_params=params,
        dtype_bytes=dtype,
        kv_lora_rank=int(kv_lora) if isinstance(kv_lora, int) else None,
        qk_rope_head_dim=rope_dim,
        sliding_window=int(window) if isinstance(window, int) and window > 0 else None,
        num_experts=experts,
        num_active_params=active_params if experts > 1 else None,
    )


def resolve_gpu(name: str | None, memory_gib: float | None = None) -> GpuSpec | None:
    """A GPU preset (``h100``, ``a100-40g``…), optionally resized; any size alone gives a custom GPU."""
    spec: GpuSpec | None = None
    if name is not None:
        key = name.lower()
        key = GPU_ALIASES.get(key, key)
        if key not in GPU_PRESETS:
            known = ", ".join(sorted(GPU_PRESETS))
            raise ConfigError(f"unknown GPU {name!r}: give a preset ({known}) or --gpu-memory-gib")
        spec = GPU_PRESETS[key]
    if memory_gib is not None:
        if not memory_gib > 0:
            raise ConfigError(f"--gpu-memory-gib must be positive, got {memory_gib}")
        base = spec or GPU_PRESETS["h100"]
        label = spec.name if spec else f"GPU {memory_gib:g} GiB"
        spec = replace(base, name=label, memory_bytes=int(memory_gib * GIB))
    return spec


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The vLLM serve flags that decide memory: everything ``plan_kv_cache`` needs."""

    max_model_len: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    gpu_memory_utilization: float = 0.92
    tensor_parallel_size: int = 1
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_dtype_bytes: int | None = None
    enforce_eager: bool = False
    other_process_bytes: int = 0  # device memory other processes hold at start-up (module docstring)
    cuda_graph_capture_bytes: int | None = None  # what graph capture really takes; None: the reserve


@dataclass(frozen=True, slots=True)
class KvCacheLayout:
    """The result of start-up: the block pool vLLM would allocate, and where the memory went."""

    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    kv_bytes_per_token: int
    block_bytes: int
    kv_cache_bytes: int  # bytes of the allocated pool (num_gpu_blocks × block_bytes)
    available_kv_bytes: int  # what the budget left for KV (≥ kv_cache_bytes unless overridden)
    weights_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    requested_bytes: int  # total × utilization (0 when no GPU is modelled)
    gpu_total_bytes: int  # 0 when no GPU is modelled
    overridden: bool  # num_gpu_blocks or KV bytes came from a flag, not from profiling

    @property
    def kv_cache_size_tokens(self) -> int:
        """vLLM's "KV cache size: N tokens" (``num_gpu_blocks × block_size``)."""
        return self.num_gpu_blocks * self.block_size

    @property
    def usable_blocks(self) -> int:
        return usable_blocks(self.num_gpu_blocks)

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency for max_model_len tokens per request: X x"."""
        return self.num_gpu_blocks / max(blocks_for_tokens(self.max_model_len, self.block_size), 1)

    @property
    def static_used_bytes(self) -> int:
        """GPU bytes held from start-up on: weights, non-torch, CUDA graphs and the KV pool."""
        return self.weights_bytes + self.non_torch_bytes + self.cuda_graph_bytes + self.kv_cache_bytes

    def startup_lines(self) -> list[str]:
        """The log lines vLLM prints about the pool (0.33 wording)."""
        avail = format_gib(self.available_kv_bytes)
        return [
            f"Available KV cache memory: {avail} GiB",
            f"GPU KV cache size: {self.kv_cache_size_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
        ]


def format_gib(num_bytes: float) -> str:
    """GiB the way vLLM's ``format_gib`` renders it (two decimals, trailing zeros trimmed)."""
    return str(round(num_bytes / GIB, 2))


def activation_peak_bytes(model: ModelSpec, config: EngineConfig) -> int:
    """Estimated peak activation bytes of vLLM's profile run (see the module docstring)."""
    return step_activation_bytes(
        model,
        config.max_num_batched_tokens,
        min(config.max_num_seqs, config.max_num_batched_tokens),
        config.tensor_parallel_size,
    )


def step_activation_bytes(model: ModelSpec, batched_tokens: int, num_seqs: int, tp: int = 1) -> int:
    """Activation bytes of one forward pass over ``batched_tokens`` tokens of ``num_seqs`` sequences."""
    per_token = (12 * model.hidden_size + 6 * model.intermediate_size) * model.dtype_bytes // max(tp, 1)
    logits = 2 * num_seqs * model.vocab_size * 4
    return batched_tokens * per_token + logits


def plan_kv_cache(model: ModelSpec, gpu: GpuSpec | None, config: EngineConfig) -> KvCacheLayout:
    """Size the block pool like vLLM's start-up, or raise ``ConfigError`` with vLLM's refusal text."""
    _check_config(model, config)
    tp = config.tensor_parallel_size
    per_token = model.kv_bytes_per_token(tp, config.kv_cache_dtype_bytes)
    block_bytes = per_token * config.block_size
    weights = model.weights_bytes(tp)
    act = activation_peak_bytes(model, config)
    non_torch = NON_TORCH_BYTES + NCCL_BYTES_PER_EXTRA_RANK * (1 if tp > 1 else 0)
    graphs = 0 if config.enforce_eager else CUDA_GRAPH_BYTES
    total = gpu.memory_bytes if gpu else 0
    requested = math.ceil(total * config.gpu_memory_utilization) if gpu else 0
    if gpu is not None and weights > total:
        raise ConfigError(
            "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free "
            "memory for weights, increasing --tensor-parallel-size, or using --quantization. "
            f"(weights need {format_gib(weights)} GiB per GPU; {gpu.name} has {format_gib(total)} GiB)"
        )
    if gpu is not None:
        _check_free_memory(gpu, config, requested)
    if config.kv_cache_memory_bytes is not None:
        available = config.kv_cache_memory_bytes
    elif gpu is not None:
        available = requested - weights - act - non_torch - graphs
    elif config.num_gpu_blocks_override is not None:
        available = config.num_gpu_blocks_override * block_bytes
    else:
        raise ConfigError(
            "give a GPU (--gpu / --gpu-memory-gib), --num-gpu-blocks or --kv-cache-memory-bytes"
        )
    if available <= 0 and config.num_gpu_blocks_override is None:
        raise ConfigError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
            f"despite its name). See {DOCS_URL} for more details."
        )
    num_blocks = max(available, 0) // block_bytes
    if config.num_gpu_blocks_override is not None:
        num_blocks = config.num_gpu_blocks_override
    layout = KvCacheLayout(
        num_gpu_blocks=num_blocks,
        block_size=config.block_size,
        max_model_len=config.max_model_len,
        kv_bytes_per_token=per_token,
        block_bytes=block_bytes,
        kv_cache_bytes=num_blocks * block_bytes,
        available_kv_bytes=max(available, 0),
        weights_bytes=weights if gpu else 0,
        activation_peak_bytes=act if gpu else 0,
        non_torch_bytes=non_torch if gpu else 0,
        cuda_graph_bytes=graphs if gpu else 0,
        requested_bytes=requested,
        gpu_total_bytes=total,
        overridden=config.kv_cache_memory_bytes is not None or config.num_gpu_blocks_override is not None,
    )
    _check_fits_one_request(layout)
    if gpu is not None and not config.enforce_eager:
        _check_graph_capture(gpu, config, layout)
    return layout


def _check_free_memory(gpu: GpuSpec, config: EngineConfig, requested_bytes: int) -> None:
    """vLLM V1's first check: the device must have ``total × utilization`` free (vllm-facts §2.5)."""
    free = gpu.memory_bytes - max(config.other_process_bytes, 0)
    if free >= requested_bytes:
        return
    raise ConfigError(
        f"Free memory on device cuda:0 ({format_gib(free)}/{format_gib(gpu.memory_bytes)} GiB) on startup "
        f"is less than desired GPU memory utilization ({config.gpu_memory_utilization}, "
        f"{format_gib(requested_bytes)} GiB). Decrease GPU memory utilization or reduce GPU memory used "
        "by other processes."
    )


def _check_graph_capture(gpu: GpuSpec, config: EngineConfig, layout: KvCacheLayout) -> None:
    """CUDA-graph capture after the pool is allocated: PyTorch's OOM text when it does not fit."""
    needed = CUDA_GRAPH_BYTES if config.cuda_graph_capture_bytes is None else config.cuda_graph_capture_bytes
    held = layout.weights_bytes + layout.non_torch_bytes + layout.kv_cache_bytes
    free = gpu.memory_bytes - max(config.other_process_bytes, 0) - held
    if needed <= free:
        return
    raise ConfigError(
        f"CUDA out of memory. Tried to allocate {needed // MIB} MiB. GPU 0 has a total capacity of "
        f"{format_gib(gpu.memory_bytes)} GiB of which {max(free, 0) // MIB} MiB is free. "
        "(while capturing CUDA graphs; --enforce-eager skips the capture, or lower "
        "--gpu-memory-utilization)"
    )


def _check_config(model: ModelSpec, config: EngineConfig) -> None:
    for name in (
        "max_model_len",
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "tensor_parallel_size",
    ):
        value = getattr(config, name)
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if config.block_size not in ALLOWED_BLOCK_SIZES and config.block_size % CPU_BLOCK_MULTIPLE:
        allowed = ", ".join(str(b) for b in ALLOWED_BLOCK_SIZES)
        raise ConfigError(
            f"--block-size must be one of {allowed} or a multiple of {CPU_BLOCK_MULTIPLE} (vLLM's choices "
            f"on GPUs and on the CPU backend), got {config.block_size}"
        )
    _check_tensor_parallel(model, config.tensor_parallel_size)
    if not 0 < config.gpu_memory_utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {config.gpu_memory_utilization}")
    if config.num_gpu_blocks_override is not None and config.num_gpu_blocks_override < 2:
        raise ConfigError(
            f"num_gpu_blocks must be at least 2 (one is the null block), got {config.num_gpu_blocks_override}"
        )
    if config.max_model_len > model.max_position_embeddings:
        raise ConfigError(
            f"User-specified max_model_len ({config.max_model_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={model.max_position_embeddings} in the "
            "model's config.json)."
        )
    window = model.sliding_window
    if window is not None and window < config.max_model_len:
        raise ConfigError(
            f"model {model.name!r} uses sliding-window attention (window {window} < max_model_len "
            f"{config.max_model_len}); vLLM's hybrid KV allocator is not modelled. Use "
            f"--max-model-len {window} "
            "or a config without sliding_window."
        )


def _check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """vLLM's sharding rules: attention heads split evenly; KV heads split, or replicated when fewer."""
    heads = model.num_attention_heads
    if heads % tp:
        # vLLM ModelConfig.verify_with_parallel_config raises this text.
        raise ConfigError(
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."
        )
    kv_heads = model.num_kv_heads
    if model.is_mla or tp == 1:
        return
    if (kv_heads >= tp and kv_heads % tp) or (kv_heads < tp and tp % kv_heads):
        raise ConfigError(
            f"the {kv_heads} KV heads of {model.name!r} cannot be sharded over tensor parallel size {tp}: "
            "vLLM needs KV heads divisible by TP, or TP divisible by KV heads (then they are replicated)"
        )


def _check_fits_one_request(layout: KvCacheLayout) -> None:
    needed_blocks = blocks_for_tokens(layout.max_model_len, layout.block_size)
    if needed_blocks <= layout.usable_blocks:
        return
    estimated = layout.usable_blocks * layout.block_size
    needed = format_gib(needed_blocks * layout.block_bytes)
    avail = format_gib(layout.usable_blocks * layout.block_bytes)
    raise ConfigError(
        f"To serve at least one request with the model's max seq len ({layout.max_model_len}), "
        f"({needed} GiB KV "
        f"cache is needed, which is larger than the available KV cache memory ({avail} GiB). Based on the "
        f"available memory, the estimated maximum model length is {estimated}. Try increasing "
        "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
        f"`max_model_len` when initializing the engine. See {DOCS_URL} for more details."
    )


def default_batch_limits(gpu: GpuSpec | None) -> tuple[int, int]:
    """vLLM V1's API-server defaults ``(max_num_batched_tokens, max_num_seqs)`` for a device (§7)."""
    if gpu is None:
        return 2048, 128  # CPU backend, one worker
    if gpu.memory_bytes >= 160 * GIB:
        return 16384, 1024
    if gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256
