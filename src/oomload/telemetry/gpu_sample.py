"""``GpuSample``: one device's memory at one moment, the value every GPU source produces (pure).

One sample is one ``gpu.jsonl`` line::

    {"t_unix_s": 1718000000.1, "source": "nvml"|"dcgm"|"remote", "device": 0,
     "total_bytes": …, "used_bytes": …, "free_bytes": …, "util_pct": 37.0 | null,
     "processes": [{"pid": 4242, "used_bytes": …}] | null}

``processes`` is ``null`` when the source cannot tell (a DCGM exporter, or NVML refusing the query),
which is not the same as ``[]`` (NVML answered: no compute process on this device). A process whose
``used_bytes`` NVML cannot read (some containers) has ``used_bytes: null``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

GPU_SOURCES = ("nvml", "dcgm", "remote")


class ProcessMemoryJson(TypedDict):
    pid: int
    used_bytes: int | None


class GpuSampleJson(TypedDict):
    t_unix_s: float
    source: str
    device: int
    total_bytes: int
    used_bytes: int
    free_bytes: int
    util_pct: float | None
    processes: list[ProcessMemoryJson] | None


@dataclass(frozen=True)
class ProcessMemory:
    """GPU memory one process holds on one device."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuSample:
    """One device's memory at ``t_unix_s`` (``time.time()``, the clock the load steps use)."""

    t_unix_s: float
    source: str
    device: int
    total_bytes: int
    used_bytes: int
    free_bytes: int
    util_pct: float | None = None
    processes: tuple[ProcessMemory, ...] | None = None
    name: str | None = None
    uuid: str | None = None

    def to_json(self) -> GpuSampleJson:
        """The ``gpu.jsonl`` line (``name``/``uuid`` stay out of it: they never change in a run)."""
        return {
            "t_unix_s": self.t_unix_s,
            "source": self.source,
            "device": self.device,
            "total_bytes": self.total_bytes,
            "used_bytes": self.used_bytes,
            "free_bytes": self.free_bytes,
            "util_pct": self.util_pct,
            "processes": None
            if self.processes is None
            else [{"pid": p.pid, "used_bytes": p.used_bytes} for p in self.processes],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> GpuSample:
        """Inverse of ``to_json`` (raises ``KeyError``/``TypeError``/``ValueError`` on a bad line)."""
        processes = obj.get("processes")
        return cls(
            t_unix_s=float(obj["t_unix_s"]),
            source=str(obj["source"]),
            device=int(obj["device"]),
            total_bytes=int(obj["total_bytes"]),
            used_bytes=int(obj["used_bytes"]),
            free_bytes=int(obj["free_bytes"]),
            util_pct=None if obj.get("util_pct") is None else float(obj["util_pct"]),
            processes=None
            if processes is None
            else tuple(
                ProcessMemory(int(p["pid"]), None if p.get("used_bytes") is None else int(p["used_bytes"]))
                for p in processes
            ),
        )


class GpuSource(Protocol):
    """Something that samples GPU memory: NVML here, a DCGM exporter, a remote ``oomload sample``."""

    def open(self) -> None:
        """Check the source can be used; raise ``SamplerUnavailableError`` with one sentence if not."""

    def sample(self) -> Sequence[GpuSample]:
        """One sample per watched device, stamped now."""
        ...

    def close(self) -> None:
        """Release the source (idempotent)."""
