"""The kernel's memory and process files, parsed (pure): text in, values out, exactly as Linux writes them.

===============================  ==================================================================
file                             what is kept
===============================  ==================================================================
``/proc/PID/stat``               pid, ``comm``, state, parent pid, CPU time in user and kernel mode,
                                 start time (``ProcStat``); ``comm`` is between the first ``(`` and the
                                 *last* ``)``: it may hold spaces and parentheses of its own
``/proc/PID/task/*/schedstat``   a thread's time on a CPU, time runnable but waiting for one (the
                                 run-queue delay), time slices (``Schedstat``, nanoseconds)
``/proc/PID/status``             ``Name``, ``VmRSS``, ``VmHWM``, ``VmData`` (``kB`` lines; the kernel's
                                 kB is KiB)
``/proc/PID/limits``             the soft limit of ``Max data size`` (``RLIMIT_DATA``: ``prlimit
                                 --data``, ``ulimit -d``), ``unlimited`` = no limit; columns aligned
                                 by spaces after a name that holds spaces
``/proc/PID/smaps_rollup``       ``Pss``
``/proc/PID/cgroup``             ``hierarchy:controllers:path`` lines: v2 ``0::/path``, v1
                                 ``4:memory:/path`` or ``4:cpu,memory:/path``
``/proc/net/tcp``, ``tcp6``      local port (hex), state (``0A`` = LISTEN), socket inode
``/proc/self/mountinfo``         per mount: the path inside its file system that it shows (``root``),
                                 where (``mount_point``), file system type, super options; ``\040``
                                 and other octal escapes decoded
cgroup number files              ``memory.current``, ``memory.max`` (``max`` = no limit),
                                 ``memory.peak``, ``memory.usage_in_bytes``, ``memory.failcnt``…
cgroup v1 ``limit_in_bytes``     LONG_MAX rounded down to the page size means no limit
flat keyed files                 ``memory.events`` (``low high max oom oom_kill oom_group_kill``),
                                 ``memory.oom_control`` (``oom_kill_disable under_oom oom_kill``),
                                 ``cgroup.events`` (``populated frozen``)
===============================  ==================================================================

``descendants`` walks parent pids into a process tree; ``cgroup_mount_dir`` finds where a cgroup
path is seen through the mounts. Reading the files is
``oomload.telemetry.hostmem``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

KIB = 1024
LONG_MAX = 2**63 - 1
# cgroup v1 writes "no limit" as LONG_MAX rounded down to the page size (9223372036854771712 with 4 KiB
# pages); anything this close to it is no limit, for pages up to 2 MiB.
V1_NO_LIMIT_BYTES = LONG_MAX - 2 * 1024 * 1024
TCP_LISTEN = 0x0A


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` used here."""

    pid: int
    comm: str
    state: str
    ppid: int
    start_ticks: int  # field 22: start time since boot, in clock ticks (tells a reused pid apart)
    utime_ticks: int = 0  # field 14: CPU time in user mode, in clock ticks (all threads)
    stime_ticks: int = 0  # field 15: CPU time in kernel mode, in clock ticks (all threads)


def parse_proc_stat(text: str) -> ProcStat:
    """``/proc/PID/stat`` → ``ProcStat``; ``comm`` is between the first ``(`` and the *last* ``)``
    (it may hold both). ``ValueError`` for text that is not such a line."""
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    rest = text[close_at + 1 :].split()
    if len(rest) < 20:
        raise ValueError(f"a /proc/PID/stat line with {len(rest) + 2} fields, expected ≥ 22")
    return ProcStat(
        pid=int(text[:open_at]),
        comm=text[open_at + 1 : close_at],
        state=rest[0],
        ppid=int(rest[1]),
        start_ticks=int(rest[19]),
        utime_ticks=int(rest[11]),
        stime_ticks=int(rest[12]),
    )


@dataclass(frozen=True, slots=True)
class Schedstat:
    """``/proc/PID/task/TID/schedstat`` (or ``/proc/PID/schedstat``: the thread group leader)."""

    run_ns: int  # time spent on a CPU
    wait_ns: int  # time runnable but waiting for a CPU (run-queue delay)
    slices: int  # time slices run on a CPU


def parse_schedstat(text: str) -> Schedstat:
    """``"67071265 32694567 205\\n"`` → ``Schedstat``; ``ValueError`` for anything but three integers."""
    fields = text.split()
    if len(fields) != 3 or not all(f.isdigit() for f in fields):
        raise ValueError(f"not a schedstat line: {text[:80]!r}")
    return Schedstat(run_ns=int(fields[0]), wait_ns=int(fields[1]), slices=int(fields[2]))


@dataclass(frozen=True, slots=True)
class ProcStatus:
    """The memory fields of ``/proc/PID/status`` (``None``: no such line, as for a zombie)."""

    name: str | None
    rss_bytes: int | None  # VmRSS
    hwm_bytes: int | None  # VmHWM, the peak RSS
    data_bytes: int | None = None  # VmData: private writable memory, what RLIMIT_DATA bounds


def parse_proc_status(text: str) -> ProcStatus:
    """``/proc/PID/status`` (``VmRSS:\\t  1924 kB`` lines) → ``ProcStatus``."""
    fields = _colon_fields(text)
    return ProcStatus(
        name=fields.get("Name"),
        rss_bytes=_kib_bytes(fields.get("VmRSS")),
        hwm_bytes=_kib_bytes(fields.get("VmHWM")),
        data_bytes=_kib_bytes(fields.get("VmData")),
    )


DATA_LIMIT = "Max data size"


def parse_data_limit(text: str) -> int | None:
    """``/proc/PID/limits`` → the soft ``Max data size`` in bytes (``None``: unlimited, or no such
    line). ``ValueError`` for a line that is neither a number nor ``unlimited``."""
    for line in text.splitlines():
        if line.startswith(DATA_LIMIT):
            soft = line[len(DATA_LIMIT) :].split()[0]
            return None if soft == "unlimited" else int(soft)
    return None


def parse_smaps_rollup(text: str) -> int | None:
    """``/proc/PID/smaps_rollup`` → its ``Pss`` in bytes (``None`` without a ``Pss:`` line)."""
    return _kib_bytes(_colon_fields(text).get("Pss"))


@dataclass(frozen=True, slots=True)
class CgroupEntry:
    """One line of ``/proc/PID/cgroup``: ``hierarchy-id:controllers:path``."""

    hierarchy: int
    controllers: tuple[str, ...]  # () for the v2 line "0::/path"
    path: str


def parse_proc_cgroup(text: str) -> tuple[CgroupEntry, ...]:
    """``/proc/PID/cgroup`` → its entries (malformed lines are left out)."""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        controllers = tuple(c for c in parts[1].split(",") if c)
        entries.append(CgroupEntry(int(parts[0]), controllers, parts[2]))
    return tuple(entries)


def memory_cgroup_entry(entries: Iterable[CgroupEntry]) -> tuple[Literal[1, 2], str] | None:
    """(version, path) of the memory controller's cgroup: the v1 ``memory`` line when there is one
    (hybrid hosts have both kinds), else the v2 ``0::`` line; ``None`` without either."""
    listed = list(entries)
    for entry in listed:
        if entry.hierarchy != 0 and "memory" in entry.controllers:
            return 1, entry.path
    for entry in listed:
        if entry.hierarchy == 0 and not entry.controllers:
            return 2, entry.path
    return None


def parse_cgroup_bytes(text: str) -> int | None:
    """A one-number cgroup file (``memory.current``, ``memory.max``…) → bytes; ``max`` → ``None``."""
    value = text.strip()
    if value == "max":
        return None
    return int(value)


def parse_v1_limit(text: str) -> int | None:
    """``memory.limit_in_bytes`` → bytes; the page-rounded LONG_MAX that means no limit → ``None``."""
    value = int(text.strip())
    return None if value >= V1_NO_LIMIT_BYTES else value


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (``memory.events``, ``memory.oom_control``, ``cgroup.events``) → a dict."""
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                values[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return values


@dataclass(frozen=True, slots=True)
class TcpSocket:
    """One line of ``/proc/net/tcp`` or ``tcp6``."""

    local_port: int
    state: int  # 0x0A = LISTEN
    inode: int


def parse_proc_net_tcp(text: str) -> tuple[TcpSocket, ...]:
    """``/proc/net/tcp`` or ``tcp6`` → its sockets (the header and malformed lines are left out)."""
    sockets = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10 or not fields[0].endswith(":") or ":" not in fields[1]:
            continue
        try:
            port = int(fields[1].rsplit(":", 1)[1], 16)
            sockets.append(TcpSocket(local_port=port, state=int(fields[3], 16), inode=int(fields[9])))
        except ValueError:
            continue
    return tuple(sockets)


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of ``/proc/PID/mountinfo``."""

    root: str  # the directory of the file system that the mount shows ("/" for all of it)
    mount_point: str
    fstype: str
    super_options: tuple[str, ...]


def parse_mountinfo(text: str) -> tuple[Mount, ...]:
    """``/proc/self/mountinfo`` → its mounts: ``id parent major:minor root mount-point options
    [optional…] - fstype source super-options`` (malformed lines are left out)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 4 or len(fields) < 5:
            continue
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fields[dash + 1],
                super_options=tuple(fields[dash + 3].split(",")),
            )
        )
    return tuple(mounts)


def cgroup_mount_dir(mounts: Iterable[Mount], version: Literal[1, 2], path: str) -> str | None:
    """Where cgroup ``path`` (of the v1 memory hierarchy, or v2) is seen through these mounts: the
    mount of that hierarchy whose root holds ``path`` (the deepest such root: a container's v1 mounts
    show its own cgroup as their root), joined with the rest of the path; ``None`` when no mount
    shows it."""
    best: tuple[int, str] | None = None
    for mount in mounts:
        if version == 2 and mount.fstype != "cgroup2":
            continue
        if version == 1 and (mount.fstype != "cgroup" or "memory" not in mount.super_options):
            continue
        root = mount.root.rstrip("/")
        if path != root and not path.startswith(root + "/"):
            continue
        rest = path[len(root) :].lstrip("/")
        where = mount.mount_point.rstrip("/") + ("/" + rest if rest else "")
        if best is None or len(root) > best[0]:
            best = (len(root), where or "/")
    return None if best is None else best[1]


def _unescape(value: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space, ``\\011``, ``\\012``, ``\\134``)."""
    if "\\" not in value:
        return value
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\" and value[i + 1 : i + 4].isdigit():
            out.append(chr(int(value[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def descendants(root_pid: int, stats: Mapping[int, ProcStat]) -> list[int]:
    """``root_pid`` and every descendant in ``stats``, root first, breadth first; ``[]`` without root."""
    if root_pid not in stats:
        return []
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        if pid != root_pid:
            children.setdefault(stat.ppid, []).append(pid)
    order, seen = [root_pid], {root_pid}
    for pid in order:  # grows while it is walked
        for child in sorted(children.get(pid, ())):
            if child not in seen:
                seen.add(child)
                order.append(child)
    return order


def _colon_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _kib_bytes(value: str | None) -> int | None:
    """``"1924 kB"`` → 1970176 bytes (the kernel's ``kB`` is KiB)."""
    if value is None:
        return None
    number = value.split()[0] if value.split() else ""
    return int(number) * KIB if number.isdigit() else None
