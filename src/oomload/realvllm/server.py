"""``RealVllmServer``: a real ``vllm serve`` (CPU build) on loopback, started and always stopped.

Start: ``<venv>/bin/python launcher.py serve MODEL --host 127.0.0.1 --port P --enforce-eager
--block-size B --num-gpu-blocks-override N --kv-cache-memory-bytes M --max-model-len L
--max-num-seqs S [--max-num-queued-reqs Q]`` with ``VLLM_HOST_IP=127.0.0.1`` (keeps vLLM's internal
queue on loopback), ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` (no downloads) and usage statistics off.
The KV cache is always explicit: the CPU backend's automatic sizing fails on small machines, and
``--num-gpu-blocks-override`` only works next to ``--kv-cache-memory-bytes``; ``VLLM_CPU_KVCACHE_SPACE``
would override both and is removed from the child's environment. ``--enforce-eager`` starts in about
20 s instead of 40-55 s with torch.compile.

Ready: ``GET /health`` answers 200. If the process exits first, or the timeout passes, the start
raises ``EndpointError`` with the tail of the server log.

The log: stdout and stderr go to ``log_path`` as the server writes them — unless the line holds
``secrets`` (``ServeCommand.secrets``: its ``--api-key``, which vLLM logs at start-up among its
non-default arguments, and the like). Then the server writes to a file that has no name: made in a
private directory (``tempfile.mkdtemp``: mode 0700), held open by oomload and removed with its directory
before the server starts, so its bytes live only as long as an open descriptor (the server's, oomload's)
and a run killed hard (SIGKILL, a CI job's timeout) leaves no secret on disk, in the run directory or
elsewhere. ``ServerLogFollower`` reads it back through ``/proc/PID/fd/N`` (where there is no ``/proc``
the file keeps its name until ``stop()``) and copies what it gains into ``log_path`` every half second
with each secret written as ``***``, so ``log_path`` never holds a secret, not even for a moment. The
copy is the follower's in every other way too: past 64 MiB only the last MiB is kept, and a write that
fails stops the copy with one sentence (``on_log_problem``; its sentences call the raw log "the
server's log", never the ``/proc`` path). ``sync_log()`` brings the copy up to now
(``start()`` does before it returns, so the start-up lines are there; a reader of a death does before it
reads), ``log_text()`` is the log so far with the secrets as ``***``, and ``stop()`` finishes the copy
(the last chunk, the scrubber's held-back end) and closes the raw log.

The server runs in a process group of its own but in oomload's session. Not a session of its own:
on Linux a session is a CPU autogroup, and the scheduler shares the CPUs fairly between autogroups
before it reads any ``nice`` inside them, so a server in its own session takes its share whatever
its niceness. Measured on this 2-core host (shared-prefix traffic at 12, the server at ``nice -n
10``): in a session of its own the load generator waited 63 % of the step for a CPU, its loop lagged
up to 2.8 s and it held 6.8 of 12; in oomload's session it waited 3 %, lagged 3 ms and held 11.9.
So ``nice -n 10`` in front of ``--serve`` keeps the load generator fed on a host it shares.

Stop: vLLM runs as three processes (API server, EngineCore, Worker) in the server's process
group. ``stop()`` sends SIGTERM to the whole group, waits until no live member is left, then SIGKILLs
whatever remains; it is idempotent and runs on context exit whatever happened. ``kill()`` SIGKILLs the
group at once (an abrupt engine death for tests).

``python -m oomload.realvllm.server [--port 8000]`` does all of it for a user: installs the
environment if needed, builds the tiny model and serves it until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from oomload.credentials import scrub
from oomload.errors import ConfigError, EndpointError, ExitCode, OomloadError
from oomload.realvllm.install import DEFAULT_ROOT, ensure_venv
from oomload.realvllm.tinymodel import ensure_tiny_model
from oomload.telemetry.scrape import open_direct
from oomload.telemetry.serverlog import ServerLogFollower

LAUNCHER = Path(__file__).with_name("launcher.py")
KV_BYTES_PER_TOKEN_TINY = 1024  # the tiny model: 2 (K, V) × 2 layers × 4 heads × 32 × 2 bytes
_ENV_REMOVED = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_API_KEY", "VLLM_PORT")


@dataclass(frozen=True, slots=True)
class VllmServerConfig:
    """What to serve and with which memory limits.

    ``num_gpu_blocks`` (``--num-gpu-blocks-override``) fixes the KV pool exactly; ``None`` lets
    ``kv_cache_memory_bytes`` decide it. The default (12 blocks of 256 tokens, 3072 tokens) makes
    requests of 256 + 256 tokens preempt from 6 concurrent requests on (``floor(11 / 2) + 1``).

    Why blocks of 256: a request holds its last block only for its last ``block_size`` decode steps,
    so a batch preempts only if its requests reach their last block within that window of each
    other. On 2 busy cores requests of one burst start up to a few hundred ms apart; with blocks of
    32 a burst at the predicted onset preempted in about half the tries, with 256 in almost all.
    The CPU backend accepts multiples of 32.
    """

    python: Path
    model_dir: Path
    served_model_name: str = "tiny-model"
    block_size: int = 256
    num_gpu_blocks: int | None = 12
    kv_cache_memory_bytes: int = 16 * 1024 * 1024
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_queued_reqs: int | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def program(self) -> str:
        return f"vLLM with {self.python}"

    def serve_env(self, env: dict[str, str], tmp_dir: Path) -> dict[str, str]:
        """The child's environment (module docstring): offline, on loopback, its own ``TMPDIR``."""
        return harness_env(env, tmp_dir)

    def serve_argv(self, host: str, port: int) -> list[str]:
        """The full command line."""
        argv = [
            str(self.python),
            str(LAUNCHER),
            "serve",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            host,
            "--port",
            str(port),
            "--enforce-eager",
            "--block-size",
            str(self.block_size),
            "--kv-cache-memory-bytes",
            str(self.kv_cache_memory_bytes),
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
        ]
        if self.num_gpu_blocks is not None:
            argv += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        if self.max_num_queued_reqs is not None:
            argv += ["--max-num-queued-reqs", str(self.max_num_queued_reqs)]
        return argv + list(self.extra_args)


def harness_env(env: dict[str, str], tmp_dir: Path) -> dict[str, str]:
    """The harness's environment for a vLLM child: offline, usage statistics off, loopback, a private
    ``TMPDIR``, and none of the variables that would override the explicit KV cache or the port."""
    out = {k: v for k, v in env.items() if k not in _ENV_REMOVED}
    out.update(
        VLLM_HOST_IP="127.0.0.1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONNOUSERSITE="1",
        TMPDIR=str(tmp_dir),
    )
    return out


class ServeSpec(Protocol):
    """What ``RealVllmServer`` starts: a command line for a host and port, and its environment.
    ``VllmServerConfig`` is the harness's; ``oomload tune`` gives the user's ``--serve`` line."""

    @property
    def program(self) -> str: ...

    def serve_argv(self, host: str, port: int) -> list[str]: ...

    def serve_env(self, env: dict[str, str], tmp_dir: Path) -> dict[str, str]: ...


RAW_LOG_SHOWN = "the server's log"  # the raw log (with secrets) in the follower's sentences


def free_port(host: str = "127.0.0.1", port: int = 0) -> int:
    """Bind ``host:port`` (``host`` an IPv4 or IPv6 address or a name; ``port`` 0: any free one) in the
    host's own family and return the port bound: it was free a moment ago (the server binds it shortly
    after). ``OSError`` when it cannot be bound — ``socket.gaierror`` (or ``UnicodeError``) for a name
    that does not resolve; ``check_listen_address`` says so in a sentence."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(address)
        return int(sock.getsockname()[1])


def check_listen_address(
    host: str,
    port: int | None,
    *,
    who: str = "the server",
    host_flag: str = "--host",
    port_flag: str = "--port",
) -> None:
    """``ConfigError`` when ``who`` could not listen on ``host`` (not an address of this machine, no
    such name) or on ``host:port`` (in use; ``None``: any free port): one sentence naming the flags
    (``host_flag``, ``port_flag``), before anything starts — not an ``OSError`` from the first
    candidate's start (``oomload tune``) or the Locust master's bind (``oomload replay --workers``)."""
    try:
        free_port(host, port or 0)
    except (socket.gaierror, UnicodeError) as err:
        raise ConfigError(
            f"{host_flag} {host!r} is not an address or a name this machine resolves ({err})"
        ) from err
    except OSError as err:
        if port is not None and err.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{port_flag} {port} on {host} is in use ({err.strerror}): pick a free port or omit "
                f"{port_flag}"
            ) from err
        raise ConfigError(
            f"{who} cannot listen on {host_flag} {host} ({err.strerror}): give an address of this "
            "machine (127.0.0.1, 0.0.0.0 or one of its interfaces)"
        ) from err


class RealVllmServer:
    """A running ``vllm serve`` for one configuration; use as a context manager.

    ``log_dir`` receives ``vllm-server.log`` (stdout and stderr; with ``secrets``, a copy without them:
    module docstring) and the server's ``TMPDIR``. The command comes from ``config`` (any
    ``ServeSpec``: the harness's ``VllmServerConfig`` or the user's line in ``oomload tune`` and
    ``oomload replay --serve``, which may start the simulator through the same class).
    """

    def __init__(
        self,
        config: ServeSpec,
        log_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 15.0,
        log_name: str = "vllm-server.log",
        cwd: Path | None = None,
        tmp_dir: Path | None = None,
        secrets: Iterable[str | None] = (),
        on_log_problem: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.log_dir = Path(log_dir)
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_path = self.log_dir / log_name
        self.cwd = cwd  # None: the log directory (the harness); oomload tune: the user's directory
        # the server's TMPDIR: vLLM puts ZMQ IPC sockets there, whose paths must stay under 107 bytes
        self.tmp_dir = tmp_dir
        self.secrets = tuple(s for s in secrets if s)  # never in log_path (module docstring)
        self.on_log_problem = on_log_problem
        self.startup_s: float | None = None
        self.exit_code: int | None = None  # set once the server is seen to have exited (``poll``)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._log: IO[bytes] | None = None  # what the server writes to: log_path, or the raw log
        self._raw_source: Path | None = None  # with secrets: where the raw log is read (/proc/PID/fd/N)
        self._raw_fd: int | None = None  # with secrets: the descriptor that keeps an unnamed raw log
        self._copy: ServerLogFollower | None = None  # with secrets: raw log → log_path, scrubbed

    @property
    def url(self) -> str:
        if self.port is None:
            raise EndpointError("the vLLM server has not been started")
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address, bracketed
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> RealVllmServer:
        """Start the server and wait for ``/health``; on failure stop everything and raise."""
        if self._proc is not None:
            return self
        self.log_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp_dir or self.log_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = free_port(self.host)
        env = self.config.serve_env(dict(os.environ), tmp)
        self._open_log()
        started = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                self.config.serve_argv(self.host, self.port),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd or self.log_dir,
                process_group=0,  # not a session: a session is a CPU autogroup (module docstring)
            )
        except OSError as err:
            self._close_log()
            raise EndpointError(f"cannot start {self.config.program}: {err}") from err
        self._pgid = self._proc.pid
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        self.sync_log()  # its start-up lines (the limits it took) are in log_path for whoever reads them
        return self

    def _open_log(self) -> None:
        """Open what the server writes to: ``log_path``, or with secrets a raw log in a private directory
        that ``ServerLogFollower`` copies into ``log_path`` without them (module docstring)."""
        if not self.secrets:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - held open while the server runs
            return
        raw = Path(tempfile.mkdtemp(prefix="oomload-log-")) / self.log_path.name  # 0700
        self._log = open(raw, "ab")  # noqa: SIM115 - held open while the server runs
        self._raw_source, self._raw_fd = _unnamed(raw)
        self._copy = ServerLogFollower(
            self._raw_source,
            self.log_path,
            secrets=self.secrets,
            on_problem=self.on_log_problem,
            shown=RAW_LOG_SHOWN,  # not /proc/PID/fd/N, a path the user never gave
        )
        self._copy.start()  # from the raw log's end: its first byte, it was just made

    def _wait_healthy(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.startup_timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                self.exit_code = code
                raise EndpointError(
                    f"vLLM exited with code {code} before it was ready; last lines of {self.log_path}:\n"
                    + self.log_tail()
                )
            if self.healthy(timeout_s=2.0):
                return
            if time.monotonic() > deadline:
                raise EndpointError(
                    f"vLLM did not answer /health within {self.startup_timeout_s:.0f} s; "
                    f"last lines of {self.log_path}:\n" + self.log_tail()
                )
            time.sleep(0.5)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """True when ``GET /health`` answers 200 now."""
        try:
            with open_direct(self.url + "/health", timeout_s) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def poll(self) -> int | None:
        """The server's exit status once it has exited (``Popen``'s: ``-9`` for SIGKILL), else ``None``."""
        if self._proc is not None:
            code = self._proc.poll()
            if code is not None:
                self.exit_code = code
        return self.exit_code

    def sync_log(self) -> None:
        """Copy into ``log_path`` what the server wrote since the last copy (with secrets; without them
        the server writes there itself). What could begin a secret waits for the next byte or ``stop()``."""
        if self._copy is not None:
            self._copy.poll_once()

    def log_text(self) -> str:
        """The server's log up to now, each secret as ``***`` (``""`` without a log). While it runs with
        secrets, the raw log read whole (nothing held back); otherwise ``log_path``."""
        path = self._log_source()
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return scrub(text, self.secrets)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` of ``log_text()`` (``(no log)`` without one)."""
        if not self._log_source().is_file():
            return "(no log)"
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _log_source(self) -> Path:
        return self.log_path if self._raw_source is None else self._raw_source

    def pause(self) -> None:
        """SIGSTOP every process of the server: nothing more is computed or sent (a hung server)."""
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        self._signal_group(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL every process of the server at once (an abrupt death), then reap it."""
        self._signal_group(signal.SIGKILL)
        self._wait_group_gone(self.stop_timeout_s)

    def stop(self) -> None:
        """SIGTERM the process group, wait for it, SIGKILL what is left. Safe to call twice."""
        if self._pgid is not None:
            self.poll()  # an exit of its own is kept: it is evidence (``oomload replay --serve``)
            self._signal_group(signal.SIGTERM)
            if not self._wait_group_gone(self.stop_timeout_s):
                self._signal_group(signal.SIGKILL)
                self._wait_group_gone(self.stop_timeout_s)
        self._proc = None
        self._pgid = None
        self._close_log()

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._pgid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pgid, sig)

    def _wait_group_gone(self, timeout_s: float) -> bool:
        """Reap our child and wait until the group has no live (non-zombie) member."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=0.1)
            if self._pgid is None or not group_members(self._pgid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def _close_log(self) -> None:
        """Close the server's log; with secrets finish the copy (the last chunk, the scrubber's held-back
        end) and let the raw log go (without ``/proc`` it still has its name: remove it and its directory)."""
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._copy is not None:
            self._copy.stop()
            self._copy = None
        if self._raw_fd is not None:
            os.close(self._raw_fd)
            self._raw_fd = None
        elif self._raw_source is not None:
            shutil.rmtree(self._raw_source.parent, ignore_errors=True)
        self._raw_source = None

    def __enter__(self) -> RealVllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _unnamed(path: Path) -> tuple[Path, int | None]:
    """Hold ``path`` open for reading and remove it with its directory: its bytes then live as long as a
    descriptor on it (the writer's, this one), and nothing is left on disk when both processes are killed.
    Returns where to read it (``/proc/PID/fd/N``) and the descriptor to close when done; where ``/proc``
    has no such link, ``(path, None)``: the file keeps its name."""
    fd = os.open(path, os.O_RDONLY)  # not inherited by the server (PEP 446)
    view = Path(f"/proc/{os.getpid()}/fd/{fd}")
    if not view.is_file():
        os.close(fd)
        return path, None
    path.unlink()
    path.parent.rmdir()
    return view, fd


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group ``pgid`` (Linux ``/proc``)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces or parentheses, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m oomload.realvllm.server``: install if needed, build the tiny model, serve until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m oomload.realvllm.server",
        description="Serve the tiny local model with the real vLLM (CPU build) on loopback, until Ctrl-C.",
    )
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="venv + model folder (default .e2e)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--block-size", type=int, default=256, help="tokens per KV block (multiple of 32)")
    parser.add_argument("--num-gpu-blocks", type=int, default=12, help="KV blocks (one is vLLM's null block)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-queued-reqs", type=int, default=None)
    parser.add_argument("--startup-timeout-s", type=float, default=180.0)
    args = parser.parse_args(argv)
    root = args.root.absolute()
    try:
        python = ensure_venv(root)
        model = ensure_tiny_model(python, root / "tiny-model")
        config = VllmServerConfig(
            python=python.absolute(),
            model_dir=model.absolute(),
            block_size=args.block_size,
            num_gpu_blocks=args.num_gpu_blocks,
            kv_cache_memory_bytes=max(
                16 << 20, args.num_gpu_blocks * args.block_size * KV_BYTES_PER_TOKEN_TINY
            ),
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_queued_reqs=args.max_num_queued_reqs,
        )
        server = RealVllmServer(
            config, root / "logs", port=args.port, startup_timeout_s=args.startup_timeout_s
        )
        print(f"starting vLLM (log: {server.log_path}) ...", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        with server:
            print(
                f"ready after {server.startup_s:.1f} s: {server.url}  (model tiny-model; Ctrl-C stops)",
                flush=True,
            )
            while not stop.wait(1.0):
                if not server.is_running():
                    print(
                        f"vLLM exited; last lines of {server.log_path}:\n{server.log_tail()}", file=sys.stderr
                    )
                    return int(ExitCode.UNREACHABLE)
    except OomloadError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
