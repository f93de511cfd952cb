"""The master's side of distributed load: the pool of its Locust workers (local and on other hosts)
and their results. Each worker is an ``oomload worker`` process (``oomload.run.worker_node``); the
master's ``StepMeter`` over them is ``oomload.run.master_meter``, Locust's master behind the link's
checks ``oomload.run.master_auth``.

``WorkerPool`` waits for ``K`` workers (``--workers K``; ``--processes N`` starts N of them on this
host as ``oomload worker`` processes that reach the master on its ``--master-bind-host`` address, or
127.0.0.1 when it binds every address; their output in ``worker.K.log``, SIGTERM when oomload dies).
Each says hello (``oomload.load.wire``); the master checks its versions, gives it an index ``k``
(local workers keep their own; remote ones take the next free one) and sends it the run's
``LoadOptions`` and the trace's lengths; the load starts once all K are bound and ready. A worker
that fails before the load, a refusal or a timeout ends the run with one sentence that names what is
missing ("1 of 2 Locust workers arrived within 60 s …"), never a traceback.

**The link is authenticated.** The master holds a worker token (``master_token``:
``$OOMLOAD_WORKER_TOKEN`` when set; else, when remote workers are expected, the file
``default_token_path`` — made once with mode 0600 and reused, so an operator copies it to the load
hosts once; else, for ``--processes`` alone, a fresh one in memory that the local workers get
through their environment). Before anything else each worker and the master prove to each other that
they hold it (``oomload.load.wire``), and every oomload message after that is sealed with a key of
that connection. ``GuardedMaster`` (``master_auth``) stands in front of Locust's own message
handling: a peer that has not completed the handshake reaches nothing but the handshake (its
``client_ready`` is answered but held back from Locust until it has, so it never gets users), a
frame that cannot be decoded or claims another peer's id, a message whose handler fails, an unsealed
or badly sealed message and a result row that is not a valid ``RequestResult`` for a step that has
begun are all dropped and counted — never fatal, never written. The first drop of each kind is a
``link_rejected`` event (and a warning), the totals a ``link_rejected_total`` event at the end.

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
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

from oomload import __version__
from oomload.errors import ConfigError, RunAbortedError
from oomload.load import wire
from oomload.run.worker_node import default_token_path, read_token_file

WORKER_NAME_PREFIX = "worker"
LOCAL_WORKER_ENV = "OOMLOAD_LOCAL_WORKER"  # set in the environment of the workers oomload starts
MAX_PENDING = 256  # peers in their handshake at once; beyond, the longest-waiting one is forgotten


def master_token(environ: Mapping[str, str], remote: bool, say: Any) -> str:
    """The worker token of this master: ``$OOMLOAD_WORKER_TOKEN`` when set; else, with remote workers,
    the default token file (made with mode 0600 when missing; where it is, is said, never what);
    else a fresh one for the local workers only."""
    value = environ.get(wire.TOKEN_ENV)
    if value:
        return wire.check_token(value, f"${wire.TOKEN_ENV}")
    if not remote:
        return wire.new_token()
    path = default_token_path(environ)
    if path.exists():
        token = read_token_file(path)
        say(f"worker token: {path} (give it to each load host's `oomload worker` with --token-file)")
        return token
    token = wire.new_token()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(token + "\n")
    except OSError as err:
        raise ConfigError(
            f"the worker token file {path} cannot be written ({err.strerror or err}); set "
            f"${wire.TOKEN_ENV} (at least {wire.MIN_TOKEN_CHARS} characters) on the master and the workers"
        ) from err
    say(
        f"worker token: made {path} (mode 0600); copy it to each load host and give it to "
        "`oomload worker` with --token-file"
    )
    return token


@dataclass
class WorkerInfo:
    """One worker as the master knows it."""

    index: int
    client_id: str
    host: str
    pid: int
    local: bool
    keys: wire.LinkKeys | None = None  # the sealing of its connection
    ready: bool = False
    rows: int = 0
    next_seq: int = 0
    gaps: int = 0
    lost: str | None = None  # how it was lost, once it was

    def name(self) -> str:
        where = "local" if self.local else self.host
        return f"worker {self.index} ({where}, pid {self.pid})"


@dataclass
class Handshake:
    """A peer between its hello and its proof."""

    worker_nonce: str
    master_nonce: str
    hello: dict[str, Any]


def printable(text: Any, limit: int = 200) -> str:
    """Peer-supplied text as it may be shown or written: printable characters only, cut short."""
    return "".join(c for c in str(text)[:limit] if c.isprintable())


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
        self.token = ""  # set by prepare_token before the master listens
        self.pending: dict[str, Handshake] = {}  # by the peer's ZeroMQ identity
        self.held: dict[str, Any] = {}  # Locust client_ready of peers that have not said hello yet
        self.dropped: Counter[str] = Counter()
        self.last_step = -1  # the highest step index begun: a row of a later step is forged
        self._stop_seq = 0
        self._proc_lost: set[int] = set()

    @property
    def expected(self) -> int:
        return int(self.session.config.expected_workers())

    # -- set-up ----------------------------------------------------------------------------------
    def prepare_token(self, say: Any) -> None:
        remote = self.expected > self.session.config.local_workers()
        self.token = master_token(os.environ, remote, say)

    def listen(self, runner: Any) -> None:
        runner.register_message(wire.HELLO, self.on_hello)
        runner.register_message(wire.AUTH, self.on_auth)
        runner.register_message(wire.READY, self.on_ready)
        runner.register_message(wire.FAILED, self.on_failed)
        runner.register_message(wire.RESULTS, self.on_results)
        runner.register_message(wire.DRAINED, self.on_drained)

    def spawn_local(self, port: int) -> None:
        """Start the local worker processes: ``oomload worker`` against this master on its bind address
        (127.0.0.1 for a wildcard bind: ``wire.local_master_address``)."""
        s = self.session
        master = wire.local_master_address(s.config.master_bind_host, port)
        for k in range(s.config.local_workers()):
            cmd = [
                sys.executable,
                "-m",
                "oomload",
                "worker",
                "--master",
                master,
                "--local-index",
                str(k),
                "--local-run-dir",
                str(s.writer.path),
                "--url",
                s.url,
                "--api-key-env",
                s.config.api_key_env,
            ]
            log = s.writer.path / f"{WORKER_NAME_PREFIX}.{k}.log"
            self.logs.append(log)
            # the token by the environment, never the command line
            env = {**os.environ, LOCAL_WORKER_ENV: str(k), wire.TOKEN_ENV: self.token}
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
            sentence += (
                f"; start the others with `oomload worker --master {address} --url {self.session.url} "
                "--token-file FILE`, or lower --workers"
            )
        else:
            sentence += f"; their output is in {self.session.writer.path}/{WORKER_NAME_PREFIX}.*.log"
        return sentence

    # -- the link --------------------------------------------------------------------------------
    def authenticated(self, client_id: str) -> WorkerInfo | None:
        info = self.workers.get(client_id)
        return info if info is not None and info.keys is not None else None

    def admit(self, client_id: str, kind: str) -> str | None:
        """What ``GuardedMaster`` does with a Locust message of ``kind`` from ``client_id``: None to
        handle it, ``"hold"`` for the client_ready of a peer that has not proved the token yet, ``""``
        to drop it quietly (the heartbeats of a peer in its handshake), else the reason to count."""
        if self.authenticated(client_id) is not None:
            return None
        if kind in (wire.HELLO, wire.AUTH):
            return None
        if kind == "client_ready":
            return "hold"
        if kind in ("heartbeat", "stats", "logs") and (client_id in self.held or client_id in self.pending):
            return ""
        return "unauthenticated"

    def hold(self, client_id: str, msg: Any) -> None:
        """Keep a peer's client_ready until it proved the token; when ``MAX_PENDING`` peers wait, the
        one that has waited longest is forgotten (a flood of strangers cannot fill the table for good)."""
        if client_id not in self.held and len(self.held) >= MAX_PENDING:
            oldest = next(iter(self.held))
            self.held.pop(oldest)
            self.pending.pop(oldest, None)
            self.drop(oldest, "too_many_peers")
        self.held[client_id] = msg

    def drop(self, client_id: Any, reason: str) -> None:
        """Count a dropped message; the first of each reason is an event and a warning."""
        self.dropped[reason] += 1
        if self.dropped[reason] > 1:
            return
        s = self.session
        peer = printable(client_id, 100)
        s.writer.event("link_rejected", reason=reason, peer=peer)
        s.console.print(
            f"[yellow]warning:[/] dropped a message on the worker port ({reason}) from {escape(peer)}; "
            "further drops are counted (events.jsonl)",
            highlight=False,
        )  # the peer's id is escaped: a stranger's bytes are never read as markup

    def report_drops(self) -> None:
        if self.dropped:
            self.session.writer.event("link_rejected_total", counts=dict(sorted(self.dropped.items())))

    def opened(self, kind: str, msg: Any) -> tuple[WorkerInfo, dict[str, Any]] | None:
        """A sealed message's sender and body, or None (dropped and counted)."""
        info = self.authenticated(msg.node_id)
        if info is None or info.keys is None:
            self.drop(msg.node_id, "unauthenticated")
            return None
        try:
            return info, info.keys.open(kind, msg.data)
        except wire.LinkRejected as err:
            self.drop(msg.node_id, err.reason)
            return None

    def send(self, info: WorkerInfo, kind: str, body: dict[str, Any]) -> None:
        if info.keys is not None and self.session.runner is not None:
            self.session.runner.send_message(kind, info.keys.seal(kind, body), client_id=info.client_id)

    def broadcast(self, kind: str, body: dict[str, Any]) -> None:
        """One sealed message to every authenticated worker still there, each with its own seal."""
        if kind == wire.STEP:
            self.last_step = max(self.last_step, int(body["step"]))
        for info in self.live():
            self.send(info, kind, body)

    def on_hello(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        s = self.session
        data = msg.data if isinstance(msg.data, dict) else {}
        client_id = msg.node_id
        if self.authenticated(client_id) is not None or client_id not in self.held:
            self.drop(client_id, "unexpected_hello")
            return
        if not wire.nonce_ok(data.get("nonce")):
            self.drop(client_id, "malformed")
            return
        import locust

        why = wire.version_mismatch(
            {"oomload_version": __version__, "locust_version": locust.__version__}, data
        )
        host = printable(data.get("host") or client_id.rsplit("_", 1)[0], 100)
        if why is not None:
            self.refused.append(f"{host} ({why})")
            s.runner.send_message(wire.REFUSED, {"error": why}, client_id=client_id)
            return
        shake = Handshake(str(data["nonce"]), wire.new_nonce(), data)
        self.pending[client_id] = shake
        proof = wire.handshake_proof(self.token, "master", shake.worker_nonce, shake.master_nonce, client_id)
        s.runner.send_message(
            wire.CHALLENGE, {"nonce": shake.master_nonce, "proof": proof}, client_id=client_id
        )

    def on_auth(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        """The peer's proof: a right one makes it a known worker (given to Locust, configured)."""
        del environment
        s = self.session
        client_id = msg.node_id
        shake = self.pending.pop(client_id, None)
        if shake is None:
            self.drop(client_id, "unexpected_auth")
            return
        data = msg.data if isinstance(msg.data, dict) else {}
        host = printable(shake.hello.get("host") or client_id.rsplit("_", 1)[0], 100)
        expected = wire.handshake_proof(
            self.token, "worker", shake.worker_nonce, shake.master_nonce, client_id
        )
        if not wire.proof_matches(expected, data.get("proof")):
            self.held.pop(client_id, None)
            why = "its worker token is not the master's"
            self.refused.append(f"{host} ({why})")
            self.drop(client_id, "bad_token")
            s.runner.send_message(wire.REFUSED, {"error": why}, client_id=client_id)
            return
        keys = wire.LinkKeys.derive(self.token, "master", shake.worker_nonce, shake.master_nonce, client_id)
        local_index = shake.hello.get("local_index")
        index = self._free_index(local_index)
        if index is None:
            why = (
                "the run has started; a worker cannot join it"
                if self.started
                else f"the master already has its {self.expected} workers"
            )
            self.held.pop(client_id, None)
            self.refused.append(f"{host} ({why})")
            s.runner.send_message(wire.REFUSED, keys.seal(wire.REFUSED, {"error": why}), client_id=client_id)
            return
        pid = shake.hello.get("pid")
        info = WorkerInfo(
            index=index,
            client_id=client_id,
            host=host,
            pid=pid if type(pid) is int else 0,
            local=local_index is not None,
            keys=keys,
        )
        self.workers[client_id] = info
        s.runner.admit_to_locust(client_id, self.held.pop(client_id))  # now Locust may give it users
        self.send(
            info,
            wire.CONFIG,
            {
                "worker": index,
                "workers": self.expected,
                "user_class": s.env.user_classes[0].__name__,
                "options": s.config.load_options(s.url, s.model, s.max_model_len).to_json(),
                "trace": wire.trace_to_wire(s.records),
            },
        )

    def _free_index(self, local_index: Any) -> int | None:
        if self.started:
            return None
        taken = {w.index for w in self.workers.values()}
        n_local = self.session.config.local_workers()
        if type(local_index) is int and 0 <= local_index < n_local and local_index not in taken:
            return local_index
        free = [k for k in range(n_local, self.expected) if k not in taken]
        return free[0] if free else None

    def on_ready(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        opened = self.opened(wire.READY, msg)
        if opened is not None:
            opened[0].ready = True

    def on_failed(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        opened = self.opened(wire.FAILED, msg)
        if opened is not None:
            info, body = opened
            self.failed.append(f"Locust {info.name()} failed: {printable(body.get('error'), 500)}")

    # -- the run ---------------------------------------------------------------------------------
    def on_results(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        """A batch of a worker's results: each row that is a valid record is written at once."""
        del environment
        opened = self.opened(wire.RESULTS, msg)
        if opened is None:
            return
        info, data = opened
        rows, seq = data.get("rows"), data.get("seq")
        if type(seq) is not int or not isinstance(rows, list) or len(rows) > wire.MAX_BATCH_ROWS:
            self.drop(msg.node_id, "bad_batch")
            return
        if data.get("worker") != info.index:
            self.drop(msg.node_id, "wrong_worker")
            return
        if seq != info.next_seq:
            info.gaps += 1
        info.next_seq = seq + 1
        for row in rows:
            try:
                result = wire.result_from_wire(row, last_step=self.last_step)
            except wire.LinkRejected as err:
                self.drop(msg.node_id, err.reason)
                continue
            self.session.writer.append("requests", result.to_json())
            info.rows += 1

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
        self._stop_seq += 1
        self.drained = set()
        self.broadcast(wire.STOP, {"grace_s": grace_s, "seq": self._stop_seq})
        return self._stop_seq

    def on_drained(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        del environment
        opened = self.opened(wire.DRAINED, msg)
        if opened is not None and opened[1].get("seq") == self._stop_seq:
            self.drained.add(opened[0].index)

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
        """Reap the local worker processes: each gets 10 s to exit, then SIGTERM, then SIGKILL; and
        write the link's drop counts, if any."""
        self.report_drops()
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
