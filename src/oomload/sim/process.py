"""``SimServer``: run ``oomload sim serve`` as a subprocess for tests, demos and ``replay`` without ``--url``.

Start: ``sys.executable -m oomload sim serve --host H --port 0 --port-file F *args`` in its own process
group; wait for the port file, then for ``GET /health`` to answer 200 (or the process to die, which
raises ``EndpointError`` with the tail of its log). Stop: SIGTERM to the group, SIGKILL after a
grace period, and always reap — no orphans, also when the ``with`` block raises.

What a caller can read: ``pid`` (the server process, whose ``/proc/PID/status`` shows the memory the
host-memory model holds), ``returncode`` (``None`` while it runs; Popen's status once it ended — 1
after an engine death, −9 when it SIGKILLed itself over a container limit, kept after ``stop``) and
``log_path``: the file that receives the server's stdout and stderr (vLLM's log lines). Given as
``log_path=``, it is opened for appending and kept; otherwise it lives in a temporary directory that
``stop`` removes (``stderr_tail`` still answers afterwards).

The child dies with its parent, also when the parent cannot stop it (``kill -9``, the OOM killer):
``SimServer`` passes ``--parent-pid`` (its own pid) and the child runs ``exit_with_parent``, a watchdog
thread that polls ``os.getppid()`` every ``PARENT_POLL_S``; once the child has been re-parented (its
parent is gone — also before the watchdog started, so no start-up race) it SIGTERMs itself, the
server's clean shutdown, and ``os._exit`` after ``PARENT_GONE_GRACE_S`` if that did not end it. Not
Linux's ``PR_SET_PDEATHSIG``: it fires when the *thread* that started the child ends, which would kill a
simulator started from a short-lived thread while its process still uses it.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from oomload.errors import ConfigError, EndpointError, ExitCode

PARENT_POLL_S = 0.2
PARENT_GONE_GRACE_S = 5.0


class SimServer:
    """A simulated vLLM server in a child process (context manager)."""

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 30.0,
        log_path: Path | None = None,
    ) -> None:
        self.args = list(args)
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.port: int | None = None
        self.url = ""
        self.pid: int | None = None
        self._keep_log = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._stderr_path: Path | None = None
        self._returncode: int | None = None
        self._stderr_cache = ""

    @property
    def log_path(self) -> Path | None:
        """The server's log file (stdout and stderr): the one given, or the temporary one until ``stop``."""
        return self._stderr_path if self._stderr_path is not None else self._keep_log

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> SimServer:
        if self._proc is not None:
            return self
        self._tmp = tempfile.TemporaryDirectory(prefix="oomload-sim-")
        tmp = Path(self._tmp.name)
        port_file = tmp / "port"
        self._stderr_path = self._keep_log if self._keep_log is not None else tmp / "stderr.log"
        cmd = [
            sys.executable,
            "-m",
            "oomload",
            "sim",
            "serve",
            "--host",
            self.host,
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--parent-pid",
            str(os.getpid()),
            *self.args,
        ]
        try:
            err = open(self._stderr_path, "ab")  # noqa: SIM115 - the child holds it; closed right below
        except OSError as exc:
            self.stop()
            raise ConfigError(
                f"cannot write the simulator's log {self._stderr_path}: {exc.strerror}"
            ) from exc
        with err:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, process_group=0
            )  # oomload's session, as --serve's (oomload.realvllm.server: a session is a CPU autogroup)
        self.pid = self._proc.pid
        try:
            self._wait_ready(port_file)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, port_file: Path) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                error = ConfigError if code == ExitCode.USAGE else EndpointError  # a bad flag: usage
                raise error(f"oomload sim serve exited with status {code} at start-up: {self.stderr_tail()}")
            if self.port is None and port_file.is_file():
                text = port_file.read_text(encoding="utf-8").strip()
                if text.isdigit():
                    self.port = int(text)
                    shown = f"[{self.host}]" if ":" in self.host else self.host
                    self.url = f"http://{shown}:{self.port}"
            if self.port is not None and self._healthy():
                return
            time.sleep(0.02)
        raise EndpointError(
            f"oomload sim serve did not answer /health within {self.startup_timeout_s:g} s: "
            f"{self.stderr_tail()}"
        )

    def _healthy(self) -> bool:
        assert self.port is not None
        conn = http.client.HTTPConnection(self.host, self.port, timeout=2.0)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL after ``timeout_s``, reap it."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=timeout_s)
            else:
                _signal_group(proc.pid, signal.SIGKILL)  # stray children of a dead leader, if any
            self._returncode = proc.returncode
            self._proc = None
        if self._tmp is not None:
            self._stderr_cache = self.stderr_tail()
            self._tmp.cleanup()
            self._tmp = None
            self._stderr_path = None

    @property
    def returncode(self) -> int | None:
        """``None`` while the server runs (or before it started); its exit status once it ended."""
        return self._returncode if self._proc is None else self._proc.poll()

    def poll(self) -> int | None:
        """``returncode`` (``oomload.run.served.ServedProcess``: the death watch and the runner ask)."""
        return self.returncode

    def sync_log(self) -> None:
        """Nothing to do (``oomload.run.served.ServedProcess``): the process writes its log itself."""

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the server to end by itself; its exit status, or ``None``."""
        if self._proc is None:
            return self._returncode
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stderr_tail(self, max_chars: int = 2000) -> str:
        """The end of the server's log (start-up errors, engine-death lines)."""
        path = self.log_path
        if path is None or not path.is_file():
            return self._stderr_cache
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 4 * max_chars, 0))
            text = f.read().decode("utf-8", errors="replace")
        return text[-max_chars:].strip()

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def exit_with_parent(parent_pid: int, *, poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """In the simulator child: end this process soon after ``parent_pid`` is gone (module docstring)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(PARENT_GONE_GRACE_S)
        os._exit(int(ExitCode.UNREACHABLE))

    thread = threading.Thread(target=watch, name="oomload-parent-watchdog", daemon=True)
    thread.start()
    return thread


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
