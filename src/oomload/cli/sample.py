"""``oomload sample``: the standalone GPU-memory sampler (NVML here, or a DCGM endpoint).

Run it on the GPU host when the load generator is elsewhere::

    oomload sample --serve --host 0.0.0.0 --port 9400     # then: oomload replay … --gpu remote:http://gpu-host:9400
    oomload sample --out gpu.jsonl --interval-s 0.1       # or a file, one gpu.jsonl line per device per tick

``oomload replay`` runs this same command as a child process (``GpuSamplerProcess``): NVML calls block,
so they stay out of Locust's gevent loop. Ctrl-C and SIGTERM stop it cleanly (exit 0). No usable GPU
is one sentence and exit 2.

Test hooks (hidden from ``--help``, not user features): ``--fake-nvml SPEC`` or the
``OOMLOAD_FAKE_NVML`` environment variable replace NVML with ``oomload.telemetry.fake_nvml``;
``--parent-pid PID`` makes the sampler exit when that process is gone (no orphans).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import IO, Any

from oomload.errors import ConfigError, ExitCode, SamplerUnavailableError

FAKE_NVML_ENV = "OOMLOAD_FAKE_NVML"


def register(subparsers: Any) -> None:
    """Add the ``sample`` sub-command."""
    parser = subparsers.add_parser(
        "sample",
        help="sample GPU memory (NVML or a DCGM endpoint) to a file and/or serve it over HTTP",
        description=(
            "Sample GPU memory, utilization and per-process memory through NVML (or read a DCGM "
            "exporter with --dcgm-url) and write gpu.jsonl lines and/or serve them as Prometheus "
            "text with DCGM metric names. Without --out and --serve, lines go to stdout."
        ),
    )
    parser.add_argument(
        "--out", metavar="FILE", help="append one JSON line per device per tick ('-' = stdout)"
    )
    parser.add_argument(
        "--serve", action="store_true", help="serve the latest samples at http://HOST:PORT/metrics"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9400, help="port to serve on (default: 9400; 0 = any)")
    parser.add_argument(
        "--interval-s", type=float, default=0.1, help="seconds between samples (default: 0.1)"
    )
    parser.add_argument(
        "--device",
        type=int,
        nargs="+",
        action="extend",
        metavar="N",
        help="GPU index(es) to sample (default: all)",
    )
    parser.add_argument(
        "--duration-s", type=float, help="stop after this many seconds (default: until stopped)"
    )
    parser.add_argument(
        "--dcgm-url", metavar="URL", help="read a DCGM exporter (or `oomload sample --serve`)"
    )
    parser.add_argument("--fake-nvml", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oomload.telemetry.gpu_sample import GpuSample, GpuSource

    _validate(args)
    source: GpuSource = _source(args)
    source.open()
    stop = threading.Event()
    latest: list[GpuSample] = []
    latest_lock = threading.Lock()
    try:
        with _output(args.out, default_stdout=not args.serve) as out, _signals_stop(stop):
            server = _serve(args.host, args.port, latest, latest_lock) if args.serve else None
            try:
                if server is not None:  # the address is announced once /metrics has a sample to serve
                    with contextlib.suppress(SamplerUnavailableError):
                        latest[:] = source.sample()
                _announce(args, source, out, server)
                _loop(args, source, out, stop, latest, latest_lock)
            finally:
                if server is not None:
                    server.shutdown()
                    server.server_close()
    finally:
        source.close()
    return int(ExitCode.OK)


def _validate(args: argparse.Namespace) -> None:
    if not args.interval_s > 0:
        raise ConfigError(f"--interval-s must be > 0, got {args.interval_s}")
    if args.duration_s is not None and not args.duration_s > 0:
        raise ConfigError(f"--duration-s must be > 0, got {args.duration_s}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be 0–65535, got {args.port}")
    if args.device and any(d < 0 for d in args.device):
        raise ConfigError(f"--device takes GPU indexes ≥ 0, got {args.device}")


def _source(args: argparse.Namespace) -> Any:
    devices: Sequence[int] | None = args.device or None
    if args.dcgm_url:
        from oomload.telemetry.dcgm import DcgmReader

        return DcgmReader(args.dcgm_url, devices=devices)
    from oomload.telemetry.nvml import NvmlSampler

    spec = args.fake_nvml or os.environ.get(FAKE_NVML_ENV)
    if spec:
        from oomload.telemetry.fake_nvml import FakeNvml, load_fake_spec

        return NvmlSampler(FakeNvml(load_fake_spec(spec)), devices)
    return NvmlSampler(None, devices)


def _loop(
    args: argparse.Namespace,
    source: Any,
    out: IO[str] | None,
    stop: threading.Event,
    latest: list[Any],
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
        if args.parent_pid is not None and os.getppid() != args.parent_pid:
            break  # the process that started us is gone: never linger as an orphan
        now = time.monotonic()
        if args.duration_s is not None and now - started >= args.duration_s:
            break
        next_tick += args.interval_s
        if next_tick < now:
            next_tick = now
        stop.wait(next_tick - now)


def _announce(
    args: argparse.Namespace, source: Any, out: IO[str] | None, server: ThreadingHTTPServer | None
) -> None:
    names = getattr(source, "names", None)
    what = (
        f"{args.dcgm_url}"
        if args.dcgm_url
        else f"{len(names or {})} GPU(s) via NVML ({', '.join(sorted(set((names or {}).values())))})"
    )
    where = []
    if out is not None:
        where.append("stdout" if out is sys.stdout else str(args.out))
    if server is not None:
        host, port = server.server_address[:2]
        where.append(f"http://{_host_for_url(str(host))}:{port}/metrics")
    print(
        f"oomload sample: {what} every {args.interval_s:g} s → {', '.join(where)}",
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


def _serve(host: str, port: int, latest: list[Any], lock: threading.Lock) -> ThreadingHTTPServer:
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
