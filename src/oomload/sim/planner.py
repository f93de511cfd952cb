"""``oomload plan``: run the engine model offline over a trace at rising concurrency (pure).

For each concurrency level ``c`` the planner runs a closed loop on a virtual clock: ``c`` clients each
send the next request of the trace (in trace order, wrapping around) and send another as soon as
theirs finishes, like ``oomload replay`` holding a step. Each request asks for exactly its trace
lengths (``prompt_tokens``, ``max_tokens = output_tokens``, ``ignore_eos``); a prompt that does not fit
``max_model_len`` is refused as vLLM would (HTTP 400) and one whose output does not fit is clamped
(vLLM ≥ 0.33). A level runs ``requests_per_level`` requests (default ``max(1000, 16 × c)``, at
most the trace length), so the cost is bounded whatever the trace size.

Per level it records the preemptions, the first preemption (virtual seconds), the peak KV usage and
the first step at which the pool is saturated (usage ≥ 99 %), peak running / waiting, a modelled
CUDA OOM, throughput and TTFT / end-to-end percentiles. The plan then reports the onset
(first level with a preemption), the last safe level, the arithmetic onset band
(``capacity.predict_preemption_onset``) and recommendations: ``max_model_len`` from the trace's P99
(``stats.recommend_max_model_len``), ``max_num_seqs`` = the last level without preemption, and
``gpu_memory_utilization`` lowered by 0.05 when a level hit the modelled OOM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oomload.capacity import OnsetPrediction, predict_preemption_onset
from oomload.sim.build import BuiltEngine, EngineOptions
from oomload.sim.scheduler import SimRequest
from oomload.stats import MaxModelLenAdvice, percentile, recommend_max_model_len

SATURATED_USAGE = 0.99


@dataclass(frozen=True, slots=True)
class LevelResult:
    """What one closed-loop concurrency level did on the virtual clock."""

    concurrency: int
    requests_finished: int
    requests_refused: int  # prompt does not fit max_model_len (HTTP 400)
    requests_clamped: int  # output clamped to max_model_len − prompt
    preemptions: int
    first_preemption_s: float | None
    max_kv_usage: float
    saturation_s: float | None  # first virtual second with usage ≥ 99 %
    max_running: int
    max_waiting: int
    oom: bool
    oom_message: str | None
    duration_s: float
    steps: int
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The plan: the pool, every level, the onsets and the recommended flags."""

    model: str
    gpu: str | None
    num_gpu_blocks: int
    block_size: int
    kv_cache_tokens: int
    kv_cache_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    max_concurrency: float
    levels: list[LevelResult]
    onset_concurrency: int | None  # first level with a preemption
    last_safe_concurrency: int | None  # highest level below the onset (and below any OOM)
    oom_concurrency: int | None
    saturation_concurrency: int | None  # first level whose KV pool saturated
    arithmetic: OnsetPrediction
    max_model_len_advice: MaxModelLenAdvice
    recommended_max_num_seqs: int | None
    recommended_gpu_memory_utilization: float
    serve_command: str
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["levels"] = [lv.as_dict() for lv in self.levels]
        a = self.arithmetic
        out["arithmetic"] = {
            "onset_mean": a.onset_mean,
            "onset_p50": a.onset_p50,
            "onset_p90": a.onset_p90,
            "band": list(a.band),
        }
        adv = self.max_model_len_advice
        out["max_model_len_advice"] = {
            "max_model_len": adv.max_model_len,
            "basis_percentile": adv.basis_percentile,
            "basis_tokens": adv.basis_tokens,
            "refused_share": adv.refused_share,
            "refused_count": adv.refused_count,
            "capped_by_model_limit": adv.capped_by_model_limit,
        }
        return out


def run_level(
    built: BuiltEngine,
    options: EngineOptions,
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    concurrency: int,
    requests: int,
) -> LevelResult:
    """One closed-loop level on a virtual clock (see the module docstring)."""
    if concurrency <= 0:
        raise ValueError(f"concurrency must be positive, got {concurrency}")
    engine = built.engine(options)
    sched = engine.scheduler
    limit = built.config.max_model_len
    n = len(prompt_tokens)
    now = 0.0
    issued = refused = clamped = 0
    ttft: list[float] = []
    e2e: list[float] = []
    first_preemption: float | None = None
    saturation: float | None = None
    max_usage = 0.0
    max_running = max_waiting = 0
    steps = 0
    generated = 0
    capacity = sched.capacity_blocks

    def issue() -> None:
        nonlocal issued, refused, clamped
        while issued < requests:
            p = int(prompt_tokens[issued % n])
            o = max(int(output_tokens[issued % n]), 1)
            issued += 1
            if p >= limit:
                refused += 1
                continue
            if p + o > limit:
                clamped += 1
                o = limit - p
            engine.add(SimRequest(str(issued), p, o, arrival_s=now))
            return

    for _ in range(concurrency):
        issue()
    oom_message: str | None = None
    while sched.running or sched.waiting:
        report = engine.step(now)
        result = report.result
        now += report.duration_s
        steps += 1
        generated += len(result.sampled)
        used = capacity - sched.free_blocks
        if used > max_usage * capacity:
            max_usage = used / capacity if capacity else 0.0
        if saturation is None and capacity and used >= SATURATED_USAGE * capacity:
            saturation = now
        if len(sched.running) > max_running:
            max_running = len(sched.running)
        if len(sched.waiting) > max_waiting:
            max_waiting = len(sched.waiting)
        if result.preempted and first_preemption is None:
            first_preemption = now
        if report.oom is not None:
            oom_message = report.oom.message
            break
        for req in result.finished:
            if req.first_token_s is not None:
                ttft.append(req.first_token_s - req.arrival_s)
            e2e.append((req.finished_s or now) - req.arrival_s)
            issue()
    return LevelResult(
        concurrency=concurrency,
        requests_finished=len(e2e),
        requests_refused=refused,
        requests_clamped=clamped,
        preemptions=engine.stats.num_preemptions,
        first_preemption_s=first_preemption,
        max_kv_usage=round(max_usage, 4),
        saturation_s=saturation,
        max_running=max_running,
        max_waiting=max_waiting,
        oom=oom_message is not None,
        oom_message=oom_message,
        duration_s=now,
        steps=steps,
        output_tokens_per_s=generated / now if now > 0 else 0.0,
        ttft_p50_s=percentile(ttft, 50) if ttft else None,
        ttft_p99_s=percentile(ttft, 99) if ttft else None,
        e2e_p50_s=percentile(e2e, 50) if e2e else None,
    )


def default_levels(max_num_seqs: int) -> list[int]:
    """Powers of two from 1 up to ``max_num_seqs`` (at most 512)."""
    levels = [1]
    while levels[-1] * 2 <= min(max_num_seqs, 512):
        levels.append(levels[-1] * 2)
    return levels


def plan(
    built: BuiltEngine,
    options: EngineOptions,
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    levels: Sequence[int],
    *,
    requests_per_level: int | None = None,
    stop_after_oom: bool = True,
) -> PlanResult:
    """Run every level and derive the onsets and the recommended vLLM flags."""
    if len(prompt_tokens) == 0:
        raise ValueError("the trace has no requests")
    prompts = np.asarray(prompt_tokens, dtype=np.int64)
    outputs = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    totals = prompts + outputs
    cfg = built.config
    layout = built.layout
    results: list[LevelResult] = []
    for c in sorted(set(levels)):
        count = requests_per_level or min(max(1000, 16 * c), len(prompts))
        level = run_level(built, options, prompts.tolist(), outputs.tolist(), c, max(count, c))
        results.append(level)
        if level.oom and stop_after_oom:
            break
    onset = next((lv.concurrency for lv in results if lv.preemptions > 0), None)
    oom_at = next((lv.concurrency for lv in results if lv.oom), None)
    saturated = next((lv.concurrency for lv in results if lv.saturation_s is not None), None)
    bad = [c for c in (onset, oom_at) if c is not None]
    first_bad = min(bad) if bad else None
    safe = [lv.concurrency for lv in results if first_bad is None or lv.concurrency < first_bad]
    last_safe = max(safe) if safe else None
    advice = recommend_max_model_len(
        totals,
        block_size=cfg.block_size,
        model_limit=built.model.max_position_embeddings,
        kv_cache_tokens=layout.kv_cache_size_tokens,
        current_max_model_len=cfg.max_model_len,
    )
    fitting = totals[prompts < cfg.max_model_len]
    arithmetic = predict_preemption_onset(
        layout.num_gpu_blocks,
        layout.block_size,
        np.minimum(fitting if fitting.size else totals, cfg.max_model_len),
    )
    util = cfg.gpu_memory_utilization
    notes: list[str] = []
    rec_util = util
    if oom_at is not None:
        rec_util = round(max(util - 0.05, 0.5), 2)
        notes.append(
            f"modelled CUDA OOM at concurrency {oom_at}: lower gpu_memory_utilization or drop overrides"
        )
    if first_bad is None:
        notes.append("no preemption at any level: the KV pool holds the highest concurrency tried")
    rec_seqs = last_safe if first_bad is not None else None
    flags = [f"vllm serve {built.model.name}", f"--max-model-len {advice.max_model_len}"]
    if rec_seqs is not None:
        flags.append(f"--max-num-seqs {rec_seqs}")
    flags.append(f"--gpu-memory-utilization {rec_util:g}")
    if cfg.tensor_parallel_size > 1:
        flags.append(f"--tensor-parallel-size {cfg.tensor_parallel_size}")
    return PlanResult(
        model=built.model.name,
        gpu=built.gpu.name if built.gpu else None,
        num_gpu_blocks=layout.num_gpu_blocks,
        block_size=layout.block_size,
        kv_cache_tokens=layout.kv_cache_size_tokens,
        kv_cache_bytes=layout.kv_cache_bytes,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        gpu_memory_utilization=util,
        tensor_parallel_size=cfg.tensor_parallel_size,
        max_concurrency=round(layout.max_concurrency, 2),
        levels=results,
        onset_concurrency=onset,
        last_safe_concurrency=last_safe,
        oom_concurrency=oom_at,
        saturation_concurrency=saturated,
        arithmetic=arithmetic,
        max_model_len_advice=advice,
        recommended_max_num_seqs=rec_seqs,
        recommended_gpu_memory_utilization=rec_util,
        serve_command=" ".join(flags),
        notes=notes,
    )
