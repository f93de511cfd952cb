"""The server oomload started itself — the simulator, or ``--serve`` — as evidence: its exit status.

A server someone else started can only be watched; one oomload started is its child, so its end is
known exactly. ``ServedProcess`` is what the runner and the death watch need of it (``pid``,
``poll()``: ``Popen``'s exit status, negative for a signal). When the server dies during a run, vLLM's
API server exits a moment after its engine (0 after an ``EngineDeadError`` shut it down, ``-9`` when the
kernel's OOM killer took it): ``record_exit`` waits up to ``wait_s`` for that, then writes
``server_exit.json`` — ``{"pid", "exit_status", "signal", "t_unix_s"}`` — which the verdict reads
(``oomload.verdict.deathcause``). A server still running then is stopped by its owner, and its exit
(oomload's own SIGTERM) is not evidence: nothing is written.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from typing import Protocol

from oomload.errors import RunDirWriteError
from oomload.rundir import RunWriter
from oomload.verdict.runview import SERVER_EXIT

EXIT_WAIT_S = 15.0  # vLLM's API server exits within a few seconds of its engine's death


class ServedProcess(Protocol):
    """A server process oomload started (``RealVllmServer``, ``SimServer``)."""

    @property
    def pid(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def sync_log(self) -> None:
        """Bring the run directory's ``server.log`` up to what the server has written."""


def exit_text(status: int) -> str:
    """``exited with status 0`` / ``was killed by SIGKILL (exit status -9)``."""
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-status).name} (exit status {status})"
    return f"exited with status {status}"


def record_exit(
    writer: RunWriter,
    served: ServedProcess,
    *,
    wait_s: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int | None:
    """Wait up to ``wait_s`` for ``served`` to exit by itself; write ``server_exit.json`` when it did."""
    deadline = clock() + wait_s
    status = served.poll()
    while status is None and clock() < deadline:
        sleep(0.1)
        status = served.poll()
    if status is None:
        return None
    sig = -status if status < 0 else None
    with contextlib.suppress(RunDirWriteError):  # a full disk is said once, by the runner
        writer.write_json(
            SERVER_EXIT,
            {"pid": served.pid, "exit_status": status, "signal": sig, "t_unix_s": clock()},
        )
    return status
