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
CUDA OOM, throughput and TTFT / end-to-end percentiles. When the engine models prefix caching and the
trace carries ``hash_ids``, each request's prompt carries its trace's prefix structure
(``odds.block_token_ids``), so the levels hold shared prefix blocks once, as the production server would.
The plan then reports the onset (first level with a preemption), the last safe level, the arithmetic
onset band (``capacity.predict_preemption_onset``, with the trace's shared prefixes, and beside it the
worst case with nothing shared when the trace shares any) and recommendations: ``max_model_len`` from
the trace's P99 (``stats.recommend_max_model_len``), ``max_num_seqs`` = the last level without
preemption, and ``gpu_memory_utilization`` lowered by 0.05 when a level hit the modelled OOM.

The ``max_model_len`` advice is limited by what the KV pool holds (vLLM refuses to start when one
``max_model_len`` request needs more than the usable blocks, ``(num_gpu_blocks − 1) × block_size``
tokens) and keeps the current setting when that already covers the P99. When the advice differs from
the setting the levels ran with, the levels run again with the advised setting (a *check* sweep, up
to the first level that preempts or dies) and ``max_num_seqs`` comes from that sweep, so the
``vllm serve`` line is one configuration that was simulated as a whole. When the pool cannot hold
even one request of the trace's P99 length (plus margin), the plan says so and sizes the KV memory
that would (``KvShortfall``): bytes for one such request and for the safe concurrency, and which
changes reach it (``gpu_memory_utilization`` up to 0.95, tensor parallelism, a bigger GPU preset),
each sized by the same start-up budget.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from oomload.capacity.blocks import (
    OnsetPrediction,
    SharedPrefixes,
    blocks_for_tokens,
    predict_preemption_onset,
    single_request_limit_tokens,
)
from oomload.capacity.odds import block_token_ids
from oomload.capacity.scheduler import SimRequest
from oomload.errors import ConfigError
from oomload.sim.build import BuiltEngine, EngineOptions, build_engine
from oomload.sim.geometry import GPU_PRESETS
from oomload.trace.model import DEFAULT_PREFIX_BLOCK_TOKENS
from oomload.trace.stats import MaxModelLenAdvice, percentile, recommend_max_model_len

SATURATED_USAGE = 0.99
SAFE_GPU_MEMORY_UTILIZATION = 0.95  # the highest utilization the plan suggests (headroom for spikes)
TP_CHOICES = (2, 4, 8)


@dataclass(frozen=True, slots=True)
class LevelResult:
    """What one closed-loop concurrency level did on the virtual clock."""

    concurrency: int
    requests_issued: int  # trace requests taken by the level (finished + refused + cut by an OOM)
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

    @property
    def refused_share(self) -> float:
        return self.requests_refused / self.requests_issued if self.requests_issued else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class KvOption:
    """One change that gives a pool able to start with the target ``max_model_len``."""

    change: str  # the flags that differ, e.g. "--tensor-parallel-size 2 (2 × NVIDIA L4)"
    kv_cache_bytes: int  # per GPU
    max_concurrency: float  # target-length requests the pool holds at once

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class KvShortfall:
    """The pool cannot hold one request of the trace's P99 length: what KV memory would."""

    target_max_model_len: int  # P99 of prompt + output, plus margin, rounded (the uncapped advice)
    concurrency: int  # requests of that length to hold at once (the safe level, at least 1)
    bytes_for_one: int  # KV (per GPU, null block included) for one request of that length
    bytes_for_concurrency: int
    available_bytes: int  # the current pool
    options: list[KvOption]

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["options"] = [o.as_dict() for o in self.options]
        return out


@dataclass(frozen=True, slots=True)
class CheckSweep:
    """The levels run again with the advised ``max_model_len`` (when it differs from the current one)."""

    max_model_len: int
    levels: list[LevelResult]
    onset_concurrency: int | None
    last_safe_concurrency: int | None
    oom_concurrency: int | None
    trace_refused: int  # trace requests whose prompt ≥ this max_model_len

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["levels"] = [lv.as_dict() for lv in self.levels]
        return out


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
    arithmetic: OnsetPrediction  # the production shape: the trace's shared prefixes held once
    max_model_len_advice: MaxModelLenAdvice
    recommended_max_num_seqs: int | None
    recommended_gpu_memory_utilization: float
    serve_command: str
    trace_requests: int = 0
    trace_refused: int = 0  # trace requests whose prompt ≥ max_model_len (each counted once)
    trace_clamped: int = 0  # trace requests whose prompt fits but prompt + output does not
    check: CheckSweep | None = None
    kv_shortfall: KvShortfall | None = None
    notes: list[str] = field(default_factory=list)
    arithmetic_worst_case: OnsetPrediction | None = None  # nothing shared (None: the trace shares nothing)
    levels_shared_prefixes: bool = False  # the levels ran with the trace's prefixes cached

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        worst = self.arithmetic_worst_case
        out["arithmetic_worst_case"] = None if worst is None else {**asdict(worst), "band": list(worst.band)}
        out["levels"] = [lv.as_dict() for lv in self.levels]
        out["check"] = None if self.check is None else self.check.as_dict()
        out["kv_shortfall"] = None if self.kv_shortfall is None else self.kv_shortfall.as_dict()
        a = self.arithmetic
        out["arithmetic"] = {
            "onset_mean": a.onset_mean,
            "onset_p50": a.onset_p50,
            "onset_p90": a.onset_p90,
            "band": list(a.band),
            "shape": a.shape,
            "grows": a.grows,
            "capped": a.capped_at(self.max_num_seqs),
        }
        adv = self.max_model_len_advice
        out["max_model_len_advice"] = {
            "max_model_len": adv.max_model_len,
            "basis_percentile": adv.basis_percentile,
            "basis_tokens": adv.basis_tokens,
            "refused_share": adv.refused_share,
            "refused_count": adv.refused_count,
            "capped_by_model_limit": adv.capped_by_model_limit,
            "capped_by_kv_cache": adv.capped_by_kv_cache,
            "kept_current": adv.kept_current,
            "current_max_model_len": adv.current_max_model_len,
        }
        return out


def run_level(
    built: BuiltEngine,
    options: EngineOptions,
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    concurrency: int,
    requests: int,
    shared: SharedPrefixes | None = None,
) -> LevelResult:
    """One closed-loop level on a virtual clock (see the module docstring); ``shared`` (one entry per
    trace request) gives each prompt its prefix structure when the engine caches prefixes."""
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
    caching = sched.config.enable_prefix_caching and shared is not None and shared.any

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
            ids = None
            if caching and shared is not None:
                ids = block_token_ids(
                    p, sched.config.block_size, shared.groups[(issued - 1) % n], tail=issued
                )
            engine.add(SimRequest(str(issued), p, o, arrival_s=now, prompt_ids=ids))
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
        requests_issued=issued,
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


def sweep(
    built: BuiltEngine,
    options: EngineOptions,
    prompts: Sequence[int],
    outputs: Sequence[int],
    levels: Sequence[int],
    *,
    requests_per_level: int | None = None,
    stop_after_oom: bool = True,
    stop_after_preemption: bool = False,
    shared: SharedPrefixes | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[LevelResult]:
    """Run every level in order (stopping after a modelled OOM, or a preemption, when told);
    ``progress(concurrency, requests)`` is told each level before it runs."""
    results: list[LevelResult] = []
    for c in sorted(set(levels)):
        count = max(requests_per_level or min(max(1000, 16 * c), len(prompts)), c)
        if progress is not None:
            progress(c, count)
        level = run_level(built, options, prompts, outputs, c, count, shared)
        results.append(level)
        if (level.oom and stop_after_oom) or (level.preemptions and stop_after_preemption):
            break
    return results


def onsets(results: Sequence[LevelResult]) -> tuple[int | None, int | None, int | None]:
    """(first level with a preemption, last level below it and below any OOM, first OOM level). A level
    that finished no request (every prompt refused as longer than ``max_model_len``) put nothing in the
    KV pool: it is no evidence that its concurrency is safe."""
    onset = next((lv.concurrency for lv in results if lv.preemptions > 0), None)
    oom_at = next((lv.concurrency for lv in results if lv.oom), None)
    bad = [c for c in (onset, oom_at) if c is not None]
    first_bad = min(bad) if bad else None
    safe = [
        lv.concurrency
        for lv in results
        if (first_bad is None or lv.concurrency < first_bad) and lv.requests_finished > 0
    ]
    return onset, (max(safe) if safe else None), oom_at


def served_nothing(results: Sequence[LevelResult]) -> bool:
    """Whether no level finished a request: the trace's prompts are all longer than ``max_model_len``."""
    return bool(results) and all(lv.requests_finished == 0 for lv in results)


def plan(
    built: BuiltEngine,
    options: EngineOptions,
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    levels: Sequence[int],
    *,
    requests_per_level: int | None = None,
    stop_after_oom: bool = True,
    chains: Sequence[Sequence[int]] = (),
    chain_block_tokens: int = DEFAULT_PREFIX_BLOCK_TOKENS,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Run every level and derive the onsets and the recommended vLLM flags; ``chains`` are the trace's
    ``hash_ids`` (one per request, ``chain_block_tokens`` tokens per id; empty: none); ``progress`` is
    told each level of both sweeps before it runs (``sweep``)."""
    if len(prompt_tokens) == 0:
        raise ValueError("the trace has no requests")
    prompts = np.asarray(prompt_tokens, dtype=np.int64)
    outputs = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    totals = prompts + outputs
    cfg = built.config
    layout = built.layout
    prompt_list, output_list = prompts.tolist(), outputs.tolist()
    shared = None
    if len(chains) == len(prompt_list) and any(chains):
        shared = SharedPrefixes.from_chains(
            chains, prompt_list, block_tokens=chain_block_tokens, block_size=layout.block_size
        )
    results = sweep(
        built, options, prompt_list, output_list, levels, requests_per_level=requests_per_level,
        stop_after_oom=stop_after_oom, shared=shared, progress=progress,
    )  # fmt: skip
    onset, last_safe, oom_at = onsets(results)
    saturated = next((lv.concurrency for lv in results if lv.saturation_s is not None), None)
    advice = recommend_max_model_len(
        totals,
        block_size=cfg.block_size,
        model_limit=built.model.max_position_embeddings,
        kv_cache_tokens=single_request_limit_tokens(layout.num_gpu_blocks, layout.block_size),
        current_max_model_len=cfg.max_model_len,
    )
    fits = prompts < cfg.max_model_len
    if not fits.any():
        fits = np.ones_like(fits)
    kv_totals = np.minimum(totals[fits], cfg.max_model_len)
    kv_prompts = np.minimum(prompts[fits], cfg.max_model_len)
    worst = predict_preemption_onset(
        layout.num_gpu_blocks, layout.block_size, kv_totals, prompt_tokens=kv_prompts
    )
    arithmetic, arithmetic_worst = replace(worst, shape="production"), None
    if shared is not None and shared.any:
        kept = SharedPrefixes(
            shared.block_size, tuple(g for g, ok in zip(shared.groups, fits, strict=True) if ok)
        )
        arithmetic = predict_preemption_onset(
            layout.num_gpu_blocks, layout.block_size, kv_totals, kept, prompt_tokens=kv_prompts
        )
        arithmetic_worst = worst
    check: CheckSweep | None = None
    rec_onset, rec_safe, rec_oom = onset, last_safe, oom_at
    if advice.max_model_len != cfg.max_model_len:
        check_opts = replace(options, max_model_len=advice.max_model_len)
        check_built = build_engine(check_opts)
        check_levels = sweep(
            check_built, check_opts, prompt_list, output_list, levels, requests_per_level=requests_per_level,
            stop_after_oom=True, stop_after_preemption=True, shared=shared, progress=progress,
        )  # fmt: skip
        rec_onset, rec_safe, rec_oom = onsets(check_levels)
        check_refused = int(np.count_nonzero(prompts >= advice.max_model_len))
        check = CheckSweep(advice.max_model_len, check_levels, rec_onset, rec_safe, rec_oom, check_refused)
    shortfall = None
    if advice.capped_by_kv_cache:
        shortfall = kv_shortfall(built, options, totals, concurrency=max(last_safe or 1, 1))
    util = cfg.gpu_memory_utilization
    notes: list[str] = []
    rec_util = util
    if oom_at is not None or rec_oom is not None:
        rec_util = round(max(util - 0.05, 0.5), 2)
        notes.append(
            f"modelled CUDA OOM at concurrency {oom_at or rec_oom}: lower gpu_memory_utilization or "
            "drop overrides"
        )
    if served_nothing(results):
        notes.append(
            f"no level finished a request: every prompt is at least max_model_len {cfg.max_model_len:,} "
            "tokens and was refused, so the levels put nothing in the KV pool and no concurrency is "
            "shown safe"
        )
    elif rec_onset is None and rec_oom is None:
        notes.append("no preemption at any level: the KV pool holds the highest concurrency tried")
    rec_seqs = rec_safe if (rec_onset is not None or rec_oom is not None) else None
    flags = [f"vllm serve {shlex.quote(built.model.name)}", f"--max-model-len {advice.max_model_len}"]
    if rec_seqs is not None:
        flags.append(f"--max-num-seqs {rec_seqs}")
    flags.append(f"--gpu-memory-utilization {rec_util:g}")
    if cfg.tensor_parallel_size > 1:
        flags.append(f"--tensor-parallel-size {cfg.tensor_parallel_size}")
    refused = prompts >= cfg.max_model_len
    clamped = ~refused & (totals > cfg.max_model_len)
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
        trace_requests=int(prompts.size),
        trace_refused=int(np.count_nonzero(refused)),
        trace_clamped=int(np.count_nonzero(clamped)),
        check=check,
        kv_shortfall=shortfall,
        notes=notes,
        arithmetic_worst_case=arithmetic_worst,
        levels_shared_prefixes=options.enable_prefix_caching and shared is not None and shared.any,
    )


def kv_shortfall(
    built: BuiltEngine, options: EngineOptions, total_tokens: Sequence[int] | np.ndarray, *, concurrency: int
) -> KvShortfall:
    """Size the KV memory that holds the trace's P99 request, and the changes that provide it."""
    uncapped = recommend_max_model_len(
        total_tokens, block_size=built.config.block_size, model_limit=built.model.max_position_embeddings
    )
    target = uncapped.max_model_len
    layout = built.layout
    blocks_one = blocks_for_tokens(target, layout.block_size)
    options_found: list[KvOption] = []
    cfg = built.config
    base = replace(options, max_model_len=target, num_gpu_blocks=None, kv_cache_memory_bytes=None)
    gpu_key = _gpu_key(built)
    candidates: list[tuple[str, EngineOptions]] = []
    if built.gpu is not None and cfg.gpu_memory_utilization < SAFE_GPU_MEMORY_UTILIZATION:
        candidates.append((
            f"--gpu-memory-utilization {SAFE_GPU_MEMORY_UTILIZATION:g}",
            replace(base, gpu_memory_utilization=SAFE_GPU_MEMORY_UTILIZATION),
        ))  # fmt: skip
    if built.gpu is not None:
        for tp in TP_CHOICES:
            if tp > cfg.tensor_parallel_size:
                gpus = f"{tp} × {built.gpu.name}"
                candidates.append(
                    (f"--tensor-parallel-size {tp} ({gpus})", replace(base, tensor_parallel_size=tp))
                )
        bigger = sorted(
            (g for g in GPU_PRESETS.items() if g[1].memory_bytes > built.gpu.memory_bytes),
            key=lambda item: item[1].memory_bytes,
        )
        for key, gpu in bigger:
            if key != gpu_key:
                candidates.append((f"--gpu {key} ({gpu.name})", replace(base, gpu=key, gpu_memory_gib=None)))
    seen_kinds: set[str] = set()
    for change, opts in candidates:
        kind = change.split(" ", 1)[0]
        if kind in seen_kinds:
            continue  # the smallest step of each kind that works is enough
        try:
            fitted = build_engine(opts)
        except ConfigError:
            continue
        seen_kinds.add(kind)
        options_found.append(
            KvOption(change, fitted.layout.kv_cache_bytes, round(fitted.layout.max_concurrency, 2))
        )
    return KvShortfall(
        target_max_model_len=target,
        concurrency=concurrency,
        bytes_for_one=(blocks_one + 1) * layout.block_bytes,
        bytes_for_concurrency=(blocks_one * concurrency + 1) * layout.block_bytes,
        available_bytes=layout.kv_cache_bytes,
        options=options_found,
    )


def _gpu_key(built: BuiltEngine) -> str | None:
    for key, gpu in GPU_PRESETS.items():
        if built.gpu is not None and gpu.name == built.gpu.name:
            return key
    return None
