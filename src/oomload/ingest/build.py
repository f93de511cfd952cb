"""From log files to a trace: plan the inputs, stream their batches on one timeline, write or summarize.

1. **Plan** (``oomload.ingest.inputs.plan_inputs``): every input is opened, its format detected
   (or forced) and its columns checked *before* anything is written, so an unknown format, an
   empty or unreadable file or a mapping naming a missing column fails fast with one sentence.
2. **Stream** (``iter_batches``): one input streams its batches as they are parsed; several inputs
   are merged by time with ``heapq.merge`` (each log is assumed to be in time order, which the
   writer checks), after adding each input's clock offset.
3. **Align** (``oomload.ingest.clocks``): several inputs share one clock only when their clocks are
   of one kind (all wall-clock or all since-start) and their time ranges overlap or follow each
   other; otherwise each input is rebased to its own start. ``build_trace`` learns the ranges
   while it writes (one pass on the shared clock) and, when they turn out not to share one, writes
   again with the offsets — so only such builds read their inputs twice; ``iter_records`` measures
   the ranges in a first pass (``oomload.ingest.counts`` holds the columns and shifts them).
4. **Write** (``oomload.ingest.writer``): streamed body, header at the end, atomic rename.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from oomload.errors import TraceFormatError
from oomload.ingest.clocks import ClockAlignment, ClockRange, align_clocks
from oomload.ingest.columns import records_from_batch
from oomload.ingest.inputs import InputPlan, plan_inputs
from oomload.ingest.keepfreed import retain_freed_memory
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
from oomload.ingest.prefixes import build_salt, header_prefix, input_prefix, salt_header
from oomload.ingest.skips import SkipLog, nothing_usable
from oomload.ingest.tokens import TokenCounter
from oomload.ingest.writer import TraceScratch, check_output_path, finish_trace, write_body
from oomload.trace.model import PrefixInfo, TraceHeader, TraceRecord
from oomload.trace.prefix import DEFAULT_BLOCK_TOKENS, BlockHasher
from oomload.trace.pseudonyms import Pseudonyms


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What ``build_trace`` wrote, what it could not use, and how it aligned several inputs."""

    out_path: Path
    records_written: int
    formats: tuple[str, ...]
    skips: SkipLog
    reordered: bool
    tokenizer: str | None = None
    alignment: ClockAlignment | None = None  # None for a single input
    read_notes: tuple[str, ...] = ()  # how the inputs were read (e.g. not in byte ranges), not in the trace
    prefix: PrefixInfo | None = None  # the header's prefix object


@dataclass(slots=True)
class ClockMeter:
    """The time range of the batches that pass through ``observe`` (raw times, before any offset)."""

    start_s: float = math.inf
    end_s: float = -math.inf

    def observe(self, batches: Iterable[pa.Table]) -> Iterator[pa.Table]:
        for batch in batches:
            if batch.num_rows:
                extremes = pc.min_max(batch.column("time_s"))
                self.start_s = min(self.start_s, extremes["min"].as_py())
                self.end_s = max(self.end_s, extremes["max"].as_py())
            yield batch

    @property
    def empty(self) -> bool:
        return self.start_s > self.end_s


def iter_batches(
    plans: Sequence[InputPlan],
    skips: SkipLog,
    counter: TokenCounter | None,
    *,
    offsets_s: Sequence[float] | None = None,
    meters: Sequence[ClockMeter] | None = None,
    pool: ReadPool | None = None,
    progress: Progress | None = None,
) -> Iterator[pa.Table]:
    """All inputs' batches, each input's times plus its offset; several inputs merged by time.

    Each input has its own skip log while it is read; they are added to ``skips`` in input order
    at the end, so the counts, examples and notes do not depend on how the reads interleave.
    """
    streams: list[Iterator[pa.Table]] = []
    logs = [skips] if len(plans) == 1 else [SkipLog(strict=skips.strict, keep=skips.keep) for _ in plans]
    prefetch(plans, pool)
    for index, plan in enumerate(plans):
        batches = input_batches(plan, logs[index], counter, pool=pool, progress=progress)
        if meters is not None:
            batches = meters[index].observe(batches)
        if offsets_s is not None and offsets_s[index] != 0.0:
            batches = shifted(batches, offsets_s[index])
        streams.append(batches)
    if len(streams) == 1:
        yield from streams[0]
        return
    yield from merge_batches(streams)
    for log in logs:
        skips.absorb(log)


def merge_batches(streams: Sequence[Iterator[pa.Table]]) -> Iterator[pa.Table]:
    """Batches of several time-ordered streams merged by time, ties in stream order (``heapq.merge``'s order).

    Each round takes, from every stream's current batch, the rows up to the smallest batch end
    ``bound`` among them (the stream that ends there, and those before it, up to and including
    ``bound``; those after it, below ``bound`` — a later batch of the bound stream may still hold
    ``bound``), and sorts them stably by time.
    """
    heads: list[pa.Table | None] = [_next_rows(stream) for stream in streams]
    while True:
        live = [i for i, head in enumerate(heads) if head is not None]
        if not live:
            return
        ends = {i: _running_max(heads[i])[-1] for i in live}
        bound = min(ends.values())
        first = min(i for i in live if ends[i] == bound)
        parts: list[pa.Table] = []
        for i in live:
            head = heads[i]
            assert head is not None
            peak = _running_max(head)
            take = int(np.count_nonzero(peak <= bound if i <= first else peak < bound))
            if take:
                parts.append(head.slice(0, take))
            rest = head.slice(take)
            heads[i] = rest if rest.num_rows else _next_rows(streams[i])
        merged = pa.concat_tables(parts)
        order = np.argsort(np.asarray(merged.column("time_s"), dtype=np.float64), kind="stable")
        yield merged.take(pa.array(order))


def _running_max(batch: pa.Table) -> npt.NDArray[np.float64]:
    return np.maximum.accumulate(np.asarray(batch.column("time_s"), dtype=np.float64))


def _next_rows(stream: Iterator[pa.Table]) -> pa.Table | None:
    for batch in stream:
        if batch.num_rows:
            return batch.replace_schema_metadata(None)
    return None


def shifted(batches: Iterable[pa.Table], offset_s: float) -> Iterator[pa.Table]:
    for batch in batches:
        index = batch.schema.get_field_index("time_s")
        yield batch.set_column(index, "time_s", pc.add(batch.column("time_s"), offset_s))


def align_inputs(meters: Sequence[ClockMeter]) -> ClockAlignment:
    """``align_clocks`` over the inputs that held requests (an empty input keeps offset 0)."""
    used = [index for index, meter in enumerate(meters) if not meter.empty]
    alignment = align_clocks([ClockRange(meters[i].start_s, meters[i].end_s) for i in used])
    offsets_s = [0.0] * len(meters)
    for index, offset_s in zip(used, alignment.offsets_s, strict=True):
        offsets_s[index] = offset_s
    return ClockAlignment(tuple(offsets_s), alignment.shared, alignment.reason)


def iter_records(
    paths: Sequence[str | Path],
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    counter: TokenCounter | None = None,
    skips: SkipLog | None = None,
) -> Iterator[TraceRecord]:
    """Records from logs, ``arrival_s`` relative to the first one (several inputs are read twice)."""
    skips = SkipLog() if skips is None else skips
    plans = plan_inputs(paths, format=format, mapping=mapping)
    offsets_s = None
    if len(plans) > 1:
        meters = [ClockMeter() for _ in plans]
        for _ in iter_batches(plans, SkipLog(), counter, meters=meters):
            pass
        offsets_s = align_inputs(meters).offsets_s
    origin_s: float | None = None
    for batch in iter_batches(plans, skips, counter, offsets_s=offsets_s):
        if origin_s is None:
            origin_s = float(batch.column("time_s")[0].as_py())
        yield from records_from_batch(batch, origin_s=origin_s)


def build_trace(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    counter: TokenCounter | None = None,
    strict: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    parallel_min_bytes: int = PARALLEL_MIN_BYTES,
    span_bytes: int = SPAN_BYTES,
    prefix_block_tokens: int | None = DEFAULT_BLOCK_TOKENS,
    keep_ids: bool = False,
) -> BuildResult:
    """Read the logs, write a trace to ``out``; raises ``TraceFormatError`` when nothing usable was found.

    A bad output path (a directory, a device, an uncreatable parent, one of ``paths``) is refused
    before any input is read (``ConfigError``); ``out`` is replaced only once the whole trace is written.
    ``prefix_block_tokens`` (``None``: off) is the block size of the prefix chains derived from the
    logs (``oomload.ingest.prefixes``). Request ids, sessions and parents are written as salted
    pseudonyms (``oomload.trace.pseudonyms``), or as the logs have them with ``keep_ids``.
    """
    out = check_output_path(out, inputs=paths)
    retain_freed_memory()
    salt = build_salt()
    hasher = None if prefix_block_tokens is None else BlockHasher(salt.salt, prefix_block_tokens)
    pseudonyms = None if keep_ids else Pseudonyms(salt.salt)
    keyed = salt_header(salt, keyed_chains=hasher is not None, pseudonyms=not keep_ids)
    plans = plan_inputs(paths, format=format, mapping=mapping, hasher=hasher, pseudonyms=pseudonyms)
    formats = tuple(dict.fromkeys(plan.format for plan in plans))
    tokenizer = None if counter is None else counter.name
    meters = [ClockMeter() for _ in plans] if len(plans) > 1 else None
    alignment = None
    sources = tuple(str(plan.source.path) for plan in plans)
    guess = TraceHeader(  # the header of a clean build; finish_trace rewrites the file when it is not
        sources, "+".join(formats), tokenizer, _header_extra(SkipLog(), None, keyed, reordered=False)
    )
    workers = default_workers() if workers is None else workers
    with (
        TraceScratch(out) as scratch,
        ReadPool(
            workers,
            files=len(plans) > 1,
            render=len(plans) == 1,
            min_bytes=parallel_min_bytes,
            span_bytes=span_bytes,
            counter=counter,
            scratch_in=out.parent,  # the trace's disk, which has room for it: not a RAM-backed /tmp
        ) as pool,
    ):
        skips = SkipLog(strict=strict)
        batches = iter_batches(plans, skips, counter, meters=meters, pool=pool, progress=progress)
        written = write_body(scratch, batches, guess)
        if meters is not None:
            alignment = align_inputs(meters)
            if not alignment.shared:  # second pass: each input on its own start
                pool.close()
                pool.files = len(plans) > 1
                skips = SkipLog(strict=strict)
                batches = iter_batches(plans, skips, counter, offsets_s=alignment.offsets_s, pool=pool)
                written = write_body(scratch, batches, guess)
        if written.count == 0:
            raise TraceFormatError(nothing_usable(skips), ", ".join(str(p) for p in paths))
        prefix, prefix_note = header_prefix(
            [plan_prefix(p, hasher) for p in plans],
            skips.truncated_requests,
        )
        if prefix_note is not None:
            skips.note(prefix_note)
        derived_from = _CHAINED_FROM.get(prefix.source)
        if derived_from is not None and written.chained == 0:  # nothing to chain: say so, claim nothing
            skips.note(
                f"no request carried a prompt to chain ({derived_from}): the trace has no prefix ids, and "
                "its reuse is unknown"
            )
            prefix = replace(prefix, source="none", exact=True)
        header = TraceHeader(
            source=sources,
            format="+".join(formats),
            tokenizer=tokenizer,
            extra=_header_extra(skips, alignment, keyed, reordered=not written.in_order),
            prefix=prefix,
        )
        finish_trace(scratch, header, written)
        read_notes = tuple(dict.fromkeys(pool.notes))
    return BuildResult(
        out_path=scratch.out,
        records_written=written.count,
        formats=formats,
        skips=skips,
        reordered=not written.in_order,
        tokenizer=tokenizer,
        alignment=alignment,
        read_notes=read_notes,
        prefix=prefix,
    )


_CHAINED_FROM = {  # the source of chains a build derives → what a request needs for one
    "messages": "its messages or prompt",
    "token-ids": "its prompt token ids",
    "column": "a conversation id",
}


def plan_prefix(plan: InputPlan, hasher: BlockHasher | None) -> PrefixInfo:
    """What one input's ids mean (``oomload.ingest.prefixes.input_prefix``)."""
    conversation = plan.mapping is not None and plan.mapping.conversation is not None
    return input_prefix(plan.source, plan.format, hasher, conversation=conversation)


def _header_extra(
    skips: SkipLog, alignment: ClockAlignment | None, keyed: dict[str, str], *, reordered: bool
) -> dict[str, Any]:
    extra: dict[str, Any] = {"skipped": skips.as_dict(), **keyed}
    if skips.notes:
        extra["notes"] = list(skips.notes)
    if reordered:
        extra["reordered"] = True
    if alignment is not None:
        extra["aligned"] = alignment.description
        if alignment.reason is not None:
            extra["aligned_reason"] = alignment.reason
    return extra
