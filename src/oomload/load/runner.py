"""One replay run, wired: preflight → run directory → telemetry → Locust → verdict.

``run_replay(config, console)`` does, in order:

1. read the trace; without a URL start the simulated vLLM (``oomload.sim.process.SimServer``) with
   demo defaults and say so;
2. preflight the endpoint (``/v1/models``: model, ``max_model_len``; warn how many trace requests
   cannot fit);
3. create the run directory, write ``config.json`` (no secrets: only the API key's variable name) and
   copy the trace (``trace.jsonl``);
4. start the ``/metrics`` poller and the GPU sampler (each optional: a missing sampler is an event);
5. run Locust in this process (``Environment`` + local runner, or a master with ``--processes N``
   local worker processes, or the web UI, which gains an "oomload" tab with the server's telemetry)
   with ``StepShape`` driving the schedule, while a monitor greenlet checks ``/health``, detects the
   first preemption (the ``num_preemptions_total`` delta) and server death, and feeds the live view;
6. on the way out — the schedule's end, a dead server, the maximum duration, Ctrl-C or SIGTERM —
   let the requests in flight finish (at most ``ramp_down_grace_s``; none for Ctrl-C), abandon the
   rest (written as ``cancelled``), stop Locust, the samplers and the simulated server, write the repro
   traces (the requests in flight at the first preemption and at the server's death),
   ``status.json``, and hand the run directory to ``oomload.report.finalize_run`` for the verdict and
   the exit code (130 when interrupted).

Server death is decided by the monitor, within a fraction of a second of the first sign: a user that
sees ``engine_dead`` or a refused connection flags it (and backs off), the monitor checks ``/health``
at once, and the server is dead when ``/health`` is refused twice, or refused / failing (5xx) while
requests died or the ``/metrics`` scrapes fail, or failing three times in a row. A dead server ends
the ramp whatever ``--stop-on`` says: later steps would measure nothing.

A step that lowers the user count (a refinement step below the previous one) stops users gracefully:
Locust's ``stop_timeout`` lets each finish its request, capped at ``ramp_down_grace_s``, after which
the rest are abandoned (``cancelled``). The new step starts when the requests in flight are down to
its level (``StepDriver`` settles; at most the same grace), so the higher step's pressure never
counts against the lower one.

With ``--processes N`` the workers (``oomload.load.locustfile``) announce themselves when bound
(``oomload_ready``), follow the steps (``oomload_step``), report their achieved concurrency with every
statistics report (``report_to_master``, once a second), and drain on ``oomload_stop``. Their output
goes to ``worker.K.log`` in the run directory; a worker that fails ends the run with one sentence.

Importing Locust monkey-patches the process with gevent; it happens inside ``run_replay`` only.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from oomload import __version__
from oomload.errors import ConfigError, ExitCode, RunAbortedError
from oomload.load.payload import Api, PayloadOptions
from oomload.load.preflight import count_unfit, preflight, split_base_url
from oomload.outcome import Outcome
from oomload.rundir import RunReader, RunWriter, new_run_dir
from oomload.schedule import Hold, SchedulePlan, StopCondition
from oomload.trace import TraceHeader, TraceRecord, read_trace, read_trace_header, write_trace

# The demo target: a simulated Llama-3.1-8B on an L4 (device memory as vLLM would use it, served on the
# simulator's /dcgm/metrics) whose KV cache preempts on traces/sample-chat.jsonl within the first few
# steps, fast enough (time scale 0.1) for the whole demo to finish in about a minute.
DEMO_MODEL = "llama-3.1-8b"
DEMO_GPU = "l4"
DEMO_SIM_ARGS: tuple[str, ...] = (
    "--model",
    DEMO_MODEL,
    "--gpu",
    DEMO_GPU,
    "--gpu-memory-utilization",
    "0.8",
    "--max-model-len",
    "8192",
    "--max-num-seqs",
    "64",
    "--time-scale",
    "0.1",
)
DEMO_LEVELS = (1, 2, 4, 8, 16)  # the demo preempts at about 10: the refinement finds it
DEMO_HOLD_S = 4.0
PREFLIGHT_TIMEOUT_S = 30.0
HEALTH_INTERVAL_S = 1.0
MONITOR_TICK_S = 0.2
RAMP_DOWN_GRACE_S = 10.0
WORKER_NAME_PREFIX = "worker"


@dataclass(frozen=True)
class ReplayConfig:
    """Everything one replay needs, validated (``oomload.cli.replay`` builds it from flags)."""

    trace_path: Path
    url: str | None = None
    model: str | None = None
    api: Api = "completions"
    stream: bool = True
    levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    hold_s: float = 30.0
    min_requests: int = 0
    warmup_s: float = 0.0
    refine: bool = True
    stop_on: tuple[StopCondition, ...] = (StopCondition("oom"),)
    max_duration_s: float | None = 1800.0
    order: str = "trace"
    seed: int = 0
    tail_percentile: float | None = None
    open_loop: bool = False
    arrival_scale: float = 1.0
    prefix_sharing: bool = False
    exact_output: bool = True
    token_id_range: tuple[int, int] = (100, 2000)
    api_key_env: str = "OPENAI_API_KEY"
    run_dir: Path | None = None
    runs_parent: Path = Path("runs")
    gates: tuple[str, ...] = ()
    web: bool = False
    web_host: str = "127.0.0.1"
    web_port: int = 8089
    processes: int = 1
    request_timeout_s: float = 600.0
    ramp_down_grace_s: float = RAMP_DOWN_GRACE_S
    metrics_interval_s: float = 1.0
    gpu: str = "auto"
    require_gpu: bool = False
    sim_args: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    live: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def schedule(self) -> SchedulePlan:
        return SchedulePlan(
            levels=self.levels, warmup=self.warmup_s > 0, refine=self.refine, stop_on=self.stop_on
        )

    def hold(self) -> Hold:
        return Hold(self.hold_s, self.min_requests)

    def grace_s(self) -> float:
        """How long stopped users may take to finish their request (ramp-down, end of run)."""
        return min(self.ramp_down_grace_s, self.request_timeout_s)

    def payload_options(self, model: str) -> PayloadOptions:
        return PayloadOptions(
            api=self.api,
            model=model,
            stream=self.stream,
            exact_output=self.exact_output,
            prefix_sharing=self.prefix_sharing,
            token_id_low=self.token_id_range[0],
            token_id_high=self.token_id_range[1],
            seed=self.seed,
        )


def run_replay(config: ReplayConfig, console: Console | None = None) -> int:
    """Run one replay and return the process exit code (``finalize_run``'s, or 130 when interrupted)."""
    console = console or Console(stderr=False)
    records = read_trace(config.trace_path)
    header = read_trace_header(config.trace_path)
    api_key = os.environ.get(config.api_key_env) or None
    import locust  # noqa: F401  (monkey-patches the process with gevent: before any socket is made)

    sim = None
    url = config.url
    if url is not None:
        url, note = split_base_url(url)
        if note:
            console.print(f"[yellow]note:[/] {note}")
    else:
        sim = _start_sim(config, console)
        url = sim.url
    try:
        return _run_with_server(config, console, records, header, url, api_key, simulated=sim is not None)
    finally:
        if sim is not None:
            sim.stop()


def preflight_timeout_s(config: ReplayConfig) -> float:
    """How long the preflight waits for ``/v1/models``: 30 s, never more than a request's timeout or
    the run's whole maximum duration."""
    limits = [PREFLIGHT_TIMEOUT_S, config.request_timeout_s]
    if config.max_duration_s is not None:
        limits.append(config.max_duration_s)
    return min(limits)


def _start_sim(config: ReplayConfig, console: Console) -> Any:
    try:
        from oomload.sim.process import SimServer
    except ImportError as err:
        raise ConfigError("no --url given and the simulated server is not available; pass --url URL") from err
    args = (*DEMO_SIM_ARGS, *config.sim_args)
    model, gpu = sim_flag(args, "--model"), sim_flag(args, "--gpu")
    console.print(
        f"[bold yellow]No --url: replaying against a SIMULATED vLLM server[/] — model {model}, "
        f"simulated GPU {gpu} (oomload sim serve {' '.join(args)})"
    )
    return SimServer(args).start()


def sim_flag(args: Sequence[str], flag: str) -> str | None:
    """The value the simulator will use for ``flag`` (the last one given, as argparse does)."""
    value = None
    for k, arg in enumerate(args):
        if arg == flag and k + 1 < len(args):
            value = args[k + 1]
        elif arg.startswith(flag + "="):
            value = arg.partition("=")[2]
    return value


def _run_with_server(
    config: ReplayConfig,
    console: Console,
    records: list[TraceRecord],
    header: TraceHeader,
    url: str,
    api_key: str | None,
    *,
    simulated: bool,
) -> int:
    info = preflight(url, model=config.model, api_key=api_key, timeout_s=preflight_timeout_s(config))
    unfit = count_unfit(records, info.max_model_len)
    if unfit:
        console.print(
            f"[yellow]warning:[/] {unfit} of {len(records)} trace requests need more than max_model_len="
            f"{info.max_model_len} tokens (prompt + output); the server will reject or clamp them"
        )
    run_dir = config.run_dir if config.run_dir is not None else new_run_dir(config.runs_parent)
    run_dir.mkdir(parents=True, exist_ok=True)
    writer = RunWriter(run_dir)
    session = _Session(
        config, console, writer, records, url, api_key, info.model, info.max_model_len, simulated
    )
    end_reason = "error"
    # from here on a Ctrl-C or SIGTERM, whenever it comes, ends in status.json and a (partial) report:
    # the session's handlers take over once it runs; until then Python's KeyboardInterrupt does
    try:
        writer.write_json(
            "config.json", _config_json(config, url, info.model, info.max_model_len, simulated, records)
        )
        write_trace(run_dir / "trace.jsonl", records, header)
        console.print(
            f"run directory [bold]{run_dir}[/] · model {info.model} · max_model_len {info.max_model_len} · "
            f"{len(records)} trace requests · levels {','.join(map(str, config.levels))}"
        )
        end_reason = session.run()
    except KeyboardInterrupt:
        end_reason = "interrupted"
        writer.event("interrupted")
    finally:
        session.shutdown()
        finished = end_reason not in ("interrupted", "error")
        writer.write_json(
            "status.json", {"finished": finished, "end_reason": end_reason, "ended_unix_s": time.time()}
        )
        writer.close()
    write_repro(run_dir)
    code = _finalize(run_dir, config.gates, console)
    if end_reason == "interrupted":
        return int(ExitCode.INTERRUPTED)
    return code


def _finalize(run_dir: Path, gates: Sequence[str], console: Console) -> int:
    try:
        from oomload.report import finalize_run
    except ImportError:
        _print_step_table(run_dir, console)
        return int(ExitCode.OK)
    return int(finalize_run(run_dir, gates=gates, console=console))


def _print_step_table(run_dir: Path, console: Console) -> None:
    from rich.table import Table

    table = Table(title=f"steps ({run_dir})")
    for col in ("step", "phase", "concurrency", "started", "ended", "errors", "preemptions", "achieved"):
        table.add_column(col)
    for line in RunReader(run_dir).stream("steps"):
        if line.get("event") == "end":
            keys = ("step", "phase", "concurrency", "started", "ended", "ended_errors")
            table.add_row(
                *(str(line.get(k, "")) for k in keys),
                str(line.get("preemptions")),
                str(line.get("achieved_concurrency_mean", "")),
            )
    console.print(table)


def _config_json(
    config: ReplayConfig,
    url: str,
    model: str,
    max_model_len: int | None,
    simulated: bool,
    records: Sequence[TraceRecord],
) -> dict[str, Any]:
    return {
        "schema": 1,
        "oomload_version": __version__,
        "started_unix_s": time.time(),
        "argv": list(config.argv),
        "trace_path": str(config.trace_path),
        "trace_count": len(records),
        "url": url,
        "simulated": simulated,
        "model": model,
        "api": config.api,
        "stream": config.stream,
        "schedule": {
            "levels": list(config.levels),
            "hold_s": config.hold_s,
            "min_requests": config.min_requests,
            "warmup_s": config.warmup_s,
            "refine": config.refine,
        },
        "stop_on": [str(c) for c in config.stop_on],
        "max_duration_s": config.max_duration_s,
        "max_model_len": max_model_len,
        "gates": list(config.gates),
        "processes": config.processes,
        "order": config.order,
        "seed": config.seed,
        "tail_percentile": config.tail_percentile,
        "open_loop": config.open_loop,
        "arrival_scale": config.arrival_scale,
        "prefix_sharing": config.prefix_sharing,
        "exact_output": config.exact_output,
        "token_id_range": list(config.token_id_range),
        "request_timeout_s": config.request_timeout_s,
        "ramp_down_grace_s": config.ramp_down_grace_s,
        "api_key_env": config.api_key_env,  # the variable's name, never its value
        "web": config.web,
    }


class _Session:
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
    ) -> None:
        self.config = config
        self.console = console
        self.writer = writer
        self.records = records
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.max_model_len = max_model_len
        self.simulated = simulated
        self.poller: Any = None
        self.gpu: Any = None
        self.env: Any = None
        self.runner: Any = None
        self.web_ui: Any = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.worker_logs: list[Path] = []
        self.workers_ready: set[int] = set()
        self.workers_drained: set[int] = set()
        self._stop_seq = 0
        self.context: Any = None
        self.driver: Any = None
        self.interrupted = False
        self.dead_evidence: str | None = None
        self.first_preemption_seen = False
        self._baseline_preemptions: int | None = None
        self._health_failures = 0
        self._health_refused = 0
        self._last_health_s = 0.0
        self.progress: Any = None
        self._saved_argv = sys.argv

    # -- telemetry -------------------------------------------------------------------------------
    def _start_telemetry(self) -> None:
        try:
            from oomload.telemetry.poller import MetricsPoller
        except ImportError:
            self.writer.event("scrape_failed", error="telemetry module not available")
        else:
            self.poller = MetricsPoller(
                self.url,
                self.writer,
                interval_s=self.config.metrics_interval_s,
                model_name=self.model,
                max_model_len=self.max_model_len,
            )
            first = self.poller.poll_once()
            if first.get("ok"):
                self._baseline_preemptions = first.get("num_preemptions_total")
            self.poller.start()
        self._start_gpu()

    def _start_gpu(self) -> None:
        spec = self.config.gpu
        if spec == "none":
            return
        source, url = "nvml", None
        if spec.startswith(("dcgm:", "remote:")):
            source, _, url = spec.partition(":")
        elif spec == "auto" and self.simulated:
            source, url = "dcgm", f"{self.url}/dcgm/metrics"
        try:
            from oomload.telemetry.gpu import GpuSamplerProcess
        except ImportError:
            self.writer.event("sampler_unavailable", detail="the GPU sampler module is not available")
            return
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

    def preemptions_total(self) -> int | None:
        if self.poller is None:
            return None
        record = self.poller.poll_once()
        value = record.get("num_preemptions_total") if record.get("ok") else None
        return value if isinstance(value, int) else None

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> str:
        import gevent
        from locust.env import Environment

        from oomload.load.context import ContextMeter
        from oomload.load.shape import StepDriver, make_shape

        self._install_signals()  # first: a Ctrl-C during the set-up below ends the run the same way
        self._start_telemetry()
        config = self.config
        user_class, self.context = build_user_class(
            config_to_worker_options(config, self.url, self.model),
            records=self.records,
            api_key=self.api_key,
            sink=self.writer,
        )
        meter: Any = ContextMeter(self.context)
        on_step: Callable[[Any], None] | None = self._on_step
        step_done = None
        plan, hold = config.schedule(), config.hold()
        if config.open_loop:
            cap = max(config.levels)
            plan = SchedulePlan(levels=(cap,), warmup=False, refine=False, stop_on=(StopCondition("never"),))
            self.context.start_open_loop(time.time() + 1.0, config.arrival_scale)

            def step_done(_elapsed: float, _completed: int) -> bool:
                return bool(self.context.exhausted and not self.context.in_flight)

        if config.processes > 1:
            meter = _MasterMeter(self, user_class)
        self.driver = StepDriver(
            plan,
            hold,
            meter,
            self.writer,
            warmup_hold=Hold(config.warmup_s, 0) if config.warmup_s > 0 else None,
            preemptions_total=self.preemptions_total,
            server_dead=lambda: self.dead_evidence is not None,
            max_duration_s=config.max_duration_s,
            on_step=on_step,
            on_step_end=self._on_step_end,
            step_done=step_done,
            settle_s=config.grace_s(),
        )
        self.env = Environment(
            user_classes=[user_class], shape_class=make_shape(self.driver, keep_open=True), host=self.url
        )
        # a step that lowers the user count lets the stopped users finish their request (capped)
        self.env.stop_timeout = config.grace_s()
        if config.processes > 1:
            self.runner = self.env.create_master_runner("127.0.0.1", _free_port())
            meter.listen(self.env)
            self.runner.register_message("oomload_ready", self._on_worker_ready)
            self.runner.register_message("oomload_drained", self._on_worker_drained)
            self._spawn_workers()
        else:
            self.runner = self.env.create_local_runner()
            self.context.live_users = lambda: int(self.runner.user_count)
        if config.web:
            from oomload.load.webui import extend_web_ui

            # Locust's web UI re-parses sys.argv with its own parser on every page load
            self._saved_argv = sys.argv
            sys.argv = [sys.argv[0]]
            self.web_ui = self.env.create_web_ui(config.web_host, config.web_port)
            extend_web_ui(self.web_ui, self.telemetry_snapshot)
            self.console.print(
                f"Locust web UI: http://{config.web_host}:{config.web_port} (telemetry: the oomload tab)"
            )
        if self.interrupted:
            self.writer.event("interrupted")
            return "interrupted"
        self._start_progress()
        self.runner.start_shape()
        monitor = gevent.spawn(self._monitor)
        deadline = None if config.max_duration_s is None else time.time() + config.max_duration_s + 30.0
        try:
            while not self.driver.finished and not self.interrupted:
                gevent.sleep(0.2)
                self._check_workers()
                if deadline is not None and time.time() > deadline:
                    self.driver.interrupt("max_duration")
            if not self.interrupted:
                self._drain(config.grace_s())
        finally:
            monitor.kill()
        if self.interrupted:
            self.driver.interrupt("interrupted")
            self.writer.event("interrupted")
            return "interrupted"
        reason = self.driver.end_reason or "completed"
        if reason.startswith("stop_condition:"):
            self.writer.event("stop_condition", reason=reason.partition(":")[2])
        return str(reason)

    def _drain(self, grace_s: float) -> None:
        """No new requests; wait (at most ``grace_s``) for those in flight to end on their own."""
        import gevent

        if self.context is not None:
            self.context.stopping = True
        deadline = time.time() + grace_s
        if self.config.processes > 1:
            seq = self._send_stop(grace_s)
            while len(self.workers_drained) < len(self.workers) and time.time() < deadline + 2.0:
                if self._stop_seq != seq or any(w.poll() is not None for w in self.workers):
                    break
                gevent.sleep(0.05)
            return
        while self.context is not None and self.context.in_flight and time.time() < deadline:
            gevent.sleep(0.05)

    def _send_stop(self, grace_s: float) -> int:
        self._stop_seq += 1
        self.workers_drained = set()
        if self.runner is not None:
            self.runner.send_message("oomload_stop", {"grace_s": grace_s, "seq": self._stop_seq})
        return self._stop_seq

    def _on_worker_ready(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        self.workers_ready.add(int(msg.data["worker"]))

    def _on_worker_drained(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        if int(msg.data.get("seq", -1)) == self._stop_seq:
            self.workers_drained.add(int(msg.data["worker"]))

    def _check_workers(self) -> None:
        for k, proc in enumerate(self.workers):
            code = proc.poll()
            if code is not None:
                raise RunAbortedError(self._worker_failure(k, f"exited with code {code} during the run"))

    def _worker_failure(self, k: int, what: str) -> str:
        last = _last_error_line(self.worker_logs[k]) if k < len(self.worker_logs) else None
        because = f" ({last})" if last else ""
        where = f"; its output is in {self.worker_logs[k]}" if k < len(self.worker_logs) else ""
        return f"Locust worker process {k} {what}{because}{where}"

    def telemetry_snapshot(self) -> dict[str, Any]:
        """What the web UI's oomload tab shows: the step, the server's /metrics, GPU memory, outcomes."""
        step = self.driver.current if self.driver is not None else None
        ctx = self.context
        latest = self.poller.latest if self.poller is not None else None
        gpu = self.gpu.latest() if self.gpu is not None else None
        pre = latest.get("num_preemptions_total") if latest else None
        base = self._baseline_preemptions or 0
        return {
            "t_unix_s": time.time(),
            "step": None
            if step is None
            else {"index": step.index, "concurrency": step.concurrency, "phase": step.phase},
            "achieved_concurrency": None
            if ctx is None or self.config.processes > 1
            else round(ctx.achieved_concurrency(), 3),
            "metrics": latest,
            "preemptions_since_start": None if not isinstance(pre, int) else pre - base,
            "gpu": gpu,
            "outcomes": {} if ctx is None else {o.value: n for o, n in ctx.outcomes.items()},
            "server_dead": self.dead_evidence,
        }

    def _on_step(self, step: Any) -> None:
        if self.config.processes > 1 and self.runner is not None:
            self.runner.send_message(
                "oomload_step", {"step": step.index, "concurrency": step.concurrency, "phase": step.phase}
            )
        if self.progress is not None:
            self.progress.step(step)

    def _on_step_end(self, line: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.step_ended(line)

    def _install_signals(self) -> None:
        import gevent

        def interrupt() -> None:
            self.interrupted = True
            if self.context is not None:
                self.context.stopping = True
            if self.env is not None:
                self.env.stop_timeout = 0.0  # abandon what is in flight (written as cancelled)

        for sig in (signal.SIGINT, signal.SIGTERM):
            gevent.signal_handler(sig, interrupt)

    def _start_progress(self) -> None:
        from oomload.load.progress import ProgressView

        self.progress = ProgressView(self, self.console, live=self.config.live)
        self.progress.start()

    # -- the monitor: health, first preemption, live view ----------------------------------------
    def _monitor(self) -> None:
        import gevent

        last_refresh = 0.0
        while True:
            gevent.sleep(MONITOR_TICK_S)
            now = time.time()
            if self.progress is not None:
                self.progress.sample()
            suspected = self.context is not None and self.context.death_suspected
            if suspected or now - self._last_health_s >= HEALTH_INTERVAL_S:
                if self.context is not None:
                    self.context.death_suspected = False
                self._last_health_s = now
                self._check_health(suspected)
            if now - last_refresh >= HEALTH_INTERVAL_S:
                last_refresh = now
                self._check_preemption()
                if self.progress is not None:
                    self.progress.refresh()

    def _check_preemption(self) -> None:
        if self.first_preemption_seen or self.poller is None:
            return
        latest = self.poller.latest
        if not latest:
            return
        total = latest.get("num_preemptions_total")
        if not isinstance(total, int):
            return
        if self._baseline_preemptions is None:
            self._baseline_preemptions = total
            return
        if total > self._baseline_preemptions:
            self.first_preemption_seen = True
            step = self.driver.current if self.driver is not None else None
            self.writer.event(
                "first_preemption",
                t_unix_s=float(latest.get("t_unix_s", time.time())),
                step=None if step is None else step.index,
                concurrency=None if step is None else step.concurrency,
            )

    def _check_health(self, suspected: bool = False) -> None:
        if self.dead_evidence is not None:
            return
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5.0) as resp:
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
        self.writer.event("health_failed", detail=failure)
        engine_dead = self.context is not None and self.context.outcomes[Outcome.ENGINE_DEAD] > 0
        scrapes_failing = self.poller is not None and int(self.poller.consecutive_failures or 0) >= 2
        corroborated = suspected or engine_dead or scrapes_failing
        if self._health_refused >= 2 or self._health_failures >= 3 or corroborated:
            self._declare_dead(failure, engine_dead, scrapes_failing)

    def _declare_dead(self, failure: str, engine_dead: bool, scrapes_failing: bool) -> None:
        step = self.driver.current if self.driver is not None else None
        evidence = f"/health {failure} ({self._health_failures}x)"
        if engine_dead:
            evidence += "; engine_dead outcomes"
        if scrapes_failing:
            evidence += "; /metrics scrapes failing"
        self.dead_evidence = evidence
        if self.context is not None:
            self.context.stopping = True  # nothing more to measure: the users go idle at once
        if self.config.processes > 1:
            self._send_stop(0.0)
        self.writer.event("server_dead", step=None if step is None else step.index, evidence=evidence)
        self.console.print(f"[bold red]server dead:[/] {evidence}")

    # -- workers (--processes N) -----------------------------------------------------------------
    def _spawn_workers(self) -> None:
        import gevent

        port = self.runner.master_bind_port
        env = dict(os.environ)
        options = config_to_worker_options(self.config, self.url, self.model)
        options["run_dir"] = str(self.writer.path)
        options["workers"] = self.config.processes
        options["user_class"] = self.env.user_classes[0].__name__
        for k in range(self.config.processes):
            env_k = {**env, "OOMLOAD_WORKER_JSON": json.dumps({**options, "worker": k})}
            cmd = [
                sys.executable,
                "-m",
                "locust",
                "-f",
                str(Path(__file__).with_name("locustfile.py")),
                "--worker",
                "--master-host",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--host",
                self.url,
                "--loglevel",
                "WARNING",
            ]
            log = self.writer.path / f"{WORKER_NAME_PREFIX}.{k}.log"
            self.worker_logs.append(log)
            with open(log, "ab") as out:  # the child keeps its own descriptor
                self.workers.append(
                    subprocess.Popen(
                        cmd,
                        env=env_k,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        preexec_fn=_die_with_parent,
                    )
                )
        deadline = time.time() + 60.0
        # ready = connected to the master AND the user class bound (the worker says so itself), so
        # the first spawn message can never reach a worker that cannot run it
        while (
            len(self.runner.clients.ready) < self.config.processes
            or len(self.workers_ready) < self.config.processes
        ):
            if self.interrupted:
                return
            for k, proc in enumerate(self.workers):
                if proc.poll() is not None:
                    raise RunAbortedError(
                        self._worker_failure(k, f"exited with code {proc.returncode} at start")
                    )
            if time.time() > deadline:
                raise RunAbortedError(
                    f"the {self.config.processes} Locust worker processes did not connect within 60 s; "
                    f"their output is in {self.writer.path}/{WORKER_NAME_PREFIX}.*.log"
                )
            gevent.sleep(0.1)

    # -- teardown --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self.context is not None:
            self.context.stopping = True
        if self.progress is not None:
            self.progress.stop()
        if self.env is not None:
            self.env.stop_timeout = 0.0  # what is still in flight now is abandoned (cancelled)
        if self.runner is not None:
            if self.config.processes > 1:
                with contextlib.suppress(Exception):
                    self._send_stop(0.0)
            with contextlib.suppress(Exception):
                self.runner.quit()
        if self.web_ui is not None:
            self.web_ui.stop()
            sys.argv = self._saved_argv
        for proc in self.workers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.poller is not None:
            self.poller.stop()
        if self.gpu is not None:
            self.gpu.stop()


class _MasterMeter:
    """``StepMeter`` from Locust's aggregated statistics (master of worker processes).

    Achieved concurrency, requests started and requests ended by outcome come from the workers' own
    reports (``report_to_master`` → ``worker_report``, once a second, so at most a second old): each
    worker sends its time-weighted mean and maximum in-flight count for the step it is in; the step's
    mean is the sum of the workers' means, its maximum the sum of their maxima (an upper bound: the
    workers' peaks need not coincide). A step shorter than one report has none.
    """

    def __init__(self, session: _Session, user_class: Any) -> None:
        self.session = session
        self.path = user_class.replay_path
        self._base = (0, 0, 0, 0)
        self._step: int | None = None
        self.reports: dict[str, dict[str, Any]] = {}

    def listen(self, env: Any) -> None:
        def on_worker_report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
            report = data.get("oomload")
            if isinstance(report, dict):
                self.reports[client_id] = report

        env.events.worker_report.add_listener(on_worker_report)

    def achieved(self) -> tuple[float | None, int | None]:
        mine = [r for r in self.reports.values() if r.get("step") == self._step]
        if not mine:
            return None, None
        return sum(float(r["mean"]) for r in mine), sum(int(r["max"]) for r in mine)

    def _totals(self) -> tuple[int, int, int, int]:
        env = self.session.env
        if env is None:
            return 0, 0, 0, 0
        entry = env.stats.get(self.path, "POST")
        dead = sum(e.occurrences for e in env.stats.errors.values() if "engine_dead" in str(e.error))
        return entry.num_requests, entry.num_failures, dead, entry.total_content_length

    def begin(self, step: Any) -> None:
        self._base = self._totals()
        self._step = step.index

    def end(self) -> None:
        if self.session.runner is not None:
            self.session.runner.send_message("oomload_step_end", {"step": self._step})

    def completed(self) -> int:
        return self._totals()[0] - self._base[0]

    def in_flight(self) -> int | None:
        """The workers' in-flight requests as last reported (at most a second old)."""
        if len(self.reports) < len(self.session.workers):
            return None
        return sum(int(r.get("in_flight", 0)) for r in self.reports.values())

    def count(self) -> Any:
        from oomload.load.shape import StepCount

        now = self._totals()
        diff = [a - b for a, b in zip(now, self._base, strict=True)]
        mean, peak = self.achieved()
        mine = [r for r in self.reports.values() if r.get("step") == self._step]
        outcomes: Counter[str] = Counter()
        for report in mine:
            outcomes.update({str(k): int(v) for k, v in (report.get("outcomes") or {}).items()})
        return StepCount(
            completed=diff[0],
            errors=diff[1],
            engine_dead=diff[2],
            completion_tokens=diff[3],
            achieved_mean=mean,
            achieved_max=peak,
            started=sum(int(r.get("started", 0)) for r in mine) if mine else None,
            cancelled=outcomes["cancelled"],
            outcomes=dict(outcomes),
        )


def _die_with_parent() -> None:
    """In a worker process (Linux): get SIGTERM when oomload dies, even by SIGKILL — no orphans."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _last_error_line(log: Path) -> str | None:
    """The last line of a worker's log that names an error (``KeyError: 'X'``), shortened."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            tail = fh.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        text = line.strip()
        if text and not text.startswith(("File ", "Traceback", "^", "~")) and not line.startswith(" "):
            return text[:200]
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- shared with the locustfile (worker processes and scenarios) ---------------------------------
def config_to_worker_options(config: ReplayConfig, url: str, model: str) -> dict[str, Any]:
    """The JSON-able options a worker process needs (no secrets: the key's variable name only)."""
    return {
        "trace": str(config.trace_path),
        "url": url,
        "model": model,
        "payload": asdict(config.payload_options(model)),
        "order": config.order,
        "seed": config.seed,
        "tail_percentile": config.tail_percentile,
        "request_timeout_s": config.request_timeout_s,
        "api_key_env": config.api_key_env,
        "open_loop": config.open_loop,
        "arrival_scale": config.arrival_scale,
    }


def build_user_class(
    options: dict[str, Any],
    *,
    records: Sequence[TraceRecord],
    api_key: str | None,
    sink: Any,
    worker: int = 0,
    workers: int = 1,
) -> tuple[Any, Any]:
    """A concrete ``ReplayUser`` subclass bound to a fresh ``ReplayContext`` (imports Locust)."""
    from oomload.load.scenario import ScenarioUser, bind_user

    # the very class the worker processes run: Locust's master tells its workers which user class to
    # spawn by name, so one class (one name) serves the master, the in-process runner and the workers
    user_class = ScenarioUser
    context = bind_user(
        user_class, options, records=records, api_key=api_key, sink=sink, worker=worker, workers=workers
    )
    return user_class, context


def write_repro(run_dir: Path) -> list[Path]:
    """Write ``repro/first_preemption.jsonl`` and ``repro/server_death.jsonl`` from the run's files.

    The requests in flight at moment T are those with ``start ≤ T ≤ end``. T is the first
    preemption's scrape time, and for a death the earliest end of a request that failed with
    ``engine_dead``/``transport_error`` in the step of death (else the ``server_dead`` event's time).
    """
    reader = RunReader(run_dir)
    events = list(reader.stream("events"))
    results = reader.requests()
    written: list[Path] = []
    moments: list[tuple[str, float]] = []
    pre = next((e for e in events if e.get("kind") == "first_preemption"), None)
    if pre is not None:
        moments.append(("first_preemption", float(pre["t_unix_s"])))
    dead = next((e for e in events if e.get("kind") == "server_dead"), None)
    if dead is not None:
        t_dead = float(dead["t_unix_s"])
        failed = [
            r.end_unix_s
            for r in results
            if r.outcome.value in ("engine_dead", "transport_error") and r.end_unix_s <= t_dead + 1.0
        ]
        moments.append(("server_death", min(failed) if failed else t_dead))
    for name, t in moments:
        in_flight = [r for r in results if r.start_unix_s <= t <= r.end_unix_s]
        if not in_flight:
            continue
        t0 = min(r.start_unix_s for r in in_flight)
        repro = [
            TraceRecord(
                id=r.request_id,
                arrival_s=r.start_unix_s - t0,
                prompt_tokens=r.prompt_tokens_asked,
                output_tokens=r.output_tokens_asked,
            )
            for r in sorted(in_flight, key=lambda r: r.start_unix_s)
        ]
        path = run_dir / "repro" / f"{name}.jsonl"
        write_trace(
            path, repro, TraceHeader(source=(str(run_dir),), format="oomload-repro", extra={"moment": name})
        )
        written.append(path)
    return written


__all__ = [
    "DEMO_HOLD_S",
    "DEMO_LEVELS",
    "DEMO_SIM_ARGS",
    "ReplayConfig",
    "build_user_class",
    "run_replay",
    "write_repro",
]
