"""``oomload plan TRACE``: what a model + GPU + vLLM flags will do with a trace, offline, in seconds.

Runs the simulated engine (no HTTP, a virtual clock) closed-loop at each concurrency level and prints
the KV pool, the preemption onset, OOM risk, KV saturation and the ``vllm serve`` flags to paste.

When the trace carries ``hash_ids`` the arithmetic and the trace's odds are given for both prompt
shapes: with the trace's shared prefixes held once (production) and with nothing shared (worst case),
so the plan says what prefix caching buys at this traffic.

A level of thousands of users simulates tens of thousands of requests (16 a user, at least 1000):
on a terminal, a transient line on stderr names the level being simulated and its requests
(``LevelStatus``), so a long plan is never silent.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oomload.cli.sim import add_engine_arguments, engine_options
from oomload.errors import ConfigError, ExitCode

if TYPE_CHECKING:
    from oomload.capacity.odds import LevelOdds
    from oomload.sim.planner import LevelResult


# The most requests a level may simulate: about 1.2 ms each here (100,000 at concurrency 8 in 2 min on
# this 2-core VM), so this is hours a level; a number past it is a slip, not a plan.
MAX_REQUESTS_PER_LEVEL = 10_000_000


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


def _levels(spec: str) -> list[int]:
    """``--concurrency``, parsed as ``oomload replay`` parses it (``schedule.parse_levels``)."""
    from oomload.capacity.schedule import parse_levels

    try:
        return list(parse_levels(spec))
    except ConfigError as err:
        raise ConfigError(f"--concurrency {err}") from err


def run(args: argparse.Namespace) -> int:
    from oomload.capacity.blocks import SharedPrefixes
    from oomload.capacity.odds import Pool, TraceOdds
    from oomload.sim.build import build_engine
    from oomload.sim.planner import default_levels, plan
    from oomload.trace.model import iter_trace, read_trace_header

    opts = engine_options(args)
    built = build_engine(opts)
    if not args.trace.exists():
        raise ConfigError(f"trace {args.trace} does not exist")
    if not args.trace.is_file():
        raise ConfigError(f"trace {args.trace} is not a file")
    prompts: list[int] = []
    outputs: list[int] = []
    chains: list[tuple[int, ...]] = []
    for record in iter_trace(args.trace):
        chains.append(record.hash_ids)
        prompts.append(record.prompt_tokens)
        outputs.append(
            record.max_tokens if record.output_tokens == 0 and record.max_tokens else record.output_tokens
        )
    if not prompts:
        raise ConfigError(f"trace {args.trace} has no requests")
    levels = (
        _levels(args.concurrency)
        if args.concurrency is not None
        else default_levels(built.config.max_num_seqs)
    )
    if args.requests_per_level is not None and not 1 <= args.requests_per_level <= MAX_REQUESTS_PER_LEVEL:
        raise ConfigError(
            f"--requests-per-level must be in 1..{MAX_REQUESTS_PER_LEVEL:,}, got {args.requests_per_level:,}"
        )
    block_tokens = read_trace_header(args.trace).prefix_or_default().block_tokens
    with LevelStatus.on_stderr() as status:
        result = plan(
            built, opts, prompts, outputs, levels, requests_per_level=args.requests_per_level,
            chains=chains, chain_block_tokens=block_tokens, progress=status,
        )  # fmt: skip
    pool = Pool(
        num_gpu_blocks=result.num_gpu_blocks,
        block_size=result.block_size,
        max_model_len=result.max_model_len,
        max_num_seqs=result.max_num_seqs,
        max_num_batched_tokens=result.max_num_batched_tokens,
    )
    shared = SharedPrefixes.from_chains(
        chains, prompts, block_tokens=block_tokens, block_size=result.block_size
    )
    trace = TraceOdds(prompts, outputs, pool, shared=shared)  # the odds tune and replay compute too
    odds = [trace.at(c) for c in sorted(set(levels))]
    worst = [trace.at(c, shape="worst-case") for c in sorted(set(levels))] if shared.any else []
    if args.json:
        obj = {**result.as_dict(), "odds": [o.to_json() for o in odds]}
        obj["odds_worst_case"] = [o.to_json() for o in worst] if worst else None
        obj["odds_onset"] = trace.onset(levels)  # bisected between the levels, as tune and replay do
        obj["odds_onset_worst_case"] = trace.onset(levels, shape="worst-case") if worst else None
        print(json.dumps(obj, indent=2))
    else:
        _print(result, built.layout.startup_lines(), len(prompts))
        _print_odds(odds, worst)
    return int(ExitCode.OK)


class LevelStatus:
    """``progress`` for ``plan``: one transient line naming the level being simulated (rich's status,
    on a terminal only); a no-op elsewhere, so pipes and ``--json`` read as before."""

    def __init__(self, console: Any = None) -> None:
        self._console = console
        self._status: Any = None

    @classmethod
    def on_stderr(cls) -> LevelStatus:
        import sys

        from rich.console import Console

        return cls(Console(stderr=True) if sys.stderr.isatty() else None)

    def __enter__(self) -> LevelStatus:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __call__(self, concurrency: int, requests: int) -> None:
        if self._console is None:
            return
        text = f"simulating concurrency {concurrency:,}: {requests:,} requests"
        if self._status is None:
            self._status = self._console.status(text)
            self._status.start()
        else:
            self._status.update(text)


def _print_odds(odds: Sequence[LevelOdds], worst: Sequence[LevelOdds]) -> None:
    """The trace's odds per level, as ``oomload replay`` computes and judges them (``oomload.capacity.odds``):
    with the trace's shared prefixes, and with nothing shared beside them when the trace shares any."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    title = "The trace's odds (requests drawn at random from the trace, 1000 per level"
    title += ", shared prefixes held once)" if worst else ")"
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ["conc", "preemptions\nper 100 req", "requests to see one\n(99 %)", "seen in\n50 req"]
    cols += ["worst case\nper 100 req"] if worst else []
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    for i, o in enumerate(odds):
        needed = o.requests_for()
        row = [
            str(o.concurrency),
            f"{o.per_100:.1f}",
            "– (< 1 per 100)" if needed is None else f"{needed:,}",
            f"{o.p_seen(50):.0%}",
        ]
        table.add_row(*row, *([f"{worst[i].per_100:.1f}"] if worst else []))
    console = Console(highlight=False)
    console.print(table)
    if worst:
        console.print(
            f"Odds onset (≥ 1 preemption per 100 requests): {_odds_onset(odds)} with shared prefixes, "
            f"{_odds_onset(worst)} in the worst case (nothing shared)"
        )


def _odds_onset(odds: Sequence[LevelOdds]) -> str:
    return next((str(o.concurrency) for o in odds if not o.negligible), "none")


def _print(result: Any, startup: list[str], trace_count: int) -> None:
    from rich.console import Console
    from rich.markup import escape

    from oomload.verdict.prediction import no_onset_reason

    console = Console(highlight=False)
    gpu = result.gpu or "no GPU (CPU backend)"
    console.print(
        f"[bold]{escape(result.model)}[/] on [bold]{escape(gpu)}[/] × {result.tensor_parallel_size}, "
        f"{trace_count:,} requests"
    )
    for line in startup:
        console.print(f"  {line}")
    console.print(
        f"  pool: {result.num_gpu_blocks:,} blocks × {result.block_size} tokens; "
        f"max_model_len {result.max_model_len:,}, max_num_seqs {result.max_num_seqs}, "
        f"max_num_batched_tokens {result.max_num_batched_tokens:,}"
    )
    if result.trace_refused or result.trace_clamped:
        share = _share(result.trace_refused, result.trace_requests)
        console.print(
            f"  [yellow]max_model_len {result.max_model_len:,} refuses {result.trace_refused:,} of the "
            f"{result.trace_requests:,} trace requests ({share}; prompt ≥ max_model_len, HTTP 400)[/] "
            f"and clamps the output of {result.trace_clamped:,}"
        )
    title = "closed-loop levels (virtual clock"
    if result.levels_shared_prefixes:
        title += ", the trace's shared prefixes cached"
    elif result.arithmetic_worst_case is not None:
        title += ", no prefix caching: nothing shared"
    console.print(_level_table(result.levels, title + ")"))
    a = result.arithmetic
    console.print(
        f"Preemption onset: [bold]{result.onset_concurrency or 'none'}[/]; last safe concurrency: "
        f"{_safe(result.last_safe_concurrency, result.levels)}; KV pool full (≥ 99 %) from: "
        f"{result.saturation_concurrency or 'never'}; modelled OOM: {result.oom_concurrency or 'none'}"
    )
    worst = result.arithmetic_worst_case
    shape = (
        "" if worst is None else f" with shared prefixes (worst case, nothing shared: {_band(worst.band)})"
    )
    capped = a.capped_at(result.max_num_seqs)
    if capped is not None or not a.grows:
        console.print(
            f"Arithmetic: no onset: {no_onset_reason(capped, _band(a.band))}; block counts alone, "
            "no simulation."
        )
    else:
        low, high = a.band
        cap = result.max_num_seqs
        reach = ""
        if cap < low:  # below the band, but its largest requests do not fit together (``capped_at``)
            reach = (
                f" The server runs at most {cap} requests at once (max_num_seqs), below the band, but {cap} "
                "of the trace's largest requests do not fit the pool together: a preemption stays possible."
            )
        elif cap < high:
            reach = (
                f" The server runs at most {cap} requests at once (max_num_seqs): only "
                f"{_band((low, cap))} of the band is reached, above it more queue."
            )
        console.print(
            f"Arithmetic band {low}–{high}{shape}: the onset from block counts alone (usable "
            "blocks ÷ blocks per request, from P90-length requests all at their peak to decode phases "
            f"spread evenly), no simulation.{reach}"
        )
    _print_advice(console, result)
    for note in result.notes:
        console.print(f"Note: {note}")
    console.print(f"\n  {result.serve_command}\n", soft_wrap=True)


def _level_table(levels: list[Any], title: str) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    oom = any(lv.oom for lv in levels)
    headers = ["conc", "done", "refused", "preempt", "1st\npreempt s", "peak\nKV %", "run/\nwait", "tok/s"]
    headers += ["TTFT\np50 s", *(["OOM"] if oom else [])]
    for col in headers:
        table.add_column(col, justify="right", no_wrap=True)
    for lv in levels:
        row = [
            str(lv.concurrency),
            f"{lv.requests_finished:,}",
            _refused(lv.requests_refused, lv.refused_share),
            str(lv.preemptions),
            _secs(lv.first_preemption_s),
            f"{lv.max_kv_usage * 100:.0f}",
            f"{lv.max_running}/{lv.max_waiting}",
            f"{lv.output_tokens_per_s:,.0f}",
            _secs(lv.ttft_p50_s),
        ]
        if oom:
            row.append("[red]OOM[/]" if lv.oom else "")
        table.add_row(*row)
    return table


def _print_advice(console: Any, result: Any) -> None:
    adv = result.max_model_len_advice
    p99 = f"P{adv.basis_percentile:g} of prompt+output = {adv.basis_tokens:,.0f} tokens"
    if adv.kept_current:
        console.print(f"max_model_len: [bold]keep {adv.max_model_len:,}[/] (already covers the {p99})")
    elif adv.capped_by_kv_cache:
        console.print(
            f"max_model_len: [bold red]this GPU/config cannot serve the trace's {p99}[/]: the KV pool holds "
            f"one request of at most {adv.max_model_len:,} tokens (vLLM refuses to start above that); "
            f"recommended {adv.max_model_len:,}; {adv.refused_count:,} requests ({adv.refused_share:.1%}) "
            "are longer (refused or clamped)"
        )
    else:
        verb = "lower" if adv.max_model_len < result.max_model_len else "raise"
        capped = " (the model's limit)" if adv.capped_by_model_limit else ""
        console.print(
            f"max_model_len: {verb} {result.max_model_len:,} → [bold]{adv.max_model_len:,}[/]{capped} "
            f"({p99} + {adv.margin:.0%}; {adv.refused_count:,} requests, {adv.refused_share:.1%}, are longer)"
        )
    short = result.kv_shortfall
    if short is not None:
        console.print(
            f"  KV needed for {short.target_max_model_len:,}-token requests: "
            f"{_gib(short.bytes_for_one)} GiB for one, {_gib(short.bytes_for_concurrency)} GiB for "
            f"{short.concurrency} at once (this config has {_gib(short.available_bytes)} GiB per GPU)"
        )
        for option in short.options:
            console.print(
                f"  · {option.change}: {_gib(option.kv_cache_bytes)} GiB KV per GPU, holds "
                f"{option.max_concurrency:.2f} such requests at once"
            )
        if not short.options:
            console.print("  · no GPU preset, utilization ≤ 0.95 or TP ≤ 8 holds one; shorten the contexts")
    check = result.check
    if check is not None:
        console.print(
            f"Checked with --max-model-len {check.max_model_len:,} (every level again): preemption "
            f"onset {check.onset_concurrency or 'none'}, last safe concurrency "
            f"{_safe(check.last_safe_concurrency, check.levels)}, "
            f"modelled OOM {check.oom_concurrency or 'none'}; refuses "
            f"{check.trace_refused:,} of the {result.trace_requests:,} trace requests "
            f"({_share(check.trace_refused, result.trace_requests)})"
        )


def _safe(level: int | None, levels: Sequence[LevelResult]) -> str:
    """The last safe level in words: unknown when no level finished a request, none when the lowest broke."""
    from oomload.sim.planner import served_nothing

    if level is not None:
        return str(level)
    return "unknown (no level finished a request)" if served_nothing(levels) else "none"


def _band(band: tuple[int, int]) -> str:
    return str(band[0]) if band[0] == band[1] else f"{band[0]}–{band[1]}"


def _refused(count: int, share: float) -> str:
    if not count:
        return "0"
    return f"{count:,} {'<1%' if share < 0.01 else format(share, '.0%')}"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "0%"


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 1024**3:.2f}"


def _secs(value: float | None) -> str:
    """Seconds in at most 4 characters where possible: 0.123, 1.27, 30.9, 875."""
    if value is None:
        return ""
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"
