"""The master's side of distributed load: its Locust workers (local and on other hosts), their
results, and the ``StepMeter`` over them.

``WorkerPool`` waits for ``K`` workers (``--workers K``; ``--processes N`` starts N of them on this
host as ``oomload worker`` processes on 127.0.0.1, their output in ``worker.K.log``, SIGTERM when
oomload dies). Each says hello (``oomload.load.wire``); the master checks its versions, gives it an
index ``k`` (local workers keep their own; remote ones take the next free one) and sends it the run's
``LoadOptions`` and the trace's lengths; the load starts once all K are bound and ready. A worker
that fails before the load, a refusal or a timeout ends the run with one sentence that names what is
missing ("1 of 2 Locust workers arrived within 60 s …"), never a traceback.

During the run every worker streams its results (``oomload_results``, batched); the master writes
them to ``requests.jsonl`` as they come, so the run directory has the shape of a single-process run.

**A worker lost during the run** (its process exited, it quit, or Locust marked it missing after 3 s
without a heartbeat) is an event (``worker_lost``: index, host, how, rows received), and the rule is:
the run continues while at least one worker remains — the remaining workers take over the lost
worker's users at once (Locust re-dispatches them, as its ``--enable-rebalancing`` does), and the
step's achieved concurrency shows any shortfall; when the last worker is lost the run ends with
``workers_lost``. Everything the lost worker had sent is in ``requests.jsonl``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomload import __version__
from oomload.errors import RunAbortedError
from oomload.load import wire

WORKER_NAME_PREFIX = "worker"
LOCAL_WORKER_ENV = "OOMLOAD_LOCAL_WORKER"  # set in the environment of the workers oomload starts


@dataclass
class WorkerInfo:
    """One worker as the master knows it."""

    index: int
    client_id: str
    host: str
    pid: int
    local: bool
    ready: bool = False
    rows: int = 0
    next_seq: int = 0
    gaps: int = 0
    lost: str | None = None  # how it was lost, once it was

    def name(self) -> str:
        where = "local" if self.local else self.host
        return f"worker {self.index} ({where}, pid {self.pid})"


class WorkerPool:
    """The workers of one session (``oomload.run.session``)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.workers: dict[str, WorkerInfo] = {}  # by Locust client id
        self.refused: list[str] = []
        self.failed: list[str] = []
        self.drained: set[int] = set()
        self.started = False  # the load has started: late workers are refused
        self._stop_seq = 0
        self._proc_lost: set[int] = set()

    @property
    def expected(self) -> int:
        return int(self.session.config.expected_workers())

    # -- set-up ----------------------------------------------------------------------------------
    def listen(self, runner: Any) -> None:
        runner.register_message(wire.HELLO, self.on_hello)
        runner.register_message(wire.READY, self.on_ready)
        runner.register_message(wire.FAILED, self.on_failed)
        runner.register_message(wire.RESULTS, self.on_results)
        runner.register_message(wire.DRAINED, self.on_drained)

    def spawn_local(self, port: int) -> None:
        """Start the local worker processes: ``oomload worker`` against this master on 127.0.0.1."""
        s = self.session
        for k in range(s.config.local_workers()):
            cmd = [
                sys.executable,
                "-m",
                "oomload",
                "worker",
                "--master",
                f"127.0.0.1:{port}",
                "--local-index",
                str(k),
                "--local-run-dir",
                str(s.writer.path),
            ]
            log = s.writer.path / f"{WORKER_NAME_PREFIX}.{k}.log"
            self.logs.append(log)
            env = {**os.environ, LOCAL_WORKER_ENV: str(k)}
            with open(log, "ab") as out:  # the child keeps its own descriptor
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        preexec_fn=die_with_parent,
                    )
                )

    def wait_ready(self, timeout_s: float, address: str) -> None:
        """Wait until all K workers are bound and ready (at most ``timeout_s``); else one sentence."""
        import gevent

        s = self.session
        deadline = time.time() + timeout_s
        while True:
            if s.interrupted:
                return
            ready = [w for w in self.live() if w.ready and w.client_id in s.runner.clients]
            if len(ready) >= self.expected:
                self.started = True
                return
            for k, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise RunAbortedError(self.failure(k, f"exited with code {proc.returncode} at start"))
            if self.failed:
                raise RunAbortedError(self.failed[0])
            if time.time() > deadline:
                raise RunAbortedError(self.missing_sentence(timeout_s, address))
            gevent.sleep(0.1)

    def missing_sentence(self, timeout_s: float, address: str) -> str:
        """What is missing when the workers did not all arrive in time."""
        ready = [w for w in self.live() if w.ready]
        local = sum(1 for w in ready if w.local)
        hosts = sorted({w.host for w in ready if not w.local})
        parts = [f"{len(ready)} of {self.expected} Locust workers arrived within {timeout_s:g} s"]
        n_local = self.session.config.local_workers()
        detail = [f"{local} of {n_local} local"] if n_local else []
        if self.expected > n_local:
            from_hosts = f" from {', '.join(hosts)}" if hosts else ""
            detail.append(f"{len(ready) - local} of {self.expected - n_local} remote{from_hosts}")
        sentence = f"{parts[0]} ({', '.join(detail)})"
        if self.refused:
            sentence += f"; refused: {'; '.join(self.refused)}"
        if self.expected > n_local:
            sentence += f"; start the others with `oomload worker --master {address}`, or lower --workers"
        else:
            sentence += f"; their output is in {self.session.writer.path}/{WORKER_NAME_PREFIX}.*.log"
        return sentence

    def on_hello(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        s = self.session
        data = msg.data or {}
        import locust

        why = wire.version_mismatch(
            {"oomload_version": __version__, "locust_version": locust.__version__}, data
        )
        index = None if why else self._free_index(data.get("local_index"))
        if why is None and index is None:
            why = (
                "the run has started; a worker cannot join it"
                if self.started
                else f"the master already has its {self.expected} workers"
            )
        host = str(data.get("host") or msg.node_id.rsplit("_", 1)[0])
        if why is not None or index is None:
            self.refused.append(f"{host} ({why})")
            s.runner.send_message(wire.REFUSED, {"error": why}, client_id=msg.node_id)
            return
        self.workers[msg.node_id] = WorkerInfo(
            index=index,
            client_id=msg.node_id,
            host=host,
            pid=int(data.get("pid") or 0),
            local=data.get("local_index") is not None,
        )
        s.runner.send_message(
            wire.CONFIG,
            {
                "worker": index,
                "workers": self.expected,
                "user_class": s.env.user_classes[0].__name__,
                "options": s.config.load_options(s.url, s.model, s.max_model_len).to_json(),
                "trace": wire.trace_to_wire(s.records),
            },
            client_id=msg.node_id,
        )

    def _free_index(self, local_index: Any) -> int | None:
        if self.started:
            return None
        taken = {w.index for w in self.workers.values()}
        n_local = self.session.config.local_workers()
        if isinstance(local_index, int) and 0 <= local_index < n_local and local_index not in taken:
            return local_index
        free = [k for k in range(n_local, self.expected) if k not in taken]
        return free[0] if free else None

    def on_ready(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        info = self.workers.get(msg.node_id)
        if info is not None:
            info.ready = True

    def on_failed(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        info = self.workers.get(msg.node_id)
        who = info.name() if info is not None else msg.node_id
        self.failed.append(f"Locust {who} failed: {msg.data.get('error')}")

    # -- the run ---------------------------------------------------------------------------------
    def on_results(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        """A batch of a worker's results: written to ``requests.jsonl`` at once."""
        del environment
        data = msg.data
        info = self.workers.get(msg.node_id)
        if info is not None:
            seq = int(data.get("seq", -1))
            if seq != info.next_seq:
                info.gaps += 1
            info.next_seq = seq + 1
        rows = data.get("rows") or []
        for row in rows:
            if isinstance(row, dict):
                self.session.writer.append("requests", row)
        if info is not None:
            info.rows += len(rows)

    def live(self) -> list[WorkerInfo]:
        return [w for w in self.workers.values() if w.lost is None]

    def live_client_ids(self) -> set[str]:
        return {w.client_id for w in self.live() if w.ready}

    def check(self) -> None:
        """Notice the workers lost since the last look (the session calls this 5 times a second)."""
        from locust.runners import STATE_MISSING

        s = self.session
        if s.runner is None or not self.started:
            return
        for k, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None and k not in self._proc_lost:
                self._proc_lost.add(k)
                info = next((w for w in self.workers.values() if w.local and w.index == k), None)
                if info is not None and info.lost is None:
                    self._lose(info, self.failure(k, f"exited with code {code} during the run"))
        for info in self.live():
            client = s.runner.clients.get(info.client_id)
            if client is None:
                self._lose(info, f"Locust {info.name()} quit")
            elif client.state == STATE_MISSING:
                self._lose(info, f"Locust {info.name()} sent no heartbeat for 3 s (missing)")

    def _lose(self, info: WorkerInfo, how: str) -> None:
        s = self.session
        info.lost = how
        left = len([w for w in self.live() if w.ready])
        s.writer.event(
            "worker_lost",
            worker=info.index,
            host=info.host,
            pid=info.pid,
            local=info.local,
            detail=how,
            rows_received=info.rows,
            workers_left=left,
        )
        rule = f"{left} worker(s) left take over its users" if left else "no worker left: the run ends"
        s.console.print(f"[yellow]warning:[/] {how}; its {info.rows} results are written; {rule}")
        if not left:
            if s.driver is not None:
                s.driver.interrupt("workers_lost")
            return
        runner = s.runner
        dispatcher = getattr(runner, "_users_dispatcher", None)
        from locust.runners import STATE_RUNNING

        # a worker that quit: Locust re-dispatches its users itself; one that went missing (Locust keeps
        # it 60 s before it does): re-dispatch now, as Locust's --enable-rebalancing would
        missing = info.client_id in runner.clients
        idle = dispatcher is not None and not dispatcher.dispatch_in_progress
        if missing and runner.state == STATE_RUNNING and idle:
            runner.start(runner.target_user_count, runner.spawn_rate)

    def send_stop(self, grace_s: float) -> int:
        s = self.session
        self._stop_seq += 1
        self.drained = set()
        if s.runner is not None:
            s.runner.send_message(wire.STOP, {"grace_s": grace_s, "seq": self._stop_seq})
        return self._stop_seq

    def on_drained(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        if int(msg.data.get("seq", -1)) == self._stop_seq:
            self.drained.add(int(msg.data["worker"]))

    def failure(self, k: int, what: str) -> str:
        last = last_error_line(self.logs[k]) if k < len(self.logs) else None
        because = f" ({last})" if last else ""
        where = f"; its output is in {self.logs[k]}" if k < len(self.logs) else ""
        return f"Locust worker process {k} {what}{because}{where}"

    def drain(self, grace_s: float) -> None:
        """Tell the workers to stop sending and wait (at most ``grace_s`` + 2 s) until every live one
        drained: each sends all its rows before it says so."""
        import gevent

        deadline = time.time() + grace_s
        seq = self.send_stop(grace_s)
        while time.time() < deadline + 2.0:
            live = {w.index for w in self.live() if w.ready}
            if self._stop_seq != seq or live <= self.drained:
                break
            gevent.sleep(0.05)
            self.check()

    def wait(self) -> None:
        """Reap the local worker processes: each gets 10 s to exit, then SIGTERM, then SIGKILL."""
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


class MasterMeter:
    """``StepMeter`` from Locust's aggregated statistics (master of worker processes).

    Achieved concurrency, requests started and requests ended by outcome come from the workers' own
    reports (``report_to_master`` → ``worker_report``, once a second, so at most a second old): each
    worker sends its time-weighted mean and maximum in-flight count for the step it is in; the step's
    mean is the sum of the workers' means, its maximum the sum of their maxima (an upper bound: the
    workers' peaks need not coincide). A step shorter than one report has none.
    """

    def __init__(self, session: Any, user_class: Any) -> None:
        self.session = session
        self.path = user_class.replay_path
        self._base = (0, 0, 0, 0)
        self._step: int | None = None
        self._began_unix_s = time.time()
        self.reports: dict[str, dict[str, Any]] = {}

    def listen(self, env: Any) -> None:
        def on_worker_report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
            report = data.get("oomload")
            if isinstance(report, dict):
                self.reports[client_id] = report

        env.events.worker_report.add_listener(on_worker_report)

    def achieved(self) -> tuple[float | None, int | None]:
        """The sum of the workers' means over the step; a worker lost during the step counts for the
        part of the step it was there (its mean × its elapsed time / the step's elapsed time)."""
        mine = {c: r for c, r in self.reports.items() if r.get("step") == self._step}
        if not mine:
            return None, None
        live = self.session.pool.live_client_ids()
        elapsed = max(1e-9, time.time() - self._began_unix_s)
        mean = 0.0
        for client_id, report in mine.items():
            share = 1.0
            if client_id not in live and report.get("elapsed_s") is not None:
                share = min(1.0, float(report["elapsed_s"]) / elapsed)
            mean += float(report["mean"]) * share
        return mean, sum(int(r["max"]) for r in mine.values())

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
        self._began_unix_s = time.time()

    def end(self) -> None:
        if self.session.runner is not None:
            self.session.runner.send_message(wire.STEP_END, {"step": self._step})

    def completed(self) -> int:
        return self._totals()[0] - self._base[0]

    def in_flight(self) -> int | None:
        """The live workers' in-flight requests as last reported (at most a second old)."""
        live = self.session.pool.live_client_ids()
        if any(c not in self.reports for c in live):
            return None
        return sum(int(self.reports[c].get("in_flight", 0)) for c in live)

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


def die_with_parent() -> None:
    """In a worker process (Linux): get SIGTERM when oomload dies, even by SIGKILL — no orphans."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def last_error_line(log: Path) -> str | None:
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
