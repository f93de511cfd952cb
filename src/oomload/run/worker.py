"""One Locust worker of an oomload master: ``oomload worker --master HOST[:PORT]`` on a load host, and
the N local ones that ``oomload replay --processes N`` starts on its own host.

``run_worker`` runs Locust's own ``WorkerRunner`` in this process (the library API, as
``locust --worker`` would) and speaks the messages of ``oomload.load.wire`` on top of it:

1. connect to the master (Locust's ``client_ready``/``ack``), retrying for at most
   ``connect_timeout_s``; no answer → ``EndpointError`` naming the address (exit 3);
2. say hello (versions, host, pid); the master answers with the run's ``LoadOptions``, the trace's
   lengths and this worker's index ``k`` of ``K`` — or refuses it with a sentence (a version
   mismatch, one worker too many) → ``ConfigError`` (exit 2);
3. read the API key from *this* host's environment (the variable the master names; the key itself
   never travels), bind the user class to its share of the trace (every K-th request from offset k),
   and say ready — or say why not (``oomload_failed``) and exit 2;
4. run the users the master dispatches; follow its steps; stream every result to the master in
   batches (``oomload.load.resultstream``), with a copy in ``--results FILE`` when given;
5. on the master's stop, drain (at most its grace), abandon what is left (written as ``cancelled``),
   flush, and say drained; on SIGTERM or Ctrl-C do the same at once and leave (Locust's ``quit``);
   when the master's heartbeat stops for ``MASTER_SILENCE_S`` the worker leaves too (exit 3).

The local workers also get the run directory's path: before the master's stop message reaches them
they already see its ``.server-dead`` marker (``ReplayContext.declared_dead``). Remote workers learn
it from the message, a fraction of a second later.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import time
from functools import partial
from pathlib import Path
from typing import Any

from oomload import __version__
from oomload.credentials import read_api_key
from oomload.errors import ConfigError, EndpointError, OomloadError
from oomload.load import wire
from oomload.load.resultstream import BATCH_INTERVAL_S, ResultStream
from oomload.run.config import LoadOptions
from oomload.rundir import server_marked_dead

WORKER_REPORT_INTERVAL_S = 1.0  # the master's step meter and hold counting read these reports
CONFIG_WAIT_S = 30.0  # after connecting: how long to wait for the master's configuration
MASTER_SILENCE_S = 15.0  # no heartbeat from the master for this long: it is gone, leave


def run_worker(
    master: str,
    *,
    connect_timeout_s: float = 60.0,
    local_index: int | None = None,
    run_dir: Path | None = None,
    results_path: Path | None = None,
    say: Any = print,
) -> int:
    """Serve the master at ``master`` (``HOST[:PORT]``) until it ends the run; returns the exit code."""
    host, port = wire.parse_master_address(master)
    import gevent
    import locust.runners
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
    try:
        runner = env.create_worker_runner(host, port)
    except ConnectionError as err:
        raise EndpointError(
            f"no oomload master answered at {host}:{port} within {connect_timeout_s:g} s; start "
            "`oomload replay … --workers K` there first, with --master-bind-host reachable from this host "
            "(it listens on 127.0.0.1 unless told otherwise)"
        ) from err
    session = WorkerSession(env, runner, local_index=local_index, run_dir=run_dir, results_path=results_path)
    session.listen()
    runner.send_message(
        wire.HELLO,
        {
            "oomload_version": __version__,
            "locust_version": locust.__version__,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "local_index": local_index,
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
    if session.left_by_signal or session.stopped_by_master:
        return 0
    raise EndpointError(
        f"the master at {host}:{port} stopped answering (no heartbeat for {MASTER_SILENCE_S:g} s); "
        f"the {session.rows_sent()} results this worker had finished were sent"
    )


class WorkerSession:
    """The message handlers and state of one worker (its index, context and result stream)."""

    def __init__(
        self,
        env: Any,
        runner: Any,
        *,
        local_index: int | None,
        run_dir: Path | None,
        results_path: Path | None,
    ) -> None:
        self.env = env
        self.runner = runner
        self.local_index = local_index
        self.run_dir = run_dir
        self.results_path = results_path
        self.index: int | None = None
        self.workers = 0
        self.error: OomloadError | None = None
        self.context: Any = None
        self.stream: ResultStream | None = None
        self.left_by_signal = False
        self.stopped_by_master = False

    def listen(self) -> None:
        r = self.runner
        r.register_message(wire.CONFIG, self.on_config)
        r.register_message(wire.REFUSED, self.on_refused)
        r.register_message(wire.STEP, self.on_step)
        r.register_message(wire.STEP_END, self.on_step_end)
        r.register_message(wire.STOP, self.on_stop)
        self.env.events.report_to_master.add_listener(self.on_report)
        self.env.events.test_stop.add_listener(lambda **_kw: self.stream_flush())

    # -- set-up ----------------------------------------------------------------------------------
    def on_refused(self, msg: Any, **_kw: Any) -> None:
        self.error = ConfigError(f"the master refused this worker: {msg.data.get('error')}")

    def on_config(self, msg: Any, **_kw: Any) -> None:
        data = msg.data
        index = int(data["worker"])
        try:
            self._bind(data, index)
        except OomloadError as err:
            self.runner.send_message(wire.FAILED, {"worker": index, "error": str(err)})
            self.error = err
            return
        self.workers = int(data["workers"])
        self.index = index
        self.runner.send_message(wire.READY, {"worker": index})

    def _bind(self, data: dict[str, Any], index: int) -> None:
        from oomload.run.scenario import ScenarioUser, bind_user

        wanted = str(data.get("user_class") or ScenarioUser.__name__)
        if wanted != ScenarioUser.__name__:
            raise ConfigError(
                f"the master runs user class {wanted!r}; this worker has {ScenarioUser.__name__!r}"
            )
        options = LoadOptions.from_json(data["options"])
        records = wire.trace_from_wire(data["trace"])
        api_key = read_api_key(options.api_key_env, os.environ)  # this host's key; never sent
        copy = None if self.results_path is None else _RowFile(self.results_path)
        self.stream = ResultStream(self.runner.send_message, index, copy=copy)
        context = bind_user(
            ScenarioUser,
            options,
            records=records,
            api_key=api_key,
            sink=self.stream,
            worker=index,
            workers=int(data["workers"]),
        )
        if self.run_dir is not None:  # a local worker: the master's marker, before its message
            context.declared_dead = partial(server_marked_dead, self.run_dir)
        context.live_users = lambda: int(self.runner.user_count)
        self.env.host = options.url
        self.context = context

    # -- the run ---------------------------------------------------------------------------------
    def on_step(self, msg: Any, **_kw: Any) -> None:
        if self.context is not None:
            data = msg.data
            self.context.begin_step(int(data["step"]), int(data["concurrency"]), str(data["phase"]))

    def on_step_end(self, msg: Any, **_kw: Any) -> None:
        del msg
        if self.context is not None:
            self.context.end_step()

    def on_report(self, client_id: str, data: dict[str, Any], **_kw: Any) -> None:
        del client_id
        if self.context is not None:
            data["oomload"] = self.context.step_report()

    def on_stop(self, msg: Any, **_kw: Any) -> None:
        """No new requests; those in flight may finish within the grace, the rest are abandoned
        (``cancelled``); every row is sent before ``oomload_drained``."""
        import gevent

        grace_s, seq = float(msg.data.get("grace_s", 0.0)), int(msg.data.get("seq", 0))
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
            self.runner.send_message(wire.DRAINED, {"worker": self.index, "seq": seq})

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
        """SIGTERM / Ctrl-C: stop sending, abandon what is in flight (cancelled), send every row, and
        tell the master this worker quit (it then gives this worker's users to the others)."""
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


class _RowFile:
    """The worker's own copy of its rows (``--results FILE``): JSON Lines, one flushed line a row."""

    def __init__(self, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)
        except OSError as err:
            raise ConfigError(f"--results {path} cannot be written ({err.strerror or err})") from err

    def append(self, stream: str, obj: dict[str, Any]) -> None:
        del stream
        self.fh.write(json.dumps(obj, separators=(",", ":"), default=str) + "\n")
        self.fh.flush()
