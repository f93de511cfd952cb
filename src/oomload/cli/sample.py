"""``oomload sample``: the standalone sampler of GPU memory (NVML here, or a DCGM endpoint) and of the
server's own host memory (its process tree and memory cgroup).

Run it on the GPU host when the load generator is elsewhere::

    oomload sample --serve --host 0.0.0.0 --port 9400     # then: oomload replay … --gpu remote:http://gpu-host:9400
    oomload sample --out gpu.jsonl --interval-s 0.1       # or a file, one gpu.jsonl line per device per tick
    oomload sample --server-port 8000 --serve --host 0.0.0.0   # the server's memory beside the GPU's
    oomload sample --cgroup /sys/fs/cgroup --out mem.jsonl     # a sidecar: the pod's cgroup

``--server-pid``, ``--server-port`` and ``--cgroup`` add ``server_memory.jsonl`` lines (to ``--out``, or
``--server-out``) and ``oomload_server_*``/``oomload_cgroup_*`` series (docs/telemetry.md). With one of
them a machine without a GPU samples the server's memory only (one line on stderr says so), unless
``--dcgm-url`` or ``--device`` asked for a GPU. A pid that is not running, a port nobody here listens
on or a directory that is not a memory cgroup is one sentence and exit 2.

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oomload.errors import ConfigError, ExitCode

if TYPE_CHECKING:
    from oomload.telemetry.hostsampler import MemoryTarget


def register(subparsers: Any) -> None:
    """Add the ``sample`` sub-command."""
    parser = subparsers.add_parser(
        "sample",
        help="sample GPU memory (NVML or a DCGM endpoint) and/or the server's host memory",
        description=(
            "Sample GPU memory, utilization and per-process memory through NVML (or read a DCGM "
            "exporter with --dcgm-url) and write gpu.jsonl lines and/or serve them as Prometheus "
            "text with DCGM metric names. With --server-pid, --server-port or --cgroup, also (or, "
            "without a GPU, only) the server's own memory: its process tree's RSS/PSS and its memory "
            "cgroup's usage, limit, peak and OOM kills, as server_memory.jsonl lines and "
            "oomload_server_*/oomload_cgroup_* series. Without --out and --serve, lines go to stdout."
        ),
    )
    parser.add_argument(
        "--out", metavar="FILE", help="append one JSON line per device (and server) per tick ('-' = stdout)"
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
    parser.add_argument(
        "--server-pid",
        metavar="PID",
        help="also sample the memory of this process, its descendants and its memory cgroup",
    )
    parser.add_argument(
        "--server-port",
        metavar="PORT",
        help="like --server-pid, for the process that listens on this TCP port here",
    )
    parser.add_argument(
        "--cgroup",
        metavar="DIR",
        help="read this memory cgroup directory (e.g. a pod's) instead of the server's own",
    )
    parser.add_argument(
        "--server-interval-s",
        type=float,
        default=0.5,
        help="seconds between reads of the server's memory (default: 0.5)",
    )
    parser.add_argument(
        "--server-out",
        metavar="FILE",
        help="append the server memory lines here ('-' = stdout; default: where --out goes)",
    )
    parser.add_argument(
        "--no-gpu",
        action="store_true",
        help="sample the server's memory only (with --server-pid, --server-port or --cgroup): no GPU source",
    )
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    # lines to stdout are for their reader: `oomload sample | head` ends when head does (oomload.cli)
    parser.set_defaults(func=run, stop_when_reader_goes=True)


def run(args: argparse.Namespace, nvml: Any = None) -> int:
    """Sample until stopped. ``nvml``: an object with ``pynvml``'s interface to use in place of NVML
    (``oomload.telemetry.fake_nvml.FakeNvml`` in tests); ``None``, the real one."""
    from oomload.telemetry.hostsampler import open_memory_source
    from oomload.telemetry.sampler import SamplerOptions, gpu_source, run_sampler

    _validate(args)
    target = memory_target(args)
    memory = open_memory_source(target) if target.watches else None
    source = None if args.no_gpu else gpu_source(args.device or None, dcgm_url=args.dcgm_url, nvml=nvml)
    options = SamplerOptions(
        interval_s=args.interval_s,
        out=args.out,
        serve=args.serve,
        host=args.host,
        port=args.port,
        duration_s=args.duration_s,
        parent_pid=args.parent_pid,
        dcgm_url=args.dcgm_url,
        server_interval_s=args.server_interval_s,
        server_out=args.server_out,
        gpu_required=memory is None or bool(args.dcgm_url or args.device),
    )
    run_sampler(source, options, memory=memory)
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
    if not args.server_interval_s > 0:
        raise ConfigError(f"--server-interval-s must be > 0, got {args.server_interval_s}")
    if args.server_pid is not None and args.server_port is not None:
        raise ConfigError("give --server-pid or --server-port, not both")
    if args.server_out is not None and not (args.server_pid or args.server_port or args.cgroup):
        raise ConfigError("--server-out needs --server-pid, --server-port or --cgroup")
    if args.no_gpu and not (args.server_pid or args.server_port or args.cgroup):
        raise ConfigError(
            "--no-gpu samples the server's memory only: give --server-pid, --server-port or --cgroup"
        )
    if args.no_gpu and (args.dcgm_url or args.device):
        raise ConfigError("--no-gpu contradicts --dcgm-url and --device; drop one")
    if args.dcgm_url is not None:
        from oomload.load.baseurl import http_url

        http_url(args.dcgm_url, "--dcgm-url")


def memory_target(args: argparse.Namespace) -> MemoryTarget:
    """The server memory the flags name (``--server-pid``, ``--server-port``, ``--cgroup``), checked as
    numbers; ``open_memory_source`` checks that it is there."""
    from oomload.telemetry.hostsampler import MemoryTarget

    return MemoryTarget(
        pid=_whole(args.server_pid, "--server-pid", "a process id"),
        port=_whole(args.server_port, "--server-port", "a TCP port", limit=65535),
        cgroup_dir=None if args.cgroup is None else Path(args.cgroup),
    )


def _whole(value: str | None, flag: str, what: str, limit: int | None = None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or int(text) <= 0 or (limit is not None and int(text) > limit):
        allowed = f"1–{limit}" if limit is not None else "a whole number > 0"
        raise ConfigError(f"{flag} must be {what} ({allowed}), got {value!r}")
    return int(text)
