"""``oomload trace build | stats | synth``: production logs → length-only traces, and what they imply.

The handlers only parse flags, call ``oomload.ingest`` / ``oomload.stats`` / ``oomload.synth`` and
print; heavy imports (pyarrow, rich, matplotlib) happen inside them so ``oomload --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from oomload.errors import ConfigError, ExitCode

if TYPE_CHECKING:
    from oomload.ingest import TraceColumns
    from oomload.stats import TraceStats


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
    build.add_argument("-o", "--out", required=True, help="trace file to write (JSONL)")
    _add_input_flags(build)
    build.add_argument("--strict", action="store_true", help="stop at the first unusable line")
    build.set_defaults(func=run_build)

    stats = actions.add_parser(
        "stats",
        help="length percentiles, arrival rates and the max_model_len a trace implies",
        description="Describe a trace (or logs): arrival rates, length percentiles (nearest rank), "
        "shares above common context limits, and the max_model_len the trace implies.",
    )
    stats.add_argument("inputs", nargs="+", metavar="TRACE_OR_LOG", help="an oomload trace, or logs")
    _add_input_flags(stats)
    stats.add_argument("--json", action="store_true", help="print JSON instead of tables")
    stats.add_argument("--plot", metavar="PNG", help="write a histogram picture with the percentiles marked")
    stats.add_argument(
        "--margin", type=float, default=0.10, help="margin over P99 of total tokens (default 0.1)"
    )
    stats.add_argument("--round-to", type=int, default=256, help="round max_model_len up to a multiple (256)")
    stats.add_argument("--block-size", type=int, help="KV block size: also round to a multiple of it")
    stats.add_argument("--current-max-model-len", type=int, help="today's max_model_len, to compare with")
    stats.add_argument(
        "--kv-cache-tokens", type=int, help="KV cache size in tokens (vLLM 'GPU KV cache size')"
    )
    stats.add_argument("--model-limit", type=int, help="the model's own context window (caps the advice)")
    stats.set_defaults(func=run_stats)

    synth = actions.add_parser(
        "synth",
        help="generate a trace from length distributions",
        description="Generate a trace from length distributions (log-normal from P50/P99, fixed, mixes).",
    )
    synth.add_argument("-o", "--out", required=True, help="trace file to write")
    synth.add_argument("--count", type=int, required=True, help="number of requests")
    synth.add_argument(
        "--input",
        default="lognormal:600:6000",
        help="prompt length spec: fixed:N | uniform:LO:HI | lognormal:P50:P99[:MAX] | A@W+B@W "
        "(default lognormal:600:6000)",
    )
    synth.add_argument(
        "--output", default="lognormal:200:1000", help="output length spec (default lognormal:200:1000)"
    )
    synth.add_argument("--rate", type=float, default=None, help="Poisson arrival rate, requests/s")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.set_defaults(func=run_synth)


def _add_input_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", help="force the input format (default: detect from content)")
    parser.add_argument(
        "--map",
        dest="mapping",
        metavar="KEY=COL,...",
        help="generic CSV/JSONL: input=COL,output=COL[,time=COL[:s|ms|us|datetime]][,id=,max_tokens=,model=]",
    )
    parser.add_argument(
        "--tokenizer",
        help="count tokens of logs that carry text only: hf:DIR (a local tokenizer.json, needs the "
        "tokenizers package), tiktoken:FILE.tiktoken, or tiktoken:ENCODING (e.g. cl100k_base: downloaded "
        "on first use, so offline it fails unless TIKTOKEN_CACHE_DIR holds it; then use a FILE or DIR)",
    )


def _missing_action(parser: argparse.ArgumentParser) -> Any:
    def run(args: argparse.Namespace) -> int:
        del args
        parser.print_help()
        return int(ExitCode.USAGE)

    return run


def _input_options(args: argparse.Namespace) -> dict[str, Any]:
    from oomload.ingest import load_token_counter, parse_mapping

    return {
        "format": args.format,
        "mapping": None if args.mapping is None else parse_mapping(args.mapping),
        "counter": None if args.tokenizer is None else load_token_counter(args.tokenizer),
    }


def run_build(args: argparse.Namespace) -> int:
    from oomload.ingest import build_trace

    result = build_trace(args.logs, args.out, strict=args.strict, **_input_options(args))
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
    from oomload.ingest import load_columns
    from oomload.stats import summarize_trace

    for name in ("round_to", "block_size", "current_max_model_len", "kv_cache_tokens", "model_limit"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.margin < 0:
        raise ConfigError(f"--margin must be ≥ 0, got {args.margin}")
    columns = load_columns(args.inputs, **_input_options(args))
    stats = summarize_trace(
        columns.arrival_s,
        columns.prompt_tokens,
        columns.output_tokens,
        columns.ok,
        margin=args.margin,
        round_to=args.round_to,
        block_size=args.block_size,
        model_limit=args.model_limit,
        kv_cache_tokens=args.kv_cache_tokens,
        current_max_model_len=args.current_max_model_len,
    )
    document = stats_document(stats, args.inputs, columns)
    if args.plot:
        plot_lengths(args.plot, columns.prompt_tokens, columns.output_tokens)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        _print_stats(document)
        if args.plot:
            print(f"histogram written to {args.plot}")
    return int(ExitCode.OK)


def stats_document(stats: TraceStats, inputs: list[str], columns: TraceColumns) -> dict[str, Any]:
    """The ``--json`` shape of ``trace stats`` (documented in docs/trace.md)."""
    advice = stats.advice
    alignment = columns.alignment
    return {
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
        "share_above": {str(limit): share for limit, share in stats.above_limits.items()},
        "max_model_len": {
            "recommended": advice.max_model_len,
            "basis": f"P{advice.basis_percentile:g} of total tokens",
            "basis_tokens": advice.basis_tokens,
            "margin": advice.margin,
            "round_to": advice.round_to,
            "capped_by_model_limit": advice.capped_by_model_limit,
            "refused_share": advice.refused_share,
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

    shares = ", ".join(f">{int(limit) // 1024}K: {share:.2%}" for limit, share in doc["share_above"].items())
    console.print(f"Share of requests above context limits (total tokens): {shares}")
    advice = doc["max_model_len"]
    lines = [
        f"max_model_len the trace implies: [bold]{advice['recommended']:,}[/bold] "
        f"({advice['basis']} = {advice['basis_tokens']:,.0f} + {advice['margin']:.0%} margin, "
        f"rounded up to a multiple of {advice['round_to']})",
        f"  would refuse {advice['refused_count']:,} requests ({advice['refused_share']:.2%} of the trace)",
    ]
    if advice["capped_by_model_limit"]:
        lines.append("  capped by the model's context limit (--model-limit)")
    if advice["max_concurrency"] is not None:
        lines.append(f"  full-length sequences that fit in the KV cache: {advice['max_concurrency']:,.2f}")
    if advice["freed_concurrency"] is not None:
        lines.append(
            f"  vs current max_model_len {advice['current_max_model_len']:,}: "
            f"{advice['current_max_concurrency']:,.2f} → {advice['max_concurrency']:,.2f} "
            f"({advice['freed_concurrency']:+,.2f} concurrent sequences)"
        )
    for line in lines:
        console.print(line)


def plot_lengths(path: str, prompt_tokens: Any, output_tokens: Any) -> None:
    """Histograms of input, output and total tokens (log-spaced bins), percentiles marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from oomload.stats import PERCENTILE_METHOD, PERCENTILES

    prompt = np.asarray(prompt_tokens)
    output = np.asarray(output_tokens)
    series = (("input tokens", prompt), ("output tokens", output), ("total tokens", prompt + output))
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), constrained_layout=True)
    for ax, (label, values) in zip(axes, series, strict=True):
        top = max(int(values.max()), 1)
        bins = np.unique(np.geomspace(1, top + 1, 60).astype(int))
        ax.hist(np.maximum(values, 1), bins=bins, color="#4c78a8")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("requests")
        marks = np.percentile(values, PERCENTILES, method="inverted_cdf")
        colors = ("#54a24b", "#f58518", "#b279a2", "#e45756", "#000000")
        for p, mark, color in zip(PERCENTILES, marks, colors, strict=True):
            ax.axvline(
                max(float(mark), 1), color=color, linestyle="--", linewidth=1, label=f"P{p:g} = {mark:,.0f}"
            )
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Request lengths ({len(prompt):,} requests; {PERCENTILE_METHOD})")
    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise ConfigError(f"cannot write the plot to {path} ({err.strerror or err})") from err
    finally:
        plt.close(fig)


def run_synth(args: argparse.Namespace) -> int:
    from oomload.synth import describe_spec, parse_length_spec, synthesize
    from oomload.trace import TraceHeader, write_trace

    prompt = parse_length_spec(args.input)
    output = parse_length_spec(args.output)
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
    written = write_trace(args.out, records, header)
    print(f"wrote {written} synthetic requests to {args.out}")
    return int(ExitCode.OK)
