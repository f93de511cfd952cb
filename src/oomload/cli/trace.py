"""``oomload trace build | stats | synth``: production logs → length-only traces, and what they imply.

The handlers only parse flags, call ``oomload.ingest`` / ``oomload.stats`` / ``oomload.synth`` and
print; heavy imports (pyarrow, rich, matplotlib) happen inside them so ``oomload --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from oomload.capacity import single_request_limit_tokens
from oomload.errors import ConfigError, ExitCode

STATS_SCHEMA = "oomload.trace-stats/1"
DEFAULT_BLOCK_SIZE = 16  # vLLM's block size on GPUs when --block-size is not given

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from rich.progress import Progress

    from oomload.ingest import TraceCounts
    from oomload.stats import LengthCounts, TraceStats


def register(subparsers: Any) -> None:
    """Add ``trace`` with its ``build``, ``stats`` and ``synth`` sub-commands."""
    parser = subparsers.add_parser(
        "trace",
        help="build, describe or synthesize length-only request traces",
        description="Turn production logs into length-only traces, describe them, or synthesize one.",
    )
    actions = parser.add_subparsers(dest="trace_command", metavar="ACTION")
    parser.set_defaults(func=_missing_action(parser))

    build = actions.add_parser(
        "build",
        help="turn production logs into a length-only trace",
        description="Turn production logs into a normalized trace: lengths, timing and ids only, never text.",
    )
    build.add_argument("logs", nargs="+", metavar="LOG", help="log files (.gz/.zst allowed), merged by time")
    build.add_argument(
        "-o", "--out", required=True, help="trace file to write (JSONL; replaced only once complete)"
    )
    _add_input_flags(build)
    build.add_argument("--strict", action="store_true", help="stop at the first unusable line")
    _add_workers_flag(build)
    build.set_defaults(func=run_build)

    stats = actions.add_parser(
        "stats",
        help="length percentiles, arrival rates and the max_model_len a trace implies",
        description="Describe a trace (or logs): arrival rates, length percentiles (nearest rank), "
        "shares above common context limits, and the max_model_len the trace implies.",
    )
    stats.add_argument("inputs", nargs="+", metavar="TRACE_OR_LOG", help="an oomload trace, or logs")
    _add_input_flags(stats)
    _add_workers_flag(stats)
    stats.add_argument("--json", action="store_true", help="print JSON instead of tables")
    stats.add_argument("--plot", metavar="PNG", help="write a histogram picture with the percentiles marked")
    stats.add_argument(
        "--margin",
        default="0.1",
        metavar="FRACTION",
        help='margin over the P99 of total tokens, a fraction: 0.1 = 10%% ("10%%" is accepted too; '
        "default 0.1)",
    )
    stats.add_argument(
        "--round-to",
        type=int,
        default=256,
        metavar="TOKENS",
        help="round max_model_len up to a multiple of this many tokens (default 256)",
    )
    stats.add_argument(
        "--block-size",
        type=int,
        metavar="TOKENS",
        help="KV block size in tokens: also round to a multiple of it",
    )
    stats.add_argument(
        "--current-max-model-len",
        type=int,
        metavar="TOKENS",
        help="today's max_model_len in tokens, to compare with",
    )
    stats.add_argument(
        "--kv-cache-tokens",
        type=int,
        metavar="TOKENS",
        help="KV cache size in tokens (vLLM's 'GPU KV cache size: N tokens'; caps the advice at its usable "
        "part, one block less — give --block-size, else 16 is assumed)",
    )
    stats.add_argument(
        "--model-limit",
        type=int,
        metavar="TOKENS",
        help="the model's own context window in tokens (caps the advice)",
    )
    stats.set_defaults(func=run_stats)

    synth = actions.add_parser(
        "synth",
        help="generate a trace from length distributions",
        description="Generate a trace from length distributions (log-normal from P50/P99, fixed, mixes).",
    )
    synth.add_argument(
        "-o", "--out", required=True, help="trace file to write (JSONL; replaced only once complete)"
    )
    synth.add_argument("--count", type=int, required=True, metavar="REQUESTS", help="number of requests")
    synth.add_argument(
        "--input",
        default="lognormal:600:6000",
        metavar="SPEC",
        help="prompt length spec in tokens (each ≥ 1): fixed:N | uniform:LO:HI | lognormal:P50:P99[:MAX] | "
        "A@W+B@W (default lognormal:600:6000)",
    )
    synth.add_argument(
        "--output",
        default="lognormal:200:1000",
        metavar="SPEC",
        help="output length spec in tokens (each ≥ 1), same forms (default lognormal:200:1000)",
    )
    synth.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="RPS",
        help="Poisson arrival rate in requests/s (default: none, every request arrives at 0 s)",
    )
    synth.add_argument(
        "--seed", type=int, default=0, help="random seed, an integer: same seed, same trace (default 0)"
    )
    synth.set_defaults(func=run_synth)


def _add_input_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", help="force the input format (default: detect from content)")
    parser.add_argument(
        "--map",
        dest="mapping",
        metavar="KEY=COL,...",
        help="generic CSV/JSONL: input=COL,output=COL[,time=COL[:s|ms|us|ns|datetime|iso]]"
        "[,id=,max_tokens=,model=]; input and output hold token counts, time is in seconds unless a "
        "unit is given",
    )
    parser.add_argument(
        "--tokenizer",
        help="count tokens of logs that carry text only: hf:DIR (a local tokenizer.json, needs the "
        "tokenizers package), tiktoken:FILE.tiktoken, or tiktoken:ENCODING (e.g. cl100k_base: downloaded "
        "on first use, so offline it fails unless TIKTOKEN_CACHE_DIR holds it; then use a FILE or DIR)",
    )


def _add_workers_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes that read big logs (default: one per CPU core with 3 cores or more, else 1; "
        "1 = this process only; logs under 64 MB are always read in this process)",
    )


def _workers(args: argparse.Namespace) -> int | None:
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be a positive number of processes, got {args.workers}")
    return int(args.workers) if args.workers is not None else None


def _missing_action(parser: argparse.ArgumentParser) -> Any:
    def run(args: argparse.Namespace) -> int:
        del args
        parser.print_help()
        return int(ExitCode.USAGE)

    return run


def parse_fraction(text: str, flag: str) -> float:
    """``"0.1"`` or ``"10%"`` → 0.1; ``ConfigError`` for anything else, or outside [0, 1]."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1] if percent else raw) / (100.0 if percent else 1.0)
    except ValueError as err:
        raise ConfigError(
            f"{flag} must be a fraction such as 0.1 or a percentage such as 10%, got {text!r}"
        ) from err
    if not 0.0 <= value <= 1.0:
        raise ConfigError(
            f"{flag} must be between 0 and 1 (a fraction: 0.1 = 10%), got {text!r}"
            + (f"; for {value:g}% write {value / 100:g} or {value:g}%" if 1 < value <= 100 else "")
        )
    return value


def _input_options(args: argparse.Namespace) -> dict[str, Any]:
    from oomload.ingest import load_token_counter, parse_mapping

    return {
        "format": args.format,
        "mapping": None if args.mapping is None else parse_mapping(args.mapping),
        "counter": None if args.tokenizer is None else load_token_counter(args.tokenizer),
    }


def run_build(args: argparse.Namespace) -> int:
    from oomload.ingest import build_trace, check_output_path

    check_output_path(args.out)  # before the tokenizer is loaded or any input is read
    workers = _workers(args)
    options = _input_options(args)
    with ReadProgress.for_inputs(args.logs, "building") as progress:
        result = build_trace(
            args.logs, args.out, strict=args.strict, workers=workers, progress=progress, **options
        )
    print(
        f"wrote {result.records_written} requests to {result.out_path} "
        f"(format {'+'.join(result.formats)}"
        + ("" if result.tokenizer is None else f", tokens counted with {result.tokenizer}")
        + ")"
    )
    skips = result.skips
    if skips.total:
        print(f"skipped {skips.total} lines:")
        for reason, count in skips.as_dict().items():
            print(f"  {count:>8}  {reason}  (first: {', '.join(skips.examples.get(reason, []))})")
    else:
        print("skipped 0 lines")
    if result.alignment is not None and not result.alignment.shared:
        print(f"note: {result.alignment.reason}: {result.alignment.description}")
    if result.reordered:
        print("note: the input was not in time order; the trace was sorted by arrival time")
    for note in skips.notes:
        print(f"note: {note}")
    return int(ExitCode.OK)


def run_stats(args: argparse.Namespace) -> int:
    from oomload.ingest import check_output_path, count_trace
    from oomload.stats import summarize_trace_counts

    for name in ("round_to", "block_size", "current_max_model_len", "kv_cache_tokens", "model_limit"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive number of tokens, got {value}")
    margin = parse_fraction(args.margin, "--margin")
    if args.plot:
        check_output_path(args.plot, example="lengths.png")
    workers = _workers(args)
    options = _input_options(args)
    with ReadProgress.for_inputs(args.inputs, "reading") as progress:
        columns = count_trace(args.inputs, workers=workers, progress=progress, **options)
    usable = _usable_kv_tokens(args.kv_cache_tokens, args.block_size)
    stats = summarize_trace_counts(
        columns.arrivals,
        columns.failed,
        columns.prompt_tokens,
        columns.output_tokens,
        columns.total_tokens,
        margin=margin,
        round_to=args.round_to,
        block_size=args.block_size,
        model_limit=args.model_limit,
        kv_cache_tokens=usable,
        current_max_model_len=args.current_max_model_len,
    )
    document = stats_document(
        stats,
        args.inputs,
        columns,
        model_limit=args.model_limit,
        kv_cache_tokens=args.kv_cache_tokens,
        usable_kv_cache_tokens=usable,
    )
    if args.plot:
        plot_lengths(args.plot, columns.prompt_tokens, columns.output_tokens, columns.total_tokens)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        _print_stats(document)
        if args.plot:
            print(f"histogram written to {args.plot}")
    return int(ExitCode.OK)


def _usable_kv_tokens(kv_cache_tokens: int | None, block_size: int | None) -> int | None:
    """The longest request a pool of ``kv_cache_tokens`` holds (vLLM's "GPU KV cache size" counts every
    block; one is the null block): the same bound as ``oomload plan`` and the run's recommendation. Without
    ``--block-size``, vLLM's GPU default of 16 tokens is assumed."""
    if kv_cache_tokens is None:
        return None
    block = block_size or DEFAULT_BLOCK_SIZE
    return single_request_limit_tokens(kv_cache_tokens // block, block)


def stats_document(
    stats: TraceStats,
    inputs: list[str],
    columns: TraceCounts,
    *,
    model_limit: int | None = None,
    kv_cache_tokens: int | None = None,
    usable_kv_cache_tokens: int | None = None,
) -> dict[str, Any]:
    """The ``--json`` shape of ``trace stats`` (schema ``STATS_SCHEMA``, documented in docs/trace.md).

    Shares are fractions (0.25 = 25 %) and their keys end in ``_fraction``.
    """
    from oomload.stats import round_up

    advice = stats.advice
    alignment = columns.alignment
    implied = round_up(max(advice.basis_tokens * (1.0 + advice.margin), 1.0), advice.round_to)
    return {
        "schema": STATS_SCHEMA,
        "inputs": list(inputs),
        "formats": list(columns.formats),
        "tokenizer": columns.tokenizer,
        "skipped": columns.skips.as_dict(),
        "aligned": None if alignment is None else alignment.description,
        "aligned_reason": None if alignment is None else alignment.reason,
        "percentile_method": stats.method,
        "count": stats.arrivals.count,
        "failed": stats.failed_count,
        "arrivals": stats.arrivals.as_dict(),
        "prompt_tokens": stats.prompt.as_dict(),
        "output_tokens": stats.output.as_dict(),
        "total_tokens": stats.total.as_dict(),
        "share_above_fraction": {str(limit): share for limit, share in stats.above_limits.items()},
        "max_model_len": {
            "recommended": advice.max_model_len,
            "implied_by_trace": implied,
            "basis": f"P{advice.basis_percentile:g} of total tokens",
            "basis_tokens": advice.basis_tokens,
            "margin_fraction": advice.margin,
            "round_to": advice.round_to,
            "capped_by_model_limit": advice.capped_by_model_limit,
            "model_limit": model_limit,
            "capped_by_kv_cache": advice.capped_by_kv_cache,
            "kv_cache_tokens": kv_cache_tokens,
            "usable_kv_cache_tokens": usable_kv_cache_tokens,
            "kept_current": advice.kept_current,
            "refused_fraction": advice.refused_share,
            "refused_count": advice.refused_count,
            "max_concurrency": advice.max_concurrency,
            "current_max_model_len": advice.current_max_model_len,
            "current_max_concurrency": advice.current_max_concurrency,
            "freed_concurrency": advice.freed_concurrency,
        },
    }


def _print_stats(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    arrivals = doc["arrivals"]
    head = Table(title=f"Trace: {', '.join(doc['inputs'])} ({'+'.join(doc['formats'])})", show_header=False)
    head.add_row("requests", f"{doc['count']:,}" + (f" ({doc['failed']:,} failed)" if doc["failed"] else ""))
    head.add_row("time span", f"{arrivals['span_s']:,.1f} s")
    mean = arrivals["mean_rps"]
    head.add_row("arrival rate, mean", "-" if mean is None else f"{mean:,.2f} req/s")
    head.add_row(
        "arrival rate, peak 1 s / 60 s",
        f"{arrivals['peak_rps_1s']:,.2f} / {arrivals['peak_rps_60s']:,.2f} req/s",
    )
    cv = arrivals["burstiness_cv"]
    head.add_row("burstiness (CV of gaps; Poisson = 1)", "-" if cv is None else f"{cv:.2f}")
    if doc["aligned_reason"]:
        head.add_row("inputs aligned", f"{doc['aligned']} ({doc['aligned_reason']})")
    if doc["skipped"]:
        head.add_row("lines skipped", ", ".join(f"{n} {reason}" for reason, n in doc["skipped"].items()))
    console.print(head)

    lengths = Table(title="Lengths (tokens)", caption=f"percentiles: {doc['percentile_method']}")
    lengths.add_column("")
    for key in ("mean", "p50", "p90", "p95", "p99", "p99.9", "max"):
        lengths.add_column(key.upper() if key != "mean" else "mean", justify="right")
    for label, key in (("input", "prompt_tokens"), ("output", "output_tokens"), ("total", "total_tokens")):
        row = doc[key]
        lengths.add_row(
            label,
            f"{row['mean']:,.1f}",
            *(f"{row[k]:,.0f}" for k in ("p50", "p90", "p95", "p99", "p99.9", "max")),
        )
    console.print(lengths)

    shares = ", ".join(
        f">{int(limit) // 1024}K: {share:.2%}" for limit, share in doc["share_above_fraction"].items()
    )
    console.print(f"Share of requests above context limits (total tokens): {shares}")
    for line in advice_lines(doc["max_model_len"]):
        console.print(line, highlight=False)


def advice_lines(advice: dict[str, Any]) -> list[str]:
    """Terminal lines of the ``max_model_len`` advice: the arithmetic, then what limited it, if anything."""
    implied, recommended = advice["implied_by_trace"], advice["recommended"]
    arithmetic = (
        f"{advice['basis']} = {advice['basis_tokens']:,.0f} + {advice['margin_fraction']:.0%} margin, "
        f"rounded up to a multiple of {advice['round_to']}"
    )
    if recommended == implied:
        lines = [f"max_model_len the trace implies: [bold]{recommended:,}[/bold] ({arithmetic})"]
    else:
        lines = [
            f"max_model_len to use: [bold]{recommended:,}[/bold]; "
            f"the trace alone implies {implied:,} ({arithmetic})"
        ]
    if advice["capped_by_model_limit"]:
        lines.append(
            f"  capped at the model's context limit {advice['model_limit']:,} tokens (--model-limit)"
        )
    if advice["capped_by_kv_cache"]:
        lines.append(
            f"  capped at {recommended:,}: the KV cache holds {advice['kv_cache_tokens']:,} tokens "
            f"({advice['usable_kv_cache_tokens']:,} usable: one block is vLLM's null block), and vLLM "
            "refuses to start when one max_model_len request does not fit (--kv-cache-tokens)"
        )
    if advice["kept_current"]:
        lines.append(
            f"  kept at the current {advice['current_max_model_len']:,}: it already covers the "
            f"{advice['basis']} ({advice['basis_tokens']:,.0f}); raising it would only lower the "
            "worst-case concurrency"
        )
    lines.append(
        f"  would refuse {advice['refused_count']:,} requests ({advice['refused_fraction']:.2%} of the trace)"
    )
    if advice["max_concurrency"] is not None:
        lines.append(f"  full-length sequences that fit in the KV cache: {advice['max_concurrency']:,.2f}")
    if advice["freed_concurrency"] is not None:
        lines.append(
            f"  vs current max_model_len {advice['current_max_model_len']:,}: "
            f"{advice['current_max_concurrency']:,.2f} → {advice['max_concurrency']:,.2f} "
            f"({advice['freed_concurrency']:+,.2f} concurrent sequences)"
        )
    return lines


def plot_lengths(
    path: str, prompt_tokens: LengthCounts, output_tokens: LengthCounts, total: LengthCounts
) -> None:
    """Histograms of input, output and total tokens (log-spaced bins) from counts, percentiles marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from oomload.ingest import TraceScratch, check_output_path
    from oomload.stats import PERCENTILE_METHOD, PERCENTILES

    series = (("input tokens", prompt_tokens), ("output tokens", output_tokens), ("total tokens", total))
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), constrained_layout=True)
    for ax, (label, counts) in zip(axes, series, strict=True):
        values, weights = counts.distinct()
        top = max(int(values.max()), 1)
        bins = np.unique(np.geomspace(1, top + 1, 60).astype(int))
        ax.hist(np.maximum(values, 1), bins=bins, weights=weights, color="#4c78a8")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("requests")
        marks = counts.percentiles(PERCENTILES)
        colors = ("#54a24b", "#f58518", "#b279a2", "#e45756", "#000000")
        for p, mark, color in zip(PERCENTILES, marks, colors, strict=True):
            ax.axvline(
                max(float(mark), 1), color=color, linestyle="--", linewidth=1, label=f"P{p:g} = {mark:,.0f}"
            )
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Request lengths ({prompt_tokens.count:,} requests; {PERCENTILE_METHOD})")
    try:
        with TraceScratch(check_output_path(path, example="lengths.png")) as scratch:
            try:
                fig.savefig(scratch.final, dpi=110, format="png")
            except OSError as err:
                raise ConfigError(f"cannot write the plot to {path} ({err.strerror or err})") from err
            scratch.commit()
    finally:
        plt.close(fig)


class ReadProgress:
    """A progress bar on stderr for reads that take more than ``delay_s``: bytes, requests/s, ETA.

    Shown only when stderr is a terminal, and only once the read has run ``delay_s`` (short
    reads print nothing more than before); it disappears when the read ends. Called with the bytes
    and requests read since the last call (``oomload.ingest.parallel.Progress``).
    """

    def __init__(
        self,
        total_bytes: int,
        label: str,
        *,
        delay_s: float = 2.0,
        enabled: bool = True,
        clock: Callable[[], float] | None = None,
        console: Any = None,
    ) -> None:
        import time

        self.total_bytes, self.label, self.delay_s, self.enabled = total_bytes, label, delay_s, enabled
        self.done_bytes = 0
        self.requests = 0
        self._clock = time.monotonic if clock is None else clock
        self._console = console
        self._start = self._clock()
        self._bar: Progress | None = None
        self._task: Any = None

    @classmethod
    def for_inputs(cls, paths: list[str], label: str) -> ReadProgress:
        import contextlib
        import os
        import sys

        total = 0
        for path in paths:
            with contextlib.suppress(OSError):
                total += os.stat(path).st_size
        return cls(total, label, enabled=sys.stderr.isatty())

    def __call__(self, read_bytes: int, requests: int) -> None:
        self.done_bytes += read_bytes
        self.requests += requests
        if not self.enabled:
            return
        if self._bar is None:
            if self._clock() - self._start < self.delay_s:
                return
            self._open()
        assert self._bar is not None
        elapsed = max(self._clock() - self._start, 1e-9)
        self._bar.update(
            self._task,
            completed=min(self.done_bytes, self.total_bytes),
            requests=f"{self.requests:,} requests, {self.requests / elapsed:,.0f}/s",
        )

    def _open(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[requests]}"),
            TimeRemainingColumn(),
            console=self._console or Console(stderr=True),
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(self.label, total=self.total_bytes or None, requests="")

    @property
    def shown(self) -> bool:
        """Whether the bar is on screen."""
        return self._bar is not None

    def __enter__(self) -> ReadProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def run_synth(args: argparse.Namespace) -> int:
    from oomload.ingest import check_output_path, write_trace_file
    from oomload.synth import describe_spec, parse_length_spec, synthesize
    from oomload.trace import TraceHeader

    check_output_path(args.out)
    prompt = parse_length_spec(args.input, name="--input")
    output = parse_length_spec(args.output, name="--output")
    records = synthesize(args.count, prompt, output, rate_rps=args.rate, seed=args.seed)
    header = TraceHeader(
        source=(),
        format="synth",
        extra={
            "synth": {
                "input": describe_spec(prompt),
                "output": describe_spec(output),
                "rate_rps": args.rate,
                "seed": args.seed,
                "count": args.count,
            }
        },
    )
    written = write_trace_file(args.out, records, header)
    print(f"wrote {written} synthetic requests to {args.out}")
    return int(ExitCode.OK)
