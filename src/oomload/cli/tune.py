"""``oomload tune TRACE --serve 'vllm serve MODEL …' [--target-concurrency C | --target-rate R]``: find and
prove the memory settings that carry the target (``oomload.tune.run``; the search's rules:
``oomload.tune.search``; a rate's concurrency: ``oomload.tune.rate``). Its flags are checked with the
same helpers as ``replay``'s (``oomload.cli.flags``)."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from oomload.cli.flags import int_list, list_items, positive, positive_int, tcp_port
from oomload.errors import ConfigError

FIXABLE = {
    "gpu-memory-utilization": "gpu_memory_utilization",
    "max-model-len": "max_model_len",
    "max-num-seqs": "max_num_seqs",
    "max-num-batched-tokens": "max_num_batched_tokens",
    "enforce-eager": "enforce_eager",
    "prefix-caching": "enable_prefix_caching",
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="start the server with candidate memory settings and prove the one that carries the target",
        description=(
            "Start the --serve command (vLLM, or `oomload sim serve`) once per candidate setting, one at a "
            "time, classify start-up failures from its log, replay the trace at and around the target, "
            "and print the winning `vllm serve` line with the gate rules that keep it true."
        ),
    )
    parser.add_argument("trace", type=Path, help="oomload trace (JSONL)")
    parser.add_argument("--serve", required=True, metavar="CMD", help="the server command line, quoted")
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument(
        "--target-concurrency",
        type=int,
        metavar="C",
        help="concurrent requests to carry (neither target: find the highest preemption-free max_num_seqs)",
    )
    goal.add_argument(
        "--target-rate",
        type=float,
        metavar="R",
        help="requests per second to carry (open loop): measured as a concurrency on the first server "
        "that starts (Little's law), then proved like --target-concurrency",
    )
    parser.add_argument(
        "--slo-ttft-p99-s", type=float, metavar="S", help="P99 TTFT at the target must be ≤ S"
    )
    space = parser.add_argument_group("search space (ladders; the command's own value when not given)")
    space.add_argument(
        "--utilization", metavar="LIST", help="gpu_memory_utilization ladder, e.g. 0.95,0.9,0.85"
    )
    space.add_argument(
        "--num-gpu-blocks",
        metavar="LIST",
        help="KV pool ladder in blocks (vLLM CPU build: the utilization stand-in)",
    )
    space.add_argument("--kv-cache-memory-bytes", metavar="LIST", help="KV pool ladder in bytes")
    space.add_argument(
        "--max-num-seqs", metavar="LIST", help="max_num_seqs ladder (default: quarters of the target)"
    )
    space.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="KNOB",
        help=f"never move this knob ({', '.join(FIXABLE)}); repeatable",
    )
    bounds = parser.add_argument_group("bounds")
    bounds.add_argument("--max-starts", type=int, default=8, help="server starts at most (default 8)")
    bounds.add_argument(
        "--max-duration-s", type=float, default=1800.0, help="wall time at most (default 1800)"
    )
    bounds.add_argument("--startup-timeout-s", type=float, default=300.0, help="per start (default 300)")
    bounds.add_argument("--replay-max-duration-s", type=float, default=300.0, help="per replay (default 300)")
    bounds.add_argument("--hold-s", type=float, default=2.0, help="replay step hold (default 2)")
    bounds.add_argument(
        "--max-requests", type=int, default=400, help="requests per replay step at most (default 400)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="load-generating processes of each candidate's replay (default 1; more when the tune says "
        "the load host limits)",
    )
    net = parser.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1", help="where the server listens (default 127.0.0.1)")
    net.add_argument("--port", type=int, help="the server's port (default: a free one)")
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="tune directory: a new or empty one (default runs/tune-<timestamp>)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from oomload.capacity.schedule import MAX_CONCURRENCY
    from oomload.cli.flags import check_new_run_dir
    from oomload.realvllm.servecmd import parse_serve_command
    from oomload.realvllm.server import check_listen_address
    from oomload.report.tune import write_tune_reports
    from oomload.tune.ladder import NO_TARGET_SEQS, seqs_ladder
    from oomload.tune.run import TuneConfig, run_tune, tune_exit_code
    from oomload.tune.search import SearchSpace, Settings

    if not args.trace.is_file():
        raise ConfigError(f"trace {args.trace} does not exist")
    target = args.target_concurrency
    if target is not None and not 1 <= target <= MAX_CONCURRENCY:  # a ladder past it crashed (exit 70)
        raise ConfigError(f"--target-concurrency must be in 1..{MAX_CONCURRENCY:,}, got {target}")
    rate = args.target_rate
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"--target-rate must be a number of requests per second > 0, got {rate}")
    tcp_port("--port", args.port)
    for name in ("max_starts", "max_requests"):
        positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    for name in ("max_duration_s", "startup_timeout_s", "replay_max_duration_s", "hold_s"):
        positive(f"--{name.replace('_', '-')}", getattr(args, name))
    if args.slo_ttft_p99_s is not None:
        positive("--slo-ttft-p99-s", args.slo_ttft_p99_s)  # no P99 is ≤ 0 s: every candidate would fail
    command = parse_serve_command(args.serve)
    fixed = set()
    for knob in args.fix:
        for part in str(knob).split(","):
            if part.strip() not in FIXABLE:
                raise ConfigError(f"--fix {part!r}: allowed knobs are {', '.join(FIXABLE)}")
            fixed.add(FIXABLE[part.strip()])
    _check_fixed_ladders(args, fixed)
    memory = _memory_ladder(args, command.value("--gpu-memory-utilization"), fixed)
    if target is None and rate is None and "max_num_seqs" in fixed:
        raise ConfigError("without a target the tune searches max_num_seqs: do not --fix it")
    if args.max_num_seqs is not None:
        seqs = int_list("--max-num-seqs", args.max_num_seqs)
    else:
        seqs = NO_TARGET_SEQS if target is None else seqs_ladder(target)
    base = Settings()
    if "max_num_seqs" in fixed:
        own = command.value("--max-num-seqs")
        base = Settings(max_num_seqs=int(own) if own and own.isdigit() else None)
    space = SearchSpace(
        memory=memory,
        max_num_seqs=tuple(sorted(set(seqs))),
        base=base,
        fixed=frozenset(fixed),
        max_starts=args.max_starts,
    )
    if not memory and "gpu_memory_utilization" not in fixed:
        raise ConfigError("the memory ladder is empty")
    check_listen_address(args.host, args.port)  # exit 2 before any candidate starts
    # replay's own rule: a tune's files beside an earlier run's (or tune's) would mix their evidence
    check_new_run_dir(args.run_dir)
    run_dir = args.run_dir or Path("runs") / time.strftime("tune-%Y%m%d-%H%M%S")
    config = TuneConfig(
        trace_path=args.trace,
        serve=command,
        target=target,
        space=space,
        run_dir=run_dir,
        host=args.host,
        port=args.port,
        max_duration_s=args.max_duration_s,
        startup_timeout_s=args.startup_timeout_s,
        replay_max_duration_s=args.replay_max_duration_s,
        hold_s=args.hold_s,
        max_requests=args.max_requests,
        replay_args=_processes_args(args.processes),
        slo_ttft_p99_s=args.slo_ttft_p99_s,
        target_rate_rps=rate,
        max_num_seqs_given=args.max_num_seqs is not None,
    )
    worst_s = config.candidate_worst_case_s(measuring_rate=rate is not None)
    if config.max_duration_s < worst_s:  # else the tune stops before its first start, "no candidate carried"
        raise ConfigError(
            f"--max-duration-s {config.max_duration_s:g} leaves no room for one candidate, which may take "
            f"{worst_s:g} s (its start-up, --startup-timeout-s {config.startup_timeout_s:g}, and "
            f"{'three' if rate is not None else 'two'} replays of --replay-max-duration-s "
            f"{config.replay_max_duration_s:g}): raise --max-duration-s or lower those two"
        )
    console = Console()
    record = run_tune(config, console)
    write_tune_reports(config.run_dir, record, console)
    return tune_exit_code(record)


def _check_fixed_ladders(args: argparse.Namespace, fixed: set[str]) -> None:
    """A ladder for a knob that ``--fix`` keeps at the line's value would be ignored: refused instead."""
    ladders = (
        ("--utilization", args.utilization, "gpu_memory_utilization", "gpu-memory-utilization"),
        ("--num-gpu-blocks", args.num_gpu_blocks, "gpu_memory_utilization", "gpu-memory-utilization"),
        (
            "--kv-cache-memory-bytes",
            args.kv_cache_memory_bytes,
            "gpu_memory_utilization",
            "gpu-memory-utilization",
        ),
        ("--max-num-seqs", args.max_num_seqs, "max_num_seqs", "max-num-seqs"),
    )
    for flag, value, knob, name in ladders:
        if value is not None and knob in fixed:
            raise ConfigError(
                f"{flag} is a ladder to search and --fix {name} keeps that knob still: drop one"
            )


def _memory_ladder(args: argparse.Namespace, own_utilization: str | None, fixed: set[str]) -> tuple[Any, ...]:
    from oomload.tune.ladder import utilization_ladder
    from oomload.tune.search import Settings

    given = [x for x in (args.utilization, args.num_gpu_blocks, args.kv_cache_memory_bytes) if x is not None]
    if len(given) > 1:
        raise ConfigError(
            "give one memory ladder: --utilization, --num-gpu-blocks or --kv-cache-memory-bytes"
        )
    if "gpu_memory_utilization" in fixed:
        return (Settings(),)
    if args.num_gpu_blocks is not None:
        values = sorted(set(int_list("--num-gpu-blocks", args.num_gpu_blocks)), reverse=True)
        return tuple(Settings(num_gpu_blocks=v) for v in values)
    if args.kv_cache_memory_bytes is not None:
        values = sorted(set(int_list("--kv-cache-memory-bytes", args.kv_cache_memory_bytes)), reverse=True)
        return tuple(Settings(kv_cache_memory_bytes=v) for v in values)
    if args.utilization is not None:
        utils = sorted({_utilization(x) for x in list_items("--utilization", args.utilization)}, reverse=True)
    else:
        start = _utilization(own_utilization) if own_utilization else 0.9
        utils = list(utilization_ladder(start))
    return tuple(Settings(gpu_memory_utilization=u) for u in utils)


def _utilization(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise ConfigError(f"gpu_memory_utilization {text!r} is not a number") from err
    if not 0 < value <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {value}")
    return value


def _processes_args(processes: int) -> tuple[str, ...]:
    """``--processes N`` for each candidate's replay (``oomload replay``'s own bound: 1..64)."""
    if not 1 <= processes <= 64:
        raise ConfigError(f"--processes must be within 1..64, got {processes}")
    return () if processes == 1 else ("--processes", str(processes))
