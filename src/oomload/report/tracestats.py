"""What ``oomload trace stats`` shows: the JSON document, the terminal tables and the length plot.

``stats_document`` turns ``oomload.trace.stats``' ``TraceStats`` of a trace (and what reading it found:
formats, skipped lines, input alignment) into the ``--json`` document (schema ``STATS_SCHEMA``,
documented in docs/trace.md); ``print_stats`` renders that same document as tables with rich, so
the terminal and JSON never disagree; ``plot_lengths`` draws the input, output and total length
histograms from the counts (log-spaced bins, the percentiles marked) into a PNG written atomically.
``usable_kv_tokens`` is the one piece of arithmetic: the longest request a KV pool of N tokens holds.

Heavy imports (rich, matplotlib, numpy) happen inside the functions.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from oomload.capacity.blocks import single_request_limit_tokens
from oomload.errors import ConfigError

if TYPE_CHECKING:
    from oomload.ingest import TraceCounts
    from oomload.trace.stats import LengthCounts, TraceStats
    from oomload.trace.tally import PrefixStats

STATS_SCHEMA = "oomload.trace-stats/1"
DEFAULT_BLOCK_SIZE = 16  # vLLM's block size on GPUs when --block-size is not given


def usable_kv_tokens(kv_cache_tokens: int | None, block_size: int | None) -> int | None:
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
    from oomload.trace.stats import round_up

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
        "prefix": None if columns.prefix is None else prefix_document(columns.prefix),
    }


def prefix_document(prefix: PrefixStats) -> dict[str, Any]:
    """The ``prefix`` object of the stats document; ``source`` ``none`` when no request carries ids."""
    from oomload.trace.prefix import describe_prefix

    doc = prefix.as_dict()
    if prefix.requests_with_ids == 0:
        doc["source"] = "none"
        doc["description"] = describe_prefix(type(prefix.info)(prefix.info.block_tokens, "none"))
    return doc


def print_stats(doc: dict[str, Any]) -> None:
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
    if doc.get("prefix") is not None:
        for line in prefix_lines(doc["prefix"], doc["count"]):
            console.print(line, highlight=False)


def prefix_lines(prefix: dict[str, Any], requests: int) -> list[str]:
    """Terminal lines of the prefix reuse: what the ids are, the two shares, the largest shared prefixes."""
    lines = [f"Prefix structure: {prefix['description']}"]
    if prefix["source"] == "none":
        return lines
    block = prefix["block_tokens"]
    sampled = prefix["approximation"]
    error = ""
    if sampled["seen_hit_tokens_error"]:
        error = f" ± {sampled['seen_hit_fraction_error']:.1%} (± {sampled['seen_hit_tokens_error']:,} tokens)"
    lines.append(
        f"  prompt tokens in blocks seen earlier (infinite cache, upper bound): "
        f"[bold]{prefix['seen_hit_fraction']:.1%}[/bold]{error} ({prefix['seen_hit_tokens']:,} of "
        f"{prefix['prompt_tokens']:,}; {block}-token blocks)"
    )
    if prefix["pool_blocks"] is not None:
        lines.append(
            f"  still held by a pool of {prefix['pool_blocks']:,} blocks "
            f"({prefix['pool_blocks'] * block:,} tokens; LRU of unreferenced blocks, requests one at a "
            f"time): [bold]{prefix['pool_hit_fraction']:.1%}[/bold]"
        )
    else:
        lines.append(
            "  give --kv-cache-tokens or --kv-blocks for the share a KV pool of that size would still hold"
        )
    if prefix["requests_with_ids"] < requests:
        lines.append(
            f"  {requests - prefix['requests_with_ids']:,} of {requests:,} requests carry no prefix ids"
        )
    for shared in prefix["largest_shared_prefixes"]:
        longer = f" (up to {shared['tokens_error']:,} more)" if shared["tokens_error"] else ""
        lines.append(
            f"  shared prefix …{str(shared['block_id'])[-6:]}: "
            f"{shared['tokens']:,} tokens{longer} × {shared['uses']:,} uses"
        )
    conversations = prefix["conversations"]
    if conversations["count"]:
        how = (
            " (inferred: each turn's chain starts with the previous turn's)"
            if conversations["inferred_from_chains"]
            else ""
        )
        over = (
            f" (up to {conversations['count_error']:,} of them may be later turns of another)"
            if conversations["count_error"]
            else ""
        )
        lines.append(
            f"  conversations{how}: {conversations['count']:,}{over}, turns mean "
            f"{conversations['mean_turns']:.1f}, max {conversations['max_turns']:,}"
        )
    if sampled["approximate"]:
        lines.append(
            f"  approximate: more than {sampled['exact_blocks_limit']:,} distinct blocks (then kept at "
            f"depths that are multiples of {sampled['sample_step_blocks']:,}) or "
            f"{sampled['exact_conversations_limit']:,} "
            "conversations held (the least recent given up); the errors above are bounds (docs/trace.md)"
        )
    return lines


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
    path: str,
    prompt_tokens: LengthCounts,
    output_tokens: LengthCounts,
    total: LengthCounts,
    prefix: dict[str, Any] | None = None,
) -> None:
    """Histograms of input, output and total tokens (log-spaced bins) from counts, percentiles marked;
    with ``prefix`` (the stats document's), a fourth panel with the prefix reuse shares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from oomload.ingest import TraceScratch, check_output_path
    from oomload.trace.stats import PERCENTILE_METHOD, PERCENTILES

    series = (("input tokens", prompt_tokens), ("output tokens", output_tokens), ("total tokens", total))
    panels = 3 if prefix is None else 4
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3 * panels), constrained_layout=True)
    if prefix is not None:
        _plot_prefix(axes[3], prefix)
    for ax, (label, counts) in zip(axes, series, strict=False):
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
        kind = PLOT_FORMATS.get(os.path.splitext(path)[1].lower(), "png")
        with TraceScratch(check_output_path(path, example="lengths.png")) as scratch:
            try:
                fig.savefig(scratch.final, dpi=110, format=kind)
            except OSError as err:
                raise ConfigError(f"cannot write the plot to {path} ({err.strerror or err})") from err
            scratch.commit()
    finally:
        plt.close(fig)


PLOT_FORMATS = {".svg": "svg", ".pdf": "pdf"}  # by the file's extension; any other name gets a PNG


def _plot_prefix(ax: Any, prefix: dict[str, Any]) -> None:
    """Bars: the share of prompt tokens in blocks seen earlier, and the share a given pool still holds."""
    ax.set_title("prefix reuse (share of prompt tokens)", fontsize=10)
    if prefix["source"] == "none":
        ax.text(0.5, 0.5, "no prefix structure in this log", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    labels = ["seen earlier\n(infinite cache)"]
    values = [prefix["seen_hit_fraction"]]
    if prefix["pool_hit_fraction"] is not None:
        labels.append(f"held by a pool of\n{prefix['pool_blocks']:,} blocks")
        values.append(prefix["pool_hit_fraction"])
    bars = ax.barh(labels, values, color="#4c78a8")
    ax.bar_label(bars, labels=[f"{v:.1%}" for v in values], padding=3)
    ax.set_xlim(0, 1)
