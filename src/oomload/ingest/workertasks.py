"""What a read worker runs (``oomload.ingest.parallel`` keeps the pool and the order of results).

- ``span_task``: a byte range of one file (JSONL lines, or CSV rows after the header line) read
  with the ordinary reader; it sends back its batches (``Sent``: columns as ``Packed``, trace lines
  it rendered as ``RenderedLines``, or rows ``Stored`` in an Arrow IPC file for ``render_task`` to
  number and render once the writer knows where they start), its skip counts with the first
  examples as line numbers from the range's start (``LineSkips``), its notes and the requests it
  gave no time. A CSV range with a line holding an odd number of ``"`` (``quoted_newline``: a
  quoted value may go on to the next line) reads nothing and says so.
- ``file_task``: a whole input read with any reader, streamed into an Arrow IPC file.
- ``worker_init`` / ``start_worker``: a worker ignores Ctrl-C and SIGTERM (the main process stops
  the pool) and exits within ``PARENT_CHECK_S`` of its main process's death; it starts at once and
  pays its first conversions (pyarrow's pandas import, the render kernels) while the first range is
  read.
- ``counter_recipe`` / ``worker_counter``: a ``--tokenizer`` travels as the value that loads it,
  loaded once per worker.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, cast

import numpy as np
import pyarrow as pa

from oomload.errors import OomloadError, TraceFormatError
from oomload.ingest.columns import BATCH_SCHEMA, format_lines, lines_bytes, make_batch
from oomload.ingest.inputs import InputPlan, iter_source_batches, with_pseudonyms
from oomload.ingest.openai_fast import read_openai_batches
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import LogSource
from oomload.ingest.tabular import csv_header, read_csv_batches
from oomload.ingest.tokens import TokenCounter, load_token_counter, reload_spec
from oomload.ingest.writer import RenderedLines, RowTimes, WorkerRows

PARENT_CHECK_S = 0.5  # how often a worker checks that its main process is still there


@dataclass(slots=True)
class SpanResult:
    batches: list[Sent]
    counts: dict[str, int]
    examples: dict[str, list[int]]
    notes: list[str]
    untimed: int = 0
    unreadable_times: int = 0  # requests whose time could not be read (``oomload.ingest.untimed``)
    lines: int | None = None  # a CSV span's rows (a JSONL span's lines: ``_LineCount``, when needed)
    error: str | None = None
    quoted_newline: bool = False  # a CSV span with a quoted value that may span lines: not read


@dataclass(slots=True)
class FileResult:
    ipc_path: str
    counts: dict[str, int]
    examples: dict[str, list[str]]
    notes: list[str]
    error: str | None = None
    error_kind: str = "trace"
    truncated_requests: int = 0


Sent: TypeAlias = "Packed | RenderedLines | Stored"  # a batch as a span task sends it (``_sent``)
CounterRecipe = tuple[str, Any] | None  # how a worker gets the build's token counter (``counter_recipe``)
_WORKER_COUNTERS: dict[str, TokenCounter] = {}  # in a worker: each tokenizer loaded once


def counter_recipe(counter: TokenCounter | None) -> CounterRecipe:
    """A token counter as sent to workers: the ``--tokenizer`` value that loads it (loaded once per
    worker, as tokenizers are big and some cannot be pickled), or else the counter itself."""
    if counter is None:
        return None
    spec = reload_spec(counter)
    return ("object", counter) if spec is None else ("spec", spec)


def worker_counter(recipe: CounterRecipe) -> TokenCounter | None:
    if recipe is None:
        return None
    kind, value = recipe
    if kind == "object":
        return cast(TokenCounter, value)
    if value not in _WORKER_COUNTERS:
        _WORKER_COUNTERS[value] = load_token_counter(value)
    return _WORKER_COUNTERS[value]


def span_task(
    plan: Any,
    span: tuple[int, int],
    origin_s: float | None = None,
    recipe: CounterRecipe = None,
    scratch: str | None = None,
) -> SpanResult:
    assert isinstance(plan, InputPlan)
    source = LogSource(plan.source.path, span=span)
    skips = _LineSkips()
    untimed: list[tuple[int, int]] = []  # (without a time, with one that could not be read) of the span
    if plan.layout is not None:
        return _csv_span_task(plan, source, skips, origin_s, scratch)
    try:
        counter = worker_counter(recipe)
        if plan.format == "openai":
            batches = list(
                with_pseudonyms(
                    plan.pseudonyms,
                    read_openai_batches(
                        source,
                        skips,
                        counter,
                        on_untimed=lambda *counts: untimed.append(counts),
                        hasher=plan.hasher,
                    ),
                )
            )
        else:
            spanned = InputPlan(source, plan.format, hasher=plan.hasher, pseudonyms=plan.pseudonyms)
            batches = list(iter_source_batches(spanned, skips, counter))
    except OomloadError as err:
        return SpanResult([], {}, {}, [], error=str(err))
    sent = _sent(batches, origin_s, scratch)
    return SpanResult(
        sent,
        skips.counts,
        skips.lines,
        list(skips.notes),
        sum(n for n, _ in untimed),
        sum(n for _, n in untimed),
    )


def _csv_span_task(
    plan: Any, source: LogSource, skips: _LineSkips, origin_s: float | None, scratch: str | None
) -> SpanResult:
    """A span of a CSV log's rows; its ``lines`` are its rows (the single-process reader's numbering)."""
    assert source.span is not None
    if quoted_newline(source.path, source.span):
        return SpanResult([], {}, {}, [], quoted_newline=True)
    try:
        names = csv_header(LogSource(source.path))
        batches = list(
            with_pseudonyms(plan.pseudonyms, read_csv_batches(source, plan.layout, skips, names=names))
        )
    except OomloadError as err:
        return SpanResult([], {}, {}, [], error=str(err))
    rows = sum(batch.num_rows for batch in batches) + sum(skips.counts.values())
    return SpanResult(
        _sent(batches, origin_s, scratch), skips.counts, skips.lines, list(skips.notes), lines=rows
    )


def _sent(batches: list[pa.Table], origin_s: float | None, scratch: str | None) -> list[Sent]:
    """A span's batches as sent to the main process. With ``origin_s`` (the trace's origin: a build of
    one input), a batch that needs nothing from the spans before (no request waiting for the previous
    span's time) is rendered here when every row has its id; when every id is generated (``r<N>``,
    N counted over the trace), consecutive such batches are stored in ``scratch`` for a second task,
    started by the writer with their first index (``render_task``). Any other batch is packed."""
    sent: list[Sent] = []
    stored: list[pa.Table] = []
    for batch in batches:
        leading = bool((batch.schema.metadata or {}).get(b"leading_untimed"))
        missing = batch.column("id").null_count
        if (
            origin_s is None
            or scratch is None
            or leading
            or 0 < missing < batch.num_rows
            or not batch.num_rows
        ):
            sent += _flushed(stored, scratch)
            sent.append(Packed.of(batch))
        elif missing == 0:
            sent += _flushed(stored, scratch)
            sent.append(RenderedLines.of(batch, origin_s))
        else:
            stored.append(batch)
    return sent + _flushed(stored, scratch)


@dataclass(frozen=True, slots=True)
class Stored:
    """Parsed rows in an Arrow IPC file of the pool's scratch directory, with their times."""

    path: str
    times: RowTimes


def _flushed(stored: list[pa.Table], scratch: str | None) -> list[Stored]:
    if not stored:
        return []
    assert scratch is not None
    table = pa.concat_tables(stored)
    stored.clear()
    fd, path = tempfile.mkstemp(suffix=".arrow", dir=scratch)
    with os.fdopen(fd, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.replace_schema_metadata(None))
    return [Stored(path, WorkerRows.times_of(table))]


def render_task(stored: str, origin_s: float, first_index: int) -> str:
    """Stored rows rendered, ids from ``r<first_index>``, into a scratch file beside them (its path)."""
    with pa.memory_map(stored) as source:
        table = pa.ipc.open_stream(source).read_all()
    os.unlink(stored)
    fd, path = tempfile.mkstemp(suffix=".jsonl", dir=os.path.dirname(stored))
    with os.fdopen(fd, "wb") as out:
        out.write(lines_bytes(format_lines(table, origin_s=origin_s, first_index=first_index)))
    return path


@dataclass(frozen=True, slots=True)
class Packed:
    """A batch as sent between processes: its all-null columns left out (a null int64 column of a
    million rows pickles as 8 MB of zeros), put back by ``table``."""

    rows: int
    columns: dict[str, pa.Array | pa.ChunkedArray]
    metadata: dict[bytes, bytes] | None

    @classmethod
    def of(cls, batch: pa.Table) -> Packed:
        columns = {name: batch.column(name) for name in batch.column_names}
        kept = {name: column for name, column in columns.items() if column.null_count < batch.num_rows}
        return cls(batch.num_rows, kept, batch.schema.metadata)

    def table(self) -> pa.Table:
        batch = make_batch(self.rows, **self.columns)
        return batch if self.metadata is None else batch.replace_schema_metadata(self.metadata)


def quoted_newline(path: Path, span: tuple[int, int]) -> bool:
    """Whether a line of ``path[span]`` holds an odd number of ``"``: a quoted value may go on to the
    next line there, where a span could start inside it (in RFC 4180 CSV a quoted value that holds
    a newline leaves an odd count on its first line; one that holds none leaves every count even)."""
    with open(path, "rb") as fh:
        fh.seek(span[0])
        data = fh.read(span[1] - span[0])
    if b'"' not in data:
        return False
    raw = np.frombuffer(data, dtype=np.uint8)
    quotes = np.flatnonzero(raw == ord('"'))
    newlines = np.flatnonzero(raw == ord("\n"))
    per_line = np.bincount(np.searchsorted(newlines, quotes), minlength=newlines.size + 1)
    return bool((per_line % 2).any())


def start_worker() -> None:
    """A task that only starts its worker: every worker starts at once, while the first span is read,
    instead of one after the other as spans are submitted. It pays now what the worker's first batch
    would: pyarrow imports pandas the first time it converts a Python list (~0.2 s here), and the
    kernels that render trace lines load on first use."""
    lines_bytes(
        format_lines(
            make_batch(1, time_s=[0.0], prompt_tokens=[1], output_tokens=[1]), origin_s=0, first_index=0
        )
    )


WORKER_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # the main process's to act on, never a worker's


def worker_init(parent: int) -> None:
    """Workers leave Ctrl-C and SIGTERM (sent to the whole process group) to the main process, which
    stops the pool: no traceback per worker, no worker gone before the main process has cleaned up.
    A worker starts with both blocked (``parallel._held_while_spawning``): ignoring them here drops one
    that came while it imported. And a worker whose main process is gone (killed, out of memory) exits
    within a second instead of waiting forever for its next task."""
    for number in WORKER_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_SIGNALS)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="oomload-parent-watch", daemon=True).start()


def file_task(plan: Any, directory: str, recipe: CounterRecipe = None) -> FileResult:
    fd, name = tempfile.mkstemp(suffix=".arrow", dir=directory)
    os.close(fd)
    skips = SkipLog()
    try:
        counter = worker_counter(recipe)
        with pa.OSFile(name, "wb") as sink, pa.ipc.new_stream(sink, BATCH_SCHEMA) as writer:
            for batch in iter_source_batches(plan, skips, counter):
                writer.write_table(batch.replace_schema_metadata(None))
    except OomloadError as err:
        kind = "trace" if isinstance(err, TraceFormatError) else type(err).__name__
        return FileResult(name, {}, {}, [], error=str(err), error_kind=kind)
    return FileResult(
        name, skips.counts, skips.examples, list(skips.notes), truncated_requests=skips.truncated_requests
    )


class _LineSkips(SkipLog):
    """A worker's skip log: the first examples kept as line numbers, to be moved to the file's."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, list[int]] = {}

    def skip(self, reason: str, path: str, line: int | None) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.lines.setdefault(reason, [])
        if len(shown) < self.keep and line is not None:
            shown.append(line)
