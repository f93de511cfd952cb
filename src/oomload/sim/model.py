"""The simulated vLLM engine: scheduler + step-time model + modelled CUDA OOM + vLLM's counters (pure).

Nothing here does I/O or reads a clock: the caller passes ``now_s`` (wall time for ``sim serve``,
a virtual clock for ``oomload plan``), so runs are deterministic.

Step-time model (roofline, one forward pass per engine step)::

    step_s = overhead_s + per_seq_s × num_seqs
           + max( weight_bytes/tp / bandwidth + kv_read_tokens × kv_bytes_per_token / bandwidth,
                  2 × active_params/tp × batched_tokens / (bf16_flops × mfu) )

A decode step of a small batch is memory-bound (all weights read once, plus every context token's
KV); a step with a long prefill chunk is compute-bound (2 FLOPs per parameter per token). ``mfu`` is
0.5 and the per-step overhead 2 ms + 20 µs per sequence (scheduler, sampler, Python) on a GPU. Without
a GPU (the CPU vLLM backend the end-to-end tests run) a fitted profile is used instead: 2 ms +
0.15 ms per sequence + 50 µs per prefill token, which matches reference ``vllm-cpu.md`` §7 within a
factor of about 1.5. The server multiplies step times by ``--time-scale`` (0 = as fast as possible).

Modelled CUDA OOM: vLLM sizes the KV pool so that weights + non-torch memory + CUDA graphs + the
profiled activation peak + the pool fit inside ``total × gpu_memory_utilization``; a step's
activations are at most the profiled peak, so a profiled configuration never OOMs. The rule here:
when a GPU is modelled and ``oom`` is ``auto`` (the default), a step whose activation bytes
(``geometry.step_activation_bytes`` × ``activation_scale``) plus the static allocation exceed the
GPU's total memory kills the engine with PyTorch's "CUDA out of memory" text
(``oomload.sim.vllmlog.cuda_oom_message``: the step's activations are what it tried to allocate, the
static allocation what the process holds, the rest of the GPU less other processes' memory what is
free). That happens only in a risky configuration: a ``--num-gpu-blocks`` /
``--kv-cache-memory-bytes`` override larger than the budget, or ``--activation-scale`` > 1
(activations the profile run underestimated) with a high utilization. ``oom="off"`` disables it;
``oom="on"`` also treats exceeding ``total × utilization`` as fatal.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from oomload.capacity.scheduler import EngineStepResult, Scheduler, SchedulerConfig, SimRequest
from oomload.sim.geometry import (
    EngineConfig,
    GpuSpec,
    KvCacheLayout,
    ModelSpec,
    step_activation_bytes,
)
from oomload.sim.vllmlog import cuda_oom_message

TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
LATENCY_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITL_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
ITERATION_BUCKETS = (*(float(2**i) for i in range(15)), 16384.0)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 bucket series up to ``max_model_len`` (token-count histograms)."""
    out: list[float] = []
    mantissa = (1, 2, 5)
    exp = 0
    while True:
        for m in mantissa:
            value = m * 10**exp
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exp += 1


@dataclass(slots=True)
class Histogram:
    """A Prometheus-style histogram: cumulative bucket counts come out at export time."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """``[(le, cumulative count), …, ("+Inf", count)]`` for ``HistogramMetricFamily``."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((_le(bound), float(running)))
        out.append(("+Inf", float(self.count)))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))


@dataclass(slots=True)
class EngineStats:
    """vLLM's counters and histograms, fed by the engine (read by the /metrics exporter)."""

    max_model_len: int
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    admission_rejections: dict[str, int] = field(
        default_factory=lambda: {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0}
    )
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    inference: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    prefill: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    decode: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    request_preemptions: Histogram = field(default_factory=lambda: Histogram(PREEMPTION_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_BUCKETS))
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)
    request_max_tokens: Histogram = field(init=False)

    def __post_init__(self) -> None:
        buckets = token_buckets(self.max_model_len)
        self.request_prompt_tokens = Histogram(buckets)
        self.request_generation_tokens = Histogram(buckets)
        self.request_max_tokens = Histogram(buckets)

    def record_finished(self, req: SimRequest) -> None:
        reason = req.finish_reason or "length"
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.request_preemptions.observe(req.num_preemptions)
        self.request_prompt_tokens.observe(req.prompt_tokens)
        self.request_generation_tokens.observe(req.num_output_tokens)
        self.request_max_tokens.observe(req.max_tokens)
        end = req.finished_s if req.finished_s is not None else req.arrival_s
        self.e2e.observe(max(end - req.arrival_s, 0.0))
        if req.first_token_s is not None:
            self.ttft.observe(max(req.first_token_s - req.arrival_s, 0.0))
            decode_s = max(end - req.first_token_s, 0.0)
            self.decode.observe(decode_s)
            if req.num_output_tokens > 1:
                per_token = decode_s / (req.num_output_tokens - 1)
                self.tpot.observe(per_token)
                for _ in range(min(req.num_output_tokens - 1, 64)):
                    self.itl.observe(per_token)
        if req.first_scheduled_s is not None:
            self.queue.observe(max(req.first_scheduled_s - req.arrival_s, 0.0))
            self.inference.observe(max(end - req.first_scheduled_s, 0.0))
            if req.first_token_s is not None:
                self.prefill.observe(max(req.first_token_s - req.first_scheduled_s, 0.0))


@dataclass(frozen=True, slots=True)
class EngineStepTimeModel:
    """Seconds one engine step takes (see the module docstring for the formula)."""

    weight_bytes: float
    kv_bytes_per_token: float
    active_params: float
    bandwidth_bytes_per_s: float
    flops: float
    overhead_s: float = 0.002
    per_seq_s: float = 20e-6
    per_prefill_token_s: float = 0.0
    cpu_profile: bool = False

    @classmethod
    def build(
        cls, model: ModelSpec, gpu: GpuSpec | None, layout: KvCacheLayout, tp: int = 1
    ) -> EngineStepTimeModel:
        if gpu is None:
            return cls(
                0,
                0,
                0,
                1,
                1,
                overhead_s=0.002,
                per_seq_s=0.15e-3,
                per_prefill_token_s=50e-6,
                cpu_profile=True,
            )
        return cls(
            weight_bytes=model.active_params * model.dtype_bytes / tp,
            kv_bytes_per_token=layout.kv_bytes_per_token,
            active_params=model.active_params / tp,
            bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s,
            flops=gpu.bf16_flops * 0.5,
        )

    def step_s(self, num_seqs: int, batched_tokens: int, prefill_tokens: int, kv_read_tokens: int) -> float:
        if num_seqs == 0:
            return 0.0
        fixed = self.overhead_s + self.per_seq_s * num_seqs
        if self.cpu_profile:
            return fixed + self.per_prefill_token_s * prefill_tokens
        memory_s = (self.weight_bytes + kv_read_tokens * self.kv_bytes_per_token) / self.bandwidth_bytes_per_s
        compute_s = 2.0 * self.active_params * batched_tokens / self.flops
        return fixed + max(memory_s, compute_s)


@dataclass(frozen=True, slots=True)
class OomEvent:
    """A modelled CUDA OOM: the engine dies with this PyTorch message."""

    message: str
    step_activation_bytes: int


@dataclass(frozen=True, slots=True)
class EngineStepReport:
    """One step of the engine: what the scheduler did, how long it took, and whether it killed it."""

    result: EngineStepResult
    duration_s: float
    oom: OomEvent | None = None


class EngineModel:
    """Scheduler + timing + OOM + counters, driven by the caller's clock."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec | None,
        engine: EngineConfig,
        layout: KvCacheLayout,
        *,
        enable_prefix_caching: bool = True,
        oom: str = "auto",
        activation_scale: float = 1.0,
    ) -> None:
        if oom not in ("auto", "on", "off"):
            raise ValueError(f"oom must be auto, on or off, got {oom!r}")
        self.model = model
        self.gpu = gpu
        self.engine = engine
        self.layout = layout
        self.scheduler = Scheduler(
            SchedulerConfig(
                num_gpu_blocks=layout.num_gpu_blocks,
                block_size=layout.block_size,
                max_num_seqs=engine.max_num_seqs,
                max_num_batched_tokens=engine.max_num_batched_tokens,
                max_model_len=engine.max_model_len,
                enable_prefix_caching=enable_prefix_caching,
            )
        )
        self.timing = EngineStepTimeModel.build(model, gpu, layout, engine.tensor_parallel_size)
        self.stats = EngineStats(max_model_len=engine.max_model_len)
        self.oom_mode = oom
        self.activation_scale = activation_scale
        self.dead: OomEvent | None = None
        self.last_activation_bytes = 0

    # -- requests ------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        self.scheduler.add(req)

    def abort(self, req: SimRequest, now_s: float) -> None:
        if self.scheduler.abort(req, now_s=now_s):
            self.stats.record_finished(req)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    def waiting_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.scheduler.waiting)

    # -- memory --------------------------------------------------------------------------------
    def gpu_used_bytes(self) -> int:
        """Modelled GPU memory in use now: the static allocation plus the last step's activations."""
        return self.layout.static_used_bytes + self.last_activation_bytes

    # -- the step ------------------------------------------------------------------------------
    def step(self, now_s: float, time_scale: float = 1.0) -> EngineStepReport:
        """Run one scheduler step starting at ``now_s``; update counters; model OOM (module docstring).

        Tokens sampled in the step are stamped at its end, ``now_s + duration × time_scale``.
        """
        if self.dead is not None:
            raise RuntimeError("the engine is dead")
        result = self.scheduler.step(now_s)
        num_seqs = len(result.scheduled)
        duration = self.timing.step_s(
            num_seqs, result.num_batched_tokens, result.num_prefill_tokens, result.kv_read_tokens
        )
        end_s = now_s + duration * time_scale
        for req in result.sampled:
            if req.num_output_tokens == 1 and req.first_token_s == now_s:  # sampled first in this step
                req.first_token_s = end_s
            if req.finished_s == now_s:
                req.finished_s = end_s
        oom = self._check_oom(result) if num_seqs else None
        stats = self.stats
        # vLLM's prompt_tokens counts every prompt token, the ones served from the prefix cache too
        stats.prompt_tokens += result.num_prefill_tokens + result.num_cached_tokens
        stats.generation_tokens += len(result.sampled)
        stats.prefix_cache_queries += result.num_queried_tokens
        stats.prefix_cache_hits += result.num_cached_tokens
        stats.num_preemptions += len(result.preempted)
        if num_seqs:
            stats.iteration_tokens.observe(result.num_batched_tokens)
        for req in result.finished:
            stats.record_finished(req)
        if oom is not None:
            self.dead = oom
        return EngineStepReport(result, duration, oom)

    def _check_oom(self, result: EngineStepResult) -> OomEvent | None:
        if self.oom_mode == "off" or self.gpu is None:
            self.last_activation_bytes = 0
            return None
        act = int(
            step_activation_bytes(
                self.model, result.num_batched_tokens, len(result.scheduled), self.engine.tensor_parallel_size
            )
            * self.activation_scale
        )
        self.last_activation_bytes = act
        limit = self.layout.gpu_total_bytes
        if self.oom_mode == "on":
            limit = self.layout.requested_bytes
        static = self.layout.static_used_bytes
        if static + act <= limit:
            return None
        total = self.layout.gpu_total_bytes
        message = cuda_oom_message(
            tried_bytes=act,
            total_bytes=total,
            free_bytes=total - static - self.engine.other_process_bytes,
            in_use_bytes=static,
            allocated_bytes=static - self.layout.non_torch_bytes - self.layout.cuda_graph_bytes,
            private_pool_bytes=self.layout.cuda_graph_bytes,
        )
        return OomEvent(message, act)


def clamp_max_tokens(prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """vLLM ≥ 0.33: ``max_tokens`` silently clamped to ``max_model_len − prompt``."""
    return max(min(max_tokens, max_model_len - prompt_tokens), 0)
