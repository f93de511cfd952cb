"""The standalone sampler behind ``oomload sample``: GPU memory and/or the server's host memory, a
sampling loop, a file, an HTTP endpoint.

``run_sampler`` opens a ``GpuSource`` (``gpu_source``: NVML here, or a DCGM exporter) and samples it
on a fixed grid of ``interval_s`` from the start: a tick that comes late is not made up with a burst,
the next one is simply due at the next grid point. Every tick's samples (one ``GpuSample`` per
device) are appended as flushed ``gpu.jsonl`` lines to the output, if any, and replace the latest
samples that the HTTP server (``serve_samples``) renders as Prometheus text with DCGM metric names
at ``/metrics``. A tick whose source fails (``SamplerUnavailableError``: a GPU lost, a DCGM
endpoint down) prints its sentence on stderr once per distinct problem and sampling goes on.

With a ``ServerMemorySource`` (``oomload.telemetry.hostsampler``) the server's host memory is read
too, on its own grid of ``server_interval_s``: one ``server_memory.jsonl`` line per read to
``server_out`` (default: the GPU lines' output), and its series beside the GPU's at ``/metrics``
(``render_server_memory_text``). Its problems are printed once each. With server memory to read, a
GPU that cannot be opened is one line on stderr and the sampler goes on without it, unless the GPU
was asked for (``gpu_required``: ``--dcgm-url`` or ``--device``); without, it is the error.

The loop ends when ``stop`` is set (SIGTERM or SIGINT while sampling in the main thread: a clean
exit), after ``duration_s``, or when ``parent_pid`` is no longer this process's parent (the
``oomload replay`` that started it is gone: never linger as an orphan).

With ``serve``, the address is announced once ``/metrics`` has a first sample to serve.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from oomload.errors import ConfigError, SamplerUnavailableError
from oomload.rundir.servermemory import ServerMemoryLine
from oomload.telemetry.gpu_sample import GpuSample, GpuSource

if TYPE_CHECKING:
    from oomload.telemetry.hostsampler import ServerMemorySampler, ServerMemorySource


@dataclass(frozen=True, slots=True)
class SamplerOptions:
    """Where samples go and when sampling stops (validated by the caller)."""

    interval_s: float = 0.1
    out: str | None = None  # a file to append lines to ('-' = stdout); None: stdout unless serving
    serve: bool = False  # serve the latest samples at http://HOST:PORT/metrics
    host: str = "127.0.0.1"
    port: int = 9400  # 0 = any free port
    duration_s: float | None = None  # None: until stopped
    parent_pid: int | None = None  # stop when this process is no longer the parent
    dcgm_url: str | None = None  # only to say what is sampled
    server_interval_s: float = 0.5  # the server's memory, when a source for it is given
    server_out: str | None = None  # its lines ('-' = stdout); None: where the GPU lines go
    gpu_required: bool = True  # False: with server memory to read, no GPU is not an error


def gpu_source(
    devices: Sequence[int] | None = None, *, dcgm_url: str | None = None, nvml: Any = None
) -> GpuSource:
    """A DCGM exporter's reader for ``dcgm_url``; else NVML through ``nvml`` (an object with ``pynvml``'s
    interface, such as ``oomload.telemetry.fake_nvml.FakeNvml``; ``None``: ``pynvml`` itself)."""
    if dcgm_url:
        from oomload.telemetry.dcgm import DcgmReader

        return DcgmReader(dcgm_url, devices=devices)
    from oomload.telemetry.nvml import NvmlSampler

    return NvmlSampler(nvml, devices)


def run_sampler(
    source: GpuSource | None,
    options: SamplerOptions,
    stop: threading.Event | None = None,
    memory: ServerMemorySource | None = None,
) -> None:
    """Open ``source`` and sample it, and/or read ``memory``, until stopped (see the module docstring);
    close the GPU source at the end."""
    stop = stop if stop is not None else threading.Event()
    gpu = _open_gpu(source, options, memory is not None)
    if gpu is None and memory is None:
        raise ValueError("nothing to sample: give a GPU source or a server memory source")
    latest: list[GpuSample] = []
    memory_latest: list[ServerMemoryLine] = []
    latest_lock = threading.Lock()
    try:
        with (
            _output(options.out, "--out", default_stdout=not options.serve) as out,
            _output(options.server_out, "--server-out", default_stdout=False) as server_out,
            _signals_stop(stop),
        ):
            memory_sampler = (
                None
                if memory is None
                else _memory_sampler(
                    memory,
                    options,
                    out if options.server_out is None else server_out,
                    memory_latest,
                    latest_lock,
                )
            )
            server = (
                serve_samples(
                    options.host,
                    options.port,
                    latest if gpu is not None else None,
                    latest_lock,
                    memory=memory_latest if memory is not None else None,
                )
                if options.serve
                else None
            )
            try:
                if server is not None and gpu is not None:  # announced once /metrics has a sample
                    with contextlib.suppress(SamplerUnavailableError):
                        latest[:] = gpu.sample()
                if memory_sampler is not None:  # its first line, before the announcement names it
                    memory_sampler.check()
                    memory_sampler.sample_once()
                _announce(options, gpu, memory, out, server)
                _loop(options, gpu, memory_sampler, out, stop, latest, latest_lock)
            finally:
                if server is not None:
                    server.shutdown()
                    server.server_close()
    finally:
        if gpu is not None:
            gpu.close()


def _open_gpu(source: GpuSource | None, options: SamplerOptions, has_memory: bool) -> GpuSource | None:
    if source is None:
        return None
    try:
        source.open()
    except SamplerUnavailableError as err:
        if options.gpu_required or not has_memory:
            raise
        print(f"oomload sample: {err}; sampling the server's memory only", file=sys.stderr, flush=True)
        return None
    return source


def _memory_sampler(
    memory: ServerMemorySource,
    options: SamplerOptions,
    out: IO[str] | None,
    latest: list[ServerMemoryLine],
    lock: threading.Lock,
) -> ServerMemorySampler:
    from oomload.telemetry.hostsampler import ServerMemorySampler

    def on_line(line: ServerMemoryLine) -> None:
        with lock:
            latest[:] = [line]
        if out is not None:
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            out.flush()

    def on_problem(sentence: str) -> None:
        print(f"oomload sample: {sentence}", file=sys.stderr, flush=True)

    return ServerMemorySampler(
        memory, interval_s=options.server_interval_s, on_line=on_line, on_problem=on_problem
    )


def _loop(
    options: SamplerOptions,
    source: GpuSource | None,
    memory: ServerMemorySampler | None,
    out: IO[str] | None,
    stop: threading.Event,
    latest: list[GpuSample],
    latest_lock: threading.Lock,
) -> None:
    started = time.monotonic()
    next_gpu = started
    next_memory = started + options.server_interval_s  # the first memory line was read before
    last_error: str | None = None
    while not stop.is_set():
        if source is not None and time.monotonic() >= next_gpu:
            last_error = _sample_gpu(source, out, latest, latest_lock, last_error)
            next_gpu = _next_tick(next_gpu, options.interval_s)
        if memory is not None and time.monotonic() >= next_memory:
            memory.sample_once()
            next_memory = _next_tick(next_memory, options.server_interval_s)
        if options.parent_pid is not None and os.getppid() != options.parent_pid:
            break  # the process that started us is gone: never linger as an orphan
        now = time.monotonic()
        if options.duration_s is not None and now - started >= options.duration_s:
            break
        due = min(t for t, on in ((next_gpu, source), (next_memory, memory)) if on is not None)
        stop.wait(max(0.0, due - now))


def _next_tick(previous: float, interval_s: float) -> float:
    """The next grid point; a late tick moves the grid to now (never a burst to catch up)."""
    due = previous + interval_s
    now = time.monotonic()
    return due if due >= now else now


def _sample_gpu(
    source: GpuSource,
    out: IO[str] | None,
    latest: list[GpuSample],
    latest_lock: threading.Lock,
    last_error: str | None,
) -> str | None:
    """One GPU tick; returns the problem it printed (one line per distinct problem, not per tick)."""
    try:
        samples = source.sample()
    except SamplerUnavailableError as err:
        if str(err) != last_error:
            print(f"oomload sample: {err}", file=sys.stderr, flush=True)
        return str(err)
    with latest_lock:
        latest[:] = samples
    if out is not None:
        out.write("".join(json.dumps(s.to_json(), separators=(",", ":")) + "\n" for s in samples))
        out.flush()
    return None


def _announce(
    options: SamplerOptions,
    source: GpuSource | None,
    memory: ServerMemorySource | None,
    out: IO[str] | None,
    server: ThreadingHTTPServer | None,
) -> None:
    what = []
    if source is not None:
        names = getattr(source, "names", None)
        gpus = (
            f"{options.dcgm_url}"
            if options.dcgm_url
            else f"{len(names or {})} GPU(s) via NVML ({', '.join(sorted(set((names or {}).values())))})"
        )
        what.append(f"{gpus} every {options.interval_s:g} s")
    if memory is not None:
        what.append(f"{memory.describe()} every {options.server_interval_s:g} s")
    where = []
    if out is not None:
        where.append("stdout" if out is sys.stdout else str(options.out))
    if options.server_out is not None and memory is not None:
        where.append("stdout" if options.server_out == "-" else options.server_out)
    if server is not None:
        host, port = server.server_address[:2]
        where.append(f"http://{_host_for_url(str(host))}:{port}/metrics")
    print(f"oomload sample: {' and '.join(what)} → {', '.join(where)}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _output(path: str | None, flag: str, *, default_stdout: bool) -> Iterator[IO[str] | None]:
    """``path`` opened to append (its folder made, as ``trace build -o`` makes one), stdout for ``-``."""
    if path is None and not default_stdout:
        yield None
        return
    if path is None or path == "-":
        yield sys.stdout
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as err:
        raise ConfigError(f"cannot write {flag} {path}: {err.strerror or err}") from err
    try:
        yield fh
    finally:
        fh.close()


@contextlib.contextmanager
def _signals_stop(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` (a clean exit 0) while sampling; only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_samples(
    host: str,
    port: int,
    latest: list[GpuSample] | None,
    lock: threading.Lock,
    *,
    memory: list[ServerMemoryLine] | None = None,
) -> ThreadingHTTPServer:
    """An HTTP server, on its own daemon thread, that renders ``latest`` at ``/metrics`` as DCGM text
    and the latest server memory line (``memory``, if given) as ``oomload_server_*`` series; ``None``:
    no such series."""
    from oomload.telemetry.dcgm import render_dcgm_text
    from oomload.telemetry.hostsampler import render_server_memory_text

    hostname = socket.gethostname()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0].rstrip("/") not in ("/metrics", ""):
                self.send_error(404, "only /metrics is served here")
                return
            with lock:
                samples = None if latest is None else list(latest)
                line = memory[-1] if memory else None
            text = "" if samples is None else render_dcgm_text(samples, hostname=hostname)
            body = (text + render_server_memory_text(line)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    try:
        server = Server((host, port), Handler)
    except OSError as err:
        raise ConfigError(f"cannot serve on {host}:{port}: {err.strerror or err}") from err
    threading.Thread(
        target=server.serve_forever, args=(0.2,), name="oomload-sample-http", daemon=True
    ).start()
    return server


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host
