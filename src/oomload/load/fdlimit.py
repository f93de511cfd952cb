"""The open-file limit of a load-generating process: raised at start, checked against the level.

Every request holds one socket while it runs (a fresh connection per request, ``oomload.load.http``),
so a process that carries N users needs N descriptors beside its own (the run directory's files, the
samplers' pipes, Locust's and the web UI's sockets). Locust's own CLI raises ``RLIMIT_NOFILE``; oomload
drives Locust's ``Environment`` directly, so it does the same itself: ``raise_open_files`` lifts the
soft limit to the hard one (``MAX_TARGET`` when the hard one is unlimited) in the master and in each
worker, before any load; children (the simulator, ``--serve``, local workers) inherit it.

A limit that even so cannot carry a level would not fail cleanly: the client's connects fail with
``EMFILE`` (counted as failed requests, as if the server had failed them) or the run directory stops
taking writes. ``open_files_problem`` says so before any load, in one sentence: a process needs the
descriptors it holds now, one per user with ``USER_MARGIN`` more, and ``RESERVE_FDS`` besides.
An ``EMFILE``/``ENFILE`` that still happens is said as ``oomload.outfile.TOO_MANY_OPEN_FILES``.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass

MAX_TARGET = 1 << 20  # the soft limit asked for when the hard one is unlimited (Linux's nr_open)
RESERVE_FDS = 64  # the process's own files and sockets besides one per user
USER_MARGIN = 0.1  # a tenth more than one descriptor per user


@dataclass(frozen=True, slots=True)
class OpenFiles:
    """The soft limit on open files and how many this process has open."""

    soft_limit: int | None  # None: unlimited
    open_now: int


def raise_open_files() -> OpenFiles:
    """Lift the soft ``RLIMIT_NOFILE`` toward the hard one (never lowers it); the result."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MAX_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        for ask in (target, min(target, MAX_TARGET // 16)):  # a kernel's nr_open may be lower
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (ask, hard))
            except (ValueError, OSError):
                continue
            soft = ask
            break
    return OpenFiles(None if soft == resource.RLIM_INFINITY else soft, _open_now())


def fds_needed(users: int, open_now: int) -> int:
    """The descriptors a process carrying ``users`` needs (module docstring)."""
    return open_now + RESERVE_FDS + math.ceil(users * (1 + USER_MARGIN))


def open_files_problem(files: OpenFiles, users: int, what: str) -> str | None:
    """The sentence that refuses ``users`` in one process under ``files``' limit; None when it fits."""
    if files.soft_limit is None:
        return None
    need = fds_needed(users, files.open_now)
    if need <= files.soft_limit:
        return None
    return (
        f"{what} needs about {need} open files in one process, but the limit is {files.soft_limit} "
        "(ulimit -n, and its hard limit allows no more): raise ulimit -n (as root, or in "
        "/etc/security/limits.conf), lower the level, or spread it with --processes"
    )


def _open_now() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc (not Linux): assume a fresh process
        return 16
