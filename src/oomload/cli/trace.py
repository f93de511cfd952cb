"""``oomload trace build | stats | synth``: production logs → length-only traces, and what they imply.

The handlers only parse flags, call ``oomload.ingest`` / ``oomload.trace.stats`` / ``oomload.trace.synth`` and
print (the stats document, its tables and the plot are ``oomload.report.tracestats``'s); heavy imports
(pyarrow, rich, matplotlib) happen inside them so ``oomload --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from oomload.cli.flags import non_negative
from oomload.errors import ConfigError, ExitCode
from oomload.trace.model import MAX_TOKENS
from oomload.trace.prefix import DEFAULT_BLOCK_TOKENS, describe_prefix

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from rich.progress import Progress


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
    build.add_argument(
        "--prefix-block-tokens",
        type=int,
        default=DEFAULT_BLOCK_TOKENS,
        metavar="TOKENS",
        help="block size of the prefix chains (hash_ids) derived from token ids or messages; the trace "
        f"then predicts any multiple of it (default {DEFAULT_BLOCK_TOKENS}, vLLM's; 0: none)",
    )
    build.add_argument(
        "--keep-ids",
        action="store_true",
        help="write the logs' request ids, sessions and parents as they are (default: salted pseudonyms, "
        "which tell nothing of them; keep them only for a trace that stays with the logs)",
    )
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
    stats.add_argument(
        "--plot",
        metavar="FILE",
        help="write a histogram with the percentiles marked: PNG, or SVG / PDF by the name's extension",
    )
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
        "--kv-blocks",
        type=int,
        metavar="BLOCKS",
        help="KV pool size in blocks (of --block-size, else of the trace's prefix blocks) for the share "
        "of prompt tokens a pool of that size would still hold (default: from --kv-cache-tokens)",
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
    synth.add_argument(
        "--count", type=int, required=True, metavar="REQUESTS", help="number of requests (at most 1,000,000)"
    )
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

    check_output_path(args.out, inputs=args.logs)  # before the tokenizer is loaded or any input is read
    if not 0 <= args.prefix_block_tokens <= MAX_TOKENS:
        raise ConfigError(
            f"--prefix-block-tokens must be in 0..{MAX_TOKENS:,} (0: no prefix chains), "
            f"got {args.prefix_block_tokens}"
        )
    workers = _workers(args)
    options = _input_options(args)
    with interrupts_latched(), ReadProgress.for_inputs(args.logs, "building") as progress:
        result = build_trace(
            args.logs,
            args.out,
            strict=args.strict,
            workers=workers,
            progress=progress,
            prefix_block_tokens=args.prefix_block_tokens or None,
            keep_ids=args.keep_ids,
            **options,
        )
    print(
        f"wrote {result.records_written} requests to {result.out_path} "
        f"(format {'+'.join(result.formats)}"
        + ("" if result.tokenizer is None else f", tokens counted with {result.tokenizer}")
        + ")"
    )
    skips = result.skips
    if skips.total:
        print(f"skipped {skips.total} line{'' if skips.total == 1 else 's'}:")
        for reason, count in skips.as_dict().items():
            print(f"  {count:>8}  {reason}  (first: {', '.join(skips.examples.get(reason, []))})")
    else:
        print("skipped 0 lines")
    if result.alignment is not None and not result.alignment.shared:
        print(f"note: {result.alignment.reason}: {result.alignment.description}")
    if result.reordered:
        print("note: the input was not in time order; the trace was sorted by arrival time")
    if result.prefix is not None and result.prefix.source != "none":  # none: said by trace stats
        print(f"prefix: {describe_prefix(result.prefix)}")
    for note in skips.notes:
        print(f"note: {note}")
    for note in result.read_notes:
        print(f"note: {note}", file=sys.stderr)
    return int(ExitCode.OK)


def run_stats(args: argparse.Namespace) -> int:
    from oomload.ingest import PoolSize, check_output_path, count_trace
    from oomload.report.tracestats import plot_lengths, print_stats, stats_document, usable_kv_tokens
    from oomload.trace.stats import summarize_trace_counts

    for name in (
        "round_to",
        "block_size",
        "current_max_model_len",
        "kv_cache_tokens",
        "model_limit",
        "kv_blocks",
    ):
        value = getattr(args, name)
        if value is not None and value <= 0:
            what = "blocks" if name == "kv_blocks" else "tokens"
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive number of {what}, got {value}")
    margin = parse_fraction(args.margin, "--margin")
    if args.plot:
        check_output_path(args.plot, example="lengths.png", inputs=args.inputs)
    workers = _workers(args)
    options = _input_options(args)
    with interrupts_latched(), ReadProgress.for_inputs(args.inputs, "reading") as progress:
        kv_pool = PoolSize(blocks=args.kv_blocks, tokens=args.kv_cache_tokens, block_tokens=args.block_size)
        columns = count_trace(args.inputs, workers=workers, progress=progress, kv_pool=kv_pool, **options)
    for note in columns.read_notes:
        print(f"note: {note}", file=sys.stderr)
    usable = usable_kv_tokens(args.kv_cache_tokens, args.block_size)
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
        plot_lengths(
            args.plot, columns.prompt_tokens, columns.output_tokens, columns.total_tokens, document["prefix"]
        )
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print_stats(document)
        if args.plot:
            print(f"histogram written to {args.plot}")
    return int(ExitCode.OK)


@contextlib.contextmanager
def interrupts_latched() -> Iterator[None]:
    """Ctrl-C and SIGTERM (``kill``, a CI job's timeout) end a read the same way — the pool stopped, the
    scratch files removed, an older trace left as it was, exit 130 — instead of killing the process
    where it stands; and each is latched (``ingest.writer.INTERRUPTED``) as well as raised, so one that
    Python drops (raised inside a weakref callback) still stops the build before its trace is put in
    place. A SIGINT the process was started to ignore stays ignored. Only in the main thread (where
    Python runs signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from oomload.ingest.writer import INTERRUPTED

    def interrupt(signum: int, frame: object) -> None:
        INTERRUPTED.set()
        raise KeyboardInterrupt

    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signals.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, interrupt) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        INTERRUPTED.clear()


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
    from oomload.trace.model import TraceHeader
    from oomload.trace.synth import describe_spec, parse_length_spec, synthesize

    check_output_path(args.out)
    non_negative("--seed", args.seed)  # numpy's generator takes no negative seed
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
