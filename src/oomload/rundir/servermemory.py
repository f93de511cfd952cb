"""A ``server_memory.jsonl`` line as written (``ServerMemoryLine``) and as read (``ServerMemoryRow``): the
server's own host memory at one moment (docs/telemetry.md). Parsed like every run-directory line
(``oomload.rundir.records``: loose JSON values, ``None`` for what is absent or not a number)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from oomload.rundir.records import as_float, as_int, as_str


class ServerMemoryLine(TypedDict):
    """``server_memory.jsonl``: the server's own (host) memory at one moment (docs/telemetry.md).

    ``rss_bytes`` / ``pss_bytes`` sum the server's process tree (``pss_bytes`` ``None`` where
    ``smaps_rollup`` is not readable); the ``cgroup_*`` fields are the server's memory cgroup
    (``cgroup``: ``"v2:/path"`` or ``"v1:/path"``, ``None`` when unreadable): ``cgroup_limit_bytes``
    ``None`` means no limit; ``cgroup_oom_kill`` counts the kernel's OOM kills in it (v2
    ``memory.events`` ``oom_kill``, v1 ``memory.oom_control`` ``oom_kill``), ``cgroup_events_max``
    the times usage hit the limit (v2 ``max``, v1 ``memory.failcnt``); ``pss_bytes`` is also ``None`` in
    lines that did not read it (PSS is read at a bounded share of the time). ``data_bytes`` /
    ``data_limit_bytes`` are the ``VmData`` and soft ``RLIMIT_DATA`` of the tree's process nearest its
    data limit (``data_limit_bytes`` ``None``: no process has one; both absent where not read, as in a
    simulator's lines or older runs). ``alive`` is false once the server's root process is gone;
    ``error`` says in one sentence what could not be read."""

    t_unix_s: float
    source: str  # "local", "sim" or "remote:URL"
    pid: int | None
    processes: int | None
    rss_bytes: int | None
    pss_bytes: int | None
    cgroup: str | None
    cgroup_current_bytes: int | None
    cgroup_limit_bytes: int | None
    cgroup_peak_bytes: int | None
    cgroup_oom_kill: int | None
    cgroup_events_max: int | None
    alive: bool
    data_bytes: NotRequired[int]
    data_limit_bytes: NotRequired[int | None]
    error: NotRequired[str]


@dataclass(frozen=True, slots=True)
class ServerMemoryRow:
    """A ``server_memory.jsonl`` line as read (``ServerMemoryLine``)."""

    t_unix_s: float
    source: str | None = None
    pid: int | None = None
    processes: int | None = None
    rss_bytes: int | None = None
    pss_bytes: int | None = None
    cgroup: str | None = None
    cgroup_current_bytes: int | None = None
    cgroup_limit_bytes: int | None = None
    cgroup_peak_bytes: int | None = None
    cgroup_oom_kill: int | None = None
    cgroup_events_max: int | None = None
    alive: bool = True
    error: str | None = None
    data_bytes: int | None = None
    data_limit_bytes: int | None = None

    @property
    def used_bytes(self) -> int | None:
        """The server's memory as its limit sees it: the usage of a memory cgroup with a limit (a
        container: what its OOM kill compares), else the tree's RSS (a cgroup without a limit is often
        a whole session's or host's, shared with other processes)."""
        if self.cgroup_current_bytes is not None and self.cgroup_limit_bytes is not None:
            return self.cgroup_current_bytes
        return self.rss_bytes

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ServerMemoryRow | None:
        """One line as a sample; ``None`` without a finite ``t_unix_s``."""
        t_unix_s = as_float(obj.get("t_unix_s"))
        if t_unix_s is None:
            return None
        return cls(
            t_unix_s=t_unix_s,
            source=as_str(obj.get("source")),
            pid=as_int(obj.get("pid")),
            processes=as_int(obj.get("processes")),
            rss_bytes=as_int(obj.get("rss_bytes")),
            pss_bytes=as_int(obj.get("pss_bytes")),
            cgroup=as_str(obj.get("cgroup")),
            cgroup_current_bytes=as_int(obj.get("cgroup_current_bytes")),
            cgroup_limit_bytes=as_int(obj.get("cgroup_limit_bytes")),
            cgroup_peak_bytes=as_int(obj.get("cgroup_peak_bytes")),
            cgroup_oom_kill=as_int(obj.get("cgroup_oom_kill")),
            cgroup_events_max=as_int(obj.get("cgroup_events_max")),
            alive=obj.get("alive") is not False,
            error=as_str(obj.get("error")),
            data_bytes=as_int(obj.get("data_bytes")),
            data_limit_bytes=as_int(obj.get("data_limit_bytes")),
        )
