"""Of what a vLLM server died at runtime: its log, its exit status and its memory, classified (pure).

A dead engine's responses never carry the cause ("EngineCore encountered an issue. See stack trace
(above) for the root cause."); the server's log does (``oomload.verdict.deathlog`` finds the root-cause
line and keeps consequences, quiet lines and start-up text out), and so do its exit status and its
memory (reference ``oom-kinds.md``). ``classify_death`` reads all three; the first rule that holds wins:

==============  ===========================================================================================
kind            the rule, and why it stands where it does
==============  ===========================================================================================
``cuda_oom``    the log's root cause is the CUDA allocator's failure ("CUDA out of memory. Tried to
                allocate …", ``torch.OutOfMemoryError``, …), or, when the log has none, a request's error
                holds it. The allocator names the failed allocation itself: nothing is more direct, and
                whatever follows (a dead engine, NCCL errors in the other ranks, exit statuses, a cgroup
                counter) is its consequence. At runtime the engine's pool is preallocated, so this is an
                activation / temporary peak.
``cpu_oom``     the same for host memory: "DefaultCPUAllocator: can't allocate memory: you tried to
                allocate N bytes", or a ``MemoryError``.
``oom_killed``  the kernel or the container's cgroup killed a server process: the cgroup's ``oom_kill``
                counter rose during the run; or the log holds the kernel's line ("Out of memory: Killed
                process", "OOMKilled"); or a SIGKILL (the exit status -9 / 137, a worker's logged exit
                code -9, a shell's "Killed") came with memory at ≥ ``AT_LIMIT_SHARE`` of a known limit in
                the last ``LAST_SAMPLES`` samples (or ``memory.peak`` rising there) — unless the
                ``oom_kill`` counter was read after the death and had not risen: a cgroup's memory
                counts its page cache, so a container that read its weights sits near its limit, and
                a SIGKILL then is someone else's (``killed``, the counter in its evidence). A kill leaves no
                traceback: what the survivors print (EOFError, NCCL errors) follows from it, so this
                stands above ``crash``.
``crash``       the log's root cause is another one (an NCCL error, a segfault, "Fatal Python error", the
                first exception after vLLM's fatal header), quoted; else a worker that died with a plain
                exit code ("Worker proc … died unexpectedly (exit code: 1)"); else an exit status (or a
                worker's exit code) of SIGSEGV, SIGABRT, SIGBUS, SIGILL or SIGFPE.
``killed``      a SIGKILL, SIGTERM, SIGINT or SIGHUP (the exit status, a worker's logged exit code, a
                shell's "Killed") with no memory evidence: someone or something outside stopped it.
``no_cause``    the engine died and nothing above says why; ``basis`` says what was missing.
==============  ===========================================================================================

``exit_status`` is the status of a server that ended by itself (Popen's convention, negative for a
signal; a shell's 128 + N is read as signal N and kept as −N): a status that oomload's own stop caused
says nothing and must not be passed. ``memory`` is the server's ``server_memory.jsonl`` samples; the
cgroup's ``oom_kill`` counter counts only when it rose between them (a kill before the run is not the
run's). The evidence lists every piece found, one sentence each, whichever rule decided.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypedDict

from oomload.rundir.records import as_int, as_str
from oomload.rundir.servermemory import ServerMemoryRow
from oomload.verdict.deathlog import allocation, allocator_failure, death_excerpt, quote, read_death_log

__all__ = ["DeathCause", "DeathCauseJson", "DeathKind", "classify_death", "death_excerpt", "exit_signal"]

AT_LIMIT_SHARE = 0.95  # memory this close to its limit, at a SIGKILL, is the kernel's doing
LAST_SAMPLES = 3  # the samples that count as "at the last sample(s)"
KILL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})


class DeathKind(StrEnum):
    """Of what the engine died (module docstring)."""

    CUDA_OOM = "cuda_oom"
    CPU_OOM = "cpu_oom"
    OOM_KILLED = "oom_killed"
    KILLED = "killed"
    CRASH = "crash"
    NO_CAUSE = "no_cause"

    @property
    def memory(self) -> bool:
        """True for the kinds that are memory deaths (advice about memory applies)."""
        return self in (DeathKind.CUDA_OOM, DeathKind.CPU_OOM, DeathKind.OOM_KILLED)


class DeathCauseJson(TypedDict):
    """``DeathCause.to_json()``: ``memory`` and ``sentence`` are derived, for readers without Python."""

    kind: str
    memory: bool
    sentence: str
    tried_bytes: int | None
    free_bytes: int | None
    total_bytes: int | None
    in_use_bytes: int | None
    limit_bytes: int | None
    peak_bytes: int | None
    exit_status: int | None
    quote: str | None
    basis: str | None
    evidence: list[str]


@dataclass(frozen=True, slots=True)
class DeathCause:
    """The kind of a death, the numbers its evidence carries, and one sentence per piece of evidence."""

    kind: DeathKind
    tried_bytes: int | None = None  # what the failed allocation asked for
    free_bytes: int | None = None  # CUDA: what the device had free then
    total_bytes: int | None = None  # CUDA: the device's capacity
    in_use_bytes: int | None = None  # CUDA: what the dying process held ("this process has X in use")
    limit_bytes: int | None = None  # the server's cgroup memory limit
    peak_bytes: int | None = None  # the most memory the server's samples saw in use
    exit_status: int | None = None  # Popen convention: negative = killed by that signal
    quote: str | None = None  # the root-cause line, without log prefixes, ≤ MAX_QUOTE_CHARS
    basis: str | None = None  # what decided the kind, in a few words ("cgroup oom_kill rose", "SIGKILL")
    evidence: tuple[str, ...] = ()

    @property
    def memory(self) -> bool:
        return self.kind.memory

    @property
    def sentence(self) -> str:
        """The death line's cause: "an activation peak: CUDA could not allocate 2.0 GiB (…)"."""
        if self.kind is DeathKind.CUDA_OOM:
            if self.tried_bytes is None:
                return "an activation peak: CUDA out of memory"
            free = ""
            if self.free_bytes is not None and self.total_bytes is not None:
                free = f" ({format_bytes(self.free_bytes)} of {format_bytes(self.total_bytes)} free)"
            return f"an activation peak: CUDA could not allocate {format_bytes(self.tried_bytes)}{free}"
        if self.kind is DeathKind.CPU_OOM:
            if self.tried_bytes is None:
                said = f" ({self.quote})" if self.quote else ""
                return f"an activation peak: host memory ran out{said}"
            return (
                f"an activation peak: the CPU allocator could not allocate {format_bytes(self.tried_bytes)}"
            )
        if self.kind is DeathKind.OOM_KILLED:
            parts = [self.basis or "the kernel's OOM kill"]
            if self.peak_bytes is not None and self.limit_bytes is not None:
                parts.append(format_pair(self.peak_bytes, self.limit_bytes))
            return f"killed by the kernel's OOM killer ({'; '.join(parts)})"
        if self.kind is DeathKind.KILLED:
            if any(e.startswith("cgroup oom_kill stayed") for e in self.evidence):
                return (
                    f"killed from outside by {self.basis or 'a signal'}: the cgroup's OOM killer did not fire"
                )
            return f"killed from outside by {self.basis or 'a signal'}, with no memory evidence"
        if self.kind is DeathKind.CRASH:
            return f"a crash: {self.quote}" if self.quote else f"a crash: ended by {self.basis or 'a signal'}"
        return f"no cause found ({self.basis})" if self.basis else "no cause found"

    def to_json(self) -> DeathCauseJson:
        return {
            "kind": self.kind.value,
            "memory": self.memory,
            "sentence": self.sentence,
            "tried_bytes": self.tried_bytes,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "in_use_bytes": self.in_use_bytes,
            "limit_bytes": self.limit_bytes,
            "peak_bytes": self.peak_bytes,
            "exit_status": self.exit_status,
            "quote": self.quote,
            "basis": self.basis,
            "evidence": list(self.evidence),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> DeathCause | None:
        """``to_json()``'s output read back; ``None`` without a known ``kind``."""
        kind = next((k for k in DeathKind if k.value == obj.get("kind")), None)
        if kind is None:
            return None
        evidence = obj.get("evidence")
        return cls(
            kind=kind,
            tried_bytes=as_int(obj.get("tried_bytes")),
            free_bytes=as_int(obj.get("free_bytes")),
            total_bytes=as_int(obj.get("total_bytes")),
            in_use_bytes=as_int(obj.get("in_use_bytes")),
            limit_bytes=as_int(obj.get("limit_bytes")),
            peak_bytes=as_int(obj.get("peak_bytes")),
            exit_status=as_int(obj.get("exit_status")),
            quote=as_str(obj.get("quote")),
            basis=as_str(obj.get("basis")),
            evidence=tuple(str(e) for e in evidence) if isinstance(evidence, list) else (),
        )


# --- memory and exit status -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _MemoryFacts:
    limit_bytes: int | None = None
    peak_bytes: int | None = None
    oom_kills: tuple[int, int] | None = None  # the cgroup's oom_kill counter: first and last seen
    kills_read_after_death: bool = False  # the counter was read in a sample after the server died
    at_limit: str | None = None  # a sentence when memory was at its limit at the end


def _memory_facts(rows: Sequence[ServerMemoryRow]) -> _MemoryFacts:
    limits = [r.cgroup_limit_bytes for r in rows if r.cgroup_limit_bytes is not None]
    limit = limits[-1] if limits else None
    used = [r.used_bytes for r in rows if r.used_bytes is not None]
    peaks = [r.cgroup_peak_bytes for r in rows if r.cgroup_peak_bytes is not None]
    peak_rose = len(peaks) > 1 and peaks[-1] > peaks[0]  # memory.peak from before the run is not the run's
    peak = max([*used, *(peaks[-1:] if peak_rose else [])], default=None)
    kills = [r.cgroup_oom_kill for r in rows if r.cgroup_oom_kill is not None]
    oom_kills = (kills[0], max(kills)) if kills else None
    at_limit = None
    if limit:
        alive = [r for r in rows if r.alive and r.used_bytes is not None] or [
            r for r in rows if r.used_bytes is not None
        ]
        last = max((r.used_bytes or 0 for r in alive[-LAST_SAMPLES:]), default=None)
        if last is not None and last >= AT_LIMIT_SHARE * limit:
            at_limit = f"memory {format_bytes(last)} of its {format_bytes(limit)} limit at the last sample"
        elif peak_rose and peaks[-1] >= AT_LIMIT_SHARE * limit:
            at_limit = (
                f"cgroup memory.peak rose to {format_bytes(peaks[-1])} of its {format_bytes(limit)} limit"
            )
    after = any(not r.alive and r.cgroup_oom_kill is not None for r in rows)
    return _MemoryFacts(limit, peak, oom_kills, kills_read_after_death=after, at_limit=at_limit)


def exit_signal(status: int | None) -> signal.Signals | None:
    """The signal that ended a process: Popen's ``-N``, or a shell's ``128 + N``; ``None`` otherwise."""
    if status is None:
        return None
    number = -status if status < 0 else status - 128 if 128 < status <= 128 + 64 else None
    try:
        return None if number is None else signal.Signals(number)
    except ValueError:
        return None


# --- the classifier -------------------------------------------------------------------------------------
def classify_death(
    *,
    log_text: str | None,
    exit_status: int | None,
    memory: Sequence[ServerMemoryRow],
    request_errors: Sequence[str] = (),
) -> DeathCause:
    """Of what the engine died, from all the evidence (module docstring for the rules)."""
    found = read_death_log(log_text or "")
    facts = _memory_facts(memory)
    sig = exit_signal(exit_status)
    worker = found.worker_exit
    worker_sig = None if worker is None else exit_signal(worker.code)
    allocator = found.line if found.sign in ("cuda_oom", "cpu_oom") else None
    from_request = None
    if allocator is None:
        from_request = next((e for e in request_errors if allocator_failure(e) is not None), None)
    kills = (
        facts.oom_kills if facts.oom_kills is not None and facts.oom_kills[1] > facts.oom_kills[0] else None
    )

    evidence = [] if found.quote is None else [f"the log: {found.quote}"]
    if from_request is not None:
        evidence.append(f"a request's error: {quote(from_request)}")
    if exit_status is not None:
        evidence.append(f"exit status {exit_status}" + (f" ({sig.name})" if sig is not None else ""))
    if worker is not None:
        named = f" ({worker_sig.name})" if worker_sig is not None else ""
        evidence.append(f"worker {worker.name} exit code {worker.code}{named}")
    shell_sig = signal.SIGKILL if found.shell_killed is not None else None
    if shell_sig is not None:
        evidence.append("the log: a shell's 'Killed' (its child died of SIGKILL)")
    if kills is not None:
        evidence.append(f"cgroup oom_kill {kills[0]} → {kills[1]}")
    no_kill = facts.kills_read_after_death and kills is None and facts.oom_kills is not None
    if no_kill and facts.oom_kills is not None:
        evidence.append(f"cgroup oom_kill stayed at {facts.oom_kills[1]} after the death")
    if facts.at_limit is not None:
        evidence.append(facts.at_limit)
    elif facts.peak_bytes is not None:
        limit = (
            f"of its {format_bytes(facts.limit_bytes)} limit" if facts.limit_bytes else "with no limit known"
        )
        evidence.append(f"memory peaked at {format_bytes(facts.peak_bytes)} {limit}")
    base = DeathCause(
        DeathKind.NO_CAUSE,
        limit_bytes=facts.limit_bytes,
        peak_bytes=facts.peak_bytes,
        exit_status=None if exit_status is None else -int(sig) if sig is not None else exit_status,
    )

    def cause(kind: DeathKind, basis: str, text: str | None = None) -> DeathCause:
        return replace(base, kind=kind, quote=text, basis=basis, evidence=tuple(evidence))

    source = allocator.message if allocator is not None else from_request
    if source is not None:
        kind = DeathKind.CUDA_OOM if allocator_failure(source) == "cuda_oom" else DeathKind.CPU_OOM
        size = allocation(source)
        basis = "the allocator's failure in the log" if allocator is not None else "a request's error"
        return replace(
            cause(kind, basis, quote(source)),
            tried_bytes=size.tried_bytes,
            free_bytes=size.free_bytes,
            total_bytes=size.total_bytes,
            in_use_bytes=size.in_use_bytes,
        )
    killer = next((s for s in (sig, worker_sig, shell_sig) if s is not None and s in KILL_SIGNALS), None)
    if kills is not None:
        return cause(DeathKind.OOM_KILLED, "cgroup oom_kill rose")
    if found.sign == "kernel_kill":
        return cause(DeathKind.OOM_KILLED, "the kernel's line in the log", found.quote)
    if killer is signal.SIGKILL and facts.at_limit is not None and not no_kill:
        return cause(DeathKind.OOM_KILLED, "SIGKILL at the memory limit")
    if found.sign == "crash":
        return cause(DeathKind.CRASH, "the log's root cause", found.quote)
    if worker is not None and worker_sig is None and worker.code != 0:
        return cause(DeathKind.CRASH, "a worker's exit code", quote(worker.line.message))
    if sig is not None and sig in CRASH_SIGNALS:
        return cause(DeathKind.CRASH, sig.name)
    if worker is not None and worker_sig is not None and worker_sig in CRASH_SIGNALS:
        return cause(DeathKind.CRASH, f"{worker_sig.name} (worker {worker.name})")
    if killer is not None:
        whose = "" if killer is sig else " (a worker)" if killer is worker_sig else " (the shell's 'Killed')"
        return cause(DeathKind.KILLED, killer.name + whose)
    if found.consequences:
        shown = "; ".join(found.consequences[:3])
        more = f" (and {len(found.consequences) - 3} more)" if len(found.consequences) > 3 else ""
        evidence.insert(0, f"the log shows only consequences: {shown}{more}")
    missing = [
        "the log names no cause" if found.lines else "no server log",
        f"exit status {exit_status}" if exit_status is not None else "no exit status",
        "memory below its limit" if facts.limit_bytes else "no memory limit known",
    ]
    return cause(DeathKind.NO_CAUSE, "; ".join(missing))


def format_bytes(n: int | None) -> str:
    """``57346048`` → ``"54.7 MiB"`` (binary units, one decimal)."""
    if n is None:
        return "?"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def format_pair(used: int, limit: int) -> str:
    """``"2.0 of 2.0 GiB"``: both in the limit's unit."""
    unit, size = next(((u, s) for u, s in (("GiB", 1024**3), ("MiB", 1024**2)) if limit >= s), ("KiB", 1024))
    return f"{used / size:.1f} of {limit / size:.1f} {unit}"
