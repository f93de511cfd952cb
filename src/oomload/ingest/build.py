"""From log files to a trace: plan the inputs, stream their batches in time order, write or summarize.

1. **Plan** (``plan_inputs``): every input is opened, its format detected (or forced) and its
   columns checked *before* anything is written, so an unknown format, an empty or unreadable file
   or a mapping naming a missing column fails fast with one sentence.
2. **Stream** (``iter_batches``): one input streams its batches as they are parsed; several inputs
   are merged by absolute time with ``heapq.merge`` (each log is assumed to be in time order,
   which the writer checks).
3. **Write** (``write_trace_file``): batches are rendered to trace lines by vectorized kernels and
   appended to a temporary body file; the first record's time is the origin (``arrival_s = 0``).
   If the merged stream turns out not to be in time order (e.g. a gateway that logs at completion),
   the body is read back (columnar, a few hundred bytes per request), sorted by time (stable) and rebased on
   the earliest request. The header — which needs the skip counts known only at the end — is
   written first into the final file, then the body is copied after it, and the file is renamed
   into place, so a failed build never leaves a half-written trace.
"""

from __future__ import annotations

import heapq
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from oomload.errors import TraceFormatError
from oomload.ingest.columns import (
    TRACE_SCHEMA,
    batches_from_records,
    format_lines,
    lines_bytes,
    make_batch,
    read_trace_columns,
    records_from_batch,
)
from oomload.ingest.detect import detect_format
from oomload.ingest.mapping import ColumnMapping, check_jsonl_mapping, csv_layout, read_mapped_jsonl_records
from oomload.ingest.mooncake import read_mooncake_batches
from oomload.ingest.openai_log import read_openai_records
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import LogSource
from oomload.ingest.tabular import AZURE, BURSTGPT, CsvLayout, check_layout, read_csv_batches
from oomload.ingest.tokens import TokenCounter
from oomload.ingest.vllm_log import read_vllm_records
from oomload.trace import TraceHeader, TraceRecord, iter_trace


@dataclass(frozen=True, slots=True)
class InputPlan:
    """One input file, its format and (for CSV formats) its column layout."""

    source: LogSource
    format: str
    layout: CsvLayout | None = None
    mapping: ColumnMapping | None = None


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What ``build_trace`` wrote, and what it could not use."""

    out_path: Path
    records_written: int
    formats: tuple[str, ...]
    skipped: dict[str, int]
    skipped_examples: dict[str, list[str]]
    notes: tuple[str, ...]
    reordered: bool
    tokenizer: str | None = None


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


def plan_inputs(
    paths: Sequence[str | Path], *, format: str | None = None, mapping: ColumnMapping | None = None
) -> list[InputPlan]:
    """Detect and check every input up front (see the module docstring)."""
    if not paths:
        raise TraceFormatError("no input files given")
    plans = []
    for path in paths:
        source = LogSource(Path(path))
        fmt = detect_format(source, forced=format, mapped=mapping is not None)
        layout = None
        if fmt == "azure":
            layout = AZURE
            check_layout(source, layout, "an Azure trace")
        elif fmt == "burstgpt":
            layout = BURSTGPT
            check_layout(source, layout, "a BurstGPT trace")
        elif fmt == "csv":
            assert mapping is not None
            layout = csv_layout(source, mapping)
        elif fmt == "jsonl":
            assert mapping is not None
            check_jsonl_mapping(source, mapping)
        plans.append(InputPlan(source, fmt, layout, mapping))
    return plans


def iter_source_batches(plan: InputPlan, skips: SkipLog, counter: TokenCounter | None) -> Iterator[pa.Table]:
    """The batches of one input, ``time_s`` on that log's clock."""
    source = plan.source
    if plan.layout is not None:
        yield from read_csv_batches(source, plan.layout, skips)
    elif plan.format == "mooncake":
        yield from read_mooncake_batches(source, skips)
    elif plan.format == "openai":
        yield from batches_from_records(read_openai_records(source, skips, counter))
    elif plan.format == "vllm-log":
        yield from batches_from_records(read_vllm_records(source, skips, counter))
    elif plan.format == "jsonl":
        assert plan.mapping is not None
        yield from batches_from_records(read_mapped_jsonl_records(source, plan.mapping, skips))
    elif plan.format == "oomload":
        yield from batches_from_records(iter_trace(source.path))
    else:  # pragma: no cover - plan_inputs only yields known formats
        raise TraceFormatError(f"no reader for format {plan.format!r}", source.path)


def iter_batches(
    plans: Sequence[InputPlan], skips: SkipLog, counter: TokenCounter | None
) -> Iterator[pa.Table]:
    """All inputs' batches; several inputs are merged by absolute time (record by record)."""
    if len(plans) == 1:
        yield from iter_source_batches(plans[0], skips, counter)
        return
    streams = [_records(iter_source_batches(plan, skips, counter)) for plan in plans]
    merged = heapq.merge(*streams, key=lambda record: record.arrival_s)
    yield from batches_from_records(merged)


def iter_records(
    paths: Sequence[str | Path],
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    counter: TokenCounter | None = None,
    skips: SkipLog | None = None,
) -> Iterator[TraceRecord]:
    """Records from logs, ``arrival_s`` relative to the first one (logs assumed in time order)."""
    skips = SkipLog() if skips is None else skips
    origin: float | None = None
    for batch in iter_batches(plan_inputs(paths, format=format, mapping=mapping), skips, counter):
        if origin is None:
            origin = float(batch.column("time_s")[0].as_py())
        yield from records_from_batch(batch, origin_s=origin)


def _records(batches: Iterable[pa.Table]) -> Iterator[TraceRecord]:
    for batch in batches:
        yield from records_from_batch(batch)


def build_trace(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    counter: TokenCounter | None = None,
    strict: bool = False,
) -> BuildResult:
    """Read the logs, write a trace to ``out``; raises ``TraceFormatError`` when nothing usable was found."""
    plans = plan_inputs(paths, format=format, mapping=mapping)
    skips = SkipLog(strict=strict)
    out_path = Path(out)
    formats = tuple(dict.fromkeys(plan.format for plan in plans))

    def header(reordered: bool) -> TraceHeader:
        extra: dict[str, Any] = {"skipped": skips.as_dict()}
        if skips.notes:
            extra["notes"] = list(skips.notes)
        if reordered:
            extra["reordered"] = True
        return TraceHeader(
            source=tuple(str(plan.source.path) for plan in plans),
            format="+".join(formats),
            tokenizer=None if counter is None else counter.name,
            extra=extra,
        )

    count, reordered = write_trace_file(out_path, iter_batches(plans, skips, counter), header)
    if count == 0:
        raise TraceFormatError(_nothing_usable(skips), ", ".join(str(p) for p in paths))
    return BuildResult(
        out_path=out_path,
        records_written=count,
        formats=formats,
        skipped=skips.as_dict(),
        skipped_examples=dict(skips.examples),
        notes=tuple(skips.notes),
        reordered=reordered,
        tokenizer=None if counter is None else counter.name,
    )


def _nothing_usable(skips: SkipLog) -> str:
    if not skips.counts:
        return "no requests found in the input"
    reasons = "; ".join(f"{reason}: {n}" for reason, n in skips.as_dict().items())
    return f"no usable requests in the input ({skips.total} lines skipped — {reasons})"


def write_trace_file(out: Path, batches: Iterable[pa.Table], header: Any) -> tuple[int, bool]:
    """Write ``batches`` as a trace at ``out``; ``header(reordered)`` gives the header at the end.

    Returns ``(records written, whether the input had to be re-sorted)``; writes nothing when empty.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    body_path = out.with_name(out.name + ".body.tmp")
    final_path = out.with_name(out.name + ".tmp")
    count = 0
    origin: float | None = None
    last_time = -np.inf
    in_order = True
    try:
        with open(body_path, "wb") as body:
            for batch in batches:
                times = np.asarray(batch.column("time_s"), dtype=np.float64)
                if origin is None:
                    origin = float(times[0])
                if in_order and (
                    times[0] < last_time or (len(times) > 1 and bool((np.diff(times) < 0).any()))
                ):
                    in_order = False
                last_time = max(last_time, float(times.max()))
                body.write(lines_bytes(format_lines(batch, origin_s=origin, first_index=count)))
                count += batch.num_rows
        if count == 0:
            return 0, False
        with open(final_path, "wb") as final:
            final.write(orjson.dumps(header(not in_order).to_json()) + b"\n")
            if in_order:
                with open(body_path, "rb") as body_in:
                    shutil.copyfileobj(body_in, final, 4 * 1024 * 1024)
            else:
                _write_sorted(body_path, final)
        os.replace(final_path, out)
        return count, not in_order
    finally:
        for temp in (body_path, final_path):
            temp.unlink(missing_ok=True)


def _write_sorted(body_path: Path, final: Any) -> None:
    options = pa_json.ParseOptions(explicit_schema=TRACE_SCHEMA, unexpected_field_behavior="ignore")
    table = pa_json.read_json(str(body_path), parse_options=options)
    table = table.take(pc.sort_indices(table, sort_keys=[("arrival_s", "ascending")]))
    columns = {name: table.column(name) for name in table.column_names if name != "arrival_s"}
    batch = make_batch(table.num_rows, time_s=table.column("arrival_s"), **columns)
    origin = float(pc.min(table.column("arrival_s")).as_py())
    final.write(lines_bytes(format_lines(batch, origin_s=origin, first_index=0)))


def load_columns(
    paths: Sequence[str | Path],
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    counter: TokenCounter | None = None,
) -> TraceColumns:
    """Arrival times (relative to the earliest), lengths and status of a trace or of logs."""
    from oomload.trace import is_trace_file, read_trace_header

    arrival: list[npt.NDArray[np.float64]] = []
    prompt: list[npt.NDArray[np.int64]] = []
    output: list[npt.NDArray[np.int64]] = []
    ok: list[npt.NDArray[np.bool_]] = []
    skips = SkipLog()
    if len(paths) == 1 and format in (None, "oomload") and mapping is None and is_trace_file(paths[0]):
        trace_header = read_trace_header(paths[0])
        for table in read_trace_columns(paths[0]):
            arrival.append(np.asarray(table.column("arrival_s"), dtype=np.float64))
            prompt.append(np.asarray(table.column("prompt_tokens"), dtype=np.int64))
            output.append(np.asarray(table.column("output_tokens"), dtype=np.int64))
            ok.append(np.asarray(pc.fill_null(table.column("ok"), True), dtype=bool))
        formats: tuple[str, ...] = ("oomload",)
        tokenizer = trace_header.tokenizer
    else:
        plans = plan_inputs(paths, format=format, mapping=mapping)
        for batch in iter_batches(plans, skips, counter):
            arrival.append(np.asarray(batch.column("time_s"), dtype=np.float64))
            prompt.append(np.asarray(batch.column("prompt_tokens"), dtype=np.int64))
            output.append(np.asarray(batch.column("output_tokens"), dtype=np.int64))
            ok.append(np.asarray(pc.fill_null(batch.column("ok"), True), dtype=bool))
        formats = tuple(dict.fromkeys(plan.format for plan in plans))
        tokenizer = None if counter is None else counter.name
    if not arrival:
        raise TraceFormatError(_nothing_usable(skips), ", ".join(str(p) for p in paths))
    times = np.concatenate(arrival)
    return TraceColumns(
        arrival_s=times - times.min(),
        prompt_tokens=np.concatenate(prompt),
        output_tokens=np.concatenate(output),
        ok=np.concatenate(ok),
        formats=formats,
        tokenizer=tokenizer,
        skips=skips,
    )
