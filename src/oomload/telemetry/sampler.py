"""The standalone GPU-memory sampler behind ``oomload sample``: a sampling loop, a file, an HTTP endpoint.

``run_sampler`` opens a ``GpuSource`` (``gpu_source``: NVML here, or a DCGM exporter) and samples it
on a fixed grid of ``interval_s`` from the start: a tick that comes late is not made up with a burst,
the next one is simply due at the next grid point. Every tick's samples (one ``GpuSample`` per
device) are appended as flushed ``gpu.jsonl`` lines to the output, if any, and replace the latest
samples that the HTTP server (``serve_samples``) renders as Prometheus text with DCGM metric names
at ``/metrics``. A tick whose source fails (``SamplerUnavailableError``: a GPU lost, a DCGM
endpoint down) prints its sentence on stderr once per distinct problem and sampling goes on.

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
from types import FrameType
from typing import IO, Any

from oomload.errors import ConfigError, SamplerUnavailableError
from oomload.telemetry.gpu_sample import GpuSample, GpuSource


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


def run_sampler(source: GpuSource, options: SamplerOptions, stop: threading.Event | None = None) -> None:
    """Open ``source`` and sample it until stopped (see the module docstring); close it at the end."""
    stop = stop if stop is not None else threading.Event()
    source.open()
    latest: list[GpuSample] = []
    latest_lock = threading.Lock()
    try:
        with _output(options.out, default_stdout=not options.serve) as out, _signals_stop(stop):
            server = serve_samples(options.host, options.port, latest, latest_lock) if options.serve else None
            try:
                if server is not None:  # the address is announced once /metrics has a sample to serve
                    with contextlib.suppress(SamplerUnavailableError):
                        latest[:] = source.sample()
                _announce(options, source, out, server)
                _loop(options, source, out, stop, latest, latest_lock)
            finally:
                if server is not None:
                    server.shutdown()
                    server.server_close()
    finally:
        source.close()


def _loop(
    options: SamplerOptions,
    source: GpuSource,
    out: IO[str] | None,
    stop: threading.Event,
    latest: list[GpuSample],
    latest_lock: threading.Lock,
) -> None:
    started = time.monotonic()
    next_tick = started
    last_error: str | None = None
    while not stop.is_set():
        try:
            samples = source.sample()
        except SamplerUnavailableError as err:
            if str(err) != last_error:  # one line per distinct problem, not one per tick
                print(f"oomload sample: {err}", file=sys.stderr, flush=True)
                last_error = str(err)
        else:
            last_error = None
            with latest_lock:
                latest[:] = samples
            if out is not None:
                out.write("".join(json.dumps(s.to_json(), separators=(",", ":")) + "\n" for s in samples))
                out.flush()
        if options.parent_pid is not None and os.getppid() != options.parent_pid:
            break  # the process that started us is gone: never linger as an orphan
        now = time.monotonic()
        if options.duration_s is not None and now - started >= options.duration_s:
            break
        next_tick += options.interval_s
        if next_tick < now:
            next_tick = now
        stop.wait(next_tick - now)


def _announce(
    options: SamplerOptions, source: GpuSource, out: IO[str] | None, server: ThreadingHTTPServer | None
) -> None:
    names = getattr(source, "names", None)
    what = (
        f"{options.dcgm_url}"
        if options.dcgm_url
        else f"{len(names or {})} GPU(s) via NVML ({', '.join(sorted(set((names or {}).values())))})"
    )
    where = []
    if out is not None:
        where.append("stdout" if out is sys.stdout else str(options.out))
    if server is not None:
        host, port = server.server_address[:2]
        where.append(f"http://{_host_for_url(str(host))}:{port}/metrics")
    print(
        f"oomload sample: {what} every {options.interval_s:g} s → {', '.join(where)}",
        file=sys.stderr,
        flush=True,
    )


@contextlib.contextmanager
def _output(path: str | None, *, default_stdout: bool) -> Iterator[IO[str] | None]:
    if path is None and not default_stdout:
        yield None
        return
    if path is None or path == "-":
        yield sys.stdout
        return
    try:
        fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as err:
        raise ConfigError(f"cannot write --out {path}: {err.strerror}") from err
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


def serve_samples(host: str, port: int, latest: list[GpuSample], lock: threading.Lock) -> ThreadingHTTPServer:
    """An HTTP server, on its own daemon thread, that renders ``latest`` at ``/metrics`` as DCGM text."""
    from oomload.telemetry.dcgm import render_dcgm_text

    hostname = socket.gethostname()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0].rstrip("/") not in ("/metrics", ""):
                self.send_error(404, "only /metrics is served here")
                return
            with lock:
                samples = list(latest)
            body = render_dcgm_text(samples, hostname=hostname).encode()
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
