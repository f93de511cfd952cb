"""``oomload sample``: the standalone GPU-memory sampler (NVML here, or a DCGM endpoint).

Run it on the GPU host when the load generator is elsewhere::

    oomload sample --serve --host 0.0.0.0 --port 9400     # then: oomload replay … --gpu remote:http://gpu-host:9400
    oomload sample --out gpu.jsonl --interval-s 0.1       # or a file, one gpu.jsonl line per device per tick

``oomload replay`` runs this same command as a child process (``GpuSamplerProcess``): NVML calls block,
so they stay out of Locust's gevent loop. Ctrl-C and SIGTERM stop it cleanly (exit 0). No usable GPU
is one sentence and exit 2. The sampling loop and its HTTP server are ``oomload.telemetry.sampler``'s;
this module parses and checks the flags.

``--parent-pid PID`` (hidden from ``--help``, set by ``GpuSamplerProcess``) makes the sampler exit when
that process is gone (no orphans). Tests replace NVML through ``run``'s ``nvml`` argument (no flag or
environment variable does it).
"""

from __future__ import annotations

import argparse
from typing import Any

from oomload.errors import ConfigError, ExitCode


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
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, nvml: Any = None) -> int:
    """Sample until stopped. ``nvml``: an object with ``pynvml``'s interface to use in place of NVML
    (``oomload.telemetry.fake_nvml.FakeNvml`` in tests); ``None``, the real one."""
    from oomload.telemetry.sampler import SamplerOptions, gpu_source, run_sampler

    _validate(args)
    source = gpu_source(args.device or None, dcgm_url=args.dcgm_url, nvml=nvml)
    options = SamplerOptions(
        interval_s=args.interval_s,
        out=args.out,
        serve=args.serve,
        host=args.host,
        port=args.port,
        duration_s=args.duration_s,
        parent_pid=args.parent_pid,
        dcgm_url=args.dcgm_url,
    )
    run_sampler(source, options)
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
