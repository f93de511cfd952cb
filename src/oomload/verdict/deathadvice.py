"""What an engine death asks of the serving flags: the numbers and words ``recommend`` gives them.

* ``activation_death`` — the death when its cause is an activation peak (``cuda_oom``, ``cpu_oom``): an
  allocation that failed at runtime, which a prefill bound answers;
* ``prefill_advice`` — that bound: a quarter (``PREFILL_SHARE``) of what the last clean level below the
  death prefilled at once (its concurrency × the trace's P99 prompt, within the server's own
  ``max_num_batched_tokens`` when known), on multiples of ``PREFILL_ROUND_TOKENS``, never below
  ``MIN_BATCHED_TOKENS``; without the server's value, in words only (a number above it would raise it);
* ``host_memory_advice`` — what a death of the server's host memory asks for, in words (the kernel's
  OOM kill: the container's limit; the CPU allocator: the process's data limit or the container's);
* ``not_memory_text`` — how a death that was not of memory reads in a reason (no flag answers it).
"""

from __future__ import annotations

from dataclasses import dataclass

from oomload.verdict.death import EngineDeath
from oomload.verdict.deathcause import DeathKind, format_bytes
from oomload.verdict.verdict import Verdict

MIN_BATCHED_TOKENS = 2048
PREFILL_ROUND_TOKENS = 256
PREFILL_SHARE = 0.25  # of what the last clean level prefilled at once (module docstring)
BATCHED_TOKENS_ACTION = "half the server's value, not below 2048"
BATCHED_TOKENS_UNKNOWN = (
    "vLLM does not export the server's value; its API server's default is 2048 on most GPUs, 8192 on "
    "H100/H200-class ones, 16384 on ≥ 160 GiB ones"
)


@dataclass(frozen=True, slots=True)
class PrefillAdvice:
    """The prefill bound: its number, why, and the bound in words when no number can be given."""

    value: int | None  # the flag's number: only when the server's own value is known and above it
    body: str  # why, in words that follow the death's own sentence
    action: str | None = None  # the bound in words, when the server's value is not known


def prefill_advice(verdict: Verdict, death: EngineDeath, current: int | None) -> PrefillAdvice:
    """The prefill bound and why. Without the server's own value (no cache config, serve line or start-up
    log said it) the bound is given in words only: a number above that value would raise it."""
    safe = level_below(verdict, death.concurrency)
    prompt = None if verdict.trace_prompt is None else verdict.trace_prompt.p99
    if safe is None or not prompt:
        body = "smaller prefill batches lower that peak (no clean level below it to size them from)"
        return PrefillAdvice(None, body, None if current is not None else BATCHED_TOKENS_ACTION)
    carried = int(safe * prompt) if current is None else min(current, int(safe * prompt))
    share = int(carried * PREFILL_SHARE)
    value = max(MIN_BATCHED_TOKENS, share // PREFILL_ROUND_TOKENS * PREFILL_ROUND_TOKENS)
    if current is not None and value >= current:
        return PrefillAdvice(
            None, f"the prefill batch is already at {current} tokens: cap max_num_seqs instead"
        )
    within = "" if current is None else f", within the server's {current}"
    bound = f"{value}" if current is not None else f"at most {value} and below the server's own value"
    body = (
        f"the prefill batch sizes that peak; concurrency {safe} prefilled up to {carried} tokens at once "
        f"({safe} × the trace's P99 prompt, {int(prompt)}{within}) and survived; a heap that grows "
        f"with the load's history leaves less, so bound it at a quarter of that, {bound}, before cutting "
        "max_num_seqs"
    )
    if current is not None:
        return PrefillAdvice(value, body)
    return PrefillAdvice(
        None, f"{body} ({BATCHED_TOKENS_UNKNOWN})", f"at most {value}, below the server's value"
    )


def activation_death(verdict: Verdict) -> EngineDeath | None:
    """The engine death, when its cause is an activation peak (an allocation that failed at runtime)."""
    death = verdict.engine_death
    if death is not None and death.kind in (DeathKind.CUDA_OOM, DeathKind.CPU_OOM):
        return death
    return None


def level_below(verdict: Verdict, concurrency: int | None) -> int | None:
    """The highest level measured below ``concurrency`` without an unsafe request (``None``: none)."""
    if concurrency is None:
        return None
    below = [
        s.concurrency
        for s in verdict.measured_steps
        if s.concurrency < concurrency and s.trusted and not s.unsafe_requests
    ]
    return max(below, default=None)


def host_memory_advice(verdict: Verdict) -> str | None:
    """What a death of the server's host memory asks for, in words (no ``vllm serve`` flag sets it)."""
    death = verdict.engine_death
    if death is None or death.cause is None:
        return None
    cause = death.cause
    if cause.kind is DeathKind.OOM_KILLED:
        peak = cause.peak_bytes or (
            None if verdict.server_memory is None else verdict.server_memory.peak_bytes
        )
        need = "" if peak is None else f"; the server used {format_bytes(peak)} at its peak"
        limit = "" if cause.limit_bytes is None else f" ({format_bytes(cause.limit_bytes)})"
        return (
            f"The kernel killed the server for memory: raise its container's memory limit{limit} above "
            f"the peak it needs with headroom{need}, or lower the concurrency it is given, and keep "
            "CPU-side caches (swap space, the CPU KV cache) inside the limit."
        )
    if cause.kind is DeathKind.CPU_OOM:
        memory = verdict.server_memory
        if memory is not None and memory.data_limit_text is not None:
            return (
                f"The server's host memory ran out under a per-process data limit ({memory.data_limit_text}; "
                "prlimit --data or ulimit -d): besides the prefill bound, raise that limit above what a "
                "process needs with headroom."
            )
        return (
            "The server's host memory ran out: besides the prefill bound, check the process or container "
            "limit it runs under."
        )
    return None


def not_memory_text(death: EngineDeath) -> str:
    """How a death that was not of memory reads in a reason."""
    if death.cause is None or death.kind is DeathKind.NO_CAUSE:
        return "of no known cause (give oomload the server's log: --serve or --server-log)"
    return death.cause.sentence
