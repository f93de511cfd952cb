"""Engine death: when the server died, the evidence, and which requests died with it (pure).

Evidence that the engine died (any one is enough):

* ``engine_dead`` request outcomes, or CUDA OOM text in a request's error;
* ``server_dead`` events, a step or the run (``status.json``) ending with reason ``server_dead``;
* the server's process vanishing from the GPU samples — the largest GPU process, when it is the
  server's own root pid (``server_memory.jsonl``) or was the only process listed on its device(s):
  on a GPU shared with another job the largest process may be the other job's, so there its vanishing
  is only supporting evidence, listed once a death is established — or the server's root process gone
  from the host-memory samples (``server_memory.jsonl``: ``alive`` false after true).

``health_failed`` events alone are not enough (the runner writes one for every failed probe, a busy
server fails one now and then); once a death is established they are listed as supporting evidence.
``real_oom`` is true only when a request's error carried an allocator's words. The death's *kind*
comes from all the evidence — the server's log, its exit status, its memory series and cgroup
counters, the requests' errors — through ``oomload.verdict.deathcause.classify_death``
(``EngineDeath.cause``); ``memory`` is true for the memory kinds (a CUDA or CPU allocation that
failed, the kernel's OOM kill) or OOM text in a request.

Casualties. When the server dies, the requests in flight at that moment end as ``transport_error``
(reset / closed), ``truncated`` (the stream broke), ``engine_dead`` or, when nothing ever answers,
``timeout``. They failed because of the death, not independently. Let ``T_e`` be the time of the
earliest evidence above and ``T_ok`` the end of the last ``ok`` request that ended at or before
``T_e`` (−∞ when there is none). A request is a casualty when

    outcome ∈ {engine_dead, transport_error, truncated, timeout}  and  start ≤ T_e  and  end ≥ T_ok

— it was sent before the death was evident and failed after the server last answered. The death
*moment* ``T_d`` is the earliest of ``T_e``, the first casualty's end and the first ``health_failed``
event at or after ``T_ok``: in-flight requests break a little before a health probe notices. The death
step is the step whose window holds ``T_d`` (latest start ≤ ``T_d``); steps that start after ``T_d``
measured a dead server.

The verdict charges casualties to the death step only: one that started in an earlier step does not
count against that step's error rate or safety (``oomload.verdict.stepfacts``), and a casualty's
``transport_error`` is not reported as a client transport problem. The death finding says how many
requests in flight failed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oomload.outcome import Outcome, RequestResult
from oomload.rundir.records import EventRow, GpuSampleRow, StepBoundary
from oomload.verdict.deathcause import DeathCause, DeathKind, classify_death
from oomload.verdict.runview import RunView

OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda oom", "cuda error: out of memory")
CASUALTY_OUTCOMES = frozenset(
    {Outcome.ENGINE_DEAD, Outcome.TRANSPORT_ERROR, Outcome.TRUNCATED, Outcome.TIMEOUT}
)
MAX_EVIDENCE = 12


@dataclass(frozen=True, slots=True)
class EngineDeath:
    step: int | None
    concurrency: int | None
    t_unix_s: float | None  # the death moment T_d (module docstring); None when only the run's end says so
    real_oom: bool
    evidence: tuple[str, ...]
    casualties: int = 0  # requests in flight that failed because of the death
    casualty_outcomes: Mapping[str, int] = field(default_factory=dict)
    casualty_ids: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    cause: DeathCause | None = None  # what killed it, from all the evidence (oomload.verdict.deathcause)

    @property
    def memory(self) -> bool:
        """A memory death: its cause is one of the memory kinds, or a request carried an allocator's words."""
        return self.real_oom or (self.cause is not None and self.cause.memory)

    @property
    def kind(self) -> DeathKind | None:
        return None if self.cause is None else self.cause.kind

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "concurrency": self.concurrency,
            "t_unix_s": self.t_unix_s,
            "real_oom": self.real_oom,
            "memory": self.memory,
            "kind": None if self.cause is None else self.cause.kind.value,
            "cause": None if self.cause is None else self.cause.to_json(),
            "evidence": list(self.evidence),
            "casualties": self.casualties,
            "casualty_outcomes": dict(self.casualty_outcomes),
        }

    @property
    def casualty_text(self) -> str | None:
        return casualty_text(self.casualties, self.casualty_outcomes)


def detect_engine_death(view: RunView) -> EngineDeath | None:
    """The engine death of a run with its evidence and casualties, or ``None`` (module docstring)."""
    vanished = _vanished_process(view.gpu, _server_pids(view))
    found, real_oom = _primary_evidence(view, vanished)
    if not found:
        return None
    t_evident = min(t for t, _ in found)
    t_last_ok = max(
        (r.end_unix_s for r in view.requests if r.outcome is Outcome.OK and r.end_unix_s <= t_evident),
        default=-math.inf,
    )
    casualties = [
        r
        for r in view.requests
        if r.outcome in CASUALTY_OUTCOMES and r.start_unix_s <= t_evident and r.end_unix_s >= t_last_ok
    ]
    health = [
        (e.t_unix_s, f"health_failed event{_detail(e)}")
        for e in view.events
        if e.kind == "health_failed" and e.t_unix_s >= t_last_ok
    ]
    moment = min([t_evident, *(r.end_unix_s for r in casualties), *(t for t, _ in health)])
    outcomes = dict(Counter(r.outcome.value for r in casualties))
    # another job's process may be the largest: then its vanishing only supports a death found otherwise
    support = [] if vanished is None or vanished.known else [(vanished.t_unix_s, vanished.text)]
    lines = sorted([*found, *health[:3], *support], key=lambda item: item[0])
    evidence = tuple(dict.fromkeys(text for _, text in lines))
    summary = casualty_text(len(casualties), outcomes)
    if summary is not None:
        evidence = (*evidence, summary)
    if len(evidence) > MAX_EVIDENCE:
        evidence = (*evidence[: MAX_EVIDENCE - 1], f"… and {len(evidence) - MAX_EVIDENCE + 1} more")
    boundary = step_at([s.boundary for s in view.steps], moment)
    cause = classify_death(
        log_text=view.server_log,
        exit_status=view.server_exit_status,
        memory=view.server_memory,
        request_errors=[r.error for r in view.requests if r.error and r.outcome in CASUALTY_OUTCOMES],
    )
    return EngineDeath(
        step=None if boundary is None else boundary.index,
        concurrency=None if boundary is None else boundary.concurrency,
        t_unix_s=None if math.isinf(moment) else moment,
        real_oom=real_oom,
        evidence=evidence,
        casualties=len(casualties),
        casualty_outcomes=outcomes,
        casualty_ids=frozenset(r.request_id for r in casualties),
        cause=cause,
    )


def casualty_text(count: int, outcomes: Mapping[str, int]) -> str | None:
    """ "N request(s) in flight failed with it (transport_error 3, …)"; ``None`` for none."""
    if not count:
        return None
    parts = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    return f"{count} request(s) in flight failed with it ({parts})"


def step_at(boundaries: Sequence[StepBoundary], t: float) -> StepBoundary | None:
    """The step whose window holds ``t`` (latest start ≤ t; the first step for earlier times)."""
    if not boundaries:
        return None
    if math.isinf(t):
        return max(boundaries, key=lambda b: b.start_unix_s)
    started = [b for b in boundaries if b.start_unix_s <= t]
    return max(started, key=lambda b: b.start_unix_s) if started else boundaries[0]


def _primary_evidence(view: RunView, vanished: _Vanished | None) -> tuple[list[tuple[float, str]], bool]:
    """(time, sentence) of every sufficient piece of evidence, and whether OOM text was seen."""
    found: list[tuple[float, str]] = []
    groups: dict[str, list[RequestResult]] = {}
    real_oom = False
    for r in view.requests:
        is_oom = _is_oom(r.error or "")
        real_oom = real_oom or is_oom
        if r.outcome is Outcome.ENGINE_DEAD or is_oom:
            http = f" (HTTP {r.http_status})" if r.http_status else ""
            groups.setdefault(f"{r.outcome.value}{http}{': ' + r.error if r.error else ''}", []).append(r)
    for what, rs in groups.items():
        first = min(rs, key=lambda r: r.end_unix_s)
        found.append((first.end_unix_s, f"{len(rs)} request(s) ended {what} (first: {first.request_id})"))
    for e in view.events:
        real_oom = real_oom or _is_oom(_detail(e))
        if e.kind == "server_dead":
            found.append((e.t_unix_s, f"server_dead event{_detail(e)}"))
    for step in view.steps:
        b = step.boundary
        if b.end_reason == "server_dead" and b.end_unix_s is not None:
            found.append((b.end_unix_s, f"step {b.index} ended with reason server_dead"))
    status = view.status
    if status is not None and status.end_reason == "server_dead":
        t = status.ended_unix_s
        found.append((math.inf if t is None else t, "run ended with reason server_dead"))
    if vanished is not None and vanished.known:
        found.append((vanished.t_unix_s, vanished.text))
    gone = _server_gone(view)
    if gone is not None:
        found.append(gone)
    return found, real_oom


def _server_gone(view: RunView) -> tuple[float, str] | None:
    """The server's root process gone from the host-memory samples, after a sample that saw it alive."""
    seen_alive = False
    for row in view.server_memory:
        if row.alive:
            seen_alive = True
        elif seen_alive:
            who = "" if row.pid is None else f" (pid {row.pid})"
            return row.t_unix_s, f"the server's process{who} is gone (host memory samples)"
    return None


@dataclass(frozen=True, slots=True)
class _Vanished:
    t_unix_s: float
    text: str
    known: bool  # the process is the server's: its root pid, or alone on its device(s)


def _server_pids(view: RunView) -> set[int]:
    return {row.pid for row in view.server_memory if row.pid is not None}


def _vanished_process(gpu: Sequence[GpuSampleRow], server_pids: set[int]) -> _Vanished | None:
    """The biggest GPU process missing from a later sample of a device it was seen on, and whether it
    is known to be the server's (one of ``server_pids``, or the only process its devices listed).

    Only a sample that listed its device's processes counts: ``processes: null`` (the source could
    not tell: a DCGM exporter, NVML refusing the query once) is no evidence, and neither is a device
    the server never used (``--gpu all`` on a host where it holds one of several GPUs).
    """
    biggest: dict[int, int] = {}
    for g in gpu:
        for p in g.processes or ():
            if p.pid is not None:
                biggest[p.pid] = max(biggest.get(p.pid, 0), p.used_bytes or 0)
    if not biggest:
        return None
    server_pid = max(biggest, key=lambda pid: biggest[pid])
    devices: set[int | None] = set()  # where the server was seen
    alone = True  # no other process listed beside it while it was seen
    for g in gpu:
        if g.processes is None:
            continue
        pids = {p.pid for p in g.processes}
        if server_pid in pids:
            devices.add(g.device)
            alone = alone and pids == {server_pid}
        elif g.device in devices:
            known = server_pid in server_pids or alone
            who = "server process" if known else "the largest GPU process,"
            text = f"{who} {server_pid} vanished from the GPU samples (device {g.device})"
            return _Vanished(g.t_unix_s, text, known)
    return None


def _detail(event: EventRow) -> str:
    text = " ".join(event.text).strip()
    return f": {text}" if text else ""


def _is_oom(text: str) -> bool:
    lowered = text.lower()
    return any(m in lowered for m in OOM_MARKERS)
