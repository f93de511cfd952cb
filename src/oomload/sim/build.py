"""Turn ``sim serve`` / ``plan`` options into a sized engine (shared by the CLI and the planner).

Defaults: model ``llama-3.1-8b``; GPU ``l4`` unless ``--num-gpu-blocks`` or ``--kv-cache-memory-bytes``
is given without ``--gpu`` (then no GPU is modelled: vLLM's CPU backend, block size 128, no OOM);
``max_model_len`` = min(the model's window, 8192) (vLLM would take the whole window);
``max_num_seqs`` / ``max_num_batched_tokens`` = vLLM V1's API-server defaults for the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomload.errors import ConfigError
from oomload.sim.geometry import (
    GIB,
    EngineConfig,
    GpuSpec,
    KvCacheLayout,
    ModelSpec,
    default_batch_limits,
    plan_kv_cache,
    resolve_gpu,
    resolve_model,
)
from oomload.sim.model import EngineModel

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "l4"
DEFAULT_MAX_MODEL_LEN = 8192
# What the simulator models: a device of at most 64 TiB (a node of today's largest GPUs is a few TiB) and a
# pool of at most 100 million blocks (the scheduler keeps arrays over the pool's blocks)
MAX_MEMORY_GIB = 65_536
MAX_GPU_BLOCKS = 100_000_000


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Everything that sizes and configures the simulated engine (None = vLLM-like default)."""

    model: str = DEFAULT_MODEL
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.92
    tensor_parallel_size: int = 1
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    enable_prefix_caching: bool = True  # vLLM V1's default
    oom: str = "auto"
    activation_scale: float = 1.0
    other_process_gib: float = 0.0  # device memory other processes hold (vLLM's free-memory check)
    cuda_graph_gib: float | None = None  # what CUDA-graph capture really takes (None: the reserve)


@dataclass(frozen=True, slots=True)
class BuiltEngine:
    model: ModelSpec
    gpu: GpuSpec | None
    config: EngineConfig
    layout: KvCacheLayout

    def engine(self, opts: EngineOptions) -> EngineModel:
        return EngineModel(
            self.model,
            self.gpu,
            self.config,
            self.layout,
            enable_prefix_caching=opts.enable_prefix_caching,
            oom=opts.oom,
            activation_scale=opts.activation_scale,
        )


def build_engine(opts: EngineOptions) -> BuiltEngine:
    """Resolve presets, apply vLLM's defaults and size the pool (raises ``ConfigError`` like vLLM)."""
    _check_positive_flags(opts)
    _check_sizes(opts)
    model = resolve_model(opts.model)
    gpu = resolve_gpu(opts.gpu, opts.gpu_memory_gib)
    if gpu is None and opts.num_gpu_blocks is None and opts.kv_cache_memory_bytes is None:
        gpu = resolve_gpu(DEFAULT_GPU)
    default_tokens, default_seqs = default_batch_limits(gpu)
    max_model_len = opts.max_model_len
    if max_model_len is None:
        max_model_len = min(model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    block_size = opts.block_size
    if block_size is None:
        block_size = 16 if gpu is not None else 128
    if opts.oom not in ("auto", "on", "off"):
        raise ConfigError(f"--oom must be auto, on or off, got {opts.oom!r}")
    if not opts.other_process_gib >= 0 or (opts.cuda_graph_gib is not None and not opts.cuda_graph_gib >= 0):
        raise ConfigError("--other-process-gib and --cuda-graph-gib must be >= 0")
    if not opts.activation_scale > 0:
        raise ConfigError(f"--activation-scale must be positive, got {opts.activation_scale}")
    config = EngineConfig(
        max_model_len=max_model_len,
        block_size=block_size,
        max_num_seqs=default_seqs if opts.max_num_seqs is None else opts.max_num_seqs,
        max_num_batched_tokens=(
            default_tokens if opts.max_num_batched_tokens is None else opts.max_num_batched_tokens
        ),
        gpu_memory_utilization=opts.gpu_memory_utilization,
        tensor_parallel_size=opts.tensor_parallel_size,
        num_gpu_blocks_override=opts.num_gpu_blocks,
        kv_cache_memory_bytes=opts.kv_cache_memory_bytes,
        enforce_eager=opts.enforce_eager,
        other_process_bytes=int(opts.other_process_gib * GIB),
        cuda_graph_capture_bytes=None if opts.cuda_graph_gib is None else int(opts.cuda_graph_gib * GIB),
    )
    layout = plan_kv_cache(model, gpu, config)
    if layout.num_gpu_blocks > MAX_GPU_BLOCKS:
        raise ConfigError(
            f"the KV pool would hold {layout.num_gpu_blocks:,} blocks, more than the {MAX_GPU_BLOCKS:,} the "
            "simulator models; give a smaller --gpu-memory-gib, --kv-cache-memory-bytes or --num-gpu-blocks"
        )
    return BuiltEngine(model, gpu, config, layout)


POSITIVE_FLAGS: tuple[tuple[str, str], ...] = (
    ("max_model_len", "--max-model-len"),
    ("block_size", "--block-size"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("tensor_parallel_size", "--tensor-parallel-size"),
    ("kv_cache_memory_bytes", "--kv-cache-memory-bytes"),
)


def _check_sizes(opts: EngineOptions) -> None:
    """Memory sizes and the pool within what the simulator models (``MAX_MEMORY_GIB``, ``MAX_GPU_BLOCKS``):
    one sentence naming the flag, before a size past them overflows an integer or an array."""
    for flag, gib in (
        ("--gpu-memory-gib", opts.gpu_memory_gib),
        ("--other-process-gib", opts.other_process_gib),
        ("--cuda-graph-gib", opts.cuda_graph_gib),
        (
            "--kv-cache-memory-bytes",
            None if opts.kv_cache_memory_bytes is None else opts.kv_cache_memory_bytes / GIB,
        ),
    ):
        if gib is not None and gib > MAX_MEMORY_GIB:  # NaN is refused where the flag is read
            raise ConfigError(f"{flag} must be at most {MAX_MEMORY_GIB:,} GiB, got {gib:g} GiB")
    if opts.num_gpu_blocks is not None and not 0 < opts.num_gpu_blocks <= MAX_GPU_BLOCKS:
        raise ConfigError(
            f"--num-gpu-blocks must be an integer in 1..{MAX_GPU_BLOCKS:,}, got {opts.num_gpu_blocks}"
        )


def _check_positive_flags(opts: EngineOptions) -> None:
    """A given count must be a positive integer: 0 never means "use the default"."""
    for name, flag in POSITIVE_FLAGS:
        value = getattr(opts, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
