"""The live part of one replay: telemetry, Locust, the death watch, the worker processes, the signal
handlers and the progress view, from start to teardown.

``Session.run()`` installs the Ctrl-C/SIGTERM handlers first, starts the ``/metrics`` poller and the
GPU sampler (each optional: a missing sampler is an event), builds the Locust user bound to a fresh
``ReplayContext``, and runs Locust in this process (``Environment`` + local runner, or a master that
waits for its K workers — ``--processes N`` local ones, remote ones from ``oomload worker`` — and
writes the results they stream, ``oomload.run.worker_pool``; with ``--web`` the web UI gains an
"oomload" tab with the server's telemetry) with ``StepShape`` driving the schedule, while the
``DeathWatch`` greenlet checks ``/health``, detects the first preemption and server death, and feeds
the live view. It returns the end reason.

On the way out — the schedule's end, a dead server, the maximum duration, Ctrl-C, SIGTERM or the web
UI's STOP (``stop_from_web``: as Ctrl-C) — the requests in flight may finish (at most
``ramp_down_grace_s``; none for an interruption), the rest are abandoned (written as ``cancelled``),
and ``shutdown()`` stops Locust, the workers and the samplers.
With ``--web`` the web UI outlives them: once the report is written, ``serve_verdict`` keeps it
serving the verdict until Ctrl-C / SIGTERM (or ``--web-keep-s``), then ``close_web`` stops it.

A step that lowers the user count stops users gracefully: Locust's ``stop_timeout`` lets each finish
its request, capped at ``ramp_down_grace_s``, after which the rest are abandoned (``cancelled``). The
new step starts when the surplus users are gone and the requests in flight are down to its level
(``StepDriver`` settles; at most the same grace), so the higher step's pressure never counts against
the lower one.

A run directory that stops taking writes (disk full: ``RunWriter.write_error``) stops the run at once:
no new request is sent (``ReplayContext.stopping``), the loop ends within its 0.2 s tick without
waiting for the requests in flight (their results could not be kept), and the end reason is
``error``; the runner then says so in one sentence (``RunDirWriteError``, exit 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rich.console import Console

from oomload.capacity.schedule import Hold, SchedulePlan, StopCondition
from oomload.errors import ConfigError
from oomload.load import wire
from oomload.load.selfcheck import SelfCheck, start_selfcheck
from oomload.load.shape import open_loop_lead_s
from oomload.realvllm.server import free_port
from oomload.run.config import LoadOptions, ReplayConfig, prefix_mode
from oomload.run.deathwatch import DeathWatch
from oomload.run.master_auth import guarded_master_class
from oomload.run.master_meter import MasterMeter
from oomload.run.served import ServedProcess
from oomload.run.serverwatch import ServerEvidence
from oomload.run.snapshot import FinalState, PlanState, TelemetrySnapshot
from oomload.run.worker_pool import WorkerPool
from oomload.rundir import RunReader, RunWriter
from oomload.rundir.records import StepEndLine
from oomload.rundir.servermemory import ServerMemoryRow
from oomload.trace.model import TraceRecord

if TYPE_CHECKING:
    from locust.env import Environment
    from locust.runners import Runner
    from locust.web import WebUI

    from oomload.load.context import ReplayContext
    from oomload.load.shape import StepDriver
    from oomload.run.livefeed import LiveFeed
    from oomload.run.oddsfeed import OddsFeed
    from oomload.run.progress import ProgressView
    from oomload.telemetry.gpu import GpuSamplerProcess
    from oomload.telemetry.poller import MetricsPoller


class Session:
    """The live part of a run: telemetry, Locust, the monitor and the signal handlers."""

    def __init__(
        self,
        config: ReplayConfig,
        console: Console,
        writer: RunWriter,
        records: list[TraceRecord],
        url: str,
        api_key: str | None,
        model: str,
        max_model_len: int | None,
        simulated: bool,
        served: ServedProcess | None = None,
    ) -> None:
        self.config = config
        self.served = served  # the server oomload started (the simulator, --serve): its exit is evidence
        self.console = console
        self.writer = writer
        self.records = records
        self.url = url  # the base URL, checked and trimmed once (oomload.load.baseurl)
        self.api_key = api_key
        self.model = model
        self.max_model_len = max_model_len
        self.simulated = simulated
        self.poller: MetricsPoller | None = None
        self.gpu: GpuSamplerProcess | None = None
        self.server_evidence: ServerEvidence | None = None  # its host memory and its log, as they come
        self.env: Environment | None = None
        self.runner: Runner | None = None
        self.web_ui: WebUI | None = None
        self.distributed = config.expected_workers() > 0  # a Locust master with workers
        self.pool = WorkerPool(self)
        self.watch = DeathWatch(self)
        self.context: ReplayContext | None = None
        self.driver: StepDriver | None = None
        self.plan: SchedulePlan | None = None  # the schedule the run follows (placed by the odds, if any)
        self.odds: OddsFeed | None = None  # the trace's odds for this run, when the pool is known
        self.interrupted = False
        self.stopped_from_web = False  # the interruption came from the web UI's STOP button
        self.progress: ProgressView | None = None
        self._saved_argv = sys.argv
        self.final: FinalState | None = None  # the verdict, once the run is over (web UI)
        self.lingering = False  # the run is over and the web UI serves its verdict until Ctrl-C
        self._linger_over = False
        self.feed: LiveFeed | None = None  # the web UI's feed over the run directory

    @property
    def dead_evidence(self) -> str | None:
        """Why the server counts as dead (``DeathWatch``), or None while it lives."""
        return self.watch.dead_evidence

    @property
    def baseline_preemptions(self) -> int | None:
        return self.watch.baseline_preemptions

    # -- telemetry -------------------------------------------------------------------------------
    def _start_telemetry(self) -> None:
        from oomload.telemetry.poller import MetricsPoller

        self.poller = MetricsPoller(
            self.url,
            self.writer,
            interval_s=self.config.metrics_interval_s,
            model_name=self.model,
            max_model_len=self.max_model_len,
        )
        first = self.poller.poll_once()
        if first.get("ok"):
            self.watch.baseline_preemptions = first.get("num_preemptions_total")
        self.poller.start()
        self._start_gpu()
        self.server_evidence = ServerEvidence.start(self)

    def _start_gpu(self) -> None:
        spec = self.config.gpu
        if spec == "none":
            return
        source, url = "nvml", None
        if spec.startswith(("dcgm:", "remote:")):
            source, _, url = spec.partition(":")
        elif spec == "auto" and self.simulated:
            source, url = "dcgm", f"{self.url}/dcgm/metrics"
        from oomload.telemetry.gpu import GpuSamplerProcess

        self.gpu = GpuSamplerProcess(
            self.writer.path / "gpu.jsonl",
            interval_s=0.5,
            source=source,
            url=url,
            required=self.config.require_gpu,
        )
        if not self.gpu.start():
            reason = getattr(self.gpu, "unavailable_reason", None) or f"{source} sampler unavailable"
            self.writer.event("sampler_unavailable", detail=str(reason))
            self.console.print(f"[dim]GPU memory not sampled: {reason}[/]")
            self.gpu = None

    def latest_server_memory(self) -> ServerMemoryRow | None:
        """The server's latest host-memory sample (``None`` before the first, or when not sampled)."""
        return None if self.server_evidence is None else self.server_evidence.latest_memory()

    def boundary_scrape(self) -> dict[str, Any] | None:
        """One ``/metrics`` scrape at a step boundary (also written to ``metrics.jsonl``)."""
        return None if self.poller is None else self.poller.poll_once()

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> str:
        import gevent
        from locust.env import Environment

        from oomload.load.context import ContextMeter
        from oomload.load.shape import StepDriver, make_shape

        self._install_signals()  # first: a Ctrl-C during the set-up below ends the run the same way
        self._start_telemetry()
        config = self.config
        user_class, context = build_user_class(
            config.load_options(self.url, self.model, self.max_model_len),
            records=self.records,
            api_key=self.api_key,
            sink=self.writer,
        )
        self.context = context
        self.writer.on_write_error = self._write_failed
        meter: Any = ContextMeter(context)
        selfcheck: SelfCheck | None = None
        step_done = None
        plan, hold = config.schedule(), config.hold()
        if config.open_loop:
            cap = max(config.levels)
            plan = SchedulePlan(levels=(cap,), warmup=False, refine=False, stop_on=(StopCondition("never"),))
            # its clock starts with its step (``_on_step``), after the set-up and the boundary scrape

            def step_done(_elapsed: float, _completed: int) -> bool:
                return bool(context.open_loop_done)

        if self.distributed:
            meter = MasterMeter(self, user_class)
        evidence = self._evidence()
        plan = self._placed(plan)
        self.plan = plan
        self.driver = StepDriver(
            plan,
            hold,
            meter,
            self.writer,
            warmup_hold=Hold(config.warmup_s, 0) if config.warmup_s > 0 else None,
            boundary_scrape=self.boundary_scrape,
            server_dead=lambda: self.dead_evidence is not None,
            max_duration_s=config.max_duration_s,
            on_step=self._on_step,
            on_step_end=self._on_step_end,
            step_done=step_done,
            settle_s=config.grace_s(),
            evidence=evidence,
            latest_scrape=self._latest_scrape,
        )
        self.env = env = Environment(
            user_classes=[user_class], shape_class=make_shape(self.driver, keep_open=True), host=self.url
        )
        # a step that lowers the user count lets the stopped users finish their request (capped)
        env.stop_timeout = config.grace_s()
        if self.distributed:
            runner = self._start_master(env, meter)
        else:
            self.runner = runner = env.create_local_runner()
            context.live_users = lambda: int(runner.user_count)
            context.selfcheck = selfcheck = start_selfcheck()  # its CPU wait and loop lag, per step
        if config.web:
            from oomload.run.webui import extend_web_ui, web_ui_banner

            # Locust's web UI re-parses sys.argv with its own parser on every page load
            self._saved_argv = sys.argv
            sys.argv = [sys.argv[0]]
            self.web_ui = env.create_web_ui(config.web_host, config.web_port)
            from oomload.run.livefeed import LiveFeed

            self.feed = LiveFeed(self.writer.path)
            extend_web_ui(
                self.web_ui, self.telemetry_snapshot, self.feed, self.writer.path, on_stop=self.stop_from_web
            )
            self.console.print(web_ui_banner(config.web_host, config.web_port))
        if self.interrupted:
            self.writer.event("interrupted")
            return "interrupted"
        self._start_progress()
        runner.start_shape()
        monitor = gevent.spawn(self.watch.run)
        deadline = None if config.max_duration_s is None else time.time() + config.max_duration_s + 30.0
        try:
            while not self.driver.finished and not self.interrupted and self.writer.write_error is None:
                gevent.sleep(0.2)
                if self.distributed:
                    self.pool.check()
                if deadline is not None and time.time() > deadline:
                    self.driver.interrupt("max_duration")
            if not self.interrupted and self.writer.write_error is None:
                self._drain(config.grace_s())
        finally:
            monitor.kill()
            if selfcheck is not None:
                selfcheck.stop()
        if self.writer.write_error is not None:  # the run directory is full: nothing more can be kept
            self.driver.interrupt("error")
            return "error"
        if self.interrupted:
            self.driver.interrupt("interrupted")
            self.writer.event("interrupted", **({"by": "web_ui"} if self.stopped_from_web else {}))
            return "interrupted"
        reason = self.driver.end_reason or "completed"
        if reason.startswith("stop_condition:"):
            self.writer.event("stop_condition", reason=reason.partition(":")[2])
        return str(reason)

    def _write_failed(self) -> None:
        """The run directory stopped taking writes: no new request (the loop above then ends the run)."""
        if self.context is not None:
            self.context.stopping = True

    def _evidence(self) -> Callable[[Any], int | None]:
        """Requests a clean step must send, by the trace's odds on the server's pool
        (``oomload.capacity.odds``, computed by ``OddsFeed`` without stalling the load; each level's
        odds go to ``odds.jsonl``) under its own scheduler limits where its line (the simulator's flags
        too) or its log gives them (``runinfo.config_limits``); nothing asked without a pool, when turned
        off, or while a level's odds are not known yet."""
        from oomload.capacity.odds import Pool
        from oomload.run.oddsfeed import OddsFeed
        from oomload.verdict.runinfo import config_limits
        from oomload.verdict.runview import SERVER_LOG, read_log_tail

        cache_config = RunReader(self.writer.path).json("cache_config.json")
        pool = Pool.from_cache_config(cache_config, self.max_model_len)
        if pool is None or not self.records:
            return lambda _step: None
        # the server's own max_num_seqs and max_num_batched_tokens, read as the verdict reads them
        log = read_log_tail(self.writer.path / SERVER_LOG)  # so far: its start-up, which says them
        limits = config_limits(RunReader(self.writer.path).config(), log)
        pool = pool.with_limits(limits.max_num_seqs, limits.max_num_batched_tokens)
        self.odds = OddsFeed(
            self.records,
            pool,
            self.config.levels,
            trace_path=self.writer.path / "trace.jsonl",
            seed=self.config.seed,
            record=lambda odds: self.writer.append("odds", odds.to_json()),
            shape="production"
            if prefix_mode(self.config, self.records)["mode"] == "shared"
            else "worst-case",
            place=self.config.evidence and self.config.place_levels and not self.config.open_loop,
            only_fitting=self.config.only_fitting,
            tail_percentile=self.config.tail_percentile,
        )
        if not self.config.evidence or self.config.open_loop:
            return lambda _step: None
        feed = self.odds
        return lambda step: feed.requests_for(step.concurrency)

    def _latest_scrape(self) -> dict[str, Any] | None:
        """The poller's last ok scrape, for a repeat to end at its preemption (``load.shape``); none
        with ``--no-evidence`` (every step then holds in full)."""
        if self.poller is None or not self.config.evidence:
            return None
        latest: dict[str, Any] | None = self.poller.latest
        return latest

    def _placed(self, plan: SchedulePlan) -> SchedulePlan:
        """The ramp placed where the trace's odds put the onset (``schedule.place_levels``), said in one
        line and recorded as a ``levels_placed`` event; ``plan`` as it is without odds, with levels the
        user named (``--concurrency``, ``--ramp``), ``--no-evidence``, an open loop or odds that call every
        level safe."""
        feed = self.odds
        if feed is None or feed.onset is None:  # no odds, or not placing (``_evidence``)
            return plan
        placed = dataclasses.replace(plan, levels=feed.levels, checks=feed.checks)
        checks = ",".join(map(str, sorted(feed.checks)))
        self.writer.event(
            "levels_placed", onset=feed.onset, levels=list(feed.levels), checks=sorted(feed.checks)
        )
        hold_s = plan.check_hold(self.config.hold()).hold_s
        said = f" ({checks}: short checks, {hold_s:g} s)" if checks else ""
        levels = ",".join(map(str, feed.levels))
        self.console.print(f"the trace's odds put the onset at {feed.onset}: levels {levels}{said}")
        return placed

    def _start_master(self, env: Environment, meter: MasterMeter) -> Runner:
        """A Locust master: bind, start the local workers, wait for all K to be bound and ready."""
        from locust.exception import RPCError

        config = self.config
        host = config.master_bind_host
        port = config.master_bind_port
        if port is None:
            port = wire.DEFAULT_MASTER_PORT if config.workers else free_port()
        self.pool.prepare_token(lambda text: self.console.print(text, highlight=False, markup=False))
        try:  # Locust's master behind the link's checks (oomload.run.master_auth: the authenticated link)
            runner: Runner = env._create_runner(
                guarded_master_class(), self.pool, master_bind_host=host, master_bind_port=port
            )
        except RPCError as err:
            raise ConfigError(
                f"the Locust master cannot listen on {host}:{port} ({err}); is the port in use? "
                "Choose another with --master-bind-port"
            ) from err
        self.runner = runner
        meter.listen(env)
        self.pool.listen(runner)
        self.pool.spawn_local(port)
        address = f"{host}:{port}"
        remote = config.expected_workers() - config.local_workers()
        if remote:
            shown = address if host not in wire.WILDCARD_HOSTS else f"{socket.gethostname()}:{port}"
            self.console.print(
                f"Locust master on {address}: waiting for {config.expected_workers()} workers "
                f"({config.local_workers()} local) at most {config.worker_timeout_s:g} s; "
                f"on each load host run `oomload worker --master {shown} --url {self.url} --token-file FILE`"
            )
        self.pool.wait_ready(config.worker_timeout_s, address)
        return runner

    def _drain(self, grace_s: float) -> None:
        """No new requests; wait (at most ``grace_s``) for those in flight to end on their own."""
        import gevent

        if self.context is not None:
            self.context.stopping = True
        if self.distributed:
            self.pool.drain(grace_s)
            return
        deadline = time.time() + grace_s
        while self.context is not None and self.context.in_flight and time.time() < deadline:
            gevent.sleep(0.05)

    def telemetry_snapshot(self) -> TelemetrySnapshot:
        """What the web UI's oomload tab shows: the step, the server's /metrics, GPU memory, outcomes."""
        step = self.driver.current if self.driver is not None else None
        ctx = self.context
        latest = self.poller.latest if self.poller is not None else None
        gpu = self.gpu.latest() if self.gpu is not None else None
        pre = latest.get("num_preemptions_total") if latest else None
        base = self.watch.baseline_preemptions or 0
        return TelemetrySnapshot(
            t_unix_s=time.time(),
            url=self.url,
            model=self.model,
            simulated=self.simulated,
            plan=self._plan_snapshot(),
            final=self.final,
            step=step,
            achieved_concurrency=None
            if ctx is None or self.distributed
            else round(ctx.achieved_concurrency(), 3),
            metrics=latest,
            preemptions_since_start=None if not isinstance(pre, int) else pre - base,
            gpu=gpu,
            server_memory=self.latest_server_memory(),
            outcomes={} if ctx is None else {o.value: n for o, n in ctx.outcomes.items()},
            server_dead=self.dead_evidence,
        )

    def _plan_snapshot(self) -> PlanState:
        """The schedule and where the run is in it (``PlanState``)."""
        config, driver = self.config, self.driver
        levels = self.plan.levels if self.plan is not None else config.levels
        plan = PlanState(
            levels=tuple(levels),
            hold_s=config.hold_s,
            min_requests=config.min_requests,
            warmup=config.warmup_s > 0,
            refine=config.refine and not config.open_loop,
            planned_steps=len(levels) + (1 if config.warmup_s > 0 else 0),
            open_loop=config.open_loop,
        )
        step = driver.current if driver is not None else None
        if self.final is not None or self.lingering:
            plan = replace(plan, state="over")
        elif driver is None or step is None:
            plan = replace(plan, state="starting")
        elif driver.finished:
            plan = replace(plan, state="finishing")
        elif driver.draining_to is not None:
            plan = replace(plan, state="draining", draining_to=driver.draining_to.concurrency)
        else:
            plan = replace(plan, state="running")
        if step is not None and driver is not None:
            plan = replace(plan, step_number=step.index + 1)
            started = driver.step_started_unix_s
            if plan.state == "running" and started is not None and not config.open_loop:
                hold = driver.hold_for(step)
                plan = replace(plan, step_left_s=round(max(0.0, hold.hold_s - (time.time() - started)), 1))
        return plan

    def _on_step(self, step: Any) -> None:
        if self.config.open_loop and self.context is not None and self.context.open_loop_start_s is None:
            lead_s = open_loop_lead_s(step.concurrency)
            self.context.start_open_loop(time.time() + lead_s, self.config.arrival_scale)
        if self.distributed and self.runner is not None:
            self.pool.broadcast(
                wire.STEP, {"step": step.index, "concurrency": step.concurrency, "phase": step.phase}
            )
        if self.progress is not None:
            self.progress.step(step)

    def _on_step_end(self, line: StepEndLine) -> None:
        if self.progress is not None:
            self.progress.step_ended(line)

    def _interrupt(self) -> None:
        """End the run now (Ctrl-C, SIGTERM, the web UI's STOP): the loop in ``run`` ends within its
        tick, the requests in flight are abandoned (written as cancelled), the end reason is
        ``interrupted``."""
        if self.lingering:  # the run is over: Ctrl-C only stops the web UI serving its verdict
            self._linger_over = True
            return
        self.interrupted = True
        if self.context is not None:
            self.context.stopping = True
        if self.env is not None:
            self.env.stop_timeout = 0.0  # abandon what is in flight (written as cancelled)

    def stop_from_web(self) -> None:
        """The web UI's STOP (``POST /stop``) while the run goes on: an interruption, said once; the
        web UI then serves the verdict as after a run that ended on its own."""
        if self.interrupted or self.lingering:
            return
        self.stopped_from_web = True
        self.console.print("[yellow]stopped from the web UI[/]: the run ends here (interrupted)")
        self._interrupt()

    def _install_signals(self) -> None:
        import gevent

        for sig in (signal.SIGINT, signal.SIGTERM):
            gevent.signal_handler(sig, self._interrupt)

    def _start_progress(self) -> None:
        from oomload.run.progress import ProgressView

        self.progress = ProgressView(self, self.console, live=self.config.live)
        self.progress.start()

    # -- after the run: the web UI serves the verdict --------------------------------------------
    def serve_verdict(self, final: FinalState, keep_s: float | None) -> None:
        """With ``--web``: keep the web UI up with the run's verdict until Ctrl-C / SIGTERM, or for
        ``keep_s`` seconds when given (0: not at all). Locust is already stopped; only its web
        server and the oomload tab still answer."""
        import gevent

        if self.web_ui is None:
            return
        self.final = final
        if (self.interrupted and not self.stopped_from_web) or (keep_s is not None and keep_s <= 0):
            return
        self.lingering = True
        web = f"http://{self.config.web_host}:{self.config.web_port}/?tab=oomload"
        until = "until Ctrl-C" if keep_s is None else f"for {keep_s:g} s (or until Ctrl-C)"
        self.console.print(
            f"[bold]The run is over.[/] The web UI keeps serving its verdict at {web} {until}.",
            highlight=False,
        )
        deadline = None if keep_s is None else time.time() + keep_s
        while not self._linger_over and (deadline is None or time.time() < deadline):
            gevent.sleep(0.2)
        self.lingering = False

    def close_web(self) -> None:
        if self.web_ui is not None:
            self.web_ui.stop()  # type: ignore[no-untyped-call]  # Locust's own, untyped
            self.web_ui = None
            sys.argv = self._saved_argv

    # -- teardown --------------------------------------------------------------------------------
    def shutdown(self, *, keep_web: bool = False) -> None:
        """Stop Locust, the workers and the samplers; the web UI too unless ``keep_web`` (the runner
        then serves the verdict with it and closes it, ``serve_verdict`` and ``close_web``)."""
        if self.context is not None:
            self.context.stopping = True
        if self.progress is not None:
            self.progress.stop()
        if self.env is not None:
            self.env.stop_timeout = 0.0  # what is still in flight now is abandoned (cancelled)
        if self.runner is not None:
            if self.distributed and self.pool.started:
                with contextlib.suppress(Exception):
                    self.pool.drain(0.0)  # every worker sends its last rows before it says drained
            with contextlib.suppress(Exception):
                self.runner.quit()
        if not keep_web:
            self.close_web()
        self.pool.wait()
        if self.poller is not None:
            self.poller.stop()
        if self.gpu is not None:
            self.gpu.stop()
        if self.server_evidence is not None:
            self.server_evidence.stop()
        if self.odds is not None:
            self.odds.stop()


def build_user_class(
    options: LoadOptions,
    *,
    records: Sequence[TraceRecord],
    api_key: str | None,
    sink: Any,
    worker: int = 0,
    workers: int = 1,
) -> tuple[Any, Any]:
    """A concrete ``ReplayUser`` subclass bound to a fresh ``ReplayContext`` (imports Locust)."""
    from oomload.run.scenario import ScenarioUser, bind_user

    # the very class the worker processes run: Locust's master tells its workers which user class to
    # spawn by name, so one class (one name) serves the master, the in-process runner and the workers
    user_class = ScenarioUser
    context = bind_user(
        user_class, options, records=records, api_key=api_key, sink=sink, worker=worker, workers=workers
    )
    return user_class, context
