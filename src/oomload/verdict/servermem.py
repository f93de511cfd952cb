"""The server's own memory over a run, summarised for the verdict (pure).

``server_memory.jsonl`` (``oomload.telemetry.hostsampler``) holds the server's host memory on the run's
clock: its process tree's RSS (and PSS) and its memory cgroup's usage, limit, peak and OOM-kill
counter. A sample's *used* memory is the usage of a memory cgroup with a limit (what a container's
OOM kill compares), else the tree's RSS: a cgroup without a limit is often a whole session's or
host's, shared with other processes (``ServerMemoryRow.used_bytes``).

``summarize_server_memory(view)`` gives ``ServerMemory``:

* the samples, the first and the peak used bytes, and the limit (the cgroup's, when it has one);
* a per-process data limit (``RLIMIT_DATA``: ``prlimit --data``, ``ulimit -d``), when a process of the
  tree has one: the smallest limit seen and the highest ``VmData`` a process near its limit reached
  (``data_limit_bytes``, ``data_peak_bytes``). It bounds each process apart, not the tree's sum, so
  it is stated beside the tree's peak, never as its limit;
* per measured step, the used bytes at its first sample and its peak (``StepMemory``), so the death
  line can say "the server's memory rose from 1.7 to 2.0 GiB of its 2.1 GiB limit over step 4";
* ``oom_kills``: how far the cgroup's ``oom_kill`` counter rose during the run (the kernel killed a
  process of the server's container for memory);
* ``problems``: each distinct sentence a sample carried about what could not be read.

No samples → ``None``: nothing is said about host memory (a remote server with no sampler beside it).

A soak (``--soak``: one level held for a long time) also gets ``soak_trends``: the trend of the
server's host memory and of each device's used memory over the held level, by
``oomload.verdict.trend.memory_trend`` (warm-up dropped, binned, an equivalence test against a
material rate: "growing" only when growth beyond the noise is also material, "levelled" when memory
rose and then stopped growing materially).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oomload.verdict.runview import RunView
from oomload.verdict.trend import MemoryTrend, memory_trend


@dataclass(frozen=True, slots=True)
class StepMemory:
    """The server's used memory during one step: at its first sample and at its peak."""

    step: int
    concurrency: int
    first_bytes: int
    peak_bytes: int
    samples: int


@dataclass(frozen=True, slots=True)
class ServerMemory:
    """The server's host memory over the run (module docstring)."""

    samples: int
    source: str | None
    first_bytes: int | None
    peak_bytes: int | None
    limit_bytes: int | None  # the memory cgroup's limit (None: no limit, or no cgroup read)
    oom_kills: int  # rise of the cgroup's oom_kill counter over the run
    by_step: tuple[StepMemory, ...] = ()
    problems: tuple[str, ...] = ()
    data_limit_bytes: int | None = None  # the smallest per-process RLIMIT_DATA seen (None: none)
    data_peak_bytes: int | None = None  # the highest VmData of a process under that limit

    @property
    def data_limit_text(self) -> str | None:
        """ "each process's data limit 1.2 GiB, the fullest at 1.2 GiB (98%)" (``None``: no limit)."""
        if self.data_limit_bytes is None:
            return None
        peak, limit = self.data_peak_bytes, self.data_limit_bytes
        fullest = (
            ""
            if peak is None
            else f", the fullest at {gib(peak)}" + (f" ({peak / limit:.0%})" if limit else "")
        )
        return f"each process's data limit {gib(self.data_limit_bytes)}{fullest}"

    def step(self, index: int) -> StepMemory | None:
        return next((s for s in self.by_step if s.step == index), None)

    def rise_text(self, index: int) -> str | None:
        """ "the server's memory rose from 1.7 to 2.0 GiB of its 2.1 GiB limit over step 4" (``None``
        when the step has no sample)."""
        step = self.step(index)
        if step is None:
            return None
        limit = "" if self.limit_bytes is None else f" of its {gib(self.limit_bytes)} limit"
        if gib(step.peak_bytes) == gib(step.first_bytes):  # no rise the figures could show
            return f"the server's memory stayed at {gib(step.first_bytes)}{limit} over step {index}"
        same_scale = (step.first_bytes >= 2**30) == (step.peak_bytes >= 2**30)
        return (
            f"the server's memory rose from {gib(step.first_bytes, unit=not same_scale)} to "
            f"{gib(step.peak_bytes)}{limit} over step {index}"
        )

    @property
    def summary_text(self) -> str:
        """One line for the report: the peak, the limit, the samples, OOM kills."""
        if self.peak_bytes is None:
            return f"{self.samples} samples, none readable" + _problems(self.problems)
        limit = "no cgroup limit" if self.limit_bytes is None else f"limit {gib(self.limit_bytes)}"
        if self.data_limit_text is not None:
            limit += f", {self.data_limit_text}"
        elif self.limit_bytes is None:
            limit = "no limit"
        kills = f"; the kernel's OOM killer fired {self.oom_kills}×" if self.oom_kills else ""
        first = "" if self.first_bytes is None else f"{gib(self.first_bytes)} at the start, "
        return f"{first}peak {gib(self.peak_bytes)} ({limit}; {self.samples} samples){kills}"

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "source": self.source,
            "first_bytes": self.first_bytes,
            "peak_bytes": self.peak_bytes,
            "limit_bytes": self.limit_bytes,
            "oom_kills": self.oom_kills,
            "data_limit_bytes": self.data_limit_bytes,
            "data_peak_bytes": self.data_peak_bytes,
            "by_step": [
                {
                    "step": s.step,
                    "concurrency": s.concurrency,
                    "first_bytes": s.first_bytes,
                    "peak_bytes": s.peak_bytes,
                    "samples": s.samples,
                }
                for s in self.by_step
            ],
            "problems": list(self.problems),
        }


def summarize_server_memory(view: RunView) -> ServerMemory | None:
    """The run's server memory (module docstring); ``None`` without samples."""
    rows = view.server_memory
    if not rows:
        return None
    used = [r.used_bytes for r in rows if r.used_bytes is not None]
    limits = [r.cgroup_limit_bytes for r in rows if r.cgroup_limit_bytes is not None]
    limited = [r for r in rows if r.data_limit_bytes is not None]
    by_step = []
    for step in view.steps:
        values = [r.used_bytes for r in step.server_memory if r.used_bytes is not None]
        if values:
            b = step.boundary
            by_step.append(StepMemory(b.index, b.concurrency, values[0], max(values), len(values)))
    return ServerMemory(
        samples=len(rows),
        source=next((r.source for r in rows if r.source), None),
        first_bytes=used[0] if used else None,
        peak_bytes=max(used) if used else None,
        limit_bytes=min(limits) if limits else None,
        oom_kills=_counter_rise([r.cgroup_oom_kill for r in rows]),
        by_step=tuple(by_step),
        problems=tuple(dict.fromkeys(r.error for r in rows if r.error)),
        data_limit_bytes=min((r.data_limit_bytes or 0 for r in limited), default=None),
        data_peak_bytes=max((r.data_bytes for r in limited if r.data_bytes is not None), default=None),
    )


def soak_trends(view: RunView) -> tuple[MemoryTrend, ...]:
    """A soak's memory trends (``--soak``: config.json ``soak_s``): the server's host memory and each
    device's used memory over the soak's steps, at the one level it held; ``()`` for other runs."""
    if view.settings.soak_s is None or not view.steps:
        return ()
    windows = [
        (s.window_start_unix_s, s.window_end_unix_s) for s in view.steps if s.boundary.phase != "warmup"
    ]
    if not windows:
        return ()
    lo, hi = windows[0][0], windows[-1][1]
    trends = []
    host = [r for r in view.server_memory if lo <= r.t_unix_s <= hi and r.alive and r.used_bytes is not None]
    if host:
        limits = [r.cgroup_limit_bytes for r in host if r.cgroup_limit_bytes is not None]
        trends.append(
            memory_trend(
                [r.t_unix_s for r in host],
                [r.used_bytes or 0 for r in host],
                limit_bytes=min(limits) if limits else None,
                subject="server memory",
            )
        )
    for device in sorted({g.device for g in view.gpu if g.device is not None}):
        gpu = [
            g for g in view.gpu if g.device == device and lo <= g.t_unix_s <= hi and g.used_bytes is not None
        ]
        if gpu:
            totals = [g.total_bytes for g in gpu if g.total_bytes]
            trends.append(
                memory_trend(
                    [g.t_unix_s for g in gpu],
                    [g.used_bytes or 0 for g in gpu],
                    limit_bytes=max(totals) if totals else None,
                    subject=f"GPU {device} memory",
                )
            )
    return tuple(trends)


def _counter_rise(values: Sequence[int | None]) -> int:
    """How far a counter rose over the samples that read it (a reset counts from its new value)."""
    rise, last = 0, None
    for v in values:
        if v is None:
            continue
        if last is not None and v > last:
            rise += v - last
        last = v
    return rise


def gib(n_bytes: int, *, unit: bool = True) -> str:
    """``1.7 GiB`` (``512 MiB`` below 1 GiB); without ``unit`` the number alone, in the same scale."""
    if n_bytes >= 2**30:
        text = f"{n_bytes / 2**30:.1f}"
        return f"{text} GiB" if unit else text
    text = f"{n_bytes / 2**20:.0f}"
    return f"{text} MiB" if unit else text


def _problems(problems: Sequence[str]) -> str:
    return f" ({problems[0]})" if problems else ""


__all__ = ["ServerMemory", "StepMemory", "gib", "soak_trends", "summarize_server_memory"]
