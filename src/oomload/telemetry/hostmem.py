"""The server's own host memory: its process tree from ``/proc`` and its memory cgroup (Linux).

GPU memory says little about a server that dies of *host* memory (vLLM's CPU build, CPU-side caches,
a container's limit: reference/oom-kinds.md). This module reads what the kernel says about one
server, given its root process ``pid`` (the API server, or a launcher above it), into one
``server_memory.jsonl`` line (``oomload.rundir.servermemory.ServerMemoryLine``). Every file system root is
a parameter (``proc_root``, ``cgroup_root``) so tests lay out fake trees as the kernel writes them;
the files' text is parsed by ``oomload.telemetry.procfs`` (pure).

The process tree
    The root and every descendant (vLLM: API server → EngineCore → workers). Without
    ``CONFIG_PROC_CHILDREN`` Linux has no list of a process's children, so each read scans
    ``/proc/*/stat`` once for parent pids (one small read per process on the host). The parent is
    the field after the *last* ``)``: ``comm`` may hold spaces and parentheses. A process that the
    previous read counted and that still runs with the same start time stays counted after its
    parent died: an EngineCore left behind by a dead API server still holds memory. Zombies hold
    none and are not counted. The root is alive while its pid runs with the start time first seen
    (a reused pid is not the server).

Per process
    ``VmRSS`` and ``VmData`` of ``/proc/PID/status`` (readable for any process) and ``Pss`` of
    ``/proc/PID/smaps_rollup`` (the owner's or root's only; kernel ≥ 4.14). RSS counts a shared
    page in every process that maps it, so the tree's sum overstates; PSS splits it among them, so
    the sum is exact. ``pss_bytes`` is ``None`` unless every process's PSS was read. Reading PSS
    walks the page tables under the process's ``mmap_lock`` (a few ms per 100 MB of RSS, seen here:
    the server's own allocations wait meanwhile), so it is read at a bounded share of the time: after
    a PSS read that took d seconds, the next is due ``d / pss_share`` later (2 %: a tree whose PSS
    takes 5 ms to read has it every 0.25 s, one that takes 100 ms every 5 s). The reads between say
    ``pss_bytes: null`` without an error; ``pss_share=0`` never reads it, ``1`` at every read.

The per-process data limit
    ``RLIMIT_DATA`` (``prlimit --data``, ``ulimit -d``; inherited by the engine and its workers) bounds
    each process's ``VmData`` (its private writable memory), not the tree's sum: past it an allocation
    fails in that process (vLLM's CPU allocator: reference/oom-kinds.md), with no OOM kill and no
    cgroup event. Each process's soft limit is read from ``/proc/PID/limits`` once (kept by pid and
    start time). The line carries the process nearest its limit: its ``VmData`` as ``data_bytes`` and
    its limit as ``data_limit_bytes``; with no limited process, the largest ``VmData`` and ``None``.

The memory cgroup
    The root's line of ``/proc/PID/cgroup`` for the v1 ``memory`` controller (``N:memory:/path``,
    ``N:cpu,memory:/path``: a v1 or hybrid host), else its v2 line (``0::/path``). Its directory is
    found through ``/proc/self/mountinfo``: the mount of that hierarchy whose root holds the path (a
    v1 container's mounts show its own cgroup ``/docker/ID`` at the mount point itself), else under
    ``cgroup_root`` (v2) or ``cgroup_root/memory`` (v1). Inside a container with its own cgroup
    namespace the path is ``/`` and the mount is the container's cgroup; a path with ``..`` lies
    outside this namespace and cannot be read. Once found the cgroup is
    kept: after the server died it still tells what its container holds. An explicit
    ``cgroup_dir`` (a pod's cgroup) replaces the lookup.

    ==========================  =========================  ===================================
    field                       cgroup v2                  cgroup v1
    ==========================  =========================  ===================================
    ``cgroup_current_bytes``    ``memory.current``         ``memory.usage_in_bytes``
    ``cgroup_limit_bytes``      ``memory.max`` (``max``:   ``memory.limit_in_bytes`` (LONG_MAX
                                ``None``)                  rounded to a page: ``None``)
    ``cgroup_peak_bytes``       ``memory.peak`` (≥ 5.19)   ``memory.max_usage_in_bytes``
    ``cgroup_oom_kill``         ``memory.events``          ``memory.oom_control`` ``oom_kill``
                                ``oom_kill``               (≥ 4.13)
    ``cgroup_events_max``       ``memory.events`` ``max``  ``memory.failcnt``
    ==========================  =========================  ===================================

Failures
    Nothing here raises for a file it cannot read: the field is ``None`` and the line's ``error``
    names what could not be read (permission, no such file) in one sentence. A descendant that
    exits mid-read is a race, not an error. A root pid that never ran says so (``alive`` false).

Finding the processes (the tree, the listener of a port) is ``oomload.telemetry.proctree``'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

from oomload.errors import ConfigError
from oomload.rundir.servermemory import ServerMemoryLine
from oomload.telemetry.procfs import (
    cgroup_mount_dir,
    descendants,
    memory_cgroup_entry,
    parse_cgroup_bytes,
    parse_data_limit,
    parse_flat_keyed,
    parse_mountinfo,
    parse_proc_cgroup,
    parse_proc_status,
    parse_smaps_rollup,
    parse_v1_limit,
)
from oomload.telemetry.proctree import (
    PROC_ROOT,
    listening_inodes,
    read_proc_file,
    scan_processes,
    socket_inodes,
    why_unreadable,
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEAD_STATES = frozenset({"Z", "X", "x"})
PSS_SHARE = 0.02  # at most this share of one CPU (and of the server's time under mmap_lock) reading PSS
T = TypeVar("T")


# -- the memory cgroup -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    """A memory cgroup: its version, its path as ``/proc/PID/cgroup`` names it, and its directory."""

    version: Literal[1, 2]
    path: str
    directory: Path

    @property
    def label(self) -> str:
        """``v2:/path`` or ``v1:/path``, the line's ``cgroup`` field."""
        return f"v{self.version}:{self.path}"


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    """What a memory cgroup's files said (``None``: not read, or no limit for ``limit_bytes``)."""

    current_bytes: int | None = None
    limit_bytes: int | None = None
    peak_bytes: int | None = None
    oom_kill: int | None = None
    events_max: int | None = None
    populated: bool | None = None  # processes in it or below (v2 cgroup.events; v1 cgroup.procs)


def memory_cgroup_at(directory: Path, cgroup_root: Path = CGROUP_ROOT) -> MemoryCgroup:
    """An explicit cgroup directory (a pod's, a container's) as a ``MemoryCgroup``; ``ConfigError`` when
    it is not one."""
    found = _cgroup_at(directory, cgroup_root)
    if isinstance(found, str):
        raise ConfigError(found)
    return found


def read_cgroup_memory(cgroup: MemoryCgroup, *, populated: bool = False) -> tuple[CgroupMemory, list[str]]:
    """The cgroup's counters (module docstring's table) and what could not be read, as clauses;
    ``populated``: also whether a process is left in it (v1 walks its ``cgroup.procs`` files for it)."""
    if cgroup.version == 2:
        return _read_v2(cgroup.directory)
    return _read_v1(cgroup.directory, populated=populated)


def _cgroup_at(directory: Path, cgroup_root: Path) -> MemoryCgroup | str:
    if (directory / "memory.current").is_file():
        return MemoryCgroup(2, _path_under(directory, cgroup_root), directory)
    if (directory / "memory.usage_in_bytes").is_file():
        return MemoryCgroup(1, _path_under(directory, cgroup_root / "memory"), directory)
    if not directory.is_dir():
        return f"the cgroup directory {directory} does not exist"
    return (
        f"{directory} is not a memory cgroup: it has neither memory.current (cgroup v2) nor "
        "memory.usage_in_bytes (cgroup v1)"
    )


def _cgroup_of(pid: int, proc_root: Path, cgroup_root: Path) -> MemoryCgroup | str:
    source = proc_root / str(pid) / "cgroup"
    try:
        entry = memory_cgroup_entry(parse_proc_cgroup(source.read_text()))
    except OSError as err:
        return f"{source} ({why_unreadable(err)})"
    if entry is None:
        return f"{source} (no memory cgroup in it)"
    version, path = entry
    if ".." in Path(path).parts:
        return f"the memory cgroup of pid {pid} ({path}: outside this cgroup namespace)"
    return MemoryCgroup(version, path, _cgroup_directory(version, path, proc_root, cgroup_root))


def _cgroup_directory(version: Literal[1, 2], path: str, proc_root: Path, cgroup_root: Path) -> Path:
    """Where cgroup ``path`` is seen here: through the mounts of ``/proc/self/mountinfo`` (a container's
    v1 mount shows its own cgroup at the mount point, not under its full path), else under
    ``cgroup_root`` (v2) or ``cgroup_root/memory`` (v1)."""
    try:
        mounts = parse_mountinfo(read_proc_file(proc_root / "self" / "mountinfo"))
    except OSError:
        mounts = ()
    seen = cgroup_mount_dir(mounts, version, path)
    if seen is not None:
        return Path(seen)
    base = cgroup_root if version == 2 else cgroup_root / "memory"
    return base / path.lstrip("/")


def _path_under(directory: Path, mount: Path) -> str:
    try:
        relative = directory.resolve().relative_to(mount.resolve())
    except (ValueError, OSError):
        return str(directory)
    return "/" + relative.as_posix() if relative.parts else "/"


def _read_v2(directory: Path) -> tuple[CgroupMemory, list[str]]:
    problems: list[str] = []
    current = _read_number(directory / "memory.current", parse_cgroup_bytes, problems)
    if current is None:
        return CgroupMemory(), problems  # the cgroup is gone or unreadable: one clause says so
    events = _read_number(directory / "memory.events", parse_flat_keyed, problems)
    state = _read_number(directory / "cgroup.events", parse_flat_keyed, problems, optional=True)
    return CgroupMemory(
        current_bytes=current,
        limit_bytes=_read_number(directory / "memory.max", parse_cgroup_bytes, problems),
        peak_bytes=_read_number(directory / "memory.peak", parse_cgroup_bytes, problems, optional=True),
        oom_kill=None if events is None else events.get("oom_kill"),
        events_max=None if events is None else events.get("max"),
        populated=None if state is None or "populated" not in state else state["populated"] != 0,
    ), problems


def _read_v1(directory: Path, *, populated: bool) -> tuple[CgroupMemory, list[str]]:
    problems: list[str] = []
    current = _read_number(directory / "memory.usage_in_bytes", parse_cgroup_bytes, problems)
    if current is None:
        return CgroupMemory(), problems
    control = _read_number(directory / "memory.oom_control", parse_flat_keyed, problems)
    return CgroupMemory(
        current_bytes=current,
        limit_bytes=_read_number(directory / "memory.limit_in_bytes", parse_v1_limit, problems),
        peak_bytes=_read_number(directory / "memory.max_usage_in_bytes", parse_cgroup_bytes, problems),
        oom_kill=None if control is None else control.get("oom_kill"),  # absent before Linux 4.13
        events_max=_read_number(directory / "memory.failcnt", parse_cgroup_bytes, problems),
        populated=_v1_populated(directory) if populated else None,
    ), problems


def _v1_populated(directory: Path) -> bool | None:
    """v1 has no ``populated`` flag: any pid in ``cgroup.procs`` here or below."""
    try:
        for folder, _, files in os.walk(directory):
            if "cgroup.procs" in files and Path(folder, "cgroup.procs").read_text().strip():
                return True
    except OSError:
        return None
    return False


def _read_number(
    path: Path, parse: Callable[[str], T], problems: list[str], *, optional: bool = False
) -> T | None:
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        if not optional:
            problems.append(f"{path} ({why_unreadable(err)})")
        return None
    except OSError as err:
        problems.append(f"{path} ({why_unreadable(err)})")
        return None
    try:
        return parse(text)
    except ValueError:
        problems.append(f"{path} (not a number: {text.strip()[:40]!r})")
        return None


# -- one read of the server's memory -------------------------------------------------------------------
class LocalServerMemory:
    """Reads the memory of the server whose root process is ``pid`` (and/or of ``cgroup_dir``) on this
    machine, one ``ServerMemoryLine`` per ``read()``. It keeps what it learnt between reads: the
    root's start time, the tree's last members (orphans stay counted) and the cgroup once found."""

    source = "local"

    def __init__(
        self,
        pid: int | None,
        *,
        cgroup_dir: Path | None = None,
        proc_root: Path = PROC_ROOT,
        cgroup_root: Path = CGROUP_ROOT,
        clock: Callable[[], float] = time.time,
        pss_share: float = PSS_SHARE,
    ) -> None:
        if pid is None and cgroup_dir is None:
            raise ValueError("a server's memory needs a pid or a cgroup directory")
        self.pid = pid
        self._cgroup_dir = cgroup_dir
        self._proc_root = proc_root
        self._cgroup_root = cgroup_root
        self._clock = clock
        self.pss_share = pss_share
        self._pss_due = 0.0  # time.monotonic() when PSS may be read again
        self._root_start: int | None = None
        self._members: dict[int, int] = {}  # pid → start ticks, as counted by the last read
        self._data_limits: dict[tuple[int, int], int | None] = {}  # (pid, start ticks) → RLIMIT_DATA
        self.cgroup: MemoryCgroup | None = None

    def describe(self) -> str:
        """What is read, for one announcement line."""
        parts = [] if self.pid is None else [f"pid {self.pid}"]
        if self.cgroup is not None:
            parts.append(f"cgroup {self.cgroup.label}")
        elif self._cgroup_dir is not None:
            parts.append(f"cgroup {self._cgroup_dir}")
        return "the server's memory (" + ", ".join(parts) + ")"

    def check(self) -> str | None:
        """A doubt about the target in one sentence, or ``None``: a root that is not running, or a lone
        process that listens on no TCP port (the server listens; a launcher has children)."""
        if self.pid is None:
            return None
        stats = scan_processes(self._proc_root)
        root = stats.get(self.pid)
        if root is None:
            return f"pid {self.pid} is not running"
        if len(descendants(self.pid, stats)) > 1:
            return None
        inodes = socket_inodes(self.pid, self._proc_root)
        if inodes is None:
            return None  # cannot tell
        if inodes & set(listening_inodes(self._proc_root / str(self.pid) / "net")):
            return None
        return (
            f"pid {self.pid} ({root.comm}) listens on no TCP port and has no child processes: "
            "is it the server?"
        )

    def read(self) -> ServerMemoryLine:
        """The server's memory now (never raises: what cannot be read is ``None`` and the ``error``)."""
        notes: list[str] = []  # whole statements ("pid 12 is not running")
        unread: list[str] = []  # what could not be read, as clauses
        tree = _Tree()
        if self.pid is not None:
            tree = self._read_tree(notes, unread)
        alive = tree.alive
        if self.cgroup is None:
            self._find_cgroup(unread, root_alive=alive)
        memory = CgroupMemory()
        if self.cgroup is not None:
            memory, cgroup_unread = read_cgroup_memory(self.cgroup, populated=self.pid is None)
            unread += cgroup_unread
            if self.pid is None and memory.populated is not None:
                alive = memory.populated
        line: ServerMemoryLine = {
            "t_unix_s": self._clock(),
            "source": self.source,
            "pid": self.pid,
            "processes": tree.processes,
            "rss_bytes": tree.rss_bytes,
            "pss_bytes": tree.pss_bytes,
            "cgroup": None if self.cgroup is None else self.cgroup.label,
            "cgroup_current_bytes": memory.current_bytes,
            "cgroup_limit_bytes": memory.limit_bytes,
            "cgroup_peak_bytes": memory.peak_bytes,
            "cgroup_oom_kill": memory.oom_kill,
            "cgroup_events_max": memory.events_max,
            "alive": alive,
        }
        if tree.data_bytes is not None:
            line["data_bytes"] = tree.data_bytes
            line["data_limit_bytes"] = tree.data_limit_bytes
        if unread:
            notes.append("cannot read " + "; ".join(unread))
        if notes:
            line["error"] = "; ".join(notes)
        return line

    def _find_cgroup(self, unread: list[str], *, root_alive: bool) -> None:
        if self._cgroup_dir is not None:
            found = _cgroup_at(self._cgroup_dir, self._cgroup_root)
        elif self.pid is not None and self._root_start is not None:
            found = _cgroup_of(self.pid, self._proc_root, self._cgroup_root)
            if isinstance(found, str) and not root_alive:
                return  # the dead root's /proc entry is gone: no news
        else:
            return  # the root never ran: its line says so
        if isinstance(found, str):
            unread.append(found)
        else:
            self.cgroup = found

    def _read_tree(self, notes: list[str], unread: list[str]) -> _Tree:
        """What the tree holds now; see the module docstring."""
        assert self.pid is not None
        stats = scan_processes(self._proc_root)
        root = stats.get(self.pid)
        if root is not None and self._root_start is None:
            self._root_start = root.start_ticks
        if self._root_start is None:
            notes.append(f"pid {self.pid} is not running")
            return _Tree(alive=False)
        same_root = root is not None and root.start_ticks == self._root_start
        alive = same_root and root is not None and root.state not in DEAD_STATES
        members = descendants(self.pid, stats) if same_root else []
        members += [
            pid
            for pid, start in self._members.items()
            if pid not in members and pid in stats and stats[pid].start_ticks == start
        ]
        counted: dict[int, int] = {}
        rss_total, pss_total = 0, 0
        nearest: tuple[int, int | None] | None = None  # (VmData, limit) of the process nearest its limit
        pss_denied: list[int] = []
        pss_problem: str | None = None
        with_pss = self.pss_share >= 1 or (self.pss_share > 0 and time.monotonic() >= self._pss_due)
        started = time.monotonic()
        for pid in members:
            if stats[pid].state in DEAD_STATES:
                continue
            read = _read_process(pid, self._proc_root, with_pss=with_pss)
            if read is None:
                continue  # exited since the scan: a race, not an error
            rss_bytes, pss_bytes, why, data_bytes = read
            counted[pid] = stats[pid].start_ticks
            rss_total += rss_bytes
            if data_bytes is not None:
                limit = self._data_limit(pid, stats[pid].start_ticks)
                if nearest is None or _nearer((data_bytes, limit), nearest):
                    nearest = (data_bytes, limit)
            if pss_bytes is None:
                pss_denied.append(pid)
                pss_problem = pss_problem or why
            else:
                pss_total += pss_bytes
        self._members = counted
        self._data_limits = {k: v for k, v in self._data_limits.items() if counted.get(k[0]) == k[1]}
        data, data_limit = (None, None) if nearest is None else nearest
        tree = _Tree(alive, len(counted), rss_total, None, data, data_limit)
        if not with_pss:
            return tree
        now = time.monotonic()
        self._pss_due = now + (now - started) / self.pss_share
        if pss_denied:
            pids = ", ".join(str(p) for p in pss_denied[:5]) + (", …" if len(pss_denied) > 5 else "")
            unread.append(f"the PSS of pid {pids} ({pss_problem})")
            return tree
        return replace(tree, pss_bytes=pss_total)

    def _data_limit(self, pid: int, start_ticks: int) -> int | None:
        """The process's soft ``RLIMIT_DATA`` (``None``: unlimited or unreadable), read once a process."""
        key = (pid, start_ticks)
        if key not in self._data_limits:
            try:
                text = read_proc_file(self._proc_root / str(pid) / "limits")
                self._data_limits[key] = parse_data_limit(text)
            except (OSError, ValueError):
                self._data_limits[key] = None
        return self._data_limits[key]


@dataclass(frozen=True, slots=True)
class _Tree:
    """One read of the server's process tree (``None``: not read)."""

    alive: bool = True
    processes: int | None = None
    rss_bytes: int | None = None
    pss_bytes: int | None = None
    data_bytes: int | None = None  # VmData of the process nearest its data limit (the largest without one)
    data_limit_bytes: int | None = None  # that process's RLIMIT_DATA (None: no process has one)


def _nearer(a: tuple[int, int | None], b: tuple[int, int | None]) -> bool:
    """Whether process ``a`` (VmData, limit) is nearer its data limit than ``b``: a limited process
    before an unlimited one, then the smaller headroom; of unlimited ones, the larger VmData."""
    if (a[1] is None) != (b[1] is None):
        return a[1] is not None
    if a[1] is None or b[1] is None:
        return a[0] > b[0]
    return a[1] - a[0] < b[1] - b[0]


def read_server_memory(
    pid: int | None,
    *,
    cgroup_dir: Path | None = None,
    proc_root: Path = PROC_ROOT,
    cgroup_root: Path = CGROUP_ROOT,
    clock: Callable[[], float] = time.time,
) -> ServerMemoryLine:
    """One read of the server's memory (``LocalServerMemory``, without memory between reads)."""
    reader = LocalServerMemory(
        pid, cgroup_dir=cgroup_dir, proc_root=proc_root, cgroup_root=cgroup_root, clock=clock
    )
    return reader.read()


def _read_process(
    pid: int, proc_root: Path, *, with_pss: bool
) -> tuple[int, int | None, str, int | None] | None:
    """(rss_bytes, pss_bytes or None, why PSS is None, VmData) of one process; ``None`` when it is gone."""
    base = proc_root / str(pid)
    try:
        status = parse_proc_status(read_proc_file(base / "status"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None  # hidden (hidepid): as good as gone from here
    if status.rss_bytes is None:
        return 0, 0, "", None  # no memory map (exiting, or a kernel thread)
    data = status.data_bytes
    if not with_pss:
        return status.rss_bytes, None, "", data
    try:
        pss = parse_smaps_rollup(read_proc_file(base / "smaps_rollup"))
    except (FileNotFoundError, ProcessLookupError):
        if not base.exists():
            return None
        return status.rss_bytes, None, "no smaps_rollup: Linux < 4.14", data
    except OSError as err:
        return status.rss_bytes, None, why_unreadable(err), data
    if pss is None:
        return status.rss_bytes, None, "no Pss line in smaps_rollup", data
    return status.rss_bytes, pss, "", data
