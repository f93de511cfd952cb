"""A load-generating process's view of itself over one step, as ``steps.jsonl`` end lines carry it
(``loadgen``: one ``LoadgenLine`` per process, written by ``oomload.load.selfcheck``) and as readers
parse it (``LoadgenRow``). A run directory written before oomload measured itself has none (``()``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict


class LoadgenLine(TypedDict):
    """One load-generating process's view of itself over a step (``oomload.load.selfcheck``)."""

    duration_s: float  # how long it measured
    cpu_s: float  # CPU time it used (user + system, all its threads)
    cpu_wait_s: float  # time its users' thread was runnable but waited for a CPU (run-queue delay)
    cpu_wait_share: float  # cpu_wait_s / duration_s
    loop_lag_max_ms: float | None  # how late its event loop's probe woke, at most (None: no tick)
    loop_lag_p99_ms: float | None
    worker: NotRequired[int]  # the worker process (--processes / --workers); absent in-process
    # open loop only: the step's sends against the trace's arrival times (oomload.load.context)
    sends_timed: NotRequired[int]  # requests sent with an arrival time
    sends_late: NotRequired[int]  # of those, sent LATE_SEND_S or more after it
    sends_late_busy: NotRequired[int]  # of those, taken late because every user was busy
    send_late_max_ms: NotRequired[float]  # the latest send, ms after its arrival time


@dataclass(frozen=True, slots=True)
class LoadgenRow:
    """A ``LoadgenLine`` as read."""

    duration_s: float
    cpu_s: float
    cpu_wait_s: float
    cpu_wait_share: float
    loop_lag_max_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    worker: int | None = None
    sends_timed: int = 0
    sends_late: int = 0
    sends_late_busy: int = 0
    send_late_max_ms: float | None = None

    @classmethod
    def from_json(cls, obj: Any) -> LoadgenRow | None:
        """One entry; ``None`` unless its duration, CPU and wait figures are finite numbers."""
        if not isinstance(obj, Mapping):
            return None
        duration, cpu, wait = (_number(obj.get(k)) for k in ("duration_s", "cpu_s", "cpu_wait_s"))
        share = _number(obj.get("cpu_wait_share"))
        if duration is None or cpu is None or wait is None or share is None:
            return None
        return cls(
            duration_s=duration,
            cpu_s=cpu,
            cpu_wait_s=wait,
            cpu_wait_share=share,
            loop_lag_max_ms=_number(obj.get("loop_lag_max_ms")),
            loop_lag_p99_ms=_number(obj.get("loop_lag_p99_ms")),
            worker=_index(obj.get("worker")),
            sends_timed=_count(obj.get("sends_timed")),
            sends_late=_count(obj.get("sends_late")),
            sends_late_busy=_count(obj.get("sends_late_busy")),
            send_late_max_ms=_number(obj.get("send_late_max_ms")),
        )

    def late_fields(self) -> dict[str, int | float]:
        """The open-loop lateness fields as a ``LoadgenLine`` carries them (none without timed sends)."""
        if not self.sends_timed:
            return {}
        fields: dict[str, int | float] = {
            "sends_timed": self.sends_timed,
            "sends_late": self.sends_late,
            "sends_late_busy": self.sends_late_busy,
        }
        if self.send_late_max_ms is not None:
            fields["send_late_max_ms"] = self.send_late_max_ms
        return fields


def parse_loadgen(value: Any) -> tuple[LoadgenRow, ...]:
    """An end line's ``loadgen`` list as rows (an entry that does not parse is dropped; ``()`` when
    the line has none, as in a run directory written before oomload measured itself)."""
    if not isinstance(value, list):
        return ()
    return tuple(row for row in map(LoadgenRow.from_json, value) if row is not None)


def _number(value: Any) -> float | None:
    """A finite JSON number (never a bool) as ``float``; ``None`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _index(value: Any) -> int | None:
    return value if type(value) is int else None


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0
