"""``oomload replay TRACE [--url URL] …``: replay a trace with rising concurrency (docs/replay.md).

Every flag is validated — levels, stop conditions, gates, numbers, the trace itself — before any
load is sent; a bad value ends with one sentence and exit 2. Locust is imported only by the runner.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oomload.capacity.schedule import DEFAULT_REPEATS, MAX_REPEATS
from oomload.cli.crash import save_internal_error
from oomload.cli.flags import check_new_run_dir, non_negative, tcp_port
from oomload.cli.flags import positive as _positive
from oomload.credentials import read_api_key, url_credentials_error, url_has_credentials
from oomload.errors import ConfigError, OomloadError
from oomload.outfile import is_disk_error
from oomload.rundir import RunReader, check_run_dir_creatable, new_run_dir

if TYPE_CHECKING:
    from oomload.run.config import ReplayConfig


def api_key_value(args: argparse.Namespace) -> str | None:
    """The raw API key the run would send (to scrub it from crash reports); never shown."""
    return os.environ.get(getattr(args, "api_key_env", None) or "OPENAI_API_KEY") or None


DEFAULT_LEVELS = "1,2,4,8,16,32,64"


def register(subparsers: Any) -> None:
    """Add the ``replay`` sub-command."""
    p = subparsers.add_parser(
        "replay",
        help="replay a trace against an OpenAI-compatible endpoint with rising concurrency",
        description="Replay a trace's exact request lengths against an OpenAI-compatible endpoint (vLLM) "
        "with rising concurrency, watch KV cache, preemptions and GPU memory, and give a verdict. Without "
        "--url a simulated vLLM server is started (the demo).",
    )
    p.add_argument("trace", type=Path, help="oomload trace (JSONL; `oomload trace build` makes one)")
    target = p.add_argument_group("target")
    target.add_argument(
        "--url", help="base URL of the server, e.g. http://host:8000 (default: a simulated server)"
    )
    target.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    target.add_argument(
        "--api", choices=("completions", "chat"), default="completions", help="default completions"
    )
    target.add_argument("--no-stream", action="store_true", help="non-streaming requests (no TTFT)")
    target.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="environment variable holding the API key (default OPENAI_API_KEY; never stored)",
    )
    target.add_argument("--request-timeout-s", type=float, default=600.0, help="per request (default 600)")
    target.add_argument(
        "--ramp-down-grace-s",
        type=float,
        default=10.0,
        help="how long users stopped by a lower step or the run's end may finish their request before "
        "it is abandoned as cancelled (default 10, at most the request timeout)",
    )
    target.add_argument(
        "--sim",
        default="",
        metavar="ARGS",
        help='extra `oomload sim serve` flags, quoted after an = (--sim="--gpu h100")',
    )
    server = p.add_argument_group("the server's own evidence (its log, its process, its memory)")
    server.add_argument(
        "--serve",
        metavar="CMD",
        help="start the server with this line ('vllm serve MODEL …', optionally behind a wrapper such as "
        "'prlimit --data=…'), measure it, keep its log, PID and exit status, and always stop it",
    )
    server.add_argument(
        "--served-with",
        metavar="CMD",
        help="with --url: the line the server was started with ('vllm serve MODEL …'; nothing is started): "
        "its --max-num-seqs and --max-num-batched-tokens set the odds' scheduler, and `compare` shows it",
    )
    server.add_argument(
        "--serve-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="with --serve: how long the server may take to answer /health (default 900)",
    )
    server.add_argument(
        "--server-log",
        type=Path,
        metavar="FILE",
        help="the log of a server someone else started, followed as it grows (e.g. `kubectl logs -f POD > "
        "FILE`): the death's cause comes from it",
    )
    server.add_argument(
        "--server-pid",
        type=int,
        metavar="PID",
        help="the server's process on this host (default: the one listening on --url's port, on loopback)",
    )
    server.add_argument(
        "--server-memory",
        default="auto",
        metavar="SPEC",
        help="the server's host memory and cgroup: auto (this host, when the server is local), none, or "
        "remote:URL (`oomload sample --server-pid … --serve` beside the server)",
    )
    shape = p.add_argument_group("load shape")
    levels = shape.add_mutually_exclusive_group()
    levels.add_argument(
        "--concurrency", metavar="LIST", help=f"levels, e.g. 1,2,4,8 (default {DEFAULT_LEVELS})"
    )
    levels.add_argument(
        "--ramp", metavar="SPEC", help="linear:START:STOP:STEP or geometric:START:STOP:FACTOR"
    )
    shape.add_argument(
        "--hold-s", type=float, help="seconds per step (default 30; 2 against the simulated demo server)"
    )
    shape.add_argument("--min-requests", type=int, default=0, help="completed requests per step (default 0)")
    shape.add_argument(
        "--warmup-s", type=float, default=0.0, help="warm-up step at the first level (default 0)"
    )
    shape.add_argument(
        "--no-refine", action="store_true", help="no bisection between last good and first bad"
    )
    shape.add_argument(
        "--repeats",
        type=int,
        default=None,
        metavar="N",
        help=f"measure each of the two levels bracketing the onset N times; the onset is what most "
        f"repeats saw (default {DEFAULT_REPEATS}; 1: no repeats)",
    )
    shape.add_argument(
        "--no-evidence",
        action="store_true",
        help="do not extend a clean step until the trace's odds say it sent enough requests to see a "
        "preemption (99 %%)",
    )
    shape.add_argument(
        "--stop-on",
        action="append",
        metavar="COND",
        help="oom (default: stop when the server dies), first-preemption, error-rate:F, never; "
        "repeatable. A dead server always ends the ramp; a step in which no request was answered "
        "ends it too, unless never",
    )
    shape.add_argument("--max-duration-s", type=float, default=1800.0, help="whole run (default 1800)")
    shape.add_argument(
        "--soak",
        metavar="DURATION",
        help="hold one level (--concurrency N) this long (e.g. 600, 10m, 2h) and report each memory "
        "series' trend: slope, projected time to the limit, levelled off, or flat",
    )
    shape.add_argument("--open-loop", action="store_true", help="replay the trace's own arrival times")
    shape.add_argument(
        "--arrival-scale", type=float, default=None, help="open loop: arrival_s × F (default 1)"
    )
    req = p.add_argument_group("requests")
    req.add_argument("--order", choices=("trace", "sample"), default="trace", help="default trace")
    req.add_argument("--seed", type=int, default=0, help="seed for sampling and prompt ids (default 0)")
    req.add_argument(
        "--tail-percentile", type=float, metavar="P", help="replay only requests ≥ the P-th percentile"
    )
    req.add_argument(
        "--only-fitting",
        action="store_true",
        help="replay only the requests that fit the server's max_model_len (prompt + output); the rest "
        "are counted in the report, not sent (default: send them all, as production does, and count "
        "the refusals)",
    )
    req.add_argument(
        "--distinct-prompts",
        action="store_true",
        help="the worst case: every prompt distinct from token 0 (default: the trace's shared prefixes "
        "are replayed as identical token blocks, as production sends them)",
    )
    req.add_argument("--prefix-sharing", action="store_true", help=argparse.SUPPRESS)  # the default now
    req.add_argument(
        "--no-exact-output", action="store_true", help="no min_tokens/ignore_eos (non-vLLM servers)"
    )
    req.add_argument("--token-id-range", default=None, metavar="LO:HI", help="prompt token ids (100:2000)")
    out = p.add_argument_group("run")
    out.add_argument("--run-dir", type=Path, help="run directory (default: a new one under ./runs)")
    out.add_argument("--gate", action="append", default=[], metavar="EXPR", help="CI gate rule; repeatable")
    out.add_argument("--gate-file", type=Path, metavar="FILE", help="TOML file with [gate] rules = [...]")
    out.add_argument(
        "--baseline",
        type=Path,
        metavar="RUN_DIR",
        help="a saved run that relative gate rules (onset>=baseline, kv-blocks>=baseline*0.95, …) "
        "compare with",
    )
    out.add_argument("--web", action="store_true", help="open the Locust web UI")
    out.add_argument("--web-host", help="with --web: the web UI's address (default 127.0.0.1)")
    out.add_argument("--web-port", type=int, help="with --web: the web UI's port (default 8089)")
    out.add_argument(
        "--web-keep-s",
        type=float,
        default=None,
        metavar="S",
        help="with --web: after the run, keep serving the verdict S seconds (default: until Ctrl-C)",
    )
    dist = p.add_argument_group("distributed load (Locust master/worker)")
    dist.add_argument(
        "--processes",
        type=int,
        default=None,
        help="local Locust worker processes (default 1: Locust runs in this process; 0 with --workers)",
    )
    dist.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="K",
        help="wait for K workers in all: the --processes ones plus remote ones "
        "(`oomload worker --master HOST:PORT` on each load host)",
    )
    dist.add_argument(
        "--master-bind-host",
        default=None,
        metavar="H",
        help="where the master listens for workers (default 127.0.0.1; workers must hold the worker token, "
        "but the link is not encrypted: a private network or a tunnel only)",
    )
    dist.add_argument(
        "--master-bind-port",
        type=int,
        default=None,
        metavar="P",
        help="the master's port (default 5557 with --workers, a free one otherwise)",
    )
    dist.add_argument(
        "--worker-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="how long the master waits for its workers to arrive (default 60)",
    )
    out.add_argument(
        "--metrics-interval-s", type=float, default=1.0, help="/metrics scrape period (default 1)"
    )
    out.add_argument("--gpu", default="auto", help="auto, nvml, dcgm:URL, remote:URL or none (default auto)")
    out.add_argument("--require-gpu", action="store_true", help="fail when GPU memory cannot be sampled")
    out.add_argument("--no-live", action="store_true", help="no live view (one line per step)")
    out.add_argument(
        "--no-html",
        action="store_true",
        help="write no report.html (its plots take seconds; `oomload report RUN --format html` draws "
        "them later)",
    )
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace, argv: list[str] | None = None) -> ReplayConfig:
    """Validate every flag and return a ``ReplayConfig``; raises ``ConfigError`` naming the bad value."""
    from oomload.capacity.schedule import Hold, parse_levels, parse_stop_condition
    from oomload.load.baseurl import BaseUrl, http_url
    from oomload.load.payload import parse_token_id_range
    from oomload.run.runner import DEMO_HOLD_S, DEMO_LEVELS, ReplayConfig
    from oomload.trace.model import read_trace_header
    from oomload.verdict.gate import load_gate_file, needs_baseline, parse_gate

    header = read_trace_header(args.trace)  # TraceFormatError (exit 2) before anything else
    args = _with_defaults(_check_partners(args))
    if args.prefix_sharing:
        if args.distinct_prompts:
            raise ConfigError("--prefix-sharing and --distinct-prompts contradict each other; drop one")
        print(
            "note: --prefix-sharing is the default now and will be removed; drop it",
            file=sys.stderr,
        )
    demo = args.url is None and args.serve is None  # the built-in simulated server
    if args.ramp is not None:  # given empty is refused, not the default: named levels are measured as named
        if not args.ramp.strip():
            raise ConfigError("--ramp is empty; give linear:START:STOP:STEP or geometric:START:STOP:FACTOR")
        levels = parse_levels(args.ramp)
    elif args.concurrency is not None:
        levels = parse_levels(args.concurrency)
    else:
        levels = DEMO_LEVELS if demo else parse_levels(DEFAULT_LEVELS)
    stop_on = tuple(parse_stop_condition(s) for s in (args.stop_on or ["oom"]))
    if len(stop_on) > 1 and any(c.name == "never" for c in stop_on):
        raise ConfigError("--stop-on never cannot be combined with other stop conditions")
    hold_s = args.hold_s if args.hold_s is not None else (DEMO_HOLD_S if demo else 30.0)
    Hold(hold_s, args.min_requests)
    _positive("--max-duration-s", args.max_duration_s)
    _positive("--request-timeout-s", args.request_timeout_s)
    if not args.ramp_down_grace_s >= 0:
        raise ConfigError(f"--ramp-down-grace-s must be ≥ 0, got {args.ramp_down_grace_s}")
    _positive("--metrics-interval-s", args.metrics_interval_s)
    _positive("--arrival-scale", args.arrival_scale)
    non_negative("--warmup-s", args.warmup_s)
    non_negative("--seed", args.seed)  # numpy's generators take no negative seed
    if args.tail_percentile is not None and not 0 <= args.tail_percentile < 100:
        raise ConfigError(f"--tail-percentile must be within [0, 100), got {args.tail_percentile}")
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise ConfigError(f"--repeats must be within 1..{MAX_REPEATS}, got {args.repeats}")
    processes = _check_workers(args)
    tcp_port("--web-port", args.web_port)
    if args.web_keep_s is not None and not (args.web_keep_s >= 0 and math.isfinite(args.web_keep_s)):
        raise ConfigError(f"--web-keep-s must be a number of seconds >= 0, got {args.web_keep_s}")
    gpu = args.gpu
    if gpu not in ("auto", "nvml", "none") and not gpu.startswith(("dcgm:", "remote:")):
        raise ConfigError(f"--gpu {gpu!r} is not one of auto, nvml, dcgm:URL, remote:URL, none")
    if url_has_credentials(gpu.partition(":")[2]):  # the sampler's URL lands in events and config.json
        raise url_credentials_error("--gpu", gpu.partition(":")[2])
    if gpu.startswith(("dcgm:", "remote:")):
        http_url(gpu.partition(":")[2], f"--gpu {gpu.partition(':')[0]}:URL")  # exit 2 before any load
    url = None if args.url is None else BaseUrl.parse(args.url)  # ConfigError naming the flag
    if not args.api_key_env.replace("_", "").isalnum():
        raise ConfigError(f"--api-key-env {args.api_key_env!r} is not an environment variable name")
    read_api_key(args.api_key_env, os.environ)  # ConfigError naming the variable, never its value
    try:
        sim_args = tuple(shlex.split(args.sim))
    except ValueError as err:
        raise ConfigError(f"--sim {args.sim!r}: {err}") from err
    if sim_args and args.url is not None:
        raise ConfigError("--sim only applies without --url (to the simulated server)")
    check_new_run_dir(args.run_dir)
    serve = _check_server_flags(args)
    soak_s = _check_soak(args, levels)
    if soak_s is not None:
        hold_s = soak_s
    gates = tuple(args.gate)
    if args.gate_file is not None:
        gates += tuple(gate.text for gate in load_gate_file(args.gate_file))
    relative = needs_baseline([parse_gate(gate) for gate in gates])
    if relative and args.baseline is None:
        raise ConfigError(f"gate {relative[0]!r} compares with a baseline run: give --baseline RUN_DIR")
    if args.baseline is not None:
        RunReader(args.baseline)  # ConfigError naming it when it is not a run directory
    return ReplayConfig(
        trace_path=args.trace,
        url=url,
        model=args.model,
        api=args.api,
        stream=not args.no_stream,
        levels=levels,
        hold_s=hold_s,
        min_requests=args.min_requests,
        warmup_s=args.warmup_s,
        refine=not args.no_refine and soak_s is None,
        repeats=args.repeats if soak_s is None else 1,
        evidence=not args.no_evidence and soak_s is None,
        place_levels=not (args.ramp or args.concurrency),  # levels the user names are measured as named
        stop_on=stop_on,
        max_duration_s=args.max_duration_s if soak_s is None else max(args.max_duration_s, soak_s + 600.0),
        order=args.order,
        seed=args.seed,
        tail_percentile=args.tail_percentile,
        only_fitting=args.only_fitting,
        open_loop=args.open_loop,
        arrival_scale=args.arrival_scale,
        distinct_prompts=args.distinct_prompts,
        prefix_block_tokens=header.prefix_or_default().block_tokens,
        exact_output=not args.no_exact_output,
        token_id_range=parse_token_id_range(args.token_id_range),
        api_key_env=args.api_key_env,
        run_dir=args.run_dir,
        gates=gates,
        baseline=None if args.baseline is None else args.baseline.resolve(),  # report reads it from anywhere
        web=args.web,
        web_host=args.web_host,
        web_port=args.web_port,
        web_keep_s=args.web_keep_s,
        processes=processes,
        workers=args.workers,
        master_bind_host=args.master_bind_host,
        master_bind_port=args.master_bind_port,
        worker_timeout_s=args.worker_timeout_s,
        request_timeout_s=args.request_timeout_s,
        ramp_down_grace_s=args.ramp_down_grace_s,
        metrics_interval_s=args.metrics_interval_s,
        gpu=gpu,
        require_gpu=args.require_gpu,
        sim_args=sim_args,
        argv=tuple(argv if argv is not None else sys.argv[1:]),
        live=not args.no_live,
        html=not args.no_html,
        serve=serve,
        served_with=args.served_with,
        serve_timeout_s=args.serve_timeout_s,
        server_log=args.server_log,
        server_pid=args.server_pid,
        server_memory=args.server_memory,
        soak_s=soak_s,
    )


# flags whose default is None so that _check_partners sees whether they were given
PARTNER_DEFAULTS = {
    "web_host": "127.0.0.1",
    "web_port": 8089,
    "arrival_scale": 1.0,
    "master_bind_host": "127.0.0.1",
    "worker_timeout_s": 60.0,
    "serve_timeout_s": 900.0,
    "repeats": DEFAULT_REPEATS,
    "token_id_range": "100:2000",
}


def _check_partners(args: argparse.Namespace) -> argparse.Namespace:
    """A flag that means something only beside another is refused without it: one sentence naming
    the partner, exit 2 — never silently ignored. (``--no-refine`` or ``--no-evidence`` with
    ``--soak`` agree with it, and ``--repeats 1`` with ``--no-refine``: those pass.)"""
    distributed = args.workers > 0 or (args.processes or 1) > 1
    needs = (
        ("--web-host", args.web_host, "--web", args.web),
        ("--web-port", args.web_port, "--web", args.web),
        ("--web-keep-s", args.web_keep_s, "--web", args.web),
        ("--arrival-scale", args.arrival_scale, "--open-loop", args.open_loop),
        ("--master-bind-host", args.master_bind_host, "--workers K or --processes N > 1", distributed),
        ("--master-bind-port", args.master_bind_port, "--workers K or --processes N > 1", distributed),
        ("--worker-timeout-s", args.worker_timeout_s, "--workers K or --processes N > 1", distributed),
        ("--serve-timeout-s", args.serve_timeout_s, "--serve", args.serve is not None),
    )
    for flag, value, partner, present in needs:
        if value is not None and not present:
            raise ConfigError(f"{flag} only applies with {partner}: give that too, or drop {flag}")
    if args.repeats is not None and args.repeats > 1 and (args.no_refine or args.soak is not None):
        other = "--no-refine" if args.no_refine else "--soak"
        raise ConfigError(
            f"--repeats measures the refinement's levels again, which {other} turns off: drop one"
        )
    if args.require_gpu and args.gpu == "none":
        raise ConfigError("--require-gpu asks for GPU samples and --gpu none turns them off: drop one")
    if args.token_id_range is not None and args.api == "chat":
        raise ConfigError(
            "--token-id-range is for --api completions' token-id prompts: drop it with --api chat"
        )
    return args


def _with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    given = vars(args)
    return argparse.Namespace(
        **{**given, **{k: v for k, v in PARTNER_DEFAULTS.items() if given.get(k) is None}}
    )


def _check_server_flags(args: argparse.Namespace) -> str | None:
    """Validate the server flags; returns the ``--serve`` line (recognised here, before anything runs)."""
    from oomload.realvllm.servecmd import parse_serve_command

    if args.serve is not None:
        if args.url is not None:
            raise ConfigError("--serve starts the server and measures it; drop --url (or drop --serve)")
        if args.sim:
            raise ConfigError(
                "--sim applies to the built-in simulated server; with --serve, put its flags in the line"
            )
        if args.server_log is not None:
            raise ConfigError(
                "--serve keeps the server's own log; --server-log is for a server someone else started"
            )
        if args.server_pid is not None:
            raise ConfigError(
                "--serve knows the server's PID; --server-pid is for a server someone else started"
            )
        parse_serve_command(args.serve)  # ConfigError: not a vLLM server line
        _positive("--serve-timeout-s", args.serve_timeout_s)
    if args.served_with is not None:
        if args.url is None:
            raise ConfigError(
                "--served-with describes the server at --url; with --serve the line is already known"
                if args.serve is not None
                else "--served-with describes a server someone else started: give its --url too"
            )
        parse_serve_command(args.served_with, flag="--served-with")  # ConfigError: not a vLLM line
    if args.server_pid is not None and args.server_pid <= 0:
        raise ConfigError(f"--server-pid must be a process id > 0, got {args.server_pid}")
    spec = args.server_memory
    if spec not in ("auto", "none") and not spec.startswith("remote:"):
        raise ConfigError(f"--server-memory {spec!r} is not one of auto, none, remote:URL")
    if spec.startswith("remote:"):
        from oomload.load.baseurl import BaseUrl

        BaseUrl.parse(spec.partition(":")[2], flag="--server-memory remote:")
    if args.server_log is not None and args.server_log.is_dir():
        raise ConfigError(f"--server-log {args.server_log} is a directory; give the log file")
    return str(args.serve) if args.serve is not None else None


def _check_soak(args: argparse.Namespace, levels: tuple[int, ...]) -> float | None:
    """``--soak``'s duration in seconds (``None`` without it); it holds exactly one level, for longer than
    the shortest series a memory trend can judge (``trend.MIN_JUDGED_SPAN_S``)."""
    if args.soak is None:
        return None
    from oomload.verdict.trend import MIN_JUDGED_SPAN_S, WARMUP_MIN_S  # the verdict package: only for --soak
    from oomload.verdict.trendfit import MIN_FIT_SPAN_S

    soak_s = parse_duration_s("--soak", args.soak)
    if soak_s <= MIN_JUDGED_SPAN_S:
        raise ConfigError(
            f"--soak {args.soak} is too short: a memory trend drops at least its first {WARMUP_MIN_S:g} s "
            f"as warm-up and needs {MIN_FIT_SPAN_S:g} s after them, so a soak must last more than "
            f"{MIN_JUDGED_SPAN_S:g} s (e.g. 10m)"
        )
    if not args.concurrency or len(levels) != 1:
        raise ConfigError("--soak holds one level: give it with --concurrency N (one number)")
    if args.open_loop:
        raise ConfigError("--soak holds a concurrency level; drop --open-loop")
    return soak_s


def parse_duration_s(flag: str, text: str) -> float:
    """``600``, ``90s``, ``10m``, ``2h`` → seconds (> 0); ``ConfigError`` naming the flag otherwise."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    raw = text.strip().lower()
    scale = units.get(raw[-1:], 1.0)
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        value = float(number) * scale
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a duration (e.g. 600, 90s, 10m, 2h)") from None
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{flag} must be a duration > 0, got {text!r}")
    return value


def _check_workers(args: argparse.Namespace) -> int:
    """Validate the distributed-load flags; returns the number of local worker processes."""
    if not 0 <= args.workers <= 1024:
        raise ConfigError(f"--workers must be within 0..1024, got {args.workers}")
    processes = args.processes if args.processes is not None else (0 if args.workers else 1)
    if not (0 if args.workers else 1) <= processes <= 64:
        raise ConfigError(f"--processes must be within 1..64 (0..64 with --workers), got {processes}")
    if args.workers and processes > args.workers:
        raise ConfigError(
            f"--processes {processes} is more than --workers {args.workers}; --workers counts them all"
        )
    distributed = args.workers > 0 or processes > 1
    if args.open_loop and distributed:
        raise ConfigError("--open-loop runs in one process; drop --processes and --workers")
    tcp_port("--master-bind-port", args.master_bind_port)
    if not (args.worker_timeout_s > 0 and math.isfinite(args.worker_timeout_s)):
        raise ConfigError(f"--worker-timeout-s must be a number of seconds > 0, got {args.worker_timeout_s}")
    if not args.master_bind_host.strip() or any(c.isspace() for c in args.master_bind_host):
        raise ConfigError(f"--master-bind-host {args.master_bind_host!r} is not a host or address")
    if distributed and args.master_bind_host != "*":  # "*": Locust's every address (always there)
        from oomload.realvllm.server import check_listen_address

        # The host only: a port in use is told when the master binds it (with ZeroMQ's SO_REUSEADDR).
        check_listen_address(
            args.master_bind_host, None, who="the Locust master", host_flag="--master-bind-host"
        )
    return int(processes)


def _remove_if_empty(run_dir: Path | None) -> None:
    if run_dir is not None and run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()


def run(args: argparse.Namespace) -> int:
    """Validate, then run the replay (``oomload.run.runner``); returns the exit code.

    The run directory is fixed here, so that an unexpected exception (a bug) leaves its traceback in
    it (``crash.txt``) and ends in exit 70, never in a code a verdict or gate uses.
    """
    config = build_config(args)
    from oomload.run.runner import run_replay

    made_here = config.run_dir is None
    if config.run_dir is None:
        check_run_dir_creatable(config.runs_parent)
        config = dataclasses.replace(config, run_dir=new_run_dir(config.runs_parent))
    try:
        return run_replay(config)
    except OomloadError:
        if made_here:  # nothing was run (e.g. the endpoint was unreachable): no empty folder left
            _remove_if_empty(config.run_dir)
        raise
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except OSError as err:
        if err.filename is not None or is_disk_error(err):  # a full disk: exit 2 in cli.main
            raise
        raise save_internal_error(err, config.run_dir, secrets=(api_key_value(args),)) from err
    except Exception as err:
        raise save_internal_error(err, config.run_dir, secrets=(api_key_value(args),)) from err
