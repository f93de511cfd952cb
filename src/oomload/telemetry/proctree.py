"""The processes of this machine from ``/proc``: every process, one's tree, the listener of a port (Linux).

``scan_processes`` reads every ``/proc/PID/stat`` (parsed by ``oomload.telemetry.procfs``, pure);
``process_tree`` is a root and its descendants: without ``CONFIG_PROC_CHILDREN`` Linux has no list of
a process's children, so each read scans ``/proc/*/stat`` once for parent pids (one small read per
process on the host).

``find_listening_pid`` finds the local process that listens on a TCP port: the port's LISTEN
sockets in ``/proc/net/tcp`` and ``tcp6`` (state ``0A``), their inodes, and the processes whose
``/proc/PID/fd/*`` link to ``socket:[inode]`` (another user's process needs root to be seen).

``read_proc_file`` reads a small ``/proc`` file in one system call, and ``why_unreadable`` says in a
clause why one could not be read. The ``/proc`` root is a parameter, so tests lay out fake trees.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from oomload.telemetry.procfs import TCP_LISTEN, ProcStat, descendants, parse_proc_net_tcp, parse_proc_stat

PROC_ROOT = Path("/proc")


def scan_processes(proc_root: Path = PROC_ROOT) -> dict[int, ProcStat]:
    """Every process whose ``/proc/PID/stat`` can be read now (threads are not listed)."""
    stats: dict[int, ProcStat] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return stats
    for name in names:
        if not name.isdigit():
            continue
        try:
            stats[int(name)] = parse_proc_stat(read_proc_file(proc_root / name / "stat"))
        except (OSError, ValueError):
            continue  # gone since the listing, or not readable
    return stats


def process_tree(root_pid: int, proc_root: Path = PROC_ROOT) -> list[int]:
    """The pids of ``root_pid`` and all its descendants now, root first (``[]`` when it is not running)."""
    return descendants(root_pid, scan_processes(proc_root))


def listening_inodes(net_dir: Path, port: int | None = None) -> dict[int, int]:
    """Socket inode → port of the LISTEN sockets in ``net_dir/tcp`` and ``tcp6`` (on ``port`` only, if
    given). A missing file (no IPv6) is skipped."""
    found: dict[int, int] = {}
    for name in ("tcp", "tcp6"):
        try:
            text = (net_dir / name).read_text()
        except OSError:
            continue
        for sock in parse_proc_net_tcp(text):
            if sock.state == TCP_LISTEN and sock.inode and (port is None or sock.local_port == port):
                found[sock.inode] = sock.local_port
    return found


def socket_inodes(pid: int, proc_root: Path = PROC_ROOT) -> set[int] | None:
    """The socket inodes process ``pid`` holds open (``None``: its fds cannot be read)."""
    fd_dir = proc_root / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue  # closed since the listing
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def find_listening_pids(port: int, proc_root: Path = PROC_ROOT) -> list[int]:
    """Every process visible here that holds a LISTEN socket on TCP ``port`` (in this network namespace)."""
    wanted = set(listening_inodes(proc_root / "net", port))
    if not wanted:
        return []
    holders = []
    for pid in sorted(scan_processes(proc_root)):
        inodes = socket_inodes(pid, proc_root)
        if inodes and inodes & wanted:
            holders.append(pid)
    return holders


def find_listening_pid(port: int, proc_root: Path = PROC_ROOT) -> int | None:
    """The process that listens on TCP ``port`` here: of several holders of the socket (forked
    children), the topmost (its parent is not one of them; the lowest pid of several). ``None`` when
    none can be seen (not listening, or another user's process without root)."""
    holders = find_listening_pids(port, proc_root)
    if not holders:
        return None
    stats = scan_processes(proc_root)
    held = set(holders)
    top = [pid for pid in holders if pid not in stats or stats[pid].ppid not in held]
    return min(top or holders)


def read_proc_file(path: Path) -> str:
    """A small ``/proc`` file in one read: about half the cost of ``Path.read_text`` (a read scans
    every process on the host)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def why_unreadable(err: OSError) -> str:
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if err.errno == errno.ENOENT:
        return "no such file"
    if err.errno == errno.ESRCH:
        return "the process is gone"
    return err.strerror or type(err).__name__
