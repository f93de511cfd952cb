"""The watch over the server during a run: its death and its first preemption.

Server death is decided within a fraction of a second of the first sign: a user that sees
``engine_dead`` or a refused connection flags it (``ReplayContext.death_suspected``) and backs off,
the watch checks ``/health`` at once, and the server is dead when the server oomload started (the
simulator, ``--serve``) has exited, when ``/health`` is refused twice, or
refused / failing (5xx, or no longer HTTP) while requests died or the ``/metrics`` scrapes fail, or
failing three times in a row. A slow ``/health`` is not death. A dead server ends the ramp whatever
``--stop-on`` says: the users go idle at once (``ReplayContext.stopping``), the worker processes
are told to stop, and — first of all — the run directory gets the marker ``.server-dead``, which a
worker's users check before each request (``ReplayContext.may_send``): no request is sent after the
declaration, in any process.

The first preemption is the first ``num_preemptions_total`` above the baseline (the first scrape);
it is written as a ``first_preemption`` event at the time of the scrape that first showed it, with
the step whose window holds that scrape — read as the verdict reads them: every scrape from
``metrics.jsonl``, the steps' starts from ``steps.jsonl`` (``oomload.verdict.runview``). The watch
looks once a second, so the poller's latest scrape and the driver's current step may already be
later ones (a boundary scrape, the next step). The watch runs as one greenlet (``run``), ticking
every ``MONITOR_TICK_S``; it also feeds the progress view.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from oomload.outcome import Outcome
from oomload.run.served import exit_text
from oomload.rundir import mark_server_dead
from oomload.rundir.io import JsonlTail
from oomload.rundir.records import MetricsRow, StepBoundary, StepLines
from oomload.telemetry.scrape import open_direct

HEALTH_INTERVAL_S = 1.0
MONITOR_TICK_S = 0.2


class DeathWatch:
    """Health checks, server death and the first preemption for one session (``oomload.run.session``)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.dead_evidence: str | None = None
        self.first_preemption_seen = False
        self.baseline_preemptions: int | None = None
        self._health_failures = 0
        self._health_refused = 0
        self._last_health_s = 0.0
        self._metrics_tail: JsonlTail | None = None  # metrics.jsonl, read until the first preemption
        self._steps_tail: JsonlTail | None = None
        self._steps = StepLines()

    def run(self) -> None:
        """The watch's greenlet: every tick, the progress view; every second (at once when a user
        suspects death), ``/health`` and the first preemption."""
        import gevent

        s = self.session
        last_refresh = 0.0
        while True:
            gevent.sleep(MONITOR_TICK_S)
            now = time.time()
            if s.progress is not None:
                s.progress.sample()
            suspected = s.context is not None and s.context.death_suspected
            if suspected or now - self._last_health_s >= HEALTH_INTERVAL_S:
                if s.context is not None:
                    s.context.death_suspected = False
                self._last_health_s = now
                self.check_health(suspected)
            if now - last_refresh >= HEALTH_INTERVAL_S:
                last_refresh = now
                self.check_preemption()
                if s.server_evidence is not None and s.context is not None and s.context.in_flight:
                    s.server_evidence.check()
                if s.progress is not None:
                    s.progress.refresh()

    def check_preemption(self) -> None:
        """Read the scrapes written since the last call; at the first one above the baseline, write
        the ``first_preemption`` event with its time and the step whose window holds it."""
        s = self.session
        if self.first_preemption_seen or s.poller is None:
            return
        if self._metrics_tail is None or self._steps_tail is None:
            self._metrics_tail = JsonlTail(s.writer.path / "metrics.jsonl")
            self._steps_tail = JsonlTail(s.writer.path / "steps.jsonl")
        scrapes = self._metrics_tail.read()
        self._steps.add(self._steps_tail.read())  # after the scrapes: a step begun before them is read
        for scrape in filter(None, map(MetricsRow.from_json, scrapes)):
            total = scrape.num_preemptions_total
            if not scrape.ok or total is None:
                continue
            if self.baseline_preemptions is None:
                self.baseline_preemptions = total
                continue
            if total > self.baseline_preemptions:
                self.first_preemption_seen = True
                step = self._step_at(scrape.t_unix_s)
                s.writer.event(
                    "first_preemption",
                    t_unix_s=scrape.t_unix_s,
                    step=None if step is None else step.index,
                    concurrency=None if step is None else step.concurrency,
                )
                return

    def _step_at(self, t_unix_s: float) -> StepBoundary | None:
        """The step whose window holds ``t_unix_s``: the last one begun at or before it (``None``
        before the first step)."""
        begun = [b for b in self._steps.boundaries() if b.start_unix_s <= t_unix_s]
        return begun[-1] if begun else None

    def check_health(self, suspected: bool = False) -> None:
        s = self.session
        if self.dead_evidence is not None:
            return
        status = None if s.served is None else s.served.poll()
        if status is not None:  # the server oomload started has exited: dead, whatever /health says
            self._health_failures += 1
            self.declare_dead(f"the server process {exit_text(status)}", False, False, exited=True)
            return
        try:
            with open_direct(s.url + "/health", 5.0) as resp:
                resp.read()
            self._health_failures = self._health_refused = 0
            return
        except urllib.error.HTTPError as err:
            failure, refused = f"HTTP {err.code}", False
            if err.code < 500:
                return
        except urllib.error.URLError as err:
            refused = isinstance(err.reason, ConnectionRefusedError)
            if not refused and isinstance(err.reason, (TimeoutError, socket.timeout)):
                return  # a busy server answers /health slowly; that is not death
            failure = f"{err.reason}"
        except (ConnectionRefusedError, ConnectionResetError) as err:
            failure, refused = type(err).__name__, isinstance(err, ConnectionRefusedError)
        except (TimeoutError, OSError):
            return
        except (http.client.HTTPException, ValueError) as err:  # not HTTP any more: failing
            failure, refused = type(err).__name__, False
        self._health_failures += 1
        self._health_refused = self._health_refused + 1 if refused else 0
        s.writer.event("health_failed", detail=failure)
        engine_dead = s.context is not None and s.context.outcomes[Outcome.ENGINE_DEAD] > 0
        scrapes_failing = s.poller is not None and int(s.poller.consecutive_failures or 0) >= 2
        corroborated = suspected or engine_dead or scrapes_failing
        if self._health_refused >= 2 or self._health_failures >= 3 or corroborated:
            self.declare_dead(failure, engine_dead, scrapes_failing)

    def declare_dead(
        self, failure: str, engine_dead: bool, scrapes_failing: bool, *, exited: bool = False
    ) -> None:
        s = self.session
        step = s.driver.current if s.driver is not None else None
        n = self._health_failures
        evidence = f"/health failed {n}x in a row (last: {failure})" if n > 1 else f"/health {failure}"
        if exited:
            evidence = failure
        if engine_dead:
            evidence += "; engine_dead outcomes"
        if scrapes_failing:
            evidence += "; /metrics scrapes failing"
        self.dead_evidence = evidence
        mark_server_dead(s.writer.path)  # first: the workers stop sending before the message arrives
        if s.context is not None:
            s.context.stopping = True  # nothing more to measure: the users go idle at once
        if s.distributed:
            s.pool.send_stop(0.0)
        s.writer.event("server_dead", step=None if step is None else step.index, evidence=evidence)
        s.console.print(f"[bold red]server dead:[/] {evidence}")
