"""Locust worker processes for ``oomload replay --processes N``, and the master's view of them.

``WorkerPool`` starts N ``locust --worker`` processes (``oomload.load.locustfile``) against the
master on 127.0.0.1; each gets its options as JSON in ``OOMLOAD_WORKER_JSON`` (no secrets: the key's
variable name only), writes ``worker.K.log`` in the run directory and gets SIGTERM if oomload dies
(``PR_SET_PDEATHSIG``). The workers announce themselves when bound (``oomload_ready``), follow the
steps (``oomload_step`` / ``oomload_step_end``), report their achieved concurrency with every
statistics report (``report_to_master``, once a second), and drain on ``oomload_stop``
(``oomload_drained``). A worker that fails ends the run with one sentence naming its last error line
and its log.

``MasterMeter`` is the ``StepMeter`` of such a run, from Locust's aggregated statistics and the
workers' reports.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from oomload.errors import RunAbortedError
from oomload.load.config import config_to_worker_options

WORKER_NAME_PREFIX = "worker"


class WorkerPool:
    """The worker processes of one session (``oomload.load.session``)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.ready: set[int] = set()
        self.drained: set[int] = set()
        self._stop_seq = 0

    def spawn(self) -> None:
        """Start the worker processes and wait until each is connected and ready (at most 60 s)."""
        import gevent

        s = self.session
        port = s.runner.master_bind_port
        env = dict(os.environ)
        options = config_to_worker_options(s.config, s.url, s.model)
        options["run_dir"] = str(s.writer.path)
        options["workers"] = s.config.processes
        options["user_class"] = s.env.user_classes[0].__name__
        for k in range(s.config.processes):
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
                s.url,
                "--loglevel",
                "WARNING",
            ]
            log = s.writer.path / f"{WORKER_NAME_PREFIX}.{k}.log"
            self.logs.append(log)
            with open(log, "ab") as out:  # the child keeps its own descriptor
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        env=env_k,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        preexec_fn=die_with_parent,
                    )
                )
        deadline = time.time() + 60.0
        # ready = connected to the master AND the user class bound (the worker says so itself), so
        # the first spawn message can never reach a worker that cannot run it
        while len(s.runner.clients.ready) < s.config.processes or len(self.ready) < s.config.processes:
            if s.interrupted:
                return
            for k, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise RunAbortedError(self.failure(k, f"exited with code {proc.returncode} at start"))
            if time.time() > deadline:
                raise RunAbortedError(
                    f"the {s.config.processes} Locust worker processes did not connect within 60 s; "
                    f"their output is in {s.writer.path}/{WORKER_NAME_PREFIX}.*.log"
                )
            gevent.sleep(0.1)

    def send_stop(self, grace_s: float) -> int:
        s = self.session
        self._stop_seq += 1
        self.drained = set()
        if s.runner is not None:
            s.runner.send_message("oomload_stop", {"grace_s": grace_s, "seq": self._stop_seq})
        return self._stop_seq

    def on_ready(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        self.ready.add(int(msg.data["worker"]))

    def on_drained(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        if int(msg.data.get("seq", -1)) == self._stop_seq:
            self.drained.add(int(msg.data["worker"]))

    def check(self) -> None:
        for k, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None:
                raise RunAbortedError(self.failure(k, f"exited with code {code} during the run"))

    def failure(self, k: int, what: str) -> str:
        last = last_error_line(self.logs[k]) if k < len(self.logs) else None
        because = f" ({last})" if last else ""
        where = f"; its output is in {self.logs[k]}" if k < len(self.logs) else ""
        return f"Locust worker process {k} {what}{because}{where}"

    def drain(self, grace_s: float) -> None:
        """Tell the workers to stop sending and wait (at most ``grace_s`` + 2 s) until they drained."""
        import gevent

        deadline = time.time() + grace_s
        seq = self.send_stop(grace_s)
        while len(self.drained) < len(self.procs) and time.time() < deadline + 2.0:
            if self._stop_seq != seq or any(w.poll() is not None for w in self.procs):
                break
            gevent.sleep(0.05)

    def wait(self) -> None:
        """Reap the worker processes: each gets 10 s to exit, then SIGTERM, then SIGKILL."""
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
        if len(self.reports) < len(self.session.pool.procs):
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
