"""The server's host memory read from this machine's real ``/proc``: a child that holds ~200 MB and a
grandchild, a child that listens on a loopback port and forks."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from oomload.telemetry.hostmem import (
    LocalServerMemory,
    read_server_memory,
)
from oomload.telemetry.proctree import find_listening_pid, find_listening_pids, process_tree

MIB = 1024 * 1024
HOLD_BYTES = 200 * MIB

# Allocates and touches HOLD_BYTES (one byte per page), starts a sleeping grandchild, says its pid.
HOLDER = f"""
import subprocess, sys, time
buf = bytearray({HOLD_BYTES})
buf[::4096] = b"\\x01" * ({HOLD_BYTES} // 4096)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(child.pid, flush=True)
time.sleep(300)
"""

# Listens on a free loopback port, forks (the child holds the socket too), says the port and the child.
LISTENER = """
import os, socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
child = os.fork()
if child == 0:
    time.sleep(300)
    os._exit(0)
print(s.getsockname()[1], child, flush=True)
time.sleep(300)
"""


@contextmanager
def program(
    source: str, others: slice, data_limit: int | None = None
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Run ``source`` in a child Python (under an ``RLIMIT_DATA`` of ``data_limit`` bytes, its own and
    its children's); yield it and the words of its first line; kill it and the processes whose pids are
    ``others`` of those words."""

    def limit() -> None:
        if data_limit is not None:
            resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

    command = [sys.executable, "-c", source]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, preexec_fn=limit)
    assert proc.stdout is not None
    words = proc.stdout.readline().split()
    try:
        assert words, "the child program did not start"
        yield proc, words
    finally:
        for word in words[others]:
            _kill(int(word))
        proc.kill()
        proc.wait()
        proc.stdout.close()


def _kill(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_real_tree_holds_what_it_allocated() -> None:
    with program(HOLDER, slice(0, 1)) as (proc, words):
        grandchild = int(words[0])
        assert process_tree(proc.pid) == [proc.pid, grandchild]
        line = read_server_memory(proc.pid)
        assert line["pid"] == proc.pid
        assert line["processes"] == 2
        assert line["alive"] is True
        assert line["rss_bytes"] is not None and line["rss_bytes"] >= HOLD_BYTES
        assert line["pss_bytes"] is not None and line["pss_bytes"] >= HOLD_BYTES  # our own: readable
        assert line["pss_bytes"] <= line["rss_bytes"]
        if line["cgroup_current_bytes"] is not None:  # this machine's memory cgroup holds the child
            assert line["cgroup"] is not None and line["cgroup"][:3] in ("v1:", "v2:")
            assert line["cgroup_current_bytes"] >= HOLD_BYTES


def test_a_real_data_limit_and_the_process_nearest_it() -> None:
    """``prlimit --data`` as the memory-death harness uses it: the limit is inherited, and the line
    carries the holder's VmData (it allocated HOLD_BYTES) against it."""
    data_limit = 1024 * MIB
    with program(HOLDER, slice(0, 1), data_limit=data_limit) as (proc, _):
        line = read_server_memory(proc.pid)
        assert line["data_limit_bytes"] == data_limit
        assert "data_bytes" in line and HOLD_BYTES <= line["data_bytes"] <= data_limit
    with program(HOLDER, slice(0, 1)) as (proc, _):  # this test's own limit, inherited: usually none
        own = resource.getrlimit(resource.RLIMIT_DATA)[0]
        line = read_server_memory(proc.pid)
        assert line["data_limit_bytes"] == (None if own == resource.RLIM_INFINITY else own)


def test_a_dead_real_root_leaves_its_orphan_counted() -> None:
    with program(HOLDER, slice(0, 1)) as (proc, words):
        grandchild = int(words[0])
        reader = LocalServerMemory(proc.pid)
        assert reader.read()["processes"] == 2
        proc.kill()
        proc.wait()
        line = reader.read()
        assert line["alive"] is False
        assert line["processes"] == 1  # the grandchild, reparented, still runs
        assert line["rss_bytes"] is not None and 0 < line["rss_bytes"] < HOLD_BYTES
        assert process_tree(proc.pid) == []  # counted from the last read, not through the dead root
        assert process_tree(grandchild) == [grandchild]


def test_the_real_listener_of_a_loopback_port() -> None:
    with program(LISTENER, slice(1, 2)) as (proc, words):
        port, forked = int(words[0]), int(words[1])
        assert find_listening_pids(port) == sorted([proc.pid, forked])
        assert find_listening_pid(port) == proc.pid  # the topmost holder of the socket
        assert LocalServerMemory(proc.pid).check() is None  # it listens
