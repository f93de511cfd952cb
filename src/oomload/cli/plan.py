"""``oomload plan TRACE``: what a model + GPU + vLLM flags will do with a trace, offline, in seconds.

Runs the simulated engine (no HTTP, a virtual clock) closed-loop at each concurrency level and prints
the KV pool, the preemption onset, OOM risk, KV saturation and the ``vllm serve`` flags to paste.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from oomload.cli.sim import add_engine_arguments, engine_options
from oomload.errors import ConfigError, ExitCode


def register(subparsers: Any) -> None:
    """Add ``plan``."""
    parser = subparsers.add_parser(
        "plan",
        help="predict preemption / OOM for a trace on a model + GPU, offline (no server)",
        description="Run the simulated vLLM engine offline over a trace at rising concurrency.",
    )
    parser.add_argument("trace", type=Path, metavar="TRACE", help="a normalized trace (oomload trace build)")
    add_engine_arguments(parser)
    parser.add_argument(
        "--concurrency",
        help="levels: '1,2,4,8', 'linear:START:STOP:STEP' or 'geometric:START:STOP:FACTOR' "
        "(default powers of two up to max_num_seqs, at most 512)",
    )
    parser.add_argument("--requests-per-level", type=int, help="requests per level (default max(1000, 16×c))")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)


def parse_levels(text: str) -> list[int]:
    """``1,2,4`` | ``linear:START:STOP:STEP`` | ``geometric:START:STOP:FACTOR`` → sorted levels."""
    try:
        if text.startswith(("linear:", "geometric:")):
            kind, *nums = text.split(":")
            if len(nums) != 3:
                raise ValueError
            start, stop = int(nums[0]), int(nums[1])
            step = float(nums[2])
            levels: list[int] = []
            value = float(start)
            while value <= stop and len(levels) < 1000:
                if not levels or int(value) != levels[-1]:
                    levels.append(int(value))
                value = value + step if kind == "linear" else value * step
            if (kind == "linear" and step <= 0) or (kind == "geometric" and step <= 1):
                raise ValueError
        else:
            levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise ConfigError(
            f"--concurrency {text!r}: expected '1,2,4', 'linear:START:STOP:STEP' or "
            "'geometric:START:STOP:FACTOR'"
        ) from err
    if not levels or min(levels) < 1:
        raise ConfigError(f"--concurrency {text!r}: levels must be positive integers")
    return sorted(set(levels))


def run(args: argparse.Namespace) -> int:
    from oomload.sim.build import build_engine
    from oomload.sim.planner import default_levels, plan
    from oomload.trace import iter_trace

    opts = engine_options(args)
    built = build_engine(opts)
    if not args.trace.is_file():
        raise ConfigError(f"trace {args.trace} does not exist")
    prompts: list[int] = []
    outputs: list[int] = []
    for record in iter_trace(args.trace):
        prompts.append(record.prompt_tokens)
        outputs.append(
            record.max_tokens if record.output_tokens == 0 and record.max_tokens else record.output_tokens
        )
    if not prompts:
        raise ConfigError(f"trace {args.trace} has no requests")
    levels = parse_levels(args.concurrency) if args.concurrency else default_levels(built.config.max_num_seqs)
    if args.requests_per_level is not None and args.requests_per_level < 1:
        raise ConfigError(f"--requests-per-level must be positive, got {args.requests_per_level}")
    result = plan(built, opts, prompts, outputs, levels, requests_per_level=args.requests_per_level)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        _print(result, built.layout.startup_lines(), len(prompts))
    return int(ExitCode.OK)


def _print(result: Any, startup: list[str], trace_count: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    gpu = result.gpu or "no GPU (CPU backend)"
    console.print(
        f"[bold]{result.model}[/] on [bold]{gpu}[/] × {result.tensor_parallel_size}, {trace_count} requests"
    )
    for line in startup:
        console.print(f"  {line}")
    console.print(
        f"  pool: {result.num_gpu_blocks} blocks × {result.block_size} tokens; max_model_len "
        f"{result.max_model_len}, "
        f"max_num_seqs {result.max_num_seqs}, max_num_batched_tokens {result.max_num_batched_tokens}"
    )
    table = Table(title="closed-loop levels (virtual clock)")
    for col in (
        "conc",
        "done",
        "preempt",
        "1st s",
        "max KV",
        "sat. s",
        "run/wait",
        "OOM",
        "tok/s",
        "TTFT p50/p99",
    ):
        table.add_column(col, justify="right")
    refused = clamped = 0
    for lv in result.levels:
        refused += lv.requests_refused
        clamped += lv.requests_clamped
        table.add_row(
            str(lv.concurrency),
            str(lv.requests_finished),
            str(lv.preemptions),
            _num(lv.first_preemption_s),
            f"{lv.max_kv_usage:.0%}",
            _num(lv.saturation_s),
            f"{lv.max_running}/{lv.max_waiting}",
            "[red]OOM[/]" if lv.oom else "",
            f"{lv.output_tokens_per_s:,.0f}",
            f"{_num(lv.ttft_p50_s)}/{_num(lv.ttft_p99_s)}",
        )
    console.print(table)
    a = result.arithmetic
    console.print(
        f"Preemption onset: [bold]{result.onset_concurrency or 'none'}[/] (arithmetic band "
        f"{a.band[0]}–{a.band[1]}); "
        f"last safe concurrency: {result.last_safe_concurrency}; KV saturated from: "
        f"{result.saturation_concurrency or 'never'}; modelled OOM: {result.oom_concurrency or 'none'}"
    )
    adv = result.max_model_len_advice
    console.print(
        f"Recommended max_model_len {adv.max_model_len} (P{adv.basis_percentile:g} of prompt+output "
        f"{adv.basis_tokens:.0f} + {adv.margin:.0%}; refuses {adv.refused_share:.2%} of the trace)"
    )
    if refused or clamped:
        console.print(f"Requests refused (prompt ≥ max_model_len): {refused}; outputs clamped: {clamped}")
    for note in result.notes:
        console.print(f"Note: {note}")
    console.print(f"\n  {result.serve_command}\n", soft_wrap=True)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
