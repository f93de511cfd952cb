"""The load generator measures itself: per step, what one load-generating process used and waited for.

A step that did not hold its concurrency may be the server's doing or the client's: a load generator
that cannot get a CPU sends late and reads late, and its in-flight count falls for reasons that have
nothing to do with vLLM. Each process that runs users (the in-process runner, or each worker of
``--processes N`` / ``--workers``) therefore keeps, from the start of every step:

* ``cpu_s`` — the CPU time the process used (user + system, all threads: ``/proc/self/stat``, or
  ``os.times`` where there is no ``/proc``);
* ``cpu_wait_s`` — how long the thread that runs the users (gevent's hub thread, the one that created
  the ``SelfCheck``) was runnable but waited for a CPU: the second field of its
  ``/proc/self/task/TID/schedstat``, the scheduler's run-queue delay in nanoseconds; ``cpu_wait_share``
  is that over the step's duration (0 where the kernel keeps no schedstat);
* ``loop_lag_max_ms`` / ``loop_lag_p99_ms`` — a greenlet (``LoopLagProbe``) sleeps ``LAG_TICK_S``
  over and over and records how late it wakes: how long every user's greenlet waited to be resumed
  after its socket was ready, whether for a CPU or behind another greenlet's work.

``SelfCheck.report`` gives the step so far as a ``rundir.loadgenrecord.LoadgenLine`` (a worker sends it in
its once-a-second step report; ``oomload.run.master_meter`` puts the workers' together). The judging
of these figures is pure and lives in ``oomload.verdict.loadgen``.

Reading the files costs two small reads per report (about one a second per process); the probe wakes
``1 / LAG_TICK_S`` times a second. Neither blocks the loop for long.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oomload.rundir.loadgenrecord import LoadgenLine
from oomload.telemetry.procfs import parse_proc_stat, parse_schedstat
from oomload.trace.stats import percentile

LAG_TICK_S = 0.05  # the lag probe's sleep: 20 wakes a second, a lag below 50 ms is seen at most 50 ms late
MAX_LAG_SAMPLES = 4096  # per step; beyond this every other sample is dropped (the maximum is kept exactly)
PROC_SELF = Path("/proc/self")


@dataclass(frozen=True, slots=True)
class ProcessMark:
    """One reading of the process's own counters."""

    t_s: float  # monotonic
    cpu_s: float
    wait_s: float | None  # None: no schedstat (kernel without CONFIG_SCHED_INFO, not Linux)


def read_mark(tid: int, proc: Path = PROC_SELF, clock: Callable[[], float] = time.monotonic) -> ProcessMark:
    """The process's CPU time and thread ``tid``'s run-queue delay, now."""
    try:
        stat = parse_proc_stat((proc / "stat").read_text())
        cpu_s = (stat.utime_ticks + stat.stime_ticks) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        times = os.times()
        cpu_s = times.user + times.system
    try:
        wait_s: float | None = (
            parse_schedstat((proc / "task" / str(tid) / "schedstat").read_text()).wait_ns / 1e9
        )
    except (OSError, ValueError):
        wait_s = None
    return ProcessMark(t_s=clock(), cpu_s=cpu_s, wait_s=wait_s)


class LoopLagProbe:
    """How late the event loop resumes a sleeping greenlet (``run`` in a greenlet of its own)."""

    def __init__(self, tick_s: float = LAG_TICK_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.tick_s = tick_s
        self.clock = clock
        self.samples: list[float] = []  # seconds late, since ``reset``
        self.max_s: float | None = None
        self._stride = 1  # keep one sample in this many (doubles whenever the list is full)
        self._seen = 0
        self.stopped = False

    def run(self, sleep: Callable[[float], object]) -> None:
        """Sleep a tick and record the lateness, until ``stopped`` (``sleep``: ``gevent.sleep``)."""
        while not self.stopped:
            before = self.clock()
            sleep(self.tick_s)
            self.record(self.clock() - before - self.tick_s)

    def record(self, late_s: float) -> None:
        late_s = max(0.0, late_s)
        self.max_s = late_s if self.max_s is None else max(self.max_s, late_s)
        self._seen += 1
        if self._seen % self._stride:
            return
        self.samples.append(late_s)
        if len(self.samples) >= MAX_LAG_SAMPLES:
            self.samples = self.samples[::2]
            self._stride *= 2

    def reset(self) -> None:
        self.samples, self.max_s, self._stride, self._seen = [], None, 1, 0

    def p99_s(self) -> float | None:
        return percentile(self.samples, 99) if self.samples else None


class SelfCheck:
    """One process's figures for the current step (module docstring). Create it in the thread that
    runs the users; ``begin`` at each step's start, ``report`` whenever the step so far is wanted."""

    def __init__(
        self,
        probe: LoopLagProbe | None = None,
        *,
        read: Callable[[int], ProcessMark] = read_mark,
        tid: int | None = None,
    ) -> None:
        self.probe = probe
        self.read = read
        self.tid = threading.get_native_id() if tid is None else tid
        self.worker: int | None = None  # set by a worker process: its index
        self._mark = read(self.tid)

    def begin(self) -> None:
        self._mark = self.read(self.tid)
        if self.probe is not None:
            self.probe.reset()

    def report(self) -> LoadgenLine:
        now = self.read(self.tid)
        then = self._mark
        duration_s = max(0.0, now.t_s - then.t_s)
        wait_s = 0.0 if now.wait_s is None or then.wait_s is None else max(0.0, now.wait_s - then.wait_s)
        lag_max, lag_p99 = (None, None) if self.probe is None else (self.probe.max_s, self.probe.p99_s())
        line: LoadgenLine = {
            "duration_s": round(duration_s, 3),
            "cpu_s": round(max(0.0, now.cpu_s - then.cpu_s), 3),
            "cpu_wait_s": round(wait_s, 3),
            "cpu_wait_share": round(wait_s / duration_s, 4) if duration_s > 0 else 0.0,
            "loop_lag_max_ms": _ms(lag_max),
            "loop_lag_p99_ms": _ms(lag_p99),
        }
        if self.worker is not None:
            line["worker"] = self.worker
        return line

    def stop(self) -> None:
        """The probe's greenlet ends at its next wake."""
        if self.probe is not None:
            self.probe.stopped = True


def start_selfcheck() -> SelfCheck:
    """A ``SelfCheck`` for this process with its lag probe running in a greenlet (imports gevent)."""
    import gevent

    probe = LoopLagProbe()
    gevent.spawn(probe.run, gevent.sleep)
    return SelfCheck(probe)


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None or not math.isfinite(value_s) else round(1000.0 * value_s, 1)
