"""What to set instead: ``vllm serve`` settings derived from a verdict (pure).

* ``max_model_len`` — ``stats.recommend_max_model_len`` on the trace's total lengths (prompt + output):
  nearest-rank P99 plus a margin (10 %), rounded up to a multiple of lcm(256, block size), never above
  the served limit (``config.json`` ``max_model_len`` from ``/v1/models``, else ``cache_config``: the
  current setting, and the only model limit oomload knows). It
  reports the share of the trace the setting refuses and the worst-case full-length sequences the KV
  pool holds at once with it, against the current limit. Only recommended when it *lowers* the limit
  (or no limit is known); a trace that needs the full window is told so. Two cases change nothing:
  the current setting already covers the P99 (``kept_current``: raising it would only shrink KV
  concurrency, so keep it), and a KV pool too small to hold one P99-length request
  (``capped_by_kv_cache``: vLLM refuses to start with a longer limit) — then the advice is more KV
  memory (``--gpu-memory-utilization``, a bigger GPU, tensor parallelism), not a shorter window.
* ``max_num_seqs`` — the last safe concurrency, when something broke above it (preemption, a memory death,
  server errors, timeouts): capping running sequences there keeps the KV pool from preempting at the replayed
  lengths. vLLM's own queue limit turning requests away (``admission_rejected``) is no reason for a cap when
  nothing else broke (``_only_queue_limit``). A death that was not of memory (a kill from outside, a crash, no
  known cause: ``EngineDeath.memory``) is no reason for a cap: the reason names it and says the levels above
  it were not measured. A server whose own cap (``RunInfo.max_num_seqs``: its serve line's, the simulator's
  flags', else its log's) is already at or below that level gets no number: a cap there would not lower what
  broke. Nothing broke → no cap is advised, and the highest clean level is named. Something broke but requests
  queued below it (long prompts spending the prefill budget), so no level is safe → no number either: the
  clean level's engine ran fewer than its level at times, and the cell says to find the cap with ``oomload
  tune`` (``_clean_but_queued``). A run that replayed only the trace's tail (``tail_percentile`` in
  ``config.json``) or its arrival times (``open_loop``) measured no production concurrency: no cap is advised,
  and the reason says why (an open loop's reasoning names its cap and what was in flight, never a level:
  "KV-cache preemption began in the open loop (cap 16, 0.9 in flight on average)"). The cap holds for the
  prompts the run sent; when the trace shares prefixes, the reason says which shape was measured and what the
  arithmetic gives for the other (``prediction.other``): a cap measured with distinct prompts is the worst
  case, one measured with shared prefixes holds only while the server caches them.
* ``gpu_memory_utilization`` — only for a CUDA allocation that failed at runtime (the death's kind is
  ``cuda_oom``, or, without a classified cause, OOM text in a request): five points below the current
  value (default 0.9) to give activations / CUDA graphs the headroom they lacked. Any other death —
  the CPU build's allocator, the kernel's OOM kill, a crash, no known cause — gets no device advice.
* ``max_num_batched_tokens`` — for an *activation peak* (the death's kind is ``cuda_oom`` or
  ``cpu_oom``: an allocation failed in a forward pass once concurrency rose), the prefill batch is
  bounded before concurrency is capped: the last level below the death that ran clean prefilled up
  to min(the server's value, level × the trace's P99 prompt) tokens at once and survived; the advice
  is a quarter of that (``deathadvice.PREFILL_SHARE``), on multiples of 256, never below 2048. A quarter, not
  half: a heap that grows with the load's history leaves less than one step of it did. Measured on
  the CPU harness (a 1.3 GB data limit, 4,000-token prompts, death at 16 after 8 carried 32,000
  tokens): half, 15,872, died again under 20 s holds at 16 or 32 in 2 runs of 2; a quarter, 7,936,
  carried 16, 32 and 64. Under 1.11 GB the death came at 8, and a quarter, 3,840, carried 8 and 16
  (2 runs of 2). The server's value comes from the cache config, the
  ``--serve`` line or its start-up log (``runinfo.served_scheduler``); a server already at or
  below the advice gets no number and is told to cap ``max_num_seqs`` instead (the death is then
  the cap's to answer, as any other memory death is), and without the server's value the bound is given in
  words only ("at most N, below the server's value"): a number above the server's own would raise
  it. A death the prefill bound answers is not a reason for a ``max_num_seqs`` cap (preemption
  still is). Otherwise, when transient spikes are
  implicated — a real OOM, or device memory that rose during the run by more than ``SPIKE_SHARE`` of
  the device beyond its first sample (vLLM preallocates the KV cache, so used memory should stay flat)
  — half the current value, never below 2048; unless the cache config names one the flag gets no
  number — a guessed default might *raise* the server's value — and its ``action`` says in words what
  to do (halve the server's value); the reason gives vLLM's defaults per GPU class.
* The kernel's OOM kill (a container's limit) is not a ``vllm serve`` flag: the reasoning says to
  raise the limit above the peak the server needed, or to give it less concurrency.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from oomload.capacity.blocks import single_request_limit_tokens
from oomload.realvllm.servecmd import flag_text, recommended_line
from oomload.rundir.records import CacheConfig
from oomload.trace.stats import MaxModelLenAdvice, recommend_max_model_len
from oomload.verdict.death import EngineDeath
from oomload.verdict.deathadvice import (
    BATCHED_TOKENS_ACTION,
    BATCHED_TOKENS_UNKNOWN,
    MIN_BATCHED_TOKENS,
    activation_death,
    host_memory_advice,
    level_below,
    not_memory_text,
    prefill_advice,
)
from oomload.verdict.deathcause import DeathKind
from oomload.verdict.verdict import Verdict, kv_peak_text

DEFAULT_MARGIN = 0.10
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
GPU_MEMORY_UTILIZATION_STEP = 0.05
GPU_MEMORY_UTILIZATION_FLOOR = 0.5
SPIKE_SHARE = 0.02


@dataclass(frozen=True, slots=True)
class Setting:
    """One recommended flag: its value (``None``: no number), the one-sentence why, and — when a change
    is advised but no number can be given — the change in words (``action``)."""

    flag: str
    value: int | float | None
    current: int | float | None
    reason: str
    action: str | None = None

    @property
    def shown(self) -> str:
        """The "recommended" cell of every report: the value, else the action, else ``—`` (keep)."""
        if self.value is not None:
            return flag_text(self.value)
        return self.action or "—"


@dataclass(frozen=True, slots=True)
class Recommendation:
    max_model_len: Setting
    max_model_len_advice: MaxModelLenAdvice | None
    max_num_seqs: Setting
    gpu_memory_utilization: Setting
    max_num_batched_tokens: Setting
    flag_line: str
    reasoning: str

    @property
    def settings(self) -> tuple[Setting, ...]:
        return (
            self.max_model_len,
            self.max_num_seqs,
            self.gpu_memory_utilization,
            self.max_num_batched_tokens,
        )

    def to_json(self) -> dict[str, Any]:
        advice = self.max_model_len_advice
        return {
            "settings": [asdict(s) for s in self.settings],
            "max_model_len": None
            if advice is None
            else {
                **asdict(advice),
                "freed_concurrency": advice.freed_concurrency,
                "round_to_tokens": advice.round_to,
                "margin_share": advice.margin,
            },
            "flag_line": self.flag_line,
            "reasoning": self.reasoning,
        }


def recommend(verdict: Verdict, *, margin: float = DEFAULT_MARGIN) -> Recommendation:
    """Recommend ``vllm serve`` settings for the run behind ``verdict`` (module docstring)."""
    cache = CacheConfig.from_json(verdict.run.cache_config or {})  # the Verdict keeps the raw labels
    block_size = cache.block_size
    limit = verdict.run.max_model_len
    num_blocks = cache.num_gpu_blocks
    # the longest request the pool holds, as in `oomload plan`; kv_cache_size_tokens (recent vLLM:
    # int(max_concurrency × max_model_len)) only when the block count is not reported
    kv_tokens = cache.kv_cache_size_tokens
    if num_blocks and block_size:
        kv_tokens = single_request_limit_tokens(num_blocks, block_size)

    mml, advice = _max_model_len(
        verdict, margin=margin, block_size=block_size, limit=limit, kv_tokens=kv_tokens
    )
    seqs = _max_num_seqs(verdict)
    util = _gpu_memory_utilization(verdict, cache)
    batched = _max_num_batched_tokens(verdict)
    flags = tuple((s.flag, flag_text(s.value)) for s in (mml, seqs, util, batched) if s.value is not None)
    run = verdict.run
    flag_line = recommended_line(run.served_line, run.serve_args or (run.model or "MODEL",), flags)
    return Recommendation(
        max_model_len=mml,
        max_model_len_advice=advice,
        max_num_seqs=seqs,
        gpu_memory_utilization=util,
        max_num_batched_tokens=batched,
        flag_line=flag_line,
        reasoning=_reasoning(verdict, mml, advice, seqs, util, batched),
    )


def _max_model_len(
    verdict: Verdict, *, margin: float, block_size: int | None, limit: int | None, kv_tokens: int | None
) -> tuple[Setting, MaxModelLenAdvice | None]:
    totals = verdict.trace_total_tokens
    if not totals:
        return Setting(
            "--max-model-len", None, limit, "the run holds no trace lengths to derive it from"
        ), None
    advice = recommend_max_model_len(
        list(totals),
        margin=margin,
        block_size=block_size,
        model_limit=limit,
        kv_cache_tokens=kv_tokens,
        current_max_model_len=limit,
    )
    p99 = int(advice.basis_tokens)
    if advice.capped_by_kv_cache:
        why = (
            f"the usable KV pool ({kv_tokens} tokens) cannot hold one request of the trace's P99 total "
            f"length ({p99} tokens), so vLLM would refuse a limit that covers it; give the KV cache more "
            "memory (a higher --gpu-memory-utilization, a bigger GPU or tensor parallelism) — at the pool "
            f"size {advice.refused_share:.2%} of the trace would be refused"
        )
        return Setting("--max-model-len", None, limit, why), advice
    covered = limit is not None and advice.basis_tokens <= limit
    if advice.kept_current or (covered and advice.max_model_len >= (limit or 0)):
        why = (
            f"the current {limit} already covers the trace's P99 total length ({p99} tokens); "
            "raising it would only shrink the KV concurrency — keep it"
        )
        return Setting("--max-model-len", None, limit, why), advice
    if limit is not None and advice.max_model_len >= limit:
        fate = (
            "would be refused at it (left out of this replay: --only-fitting)"
            if verdict.context_overflow.left_out
            else "are refused at it"
        )
        pool = (
            f" and a KV pool that holds one such request (the usable pool holds {kv_tokens} tokens: more "
            "memory for the KV cache, a bigger GPU or tensor parallelism)"
            if kv_tokens is not None and p99 > kv_tokens
            else ", and it leaves fewer full-length sequences in the KV pool"
        )
        why = (
            f"the trace's P99 total length ({p99} tokens) exceeds the current max_model_len {limit}: "
            f"{advice.refused_count} requests ({advice.refused_share:.2%}) {fate}; a longer window needs "
            f"a model that allows it{pool}"
        )
        return Setting("--max-model-len", None, limit, why), advice
    share = f"{advice.refused_share:.2%}"
    why = (
        f"P99 total length {p99} tokens + {margin:.0%}, rounded to {advice.round_to}; "
        f"refuses {share} of the trace"
    )
    if advice.freed_concurrency is not None and advice.current_max_concurrency is not None:
        why += (
            f"; worst-case full-length sequences the KV pool holds: {advice.current_max_concurrency:.1f} → "
            f"{advice.max_concurrency:.1f}"
        )
    return Setting("--max-model-len", advice.max_model_len, limit, why), advice


def _max_num_seqs(verdict: Verdict) -> Setting:
    current = verdict.run.max_num_seqs  # the server's own cap, where its serve line or log says it
    unrepresentative = _unrepresentative_mix(verdict)
    if unrepresentative is not None:
        return Setting("--max-num-seqs", None, current, unrepresentative)
    safe = verdict.last_safe_concurrency
    bounded = _bounded_by_prefill(verdict)
    death = _capped_death(verdict)
    if not _broke(verdict):
        other = verdict.engine_death
        if bounded is not None:
            at = "" if bounded.concurrency is None else f" at {bounded.concurrency}"
            why = (
                f"only the activation peak{at} broke, and the prefill bound (--max-num-batched-tokens) "
                "answers it; no preemption or failed request calls for a cap"
            )
        elif other is not None:  # not of memory (``_capped_death``)
            at = "" if other.concurrency is None else f" at {other.concurrency}"
            why = (
                f"nothing broke below the engine's death{at}, and it was {not_memory_text(other)}: "
                "a cap does not answer it, and the levels above it were not measured"
            )
        elif (judged := verdict.preemption_judged_up_to) is None:
            why = "nothing failed, but no level was judged for preemption: no cap can be named"
        else:
            why = f"nothing broke in this run; no cap is needed up to the highest level judged ({judged})"
        why += _shape_clause(verdict)
        return Setting("--max-num-seqs", None, current, why)
    queue_limit = _only_queue_limit(verdict)
    if queue_limit is not None:
        return Setting("--max-num-seqs", None, current, queue_limit)
    preempted = [lv.concurrency for lv in verdict.preempted_levels]  # the onset's level among them
    what = "preemption" if preempted else "failures"
    bad_levels = [
        s.concurrency
        for s in verdict.measured_steps
        if s.unsafe_requests and not _death_step(verdict, s.index)
    ]
    bad_levels += preempted
    if death is not None and death.concurrency is not None:
        bad_levels.append(death.concurrency)
    first_bad = min(bad_levels) if bad_levels else None
    if safe is None:
        clean = _clean_but_queued(verdict, first_bad)
        if clean is None:
            lowest = min((s.concurrency for s in verdict.measured_steps), default=None)
            why = (
                "one request at a time already broke: no cap avoids it (the settings beside it say what may)"
                if lowest == 1
                else "the lowest level tested already broke: test lower concurrency first"
            )
            return Setting("--max-num-seqs", None, current, why)
        below, queued = clean
        why = (
            f"{what} began at {first_bad}, but requests already queued in vLLM from {queued}, so no level "
            f"proved a cap: level {below} ran without {what} while its engine ran fewer at times, and a "
            f"server capped at {below} runs {below} all the time; oomload tune finds the highest cap "
            "without preemption, starting the server with each"
        )
        return Setting("--max-num-seqs", None, current, why, action=f"below {first_bad}: oomload tune")
    where = "an unknown level" if first_bad is None else first_bad
    measured = f"the last safe concurrency was {safe}; {what} began at {where}{_shape_clause(verdict)}"
    if _capped_at_or_below(verdict, safe):  # a cap at the safe level would not lower the server's
        return Setting(
            "--max-num-seqs",
            None,
            current,
            f"{measured}; the server already runs at most {current} sequences at once, so a cap at {safe} "
            "changes nothing: what broke above it was not the number running",
        )
    return Setting("--max-num-seqs", safe, current, measured)


def _only_queue_limit(verdict: Verdict) -> str | None:
    """Why no cap, when all that broke was vLLM's own queue limit turning requests away (its 503,
    ``admission_rejected``): the engine was running and queueing all it may, and a cap on the running
    sequences would turn more away, not fewer. ``None`` when anything else broke too."""
    if verdict.preempted_levels or _capped_death(verdict) is not None:
        return None
    broke = [s for s in verdict.measured_steps if s.unsafe_requests and not _death_step(verdict, s.index)]
    rejected = sum(s.queue_rejected_requests for s in broke)
    if not broke or rejected < sum(s.unsafe_requests for s in broke):
        return None
    return (
        f"what broke, from {min(s.concurrency for s in broke)}, was vLLM's own queue limit turning requests "
        f"away ({rejected} admission rejections): a cap on running sequences would turn more away; raise "
        "--max-num-queued-reqs / --max-num-queued-tokens, or add capacity, to serve that level"
    )


def _clean_but_queued(verdict: Verdict, first_bad: int | None) -> tuple[int, int] | None:
    """(the highest level below ``first_bad`` without an unsafe request, where queueing began) when
    only queueing kept that level from being the last safe one: long prompts spending the prefill
    budget queue requests from the lowest level while preemption begins far above it. That level
    proves no cap: on the simulator a heavy-tailed mix preempted at 15 and ran clean at 14 with
    requests waiting, and the server capped at 14 still preempted 3.2 times per 100 requests at 32."""
    queued = verdict.queueing
    clean = level_below(verdict, first_bad)
    if queued is None or clean is None or queued.concurrency > clean:
        return None
    return clean, queued.concurrency


def _broke(verdict: Verdict) -> bool:
    """Something a ``max_num_seqs`` cap answers broke: preemption (at an onset, or sporadic), a death
    a cap answers (``_capped_death``), or unsafe requests outside the death's step."""
    return (
        bool(verdict.preempted_levels)  # the onset's level is one of them
        or _capped_death(verdict) is not None
        or any(s.unsafe_requests for s in verdict.measured_steps if not _death_step(verdict, s.index))
    )


def _capped_death(verdict: Verdict) -> EngineDeath | None:
    """The engine's death when a ``max_num_seqs`` cap answers it: a memory death (``EngineDeath.memory``)
    other than an activation peak the prefill bound answers (``_bounded_by_prefill``). A kill from
    outside, a crash or a death of unknown cause says nothing about how many sequences fit."""
    death = verdict.engine_death
    if death is None or not death.memory or _bounded_by_prefill(verdict) is not None:
        return None
    return death


def _bounded_by_prefill(verdict: Verdict) -> EngineDeath | None:
    """The activation-peak death, when a prefill bound answers it (a number, or one in words); ``None``
    when there is none, or the server's prefill batch is already at the bound: the cap answers it then."""
    death = activation_death(verdict)
    if death is None:
        return None
    advice = prefill_advice(verdict, death, _prefill_budget(verdict))
    return death if advice.value is not None or advice.action is not None else None


def _prefill_budget(verdict: Verdict) -> int | None:
    """The server's ``max_num_batched_tokens``: its cache config's, else its serve line's or log's."""
    cache = CacheConfig.from_json(verdict.run.cache_config or {})
    return cache.max_num_batched_tokens or verdict.run.max_num_batched_tokens


def _capped_at_or_below(verdict: Verdict, safe: int | None) -> bool:
    """The server's own ``max_num_seqs`` is known and no higher than the last safe concurrency."""
    current = verdict.run.max_num_seqs
    return current is not None and safe is not None and current <= safe


def _shape_clause(verdict: Verdict) -> str:
    """Which prompts the cap was measured with, and the arithmetic's onset for the other shape ("" when
    the trace shares nothing: both shapes agree)."""
    p = verdict.prediction
    if p is None or p.other is None or not p.expects_onset:  # no onset expected: the bands only say
        return ""  # where the pool fills, or a capped server never reaches them
    measured, other = p.arithmetic, p.other
    if verdict.prompt_shape == "production":
        return (
            "; measured with the trace's shared prefixes cached; with nothing shared (prefix caching off, "
            f"or prompts that differ) the arithmetic onset falls from {_band(measured.band)} to "
            f"{_band(other.band)}"
        )
    return (
        "; measured with distinct prompts, the worst case; with the trace's shared prefixes held once "
        f"the arithmetic onset is {_band(other.band)} (worst case {_band(measured.band)})"
    )


def _band(band: tuple[int, int]) -> str:
    return str(band[0]) if band[0] == band[1] else f"{band[0]}–{band[1]}"


def _unrepresentative_mix(verdict: Verdict) -> str | None:
    """Why this run's safe concurrency is not production's (tail-only or open-loop replay), or None."""
    run = verdict.run
    if run.tail_percentile is not None:
        return (
            "the run replayed only the trace's longest requests "
            f"(--tail-percentile {run.tail_percentile:g}): its safe concurrency is a worst case, "
            "not production's, so no max_num_seqs is derived from it"
        )
    if run.open_loop:
        return (
            "the run replayed the trace's arrival times (--open-loop): requests in flight followed the "
            "arrivals, not the concurrency levels, so no max_num_seqs is derived from it"
        )
    return None


def _gpu_memory_utilization(verdict: Verdict, cache: CacheConfig) -> Setting:
    flag, current = "--gpu-memory-utilization", cache.gpu_memory_utilization
    death = verdict.engine_death
    if death is None:
        return Setting(flag, None, current, "no engine death: memory headroom held")
    cuda = death.kind is DeathKind.CUDA_OOM or (death.cause is None and death.real_oom)
    if not cuda:
        unknown = death.kind in (None, DeathKind.NO_CAUSE)
        what = (
            "without CUDA OOM evidence" if unknown else f"of something else than device memory ({death.kind})"
        )
        why = f"the engine died {what}, so more device headroom is not indicated"
        return Setting(flag, None, current, why)
    base = current if current is not None else DEFAULT_GPU_MEMORY_UTILIZATION
    value = max(round(base - GPU_MEMORY_UTILIZATION_STEP, 2), GPU_MEMORY_UTILIZATION_FLOOR)
    where = "" if death.concurrency is None else f" {_at(verdict, death.concurrency, death.step)}"
    why = f"a real CUDA OOM{where}: leave activations and CUDA graphs more headroom ({base:g} → {value:g})"
    return Setting(flag, value, current, why)


def _max_num_batched_tokens(verdict: Verdict) -> Setting:
    flag = "--max-num-batched-tokens"
    current = _prefill_budget(verdict)
    activation = activation_death(verdict)
    if activation is not None:
        return _prefill_bound(verdict, activation, current)
    spike = _memory_rise_share(verdict)
    oom = verdict.engine_death is not None and verdict.engine_death.real_oom
    if not oom and (spike is None or spike <= SPIKE_SHARE):
        return Setting(flag, None, current, "no transient memory spike was seen")
    cause = "a CUDA OOM" if oom else f"device memory rising {spike:.1%} of the device during the run"
    why = f"{cause} points at transient prefill activations; smaller prefill chunks lower that peak"
    if current is None:  # vLLM does not export it: no number that might raise the server's value
        return Setting(flag, None, None, f"{why}; {BATCHED_TOKENS_UNKNOWN}", action=BATCHED_TOKENS_ACTION)
    value = int(math.ceil(max(MIN_BATCHED_TOKENS, current // 2) / 256) * 256)
    if value >= current:
        return Setting(flag, None, current, f"already at {current}; shrink prefill chunks no further")
    return Setting(flag, value, current, why)


def _prefill_bound(verdict: Verdict, death: EngineDeath, current: int | None) -> Setting:
    """An activation peak killed the engine: bound the prefill batch below what the last safe level
    prefilled at once (module docstring, ``max_num_batched_tokens``)."""
    flag = "--max-num-batched-tokens"
    cause = death.cause.sentence if death.cause is not None else "an allocation failed"
    where = "" if death.concurrency is None else f" {_at(verdict, death.concurrency, death.step)}"
    advice = prefill_advice(verdict, death, current)
    return Setting(flag, advice.value, current, f"{cause}{where}: {advice.body}", action=advice.action)


def _death_step(verdict: Verdict, index: int) -> bool:
    death = verdict.engine_death
    return death is not None and death.step == index


def _memory_rise_share(verdict: Verdict) -> float | None:
    """How far used device memory rose above the first step's level, as a share of the device."""
    steps = [s for s in verdict.steps if s.device_used_max_bytes is not None and s.device_total_bytes]
    if len(steps) < 2:
        return None
    base = steps[0].device_used_max_bytes or 0
    total = steps[0].device_total_bytes or 1
    return max((s.device_used_max_bytes or 0) - base for s in steps) / total


def _reasoning(
    verdict: Verdict,
    mml: Setting,
    advice: MaxModelLenAdvice | None,
    seqs: Setting,
    util: Setting,
    batched: Setting,
) -> str:
    sentences = []
    onset = verdict.preemption_onset
    death = verdict.engine_death
    if death is not None and death.concurrency is not None:
        if death.cause is not None and death.cause.kind is not DeathKind.NO_CAUSE:
            kind = f"an engine death ({death.cause.sentence})"
        else:
            kind = "a CUDA OOM" if death.real_oom else "an engine death"
        sentences.append(f"The server hit {kind} {_at(verdict, death.concurrency, death.step)}.")
    memory = host_memory_advice(verdict)
    if onset is not None:
        kv = None if onset.kv_usage_max is None else kv_peak_text(onset.kv_usage_max)
        sentences.append(f"KV-cache preemption began {_at(verdict, onset.concurrency, onset.step, kv)}.")
    elif death is None and verdict.requests_total and not verdict.requests_ok:
        sentences.append("No request succeeded, so nothing about KV memory was measured.")
    elif death is None and verdict.run.open_loop:
        held = [s for s in verdict.measured_steps if s.requests]
        if held:
            busiest = max(held, key=lambda s: s.achieved_concurrency or 0.0)
            at = _at(verdict, busiest.concurrency, busiest.index)
            failed = verdict.first_unsafe_concurrency is not None
            sentences.append(
                f"No preemption {at}, but requests failed." if failed else f"No preemption or failure {at}."
            )
    elif death is None and verdict.max_tested_concurrency is not None:
        top, unsafe = verdict.max_tested_concurrency, verdict.first_unsafe_concurrency
        judged, sporadic = verdict.preemption_judged_up_to, verdict.preempted_levels
        if sporadic:
            sentences.append(
                f"Preemption was sporadic ({sporadic[0].preempted_text}): no onset, and not safe."
            )
        elif unsafe is not None:
            sentences.append(f"No preemption, but requests failed from concurrency {unsafe}.")
        elif judged is None:
            sentences.append(f"No failed request up to concurrency {top}; preemption was not judged.")
        elif judged == top:
            sentences.append(f"No preemption or failure up to concurrency {top}.")
        else:
            sentences.append(
                f"No preemption up to {judged} (not judged above it), and no failure up to concurrency {top}."
            )
    if advice is not None and advice.capped_by_kv_cache:
        sentences.append(_capitalize(mml.reason) + ".")
    elif mml.value is not None and advice is not None:
        freed = ""
        if advice.freed_concurrency is not None:
            freed = (
                " (vLLM's maximum concurrency for full-length requests: "
                f"{advice.current_max_concurrency:.1f}x → {advice.max_concurrency:.1f}x)"
            )
        sentences.append(
            f"Capping max_model_len at {mml.value} covers the trace's P99 "
            f"({int(advice.basis_tokens)} tokens) "
            f"while refusing {advice.refused_share:.2%} of requests{freed}. It bounds the longest request, "
            "not preemption: vLLM takes KV blocks for the tokens a request holds, not for max_model_len, "
            "so the onset moves only by the requests it refuses."
        )
    unrepresentative = _unrepresentative_mix(verdict)
    if unrepresentative is not None:
        sentences.append(f"No max_num_seqs advice: {unrepresentative}.")
    if seqs.value is not None:
        sentences.append(f"Limit max_num_seqs to the last safe concurrency, {seqs.value}.")
    elif seqs.action is not None:  # no level proved a cap, only because requests queued
        sentences.append(_capitalize(seqs.reason) + ".")
    elif (
        unrepresentative is None
        and _broke(verdict)
        and _capped_at_or_below(verdict, verdict.last_safe_concurrency)
    ):  # the cap _max_num_seqs declined: the server's own is no higher
        sentences.append(
            f"The server already runs at most {seqs.current} sequences at once: a max_num_seqs cap would "
            "not lower what broke."
        )
    death_now = activation_death(verdict)  # its prefill bound, a number or in words, comes first
    activation = death_now is not None and (batched.value is not None or batched.action is not None)
    extra = [s.reason for s in (util, batched) if s.value is not None and not (activation and s is batched)]
    if extra:
        sentences.append(_capitalize("; ".join(extra)) + ".")
    if memory is not None:
        sentences.insert(1, memory)
    if activation and death_now is not None:  # the first thing to change: right after what happened
        current = None if batched.current is None else int(batched.current)
        sentences.insert(1, _capitalize(prefill_advice(verdict, death_now, current).body) + ".")
    return " ".join(sentences[:5]) if sentences else "Nothing was measured; no recommendation."


def _at(verdict: Verdict, concurrency: int, step_index: int | None, also: str | None = None) -> str:
    """Where something happened, with ``also`` in brackets: ``at concurrency 8 (also)``, or in an open loop,
    whose level only capped the arrivals' requests in flight, ``in the open loop (cap 16, 0.9 in flight on
    average; also)``."""
    if not verdict.run.open_loop:
        return f"at concurrency {concurrency}" + ("" if also is None else f" ({also})")
    step = next((s for s in verdict.steps if s.index == step_index), None)
    mean = step.achieved_concurrency if step is not None else None
    parts = [f"cap {concurrency}" + ("" if mean is None else f", {mean:.1f} in flight on average"), also]
    return f"in the open loop ({'; '.join(p for p in parts if p is not None)})"


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]
