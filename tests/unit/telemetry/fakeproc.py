"""Fake ``/proc`` and ``/sys/fs/cgroup`` trees in a directory, laid out as Linux writes them.

The texts copy the kernel's formats (``fs/proc/array.c``, ``fs/proc/task_mmu.c``, ``net/ipv4/tcp_ipv4.c``,
``mm/memcontrol.c``): tab-separated ``status`` lines with right-aligned ``kB`` values, the 52 fields of
``stat``, the ``[rollup]`` header of ``smaps_rollup``, ``/proc/net/tcp``'s fixed columns.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

V1_UNLIMITED = 9223372036854771712  # LONG_MAX rounded down to 4 KiB pages, as v1 prints "no limit"

# The 50 fields after ``comm`` of a real line (state, ppid, pgrp, session, … starttime is the 20th).
STAT_TAIL = (
    "R 32010 32010 2696 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 53866 3133440 389 18446744073709551615 "
    "94845187620864 94845187640745 140737395339936 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 94845187656752 "
    "94845187658368 94845432922112 140737395342050 140737395342070 140737395342070 140737395343339 0"
)
TCP_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
)
TCP6_HEADER = (
    "  sl  local_address                         remote_address                        st tx_queue "
    "rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
)


def stat_text(pid: int, comm: str, state: str, ppid: int, start_ticks: int) -> str:
    """``/proc/PID/stat`` as ``do_task_stat`` writes it (52 fields)."""
    fields = STAT_TAIL.split()
    fields[0], fields[1], fields[2], fields[3], fields[19] = (
        state,
        str(ppid),
        str(pid),
        str(pid),
        str(start_ticks),
    )
    assert len(fields) == 50
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


def status_text(
    pid: int,
    ppid: int,
    name: str,
    state: str,
    rss_kib: int | None,
    hwm_kib: int | None,
    data_kib: int | None = None,
) -> str:
    """``/proc/PID/status``; a process without a memory map (a zombie) has no ``Vm*``/``Rss*`` lines."""
    states = {"R": "R (running)", "S": "S (sleeping)", "Z": "Z (zombie)", "D": "D (disk sleep)"}
    lines = [
        f"Name:\t{name}",
        "Umask:\t0022",
        f"State:\t{states.get(state, state)}",
        f"Tgid:\t{pid}",
        "Ngid:\t0",
        f"Pid:\t{pid}",
        f"PPid:\t{ppid}",
        "TracerPid:\t0",
        "Uid:\t1000\t1000\t1000\t1000",
        "Gid:\t1000\t1000\t1000\t1000",
        "FDSize:\t64",
        "Groups:\t1000 ",
        f"NStgid:\t{pid}",
        f"NSpid:\t{pid}",
    ]
    if rss_kib is not None:
        hwm = rss_kib if hwm_kib is None else hwm_kib
        lines += [
            f"VmPeak:\t{hwm * 3:8d} kB",
            f"VmSize:\t{rss_kib * 3:8d} kB",
            f"VmLck:\t{0:8d} kB",
            f"VmPin:\t{0:8d} kB",
            f"VmHWM:\t{hwm:8d} kB",
            f"VmRSS:\t{rss_kib:8d} kB",
            f"RssAnon:\t{rss_kib // 2:8d} kB",
            f"RssFile:\t{rss_kib - rss_kib // 2:8d} kB",
            f"RssShmem:\t{0:8d} kB",
            f"VmData:\t{rss_kib if data_kib is None else data_kib:8d} kB",
            f"VmStk:\t{132:8d} kB",
            f"VmSwap:\t{0:8d} kB",
        ]
    lines += ["Threads:\t1", "SigQ:\t0/63421", "voluntary_ctxt_switches:\t12"]
    return "\n".join(lines) + "\n"


LIMITS = (  # (name, units) in fs/proc/base.c's order
    ("Max cpu time", "seconds"),
    ("Max file size", "bytes"),
    ("Max data size", "bytes"),
    ("Max stack size", "bytes"),
    ("Max core file size", "bytes"),
    ("Max resident set", "bytes"),
    ("Max processes", "processes"),
    ("Max open files", "files"),
    ("Max locked memory", "bytes"),
    ("Max address space", "bytes"),
)


def limits_text(data_limit: int | None) -> str:
    """``/proc/PID/limits`` as ``proc_pid_limits`` writes it: fixed-width columns, ``unlimited`` for
    RLIM_INFINITY; only the data size limited (soft and hard alike) when ``data_limit`` is given."""
    lines = [f"{'Limit':<25s} {'Soft Limit':<20s} {'Hard Limit':<20s} {'Units':<10s}"]
    for name, units in LIMITS:
        value = str(data_limit) if name == "Max data size" and data_limit is not None else "unlimited"
        lines.append(f"{name:<25s} {value:<20s} {value:<20s} {units:<10s}")
    return "\n".join(lines) + "\n"


def smaps_rollup_text(rss_kib: int, pss_kib: int) -> str:
    return (
        "55fdb83c3000-7fff27cd1000 ---p 00000000 00:00 0                          [rollup]\n"
        f"Rss:            {rss_kib:8d} kB\n"
        f"Pss:            {pss_kib:8d} kB\n"
        f"Pss_Dirty:      {pss_kib // 2:8d} kB\n"
        f"Pss_Anon:       {pss_kib // 2:8d} kB\n"
        f"Pss_File:       {pss_kib - pss_kib // 2:8d} kB\n"
        f"Pss_Shmem:      {0:8d} kB\n"
        f"Shared_Clean:   {rss_kib - pss_kib:8d} kB\n"
        f"Private_Dirty:  {pss_kib // 2:8d} kB\n"
        f"Anonymous:      {pss_kib // 2:8d} kB\n"
        f"Swap:           {0:8d} kB\n"
        f"SwapPss:        {0:8d} kB\n"
        f"Locked:         {0:8d} kB\n"
    )


def tcp_line(slot: int, port: int, state: int, inode: int, *, v6: bool = False) -> str:
    """One ``/proc/net/tcp`` (or ``tcp6``) line, local address 127.0.0.1 (or ``::``)."""
    local = ("0" * 32 if v6 else "0100007F") + f":{port:04X}"
    remote = ("0" * 32 if v6 else "00000000") + (":0000" if state == 0x0A else ":A9DE")
    return (
        f"{slot:4d}: {local} {remote} {state:02X} 00000000:00000000 00:00000000 00000000  1000        0 "
        f"{inode} 1 0000000000000000 100 0 0 10 0\n"
    )


class FakeHost:
    """``root/proc`` and ``root/cgroup`` (the ``/sys/fs/cgroup`` mount) of a made-up machine."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        self.cgroup = root / "cgroup"
        (self.proc / "net").mkdir(parents=True)
        self.cgroup.mkdir()
        self._tcp: dict[Path, list[str]] = {}

    def process(
        self,
        pid: int,
        ppid: int,
        *,
        comm: str = "python3",
        state: str = "S",
        start_ticks: int = 5000,
        rss_kib: int | None = 1000,
        pss_kib: int | None = 600,
        cgroup: str = "0::/\n",
        sockets: tuple[int, ...] = (),
        data_kib: int | None = None,
        data_limit: int | None = None,
    ) -> Path:
        """A process directory: ``stat``, ``status`` (``VmData`` ``data_kib``, else ``rss_kib``),
        ``smaps_rollup`` (unless ``pss_kib`` is None), ``limits`` (``Max data size`` ``data_limit``
        bytes, else unlimited), ``cgroup``, and ``fd/`` with a ``socket:[inode]`` link per socket (plus
        stdin/out/err); an existing one is replaced."""
        base = self.proc / str(pid)
        shutil.rmtree(base, ignore_errors=True)
        (base / "fd").mkdir(parents=True)
        (base / "net").mkdir()
        (base / "stat").write_text(stat_text(pid, comm, state, ppid, start_ticks))
        (base / "status").write_text(status_text(pid, ppid, comm[:15], state, rss_kib, None, data_kib))
        (base / "limits").write_text(limits_text(data_limit))
        if pss_kib is not None and rss_kib is not None:
            (base / "smaps_rollup").write_text(smaps_rollup_text(rss_kib, pss_kib))
        elif rss_kib is None:
            (base / "smaps_rollup").write_text("")  # no mm: the kernel prints nothing
        (base / "cgroup").write_text(cgroup)
        for fd in range(3):
            os.symlink("/dev/pts/0", base / "fd" / str(fd))
        for n, inode in enumerate(sockets, start=3):
            os.symlink(f"socket:[{inode}]", base / "fd" / str(n))
        return base

    def listen(self, port: int, inode: int, *, v6: bool = False, net: Path | None = None) -> None:
        """A LISTEN socket on ``port`` in ``net`` (default: this host's ``/proc/net``)."""
        self._tcp_line(net or self.proc / "net", port, 0x0A, inode, v6)

    def connection(self, port: int, inode: int, *, net: Path | None = None) -> None:
        """An ESTABLISHED socket on local ``port`` (not a listener)."""
        self._tcp_line(net or self.proc / "net", port, 0x01, inode, False)

    def _tcp_line(self, net: Path, port: int, state: int, inode: int, v6: bool) -> None:
        name = net / ("tcp6" if v6 else "tcp")
        lines = self._tcp.setdefault(name, [TCP6_HEADER if v6 else TCP_HEADER])
        lines.append(tcp_line(len(lines) - 1, port, state, inode, v6=v6))
        name.write_text("".join(lines))

    def cgroup_v2(
        self,
        path: str,
        *,
        current: int,
        max_bytes: int | None = None,
        peak: int | None = None,
        events_max: int = 0,
        oom_kill: int = 0,
        populated: bool = True,
    ) -> Path:
        """A v2 cgroup under the unified mount; ``max_bytes`` None writes ``max``; ``peak`` None: a
        kernel before 5.19 (no ``memory.peak``)."""
        base = self.cgroup / path.lstrip("/")
        base.mkdir(parents=True, exist_ok=True)
        (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (base / "cgroup.events").write_text(f"populated {int(populated)}\nfrozen 0\n")
        (base / "memory.current").write_text(f"{current}\n")
        (base / "memory.max").write_text("max\n" if max_bytes is None else f"{max_bytes}\n")
        (base / "memory.high").write_text("max\n")
        if peak is not None:
            (base / "memory.peak").write_text(f"{peak}\n")
        (base / "memory.events").write_text(
            f"low 0\nhigh 0\nmax {events_max}\noom {oom_kill}\noom_kill {oom_kill}\noom_group_kill 0\n"
        )
        return base

    def cgroup_v1(
        self,
        path: str,
        *,
        usage: int,
        limit: int = V1_UNLIMITED,
        max_usage: int = 0,
        failcnt: int = 0,
        oom_kill: int | None = 0,
        procs: tuple[int, ...] = (),
    ) -> Path:
        """A v1 memory cgroup under ``memory/``; ``oom_kill`` None: a kernel before 4.13 (no such line)."""
        base = self.cgroup / "memory" / path.lstrip("/")
        base.mkdir(parents=True, exist_ok=True)
        (base / "memory.usage_in_bytes").write_text(f"{usage}\n")
        (base / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (base / "memory.max_usage_in_bytes").write_text(f"{max_usage}\n")
        (base / "memory.failcnt").write_text(f"{failcnt}\n")
        control = "oom_kill_disable 0\nunder_oom 0\n" + ("" if oom_kill is None else f"oom_kill {oom_kill}\n")
        (base / "memory.oom_control").write_text(control)
        (base / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
        return base
