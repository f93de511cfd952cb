"""A trace, or logs, as the numpy columns ``trace stats`` needs (not one Python object per request).

``load_columns`` reads an oomload trace with pyarrow's JSON reader, or each log input with its
reader, keeping four columns per input: time, prompt and output tokens, success. Several inputs are
put on one timeline as ``build`` does (``oomload.ingest.clocks``): here the whole columns are in
memory, so each input's range is known at once and its offset is added in place. Arrival times
are then made relative to the earliest request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from oomload.errors import TraceFormatError
from oomload.ingest.build import ClockMeter, align_inputs, iter_source_batches, plan_inputs
from oomload.ingest.clocks import ClockAlignment
from oomload.ingest.columns import read_trace_columns
from oomload.ingest.mapping import ColumnMapping
from oomload.ingest.skips import SkipLog, nothing_usable
from oomload.ingest.tokens import TokenCounter
from oomload.trace import is_trace_file, read_trace_header


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
