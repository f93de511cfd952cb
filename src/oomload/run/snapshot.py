"""What the web UI shows of a run as it goes: typed values, JSON only at the HTTP edge.

The session builds a ``TelemetrySnapshot`` from what it already holds (it only reads the latest
samples, never scrapes): the plan and where the run is in it (``PlanState``), the current step (a
``StepPlan``), the client's achieved concurrency, the latest ``/metrics`` record and GPU sample, the
outcomes so far, the server's death, the TTFT figures of the live feed (``TtftFigures``) and, once the
run is over, the verdict's ``FinalState``. The web UI's tab rows read these values
(``oomload.run.webui.telemetry_rows``); ``to_json`` is the body of ``GET /oomload/telemetry``.

The ``/metrics`` record and the GPU sample are kept as the records the poller and the sampler write to
``metrics.jsonl`` and ``gpu.jsonl`` (the run directory's format is the edge): they are served as they
are, and read through ``rundir.records`` (``MetricsRow``, ``GpuSampleRow``) where a value is shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from oomload.capacity.schedule import StepPlan
from oomload.rundir.records import GpuSampleRow, MetricsRow
from oomload.rundir.servermemory import ServerMemoryRow
from oomload.trace.stats import percentile


@dataclass(frozen=True, slots=True)
class PlanState:
    """The schedule and where the run is in it: ``state`` is ``starting``, ``running``, ``draining`` (a
    lower step waits for the requests in flight to fall to its level, ``draining_to``), ``finishing``
    (the schedule is done, the last requests drain) or ``over``."""

    levels: tuple[int, ...] = ()
    hold_s: float | None = None
    min_requests: int | None = None
    warmup: bool = False
    refine: bool = False
    planned_steps: int | None = None
    open_loop: bool = False
    step_number: int | None = None  # the current step's number from 1
    step_left_s: float | None = None  # of the current step's hold, while running
    draining_to: int | None = None
    state: str = "starting"

    def to_json(self) -> dict[str, Any]:
        return {
            "levels": list(self.levels),
            "hold_s": self.hold_s,
            "min_requests": self.min_requests,
            "warmup": self.warmup,
            "refine": self.refine,
            "planned_steps": self.planned_steps,
            "open_loop": self.open_loop,
            "step_number": self.step_number,
            "step_left_s": self.step_left_s,
            "draining_to": self.draining_to,
            "state": self.state,
        }


@dataclass(frozen=True, slots=True)
class LatencyFigures:
    """Nearest-rank P50/P99 (ms) over ``n`` ok requests (``None`` without any)."""

    n: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> LatencyFigures:
        if not values_ms:
            return cls()
        return cls(len(values_ms), percentile(values_ms, 50), percentile(values_ms, 99))

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms}


@dataclass(frozen=True, slots=True)
class TtftFigures:
    """TTFT of the current step (``None``: no step yet) and of the whole run."""

    step: LatencyFigures | None
    run: LatencyFigures

    def to_json(self) -> dict[str, Any]:
        return {"step": None if self.step is None else self.step.to_json(), "run": self.run.to_json()}


@dataclass(frozen=True, slots=True)
class FinalState:
    """What the web UI shows once the run is over (``oomload.run.webui.final_state``): the findings,
    the ``vllm serve`` line and its settings, the onset and death times for the charts, whether
    ``report.html`` exists — or ``error`` when no verdict could be built."""

    exit_code: int
    run_dir: str
    report: bool
    error: str | None = None
    findings: tuple[Mapping[str, str], ...] = ()  # {"key", "label", "text", "severity"}
    flag_line: str | None = None
    reasoning: tuple[str, ...] = ()
    settings: tuple[Mapping[str, Any], ...] = ()  # {"flag", "recommended", "reason"}
    onset: Mapping[str, Any] | None = None  # {"concurrency", "t_unix_s", "step"}
    death: Mapping[str, Any] | None = None  # {"concurrency", "t_unix_s"}

    def to_json(self) -> dict[str, Any]:
        state: dict[str, Any] = {"exit_code": self.exit_code, "run_dir": self.run_dir, "report": self.report}
        if self.error is not None:
            state["error"] = self.error
            return state
        state.update(
            findings=[dict(f) for f in self.findings],
            flag_line=self.flag_line,
            reasoning=list(self.reasoning),
            settings=[dict(s) for s in self.settings],
            onset=None if self.onset is None else dict(self.onset),
            death=None if self.death is None else dict(self.death),
        )
        return state


@dataclass(frozen=True, slots=True)
class TelemetrySnapshot:
    """One look at the run for the web UI (module docstring)."""

    t_unix_s: float
    url: str | None = None
    model: str | None = None
    simulated: bool | None = None
    plan: PlanState = field(default_factory=PlanState)
    final: FinalState | None = None
    step: StepPlan | None = None
    achieved_concurrency: float | None = None  # the client's, in-process load only
    metrics: Mapping[str, Any] | None = None  # the latest ok ``metrics.jsonl`` record
    preemptions_since_start: int | None = None
    gpu: Mapping[str, Any] | None = None  # the latest ``gpu.jsonl`` sample
    server_memory: ServerMemoryRow | None = None  # the latest ``server_memory.jsonl`` sample
    outcomes: Mapping[str, int] = field(default_factory=dict)
    server_dead: str | None = None  # the evidence, once the server is dead
    ttft: TtftFigures | None = None

    @property
    def metrics_row(self) -> MetricsRow | None:
        return None if self.metrics is None else MetricsRow.from_json({"t_unix_s": 0.0, **self.metrics})

    @property
    def gpu_row(self) -> GpuSampleRow | None:
        return None if self.gpu is None else GpuSampleRow.from_json({"t_unix_s": 0.0, **self.gpu})

    def with_ttft(self, ttft: TtftFigures) -> TelemetrySnapshot:
        return replace(self, ttft=ttft)

    def to_json(self) -> dict[str, Any]:
        """The body of ``GET /oomload/telemetry`` (``rows`` is added by the web UI)."""
        step = self.step
        body: dict[str, Any] = {
            "t_unix_s": self.t_unix_s,
            "url": self.url,
            "model": self.model,
            "simulated": self.simulated,
            "plan": self.plan.to_json(),
            "final": None if self.final is None else self.final.to_json(),
            "step": None
            if step is None
            else {"index": step.index, "concurrency": step.concurrency, "phase": step.phase},
            "achieved_concurrency": self.achieved_concurrency,
            "metrics": None if self.metrics is None else dict(self.metrics),
            "preemptions_since_start": self.preemptions_since_start,
            "gpu": None if self.gpu is None else dict(self.gpu),
            "server_memory": None
            if self.server_memory is None
            else {
                "used_bytes": self.server_memory.used_bytes,
                "rss_bytes": self.server_memory.rss_bytes,
                "limit_bytes": self.server_memory.cgroup_limit_bytes,
                "oom_kill": self.server_memory.cgroup_oom_kill,
                "alive": self.server_memory.alive,
            },
            "outcomes": dict(self.outcomes),
            "server_dead": self.server_dead,
        }
        if self.ttft is not None:
            body["ttft"] = self.ttft.to_json()
        return body
