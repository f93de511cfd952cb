"""A trace, or logs, as what ``trace stats`` needs: counts per length and arrival statistics.

``count_trace`` (what ``trace stats`` uses) keeps **constant memory**: each batch's lengths go
into ``LengthCounts`` and its times into an ``ArrivalCounter``, then the batch is dropped. Several
inputs are read twice: once for the lengths and their time ranges (which decide the alignment), then
merged in time order (``build.merge_batches``) for the arrivals. Only when an input is not in time
order are the times gathered whole, 8 bytes per request, in one more pass. Prefix reuse goes to a
``PrefixTally`` (``oomload.trace.tally``), exact up to ``PoolSize.exact_blocks`` distinct blocks, then
sampled with a stated error: its memory is bounded too.

``load_columns`` reads an oomload trace with pyarrow's JSON reader, or each log input with its
reader, keeping four columns per input: time, prompt and output tokens, success. Several inputs are
put on one timeline as ``build`` does (``oomload.ingest.clocks``): here the whole columns are in
memory, so each input's range is known at once and its offset is added in place. Arrival times
are then made relative to the earliest request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from oomload.errors import TraceFormatError
from oomload.ingest.build import (
    ClockMeter,
    align_inputs,
    merge_batches,
    plan_prefix,
    shifted,
)
from oomload.ingest.clocks import ClockAlignment
from oomload.ingest.columns import read_trace_columns
from oomload.ingest.inputs import iter_source_batches, plan_inputs
from oomload.ingest.mapping import ColumnMapping
from oomload.ingest.parallel import (
    PARALLEL_MIN_BYTES,
    SPAN_BYTES,
    Progress,
    ReadPool,
    default_workers,
    input_batches,
    prefetch,
)
from oomload.ingest.prefixes import build_hasher, header_prefix
from oomload.ingest.skips import SkipLog, nothing_usable
from oomload.ingest.tokens import TokenCounter
from oomload.trace.model import PrefixInfo, is_trace_file, read_trace_header
from oomload.trace.prefix import DEFAULT_BLOCK_TOKENS
from oomload.trace.stats import ArrivalCounter, ArrivalStats, LengthCounts, summarize_arrivals
from oomload.trace.tally import EXACT_BLOCKS, EXACT_CONVERSATIONS, PrefixStats, PrefixTally


@dataclass(slots=True)
class TraceColumns:
    """The columns ``trace stats`` needs, from a trace or straight from logs (numpy, not objects)."""

    arrival_s: npt.NDArray[np.float64]
    prompt_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]
    ok: npt.NDArray[np.bool_]
    formats: tuple[str, ...]
    tokenizer: str | None = None
    skips: SkipLog = field(default_factory=SkipLog)
    alignment: ClockAlignment | None = None  # None for a single input


@dataclass(slots=True)
class _InputColumns:
    """One input's columns, as numpy arrays (``time_s`` on its own clock)."""

    time_s: list[npt.NDArray[np.float64]] = field(default_factory=list)
    prompt_tokens: list[npt.NDArray[np.int64]] = field(default_factory=list)
    output_tokens: list[npt.NDArray[np.int64]] = field(default_factory=list)
    ok: list[npt.NDArray[np.bool_]] = field(default_factory=list)

    def add(self, table: pa.Table, time_column: str) -> None:
        self.time_s.append(np.asarray(table.column(time_column), dtype=np.float64))
        self.prompt_tokens.append(np.asarray(table.column("prompt_tokens"), dtype=np.int64))
        self.output_tokens.append(np.asarray(table.column("output_tokens"), dtype=np.int64))
        self.ok.append(np.asarray(pc.fill_null(table.column("ok"), True), dtype=bool))


def load_columns(
    paths: Sequence[str | Path],
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    counter: TokenCounter | None = None,
) -> TraceColumns:
    """Arrival times (relative to the earliest, inputs aligned), lengths and status of a trace or logs."""
    skips = SkipLog()
    inputs: list[_InputColumns] = []
    if len(paths) == 1 and format in (None, "oomload") and mapping is None and is_trace_file(paths[0]):
        inputs.append(_InputColumns())
        for table in read_trace_columns(paths[0]):
            inputs[0].add(table, "arrival_s")
        formats: tuple[str, ...] = ("oomload",)
        tokenizer = read_trace_header(paths[0]).tokenizer
    else:
        plans = plan_inputs(paths, format=format, mapping=mapping)
        for plan in plans:
            inputs.append(_InputColumns())
            for batch in iter_source_batches(plan, skips, counter):
                inputs[-1].add(batch, "time_s")
        formats = tuple(dict.fromkeys(plan.format for plan in plans))
        tokenizer = None if counter is None else counter.name
    times = [np.concatenate(one.time_s) if one.time_s else np.empty(0) for one in inputs]
    if not any(t.size for t in times):
        raise TraceFormatError(nothing_usable(skips), ", ".join(str(p) for p in paths))
    alignment = None
    if len(inputs) > 1:
        meters = [ClockMeter(float(t.min()), float(t.max())) if t.size else ClockMeter() for t in times]
        alignment = align_inputs(meters)
        times = [t + offset_s for t, offset_s in zip(times, alignment.offsets_s, strict=True)]
    arrival_s = np.concatenate(times)
    return TraceColumns(
        arrival_s=arrival_s - arrival_s.min(),
        prompt_tokens=np.concatenate([a for one in inputs for a in one.prompt_tokens]),
        output_tokens=np.concatenate([a for one in inputs for a in one.output_tokens]),
        ok=np.concatenate([a for one in inputs for a in one.ok]),
        formats=formats,
        tokenizer=tokenizer,
        skips=skips,
        alignment=alignment,
    )


@dataclass(slots=True)
class TraceCounts:
    """What ``trace stats`` reports, gathered in constant memory (see the module docstring)."""

    arrivals: ArrivalStats
    failed: int
    prompt_tokens: LengthCounts
    output_tokens: LengthCounts
    total_tokens: LengthCounts
    formats: tuple[str, ...]
    tokenizer: str | None = None
    skips: SkipLog = field(default_factory=SkipLog)
    alignment: ClockAlignment | None = None  # None for a single input
    read_notes: tuple[str, ...] = ()  # how the inputs were read (e.g. not in byte ranges)
    prefix: PrefixStats | None = None


@dataclass(frozen=True, slots=True)
class PoolSize:
    """The KV pool ``trace stats`` models prefix reuse in: blocks, or tokens, and the server's block size."""

    blocks: int | None = None
    tokens: int | None = None
    block_tokens: int | None = None  # None: the trace's prefix block size
    exact_blocks: int = EXACT_BLOCKS  # distinct blocks the tally holds exactly (``oomload.trace.tally``)
    exact_conversations: int = EXACT_CONVERSATIONS  # and conversations (sessions, or chain ends)

    def tally(self, info: PrefixInfo, notes: list[str]) -> PrefixTally:
        """The tally for a trace whose ids mean ``info`` (a server block that is no multiple: noted)."""
        server = self.block_tokens
        if server is not None and (server < info.block_tokens or server % info.block_tokens):
            notes.append(
                f"prefix reuse counted in the trace's {info.block_tokens}-token blocks: the server block of "
                f"{server} tokens is not a multiple of them"
            )
            server = None
        block = server or info.block_tokens
        blocks = (
            self.blocks if self.blocks is not None else None if self.tokens is None else self.tokens // block
        )
        return PrefixTally(
            info,
            pool_blocks=blocks or None,
            server_block_tokens=server,
            exact_blocks=self.exact_blocks,
            exact_conversations=self.exact_conversations,
        )


def count_trace(
    paths: Sequence[str | Path],
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    counter: TokenCounter | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
    parallel_min_bytes: int = PARALLEL_MIN_BYTES,
    span_bytes: int = SPAN_BYTES,
    kv_pool: PoolSize | None = None,
) -> TraceCounts:
    """Counts per length, failures, arrival statistics and prefix reuse of a trace or logs (inputs aligned).

    Logs are read with prefix chains of ``DEFAULT_BLOCK_TOKENS`` (a salt of this read only);
    ``kv_pool`` is the pool the reuse is also modelled in (``oomload.trace.prefix``).
    """
    workers = default_workers() if workers is None else workers
    pool = ReadPool(
        workers, files=len(paths) > 1, min_bytes=parallel_min_bytes, span_bytes=span_bytes, counter=counter
    )
    with pool:
        counts = _count_trace(paths, format, mapping, counter, pool, progress, kv_pool or PoolSize())
        counts.read_notes = tuple(dict.fromkeys([*counts.read_notes, *pool.notes]))
        return counts


def _count_trace(
    paths: Sequence[str | Path],
    format: str | None,
    mapping: ColumnMapping | None,
    counter: TokenCounter | None,
    pool: ReadPool,
    progress: Progress | None,
    kv_pool: PoolSize,
) -> TraceCounts:
    notes: list[str] = []
    if len(paths) == 1 and format in (None, "oomload") and mapping is None and is_trace_file(paths[0]):
        formats: tuple[str, ...] = ("oomload",)
        header = read_trace_header(paths[0])
        tokenizer = header.tokenizer
        info = header.prefix_or_default()

        def streams(skips: SkipLog) -> list[Iterator[pa.Table]]:
            return [_renamed(read_trace_columns(paths[0]))]

    else:
        hasher = build_hasher(DEFAULT_BLOCK_TOKENS)
        plans = plan_inputs(paths, format=format, mapping=mapping, hasher=hasher)
        formats = tuple(dict.fromkeys(plan.format for plan in plans))
        tokenizer = None if counter is None else counter.name
        info, note = header_prefix([plan_prefix(p, hasher) for p in plans], 0)
        if note is not None:
            notes.append(note)

        def streams(skips: SkipLog) -> list[Iterator[pa.Table]]:
            prefetch(plans, pool)
            return [input_batches(plan, skips, counter, pool=pool, progress=progress) for plan in plans]

    skips = SkipLog()
    prompt, output, total = LengthCounts(), LengthCounts(), LengthCounts()
    failed = 0
    arrivals = ArrivalCounter()
    block_notes: list[str] = []  # a server block that is no multiple of the trace's: said when ids are
    tally = kv_pool.tally(info, block_notes)
    inputs = streams(skips)
    meters = [ClockMeter() for _ in inputs]
    for index, batches in enumerate(inputs):
        for batch in meters[index].observe(batches):
            p = np.asarray(batch.column("prompt_tokens"), dtype=np.int64)
            o = np.asarray(batch.column("output_tokens"), dtype=np.int64)
            prompt.add(p)
            output.add(o)
            total.add(p + o)
            failed += int(np.count_nonzero(~np.asarray(pc.fill_null(batch.column("ok"), True), dtype=bool)))
            if len(inputs) == 1:
                arrivals.add(np.asarray(batch.column("time_s"), dtype=np.float64))
                _tally(tally, batch)
    if prompt.count == 0:
        raise TraceFormatError(nothing_usable(skips), ", ".join(str(p) for p in paths))
    alignment = align_inputs(meters) if len(inputs) > 1 else None
    offsets_s = (0.0,) if alignment is None else alignment.offsets_s
    if len(inputs) > 1:  # a second pass: the inputs merged in time order, shifted onto one timeline
        pool.close()
        pool.files = True
        timelines = [
            shifted(batches, offset_s)
            for batches, offset_s in zip(streams(SkipLog()), offsets_s, strict=True)
        ]
        in_order = True
        for batch in merge_batches(timelines):
            _tally(tally, batch)  # every request, in time order
            in_order = in_order and arrivals.add(np.asarray(batch.column("time_s"), dtype=np.float64))
    if arrivals.in_order:
        stats = arrivals.result()
    else:  # an input out of time order: its times whole (8 bytes a request), in one more pass
        pool.close()
        pool.files = len(paths) > 1
        times = [
            np.asarray(batch.column("time_s"), dtype=np.float64) + offset_s
            for batches, offset_s in zip(streams(SkipLog()), offsets_s, strict=True)
            for batch in batches
        ]
        pool.close()
        stats = summarize_arrivals(np.concatenate(times))
    prefix = _prefix_result(tally, skips)
    if prefix.requests_with_ids:  # no block in the trace: no block size to speak of
        notes += block_notes
    return TraceCounts(
        arrivals=stats,
        failed=failed,
        prompt_tokens=prompt,
        output_tokens=output,
        total_tokens=total,
        formats=formats,
        tokenizer=tokenizer,
        skips=skips,
        alignment=alignment,
        read_notes=tuple(notes),
        prefix=prefix,
    )


def _tally(tally: PrefixTally, batch: pa.Table) -> None:
    """Feed a batch's requests, in order, to the prefix tally (a batch without ids or sessions at once)."""
    ids_column = batch.column("hash_ids")
    if batch.column("session").null_count == batch.num_rows and pc.sum(
        pc.fill_null(pc.list_value_length(ids_column), 0)
    ).as_py() in (0, None):
        p = np.asarray(batch.column("prompt_tokens"), dtype=np.int64)
        o = np.asarray(batch.column("output_tokens"), dtype=np.int64)
        block = tally.block_tokens
        tally.add_without_ids(batch.num_rows, int(p.sum()), int((-(-(p + o) // block)).sum()))
        return
    prompt = batch.column("prompt_tokens").to_pylist()
    output = batch.column("output_tokens").to_pylist()
    hash_ids = batch.column("hash_ids").to_pylist()
    session = batch.column("session").to_pylist()
    for ids, p, o, s in zip(hash_ids, prompt, output, session, strict=True):
        tally.add(ids, p, o, s)


def _prefix_result(tally: PrefixTally, skips: SkipLog) -> PrefixStats:
    """The tally's result; the truncated chains the read counted are added to the logs' info."""
    result = tally.result()
    if skips.truncated_requests:
        info = result.info
        truncated = PrefixInfo(
            info.block_tokens, info.source, info.exact, info.truncated_requests + skips.truncated_requests
        )
        return dataclasses.replace(result, info=truncated)
    return result


def _renamed(tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """Trace tables with ``arrival_s`` named ``time_s``, like the log readers' batches."""
    for table in tables:
        yield table.rename_columns(["time_s" if n == "arrival_s" else n for n in table.column_names])
