"""The server's own evidence during a run, beside its ``/metrics``: its host memory and its log.

``ServerEvidence.start(session)`` starts, each only when there is something to watch:

* **the server's host memory** (``server_memory.jsonl``, docs/telemetry.md): for a server on this
  host — the one oomload started (the simulator, ``--serve``), ``--server-pid``, or the listener on
  ``--url``'s loopback port (``--server-memory auto``) — a child ``oomload sample --no-gpu``
  (``ServerMemoryProcess``: /proc and cgroup reads block, so they stay out of Locust's gevent loop);
  for ``--server-memory remote:URL``, reads of an ``oomload sample --serve`` beside the server, on
  a thread (HTTP is cooperative under gevent);
* **the server's log** (``--server-log FILE``): ``ServerLogFollower`` copies what the server writes
  from now on into the run directory's ``server.log`` (``--serve``'s server writes there itself, or,
  with secrets in its line, ``RealVllmServer`` copies its log there the same way), the API key
  and the served line's secrets (``--served-with … --api-key``) written as ``***`` as they are copied.

What cannot be watched — no such process, a remote server with no sampler, a log that does not exist
or stops growing — is one ``events.jsonl`` line and one console line, once; the run goes on with
what it has; so is a followed log that has not grown for ``LOG_STALL_S`` while requests ran
(``check``, once a second from the death watch). ``stop()`` ends both (the follower reads once
more: a death is at the end of a log).
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from oomload.errors import OomloadError
from oomload.rundir.servermemory import ServerMemoryRow
from oomload.verdict.runview import SERVER_LOG

MEMORY_FILE = "server_memory.jsonl"
LOG_STALL_S = 60.0


class ServerEvidence:
    """The host-memory sampler and the log follower of one session (module docstring)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.memory: Any = None  # ServerMemoryProcess (a child) or ServerMemorySampler (remote reads)
        self.log: Any = None  # ServerLogFollower
        self._stall_said = False

    @classmethod
    def start(cls, session: Any) -> ServerEvidence:
        evidence = cls(session)
        evidence._start_memory()
        evidence._start_log()
        return evidence

    def latest_memory(self) -> ServerMemoryRow | None:
        """The latest host-memory sample (``None`` before the first, or when not sampled)."""
        sampler = self.memory
        if sampler is None:
            return None
        latest = sampler.latest() if callable(sampler.latest) else sampler.latest  # child or thread
        return None if not latest else ServerMemoryRow.from_json(latest)

    def check(self) -> None:
        """Once a second under load: a followed log that stopped growing is said once (vLLM logs its
        throughput every 10 s while it serves; a file no longer written is not the server's log)."""
        if self.log is None or self._stall_said:
            return
        if self.log.stalled_s() >= LOG_STALL_S:
            self._stall_said = True
            self._note(
                "server_log_problem",
                f"--server-log {self.session.config.server_log} has not grown for {LOG_STALL_S:.0f} s while "
                "requests ran: is it the server's log? The death's cause comes from what it holds",
            )

    def stop(self) -> None:
        if self.memory is not None:
            self.memory.stop()
        if self.log is not None:
            self.log.stop()

    def _start_memory(self) -> None:
        from oomload.telemetry.hostsampler import resolve_memory_target

        s = self.session
        config = s.config
        known_pid = config.server_pid or (None if s.served is None else s.served.pid)
        try:
            target = resolve_memory_target(config.server_memory, s.url, known_pid)
            if target.url is not None:
                self.memory = self._remote(target)
            elif target.watches:
                self.memory = self._local(target)
            elif config.server_memory != "none" and target.reason:
                self._note(
                    "server_memory_unavailable", f"the server's memory is not sampled: {target.reason}"
                )
        except OomloadError as err:
            self._note("server_memory_unavailable", f"the server's memory is not sampled: {err}")

    def _local(self, target: Any) -> Any:
        from oomload.telemetry.gpu import ServerMemoryProcess

        flags = [f"--server-pid={target.pid}"] if target.pid is not None else [f"--server-port={target.port}"]
        if target.cgroup_dir is not None:
            flags.append(f"--cgroup={target.cgroup_dir}")
        sampler = ServerMemoryProcess(self.session.writer.path / MEMORY_FILE, flags)
        if sampler.start():
            return sampler
        reason = sampler.unavailable_reason or "the server memory sampler did not start"
        self._note("server_memory_unavailable", f"the server's memory is not sampled: {reason}")
        return None

    def _remote(self, target: Any) -> Any:
        from oomload.telemetry.hostsampler import ServerMemorySampler, open_memory_source

        def problem(sentence: str) -> None:
            self._note("server_memory_problem", sentence)

        sampler = ServerMemorySampler(open_memory_source(target), self.session.writer, on_problem=problem)
        sampler.start()
        return sampler

    def _start_log(self) -> None:
        path = self.session.config.server_log
        if path is None:
            return
        from oomload.telemetry.serverlog import ServerLogFollower

        def problem(sentence: str) -> None:
            self._note("server_log_problem", sentence)

        secrets = (self.session.api_key, *self.session.config.serve_secrets())
        self.log = ServerLogFollower(
            path, self.session.writer.path / SERVER_LOG, on_problem=problem, secrets=secrets
        )
        self.log.start()

    def _note(self, kind: str, sentence: str) -> None:
        s = self.session
        s.writer.event(kind, detail=sentence)
        s.console.print(f"[yellow]note:[/] {escape(sentence)}")
