"""One Locust worker of an oomload master: ``oomload worker --master HOST[:PORT]`` on a load host, and
the N local ones that ``oomload replay --processes N`` starts on its own host.

``run_worker`` runs Locust's own ``WorkerRunner`` in this process (the library API, as
``locust --worker`` would) and speaks the messages of ``oomload.load.wire`` on top of it:

1. connect to the master (Locust's ``client_ready``/``ack``), retrying for at most
   ``connect_timeout_s``; no answer → ``EndpointError`` naming the address (exit 3);
2. say hello (versions, host, pid, a fresh nonce); the master answers with its proof that it holds
   the worker token (``oomload.load.wire``: an HMAC over both nonces) — a master whose proof is wrong
   (a stranger on that address, another run's master) is refused with one sentence and the worker
   leaves having sent nothing else (``LinkRefusedError``, exit 2); otherwise the worker proves the
   token in turn, and from then on every oomload message both ways is sealed;
3. the master sends (sealed) the run's ``LoadOptions``, the trace's lengths and this worker's index
   ``k`` of ``K`` — or refuses it with a sentence (a version mismatch, a wrong token, one worker too
   many) → ``ConfigError`` (exit 2);
4. check the master's target URL against what *this* worker was told to trust (its own ``--url``,
   repeatable): another URL is refused with one sentence (exit 2) before any request or key is
   touched; read the API key from *this* host's environment through *this* worker's own variable
   (``--api-key-env``, default ``OPENAI_API_KEY``; the variable the master names is ignored, and the
   key never travels); bind the user class to its share of the trace (every K-th request from offset
   k), and say ready — or say why not (``oomload_failed``) and exit 2;
5. run the users the master dispatches; follow its steps (at a step's end, stop sending and answer
   with the step's final counts: ``oomload_step_count``); stream every result to the master in
   batches (``oomload.load.resultstream``), with a copy in ``--results FILE`` when given — a copy
   that cannot be written (a full disk) fails closed: the worker leaves as on SIGTERM (below) and
   exits 2 with one sentence, the file ending on its last whole row;
6. on the master's stop, drain (at most its grace), abandon what is left (written as ``cancelled``),
   flush, and say drained; on SIGTERM or Ctrl-C do the same at once and leave (Locust's ``quit``);
   when the master's heartbeat stops for ``MASTER_SILENCE_S`` the worker leaves too (exit 3).

Until the master has proved the token, the worker passes on nothing from it but Locust's ``ack`` and
heartbeat and the handshake itself; a frame it cannot decode, or a message whose handler fails, is
dropped and counted (said when the worker ends), never fatal.

**The token.** ``--token-file FILE`` (mode 0600: a file others can read is refused), else
``$OOMLOAD_WORKER_TOKEN``, else the default file the master writes (``default_token_path``: the same
host or a shared home) — never a command-line value, never printed.

The local workers also get the run directory's path: before the master's stop message reaches them
they already see its ``.server-dead`` marker (``ReplayContext.declared_dead``). Remote workers learn
it from the message, a fraction of a second later.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import socket
import stat
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from oomload import __version__
from oomload.credentials import read_api_key
from oomload.errors import ConfigError, EndpointError, LinkRefusedError, OomloadError, OutputWriteError
from oomload.load import wire
from oomload.load.fdlimit import raise_open_files
from oomload.load.resultstream import BATCH_INTERVAL_S, ResultStream
from oomload.load.selfcheck import start_selfcheck
from oomload.outfile import reason
from oomload.run.config import LoadOptions
from oomload.rundir import server_marked_dead

WORKER_REPORT_INTERVAL_S = 1.0  # the master's step meter and hold counting read these reports
CONFIG_WAIT_S = 30.0  # after connecting: how long to wait for the master's configuration
MASTER_SILENCE_S = 15.0  # no heartbeat from the master for this long: it is gone, leave


@dataclass(frozen=True)
class WorkerTrust:
    """What this worker host decides for itself, whatever its master says: the token it shares with
    its master, the server URLs it may load (``wire.url_key`` forms) and its API key's variable."""

    token: str
    urls: tuple[str, ...]
    api_key_env: str

    def trusts(self, url: str) -> bool:
        return wire.url_key(url) in self.urls


def default_token_path(environ: Mapping[str, str]) -> Path:
    """Where the master keeps the worker token it made (``$XDG_CONFIG_HOME/oomload/worker-token``)."""
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(base) / "oomload" / "worker-token"


def read_token_file(path: Path) -> str:
    """The token in ``path``; ``ConfigError`` when it is missing, unreadable, or readable by others."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as err:
        raise ConfigError(f"the worker token file {path} cannot be read ({err.strerror or err})") from err
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the worker token file {path} can be read by others (mode {stat.S_IMODE(mode):04o}); "
            f"run chmod 600 {path}"
        )
    return wire.check_token(text, str(path))


def worker_token(token_file: Path | None, environ: Mapping[str, str]) -> str:
    """This worker's token: ``--token-file``, else ``$OOMLOAD_WORKER_TOKEN``, else the default file;
    ``ConfigError`` (one sentence, never the value) when there is none."""
    if token_file is not None:
        return read_token_file(token_file)
    value = environ.get(wire.TOKEN_ENV)
    if value:
        return wire.check_token(value, f"${wire.TOKEN_ENV}")
    default = default_token_path(environ)
    if default.exists():
        return read_token_file(default)
    raise ConfigError(
        f"this worker has no worker token: copy the file the master wrote (it names it when it starts) "
        f"and give it with --token-file FILE, or set ${wire.TOKEN_ENV}"
    )


def run_worker(
    master: str,
    *,
    trust: WorkerTrust,
    connect_timeout_s: float = 60.0,
    local_index: int | None = None,
    run_dir: Path | None = None,
    results_path: Path | None = None,
    say: Any = print,
) -> int:
    """Serve the master at ``master`` (``HOST[:PORT]``) until it ends the run; returns the exit code."""
    host, port = wire.parse_master_address(master)
    raise_open_files()  # one socket per user (oomload.load.fdlimit); Locust's CLI would have raised it
    import gevent
    import locust.runners
    import locust.stats
    from locust.env import Environment
    from locust.log import setup_logging

    from oomload.run.scenario import ScenarioUser

    setup_logging("WARNING")  # type: ignore[no-untyped-call]
    locust.runners.WORKER_REPORT_INTERVAL = WORKER_REPORT_INTERVAL_S
    locust.runners.CONNECT_RETRY_COUNT = max(
        0, math.ceil(connect_timeout_s / locust.runners.CONNECT_TIMEOUT) - 1
    )
    locust.runners.MASTER_HEARTBEAT_TIMEOUT = int(MASTER_SILENCE_S)
    env = Environment(user_classes=[ScenarioUser])
    session = WorkerSession(
        env,
        trust,
        f"{host}:{port}",
        local_index=local_index,
        run_dir=run_dir,
        results_path=results_path,
        say=say,
    )
    try:
        env.stats = locust.stats.RequestStats(use_response_times_cache=False)  # as create_worker_runner
        runner = env._create_runner(guarded_worker_class(), host, port, session)
    except ConnectionError as err:
        raise EndpointError(
            f"no oomload master answered at {host}:{port} within {connect_timeout_s:g} s; start "
            "`oomload replay … --workers K` there first, with --master-bind-host reachable from this host "
            "(it listens on 127.0.0.1 unless told otherwise)"
        ) from err
    session.listen()
    runner.send_message(
        wire.HELLO,
        {
            "oomload_version": __version__,
            "locust_version": locust.__version__,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "local_index": local_index,
            "nonce": session.nonce,
        },
    )
    deadline = time.time() + CONFIG_WAIT_S
    while session.index is None and session.error is None and time.time() < deadline:
        gevent.sleep(0.05)
    if session.error is not None or session.index is None:
        runner.quit()
        session.leave_master()
        raise session.error or EndpointError(
            f"the master at {host}:{port} accepted the connection but sent no configuration within "
            f"{CONFIG_WAIT_S:g} s; is it an oomload master of the same version?"
        )
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, session.leave)
    flusher = gevent.spawn(session.flush_forever)
    say(f"oomload worker {session.index} of {session.workers} serving the master at {host}:{port}")
    runner.greenlet.join()
    flusher.kill()
    session.stream_flush()
    if session.dropped:
        what = ", ".join(f"{n} {why}" for why, n in sorted(session.dropped.items()))
        say(f"oomload worker {session.index}: dropped messages from the master ({what})")
    if session.copy is not None:
        session.copy.close()
        if (failure := session.copy.failure()) is not None:
            raise failure  # it left its master when the copy failed: exit 2, one sentence
    if session.left_by_signal or session.stopped_by_master:
        return 0
    raise EndpointError(
        f"the master at {host}:{port} stopped answering (no heartbeat for {MASTER_SILENCE_S:g} s); "
        f"the {session.rows_sent()} results this worker had finished were sent"
    )


class WorkerSession:
    """The message handlers and state of one worker (its index, context, link keys and result stream)."""

    def __init__(
        self,
        env: Any,
        trust: WorkerTrust,
        master: str,
        *,
        local_index: int | None,
        run_dir: Path | None,
        results_path: Path | None,
        say: Callable[[str], object] = print,
    ) -> None:
        self.env = env
        self.say = say
        self.copy: _RowFile | None = None
        self.runner: Any = None  # set by the guarded runner before it connects
        self.trust = trust
        self.master = master
        self.local_index = local_index
        self.run_dir = run_dir
        self.results_path = results_path
        self.nonce = wire.new_nonce()
        self.keys: wire.LinkKeys | None = None  # once the master proved the token
        self.dropped: Counter[str] = Counter()
        self.index: int | None = None
        self.workers = 0
        self.error: OomloadError | None = None
        self.context: Any = None
        self.stream: ResultStream | None = None
        self.left_by_signal = False
        self.stopped_by_master = False

    def listen(self) -> None:
        r = self.runner
        r.register_message(wire.CHALLENGE, self.on_challenge)
        r.register_message(wire.CONFIG, self.on_config)
        r.register_message(wire.REFUSED, self.on_refused)
        r.register_message(wire.STEP, self.on_step)
        r.register_message(wire.STEP_END, self.on_step_end)
        r.register_message(wire.STOP, self.on_stop)
        self.env.events.report_to_master.add_listener(self.on_report)
        self.env.events.test_stop.add_listener(lambda **_kw: self.stream_flush())

    # -- the link --------------------------------------------------------------------------------
    def admits(self, kind: Any) -> bool:
        """Whether a message of this type from the master may reach Locust or a handler now: before
        the master proved the token only Locust's ack and heartbeat and the handshake may."""
        if not isinstance(kind, str):
            return False
        return self.keys is not None or kind in ("ack", "heartbeat", wire.CHALLENGE, wire.REFUSED)

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def send(self, kind: str, body: dict[str, Any]) -> None:
        """A sealed oomload message to the master (only once the handshake is done)."""
        if self.keys is not None:
            self.runner.send_message(kind, self.keys.seal(kind, body))

    def opened(self, kind: str, msg: Any) -> dict[str, Any] | None:
        """The body of a sealed message from the master, or None (dropped and counted)."""
        if self.keys is None:
            self.drop("unauthenticated")
            return None
        try:
            return self.keys.open(kind, msg.data)
        except wire.LinkRejected as err:
            self.drop(err.reason)
            return None

    def on_challenge(self, msg: Any, **_kw: Any) -> None:
        data = msg.data if isinstance(msg.data, dict) else {}
        master_nonce = data.get("nonce")
        if self.keys is not None or self.error is not None:
            self.drop("repeated_handshake")
            return
        client_id = str(self.runner.client_id)
        token = self.trust.token
        expected = (
            wire.handshake_proof(token, "master", self.nonce, master_nonce, client_id)
            if isinstance(master_nonce, str) and wire.nonce_ok(master_nonce)
            else ""
        )
        if not expected or not wire.proof_matches(expected, data.get("proof")):
            self.error = LinkRefusedError(
                f"the master at {self.master} did not prove that it holds this worker's token; refused "
                "before any configuration, request or key. Is it the oomload master you meant, and do "
                f"both use the same token (--token-file or ${wire.TOKEN_ENV})?"
            )
            return
        assert isinstance(master_nonce, str)  # checked with the proof
        self.keys = wire.LinkKeys.derive(token, "worker", self.nonce, master_nonce, client_id)
        proof = wire.handshake_proof(token, "worker", self.nonce, master_nonce, client_id)
        self.runner.send_message(wire.AUTH, {"proof": proof})

    # -- set-up ----------------------------------------------------------------------------------
    def on_refused(self, msg: Any, **_kw: Any) -> None:
        data = msg.data if isinstance(msg.data, dict) else {}
        if self.keys is not None and "mac" in data:  # refused after the handshake: sealed
            body = self.opened(wire.REFUSED, msg)
            if body is None:
                return
            data = body
        why = "".join(c for c in str(data.get("error"))[:300] if c.isprintable())
        self.error = ConfigError(f"the master refused this worker: {why}")

    def on_config(self, msg: Any, **_kw: Any) -> None:
        data = self.opened(wire.CONFIG, msg)
        if data is None or self.index is not None:
            return
        try:
            index, workers = int(data["worker"]), int(data["workers"])
            self._bind(data, index, workers)
        except OomloadError as err:
            self.send(wire.FAILED, {"worker": data.get("worker"), "error": str(err)})
            self.error = err
            return
        except (KeyError, TypeError, ValueError) as err:
            self.error = ConfigError(
                f"the master's configuration has a shape this worker cannot read ({err})"
            )
            return
        self.workers = workers
        self.index = index
        self.send(wire.READY, {"worker": index})

    def _bind(self, data: dict[str, Any], index: int, workers: int) -> None:
        from oomload.credentials import redact_url
        from oomload.run.scenario import ScenarioUser, bind_user

        wanted = str(data.get("user_class") or ScenarioUser.__name__)
        if wanted != ScenarioUser.__name__:
            raise ConfigError(
                f"the master runs user class {wanted!r}; this worker has {ScenarioUser.__name__!r}"
            )
        options = LoadOptions.from_json(data["options"])
        if not self.trust.trusts(options.url):  # before any request, before the key is read
            shown = "".join(c for c in redact_url(str(options.url))[:200] if c.isprintable())
            raise LinkRefusedError(
                f"the master asks this worker to load {shown}, which it was not told to trust "
                f"(--url {' '.join(self.trust.urls) or 'not given'}); refused: start it with the "
                "master's --url"
            )
        records = wire.trace_from_wire(data["trace"])
        # this host's key, through this worker's own variable (the name in options is ignored); never sent
        api_key = read_api_key(self.trust.api_key_env, os.environ)
        copy = None if self.results_path is None else _RowFile(self.results_path, self.leave)
        self.copy = copy
        self.stream = ResultStream(self.send, index, copy=copy)
        context = bind_user(
            ScenarioUser,
            options,
            records=records,
            api_key=api_key,
            sink=self.stream,
            worker=index,
            workers=workers,
        )
        if self.run_dir is not None:  # a local worker: the master's marker, before its message
            context.declared_dead = partial(server_marked_dead, self.run_dir)
        context.live_users = lambda: int(self.runner.user_count)
        context.selfcheck = selfcheck = start_selfcheck()  # its CPU wait and loop lag, per step
        selfcheck.worker = index
        self.env.host = options.url
        self.context = context

    # -- the run ---------------------------------------------------------------------------------
    def on_step(self, msg: Any, **_kw: Any) -> None:
        data = self.opened(wire.STEP, msg)
        if self.context is not None and data is not None:
            self.context.begin_step(int(data["step"]), int(data["concurrency"]), str(data["phase"]))

    def on_step_end(self, msg: Any, **_kw: Any) -> None:
        data = self.opened(wire.STEP_END, msg)
        if self.context is not None and data is not None:
            self.context.end_step()  # no request of this step is sent from here on: its counts are final
            self.send(wire.STEP_COUNT, self.context.step_report())

    def on_report(self, client_id: str, data: dict[str, Any], **_kw: Any) -> None:
        del client_id
        if self.context is not None and self.keys is not None:
            data["oomload"] = self.keys.seal(wire.REPORT, self.context.step_report())

    def on_stop(self, msg: Any, **_kw: Any) -> None:
        """No new requests; those in flight may finish within the grace, the rest are abandoned
        (``cancelled``); every row is sent before ``oomload_drained``."""
        import gevent

        data = self.opened(wire.STOP, msg)
        if data is None:
            return
        grace_s, seq = float(data.get("grace_s", 0.0)), int(data.get("seq", 0))
        self.stopped_by_master = True
        context = self.context
        if context is None:
            return
        context.stopping = True

        def drain() -> None:
            deadline = context.clock() + grace_s
            while context.in_flight and context.clock() < deadline:
                gevent.sleep(0.05)
            if context.in_flight:
                self.env.stop_timeout = 0.0
                self.runner.stop()  # abandons them: each is written as cancelled
            self.stream_flush()
            self.send(wire.DRAINED, {"worker": self.index, "seq": seq})

        gevent.spawn(drain)

    def flush_forever(self) -> None:
        import gevent

        while True:
            gevent.sleep(BATCH_INTERVAL_S)
            self.stream_flush()

    def stream_flush(self) -> None:
        if self.stream is not None:
            self.stream.flush()

    def rows_sent(self) -> int:
        return 0 if self.stream is None else self.stream.rows_sent

    def leave(self) -> None:
        """SIGTERM / Ctrl-C, or a ``--results`` copy that failed: stop sending, abandon what is in flight
        (cancelled), send every row, and tell the master this worker quit (it then gives this worker's
        users to the others)."""
        import gevent

        if self.left_by_signal:
            return
        self.left_by_signal = True

        def go() -> None:
            if self.context is not None:
                self.context.stopping = True
            self.env.stop_timeout = 0.0
            self.runner.stop()
            self.stream_flush()
            self.leave_master()
            self.runner.greenlet.kill(block=False)

        gevent.spawn(go)

    def leave_master(self) -> None:
        from locust.rpc import Message

        with contextlib.suppress(Exception):  # the master may be gone already: nothing to tell
            quit_message = Message("quit", None, self.runner.client_id)  # type: ignore[no-untyped-call]
            self.runner.client.send(quit_message)


def guarded_worker_class() -> Any:
    """Locust's ``WorkerRunner`` with the link's checks in front of its message handling: a frame it
    cannot decode and a message whose handler fails are dropped and counted (Locust's own loop would
    die on some), and until the master proved the token only the handshake gets through."""
    import gevent
    from locust.exception import RPCError
    from locust.runners import WorkerRunner

    class GuardedWorkerRunner(WorkerRunner):
        def __init__(self, environment: Any, master_host: str, master_port: int, link: WorkerSession) -> None:
            self.oomload_link = link
            link.runner = self  # the handshake may begin while Locust connects
            super().__init__(environment, master_host, master_port)

        def worker(self) -> Any:  # Locust's receive loop, with undecodable frames dropped
            self.last_received_spawn_timestamp = 0
            while True:
                try:
                    msg = self.client.recv()  # type: ignore[no-untyped-call]
                except RPCError:
                    self.oomload_link.drop("broken_frame")
                    gevent.sleep(0.05)  # a broken connection: Locust's heartbeat check decides
                    continue
                except Exception:
                    self.oomload_link.drop("malformed")
                    continue
                self.handle_message(msg)

        def handle_message(self, msg: Any) -> None:
            if not self.oomload_link.admits(getattr(msg, "type", None)):
                self.oomload_link.drop("unauthenticated")
                return
            try:
                super().handle_message(msg)
            except Exception:
                self.oomload_link.drop("malformed")

    return GuardedWorkerRunner


class _RowFile:
    """The worker's own copy of its rows (``--results FILE``): JSON Lines, one whole line a row.

    A write that fails (a full, read-only or vanished disk, a file size limit) fails closed: the line
    it began is cut off again (the file ends on its last whole row), the copy ends, and ``on_failure``
    is called once — the worker then leaves its master as on SIGTERM (every row it has still goes to
    the master) and exits 2 with ``failure()``'s sentence."""

    def __init__(self, path: Path, on_failure: Callable[[], object]) -> None:
        self.path = path
        self.on_failure = on_failure
        self.rows = 0
        self.reason: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(path, "ab", buffering=0)  # noqa: SIM115 (kept open for the run)
            self.size = self.fh.seek(0, os.SEEK_END)  # the bytes of whole rows: an older copy's too
        except OSError as err:
            raise OutputWriteError(
                f"--results {path} cannot be written ({reason(err)})", path, reason(err)
            ) from err

    def append(self, stream: str, obj: dict[str, Any]) -> None:
        del stream
        if self.reason is not None:
            return
        line = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
        try:
            view = memoryview(line)
            while view:  # unbuffered: nothing is left to be written later, at close
                done = self.fh.write(view)
                if not done:  # a regular file takes at least a byte or says why not
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[done:]
        except OSError as err:
            self.reason = reason(err)
            with contextlib.suppress(OSError):
                os.ftruncate(self.fh.fileno(), self.size)  # no torn last line
            self.close()
            self.on_failure()
            return
        self.size += len(line)
        self.rows += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.fh.close()

    def failure(self) -> OutputWriteError | None:
        """The sentence for a copy that stopped early, ``None`` while it holds every row."""
        if self.reason is None:
            return None
        return OutputWriteError(
            f"--results {self.path} could not be written ({self.reason}); this worker stopped and left "
            f"its master after {self.rows} rows, which the file holds whole — every result it had still "
            "went to the master",
            self.path,
            self.reason,
        )
