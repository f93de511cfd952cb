"""Writing a trace file from batches: a streamed body, a header known only at the end, an atomic rename.

1. ``write_body`` renders each batch to trace lines with vectorized kernels (``columns.format_lines``)
   and appends them to a scratch body file; the first request's time is the origin
   (``arrival_s = 0``). It notes whether the times ever went backwards.
2. ``finish_trace`` writes the header — which needs the skip counts and clock alignment, known only
   after the last batch — into the final scratch file, then appends the body: copied as is when it
   was in time order, otherwise read back in columns (a few hundred bytes per request), sorted by
   time (stable) and rebased on the earliest request. The scratch file is then renamed into place,
   so a failed build never leaves a half-written trace.

``TraceScratch`` names the two scratch files next to the output and removes them whatever happens.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from oomload.ingest.columns import TRACE_SCHEMA, format_lines, lines_bytes, make_batch
from oomload.trace import TraceHeader

COPY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BodyWritten:
    """How many requests ``write_body`` wrote, and whether their times never went backwards."""

    count: int
    in_order: bool


@dataclass(frozen=True, slots=True)
class TraceScratch:
    """The scratch files of one build (``with`` removes them, whether the build succeeded or not)."""

    out: Path

    @property
    def body(self) -> Path:
        return self.out.with_name(self.out.name + ".body.tmp")

    @property
    def final(self) -> Path:
        return self.out.with_name(self.out.name + ".tmp")

    def __enter__(self) -> TraceScratch:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        for temp in (self.body, self.final):
            temp.unlink(missing_ok=True)


def write_body(body_path: Path, batches: Iterable[pa.Table]) -> BodyWritten:
    """Render ``batches`` as trace lines into ``body_path`` (overwritten), origin = the first request."""
    count = 0
    origin_s: float | None = None
    last_s = -np.inf
    in_order = True
    with open(body_path, "wb") as body:
        for batch in batches:
            times = np.asarray(batch.column("time_s"), dtype=np.float64)
            if origin_s is None:
                origin_s = float(times[0])
            if in_order and (times[0] < last_s or (len(times) > 1 and bool((np.diff(times) < 0).any()))):
                in_order = False
            last_s = max(last_s, float(times.max()))
            body.write(lines_bytes(format_lines(batch, origin_s=origin_s, first_index=count)))
            count += batch.num_rows
    return BodyWritten(count, in_order)


def finish_trace(scratch: TraceScratch, header: TraceHeader, written: BodyWritten) -> None:
    """Header + body (sorted when it was not in time order) into ``scratch.out``, atomically."""
    with open(scratch.final, "wb") as final:
        final.write(orjson.dumps(header.to_json()) + b"\n")
        if written.in_order:
            with open(scratch.body, "rb") as body_in:
                shutil.copyfileobj(body_in, final, COPY_BYTES)
        else:
            _write_sorted(scratch.body, final)
    os.replace(scratch.final, scratch.out)


def _write_sorted(body_path: Path, final: IO[bytes]) -> None:
    options = pa_json.ParseOptions(explicit_schema=TRACE_SCHEMA, unexpected_field_behavior="ignore")
    table = pa_json.read_json(str(body_path), parse_options=options)
    table = table.take(pc.sort_indices(table, sort_keys=[("arrival_s", "ascending")]))
    columns = {name: table.column(name) for name in table.column_names if name != "arrival_s"}
    batch = make_batch(table.num_rows, time_s=table.column("arrival_s"), **columns)
    origin_s = float(pc.min(table.column("arrival_s")).as_py())
    final.write(lines_bytes(format_lines(batch, origin_s=origin_s, first_index=0)))
