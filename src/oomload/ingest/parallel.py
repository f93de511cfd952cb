"""Reading big inputs on every core: a process pool over byte spans of one file, and over files.

``input_batches`` gives one input's batches exactly as ``inputs.iter_source_batches`` does, in the
same order, with the same skip counts, examples, line numbers and notes — so a parallel build
writes the same trace, byte for byte, as a single-process one (``tests/unit/ingest/test_parallel.py``
forces many small spans to check it). How:

- **Spans** (uncompressed OpenAI-style JSONL of at least ``PARALLEL_MIN_BYTES``): the file is cut
  into about ``SPAN_BYTES`` spans at line starts; each worker reads its span with the ordinary
  reader (``LogSource(path, span=…)``) and sends back its batches, skip counts with the first
  examples (line numbers counted from the span's start) and the numbers of requests it gave a
  time: those without one, and those whose time could not be read. The main process takes the
  spans in file order: it adds the lines of the spans before to the examples (counted only when a
  span skipped a line: ``_LineCount``), replays them into the caller's ``SkipLog`` (so
  ``--strict`` stops at the first bad line of the file, as it would single-process), gives a
  span's leading requests without a time the time of the request before them (before the file's
  first timed request: its time, their batches held until it comes), and
  notes the two totals once, at the end, as the reader does. ``span_task`` reads
  Mooncake spans too, but Mooncake logs are read in-process: pyarrow's JSON reader already keeps
  2 cores busy there, and a 510 MB Mooncake build spread over 2 workers measured 1.3-1.4× slower.
- **CSV spans** (uncompressed Azure, BurstGPT and mapped CSV of at least ``PARALLEL_MIN_BYTES``):
  the rows after the header line are cut the same way; each worker reads its span with the
  ordinary reader given the header's column names, and its ``lines`` are its rows (blank lines
  are not rows), so the line numbers are the single-process reader's. A span is cut at a line
  start, which is a row start unless a quoted value holds a newline; a worker that finds a line
  with an odd number of ``"`` in its span (``quoted_newline``: where a quoted value may go on to
  the next line) reads nothing, and the main process reads the rest of the file from that span's
  start (a row start: every line before held an even number) itself, noting it in
  ``ReadPool.notes`` (printed by the CLI, not written into the trace, which is the same either way).
- **Rendering in workers** (a build of one input, ``ReadPool.render``): the first span (1 MiB) is
  read by the main process while the workers start; its first request is the trace's origin, and
  with it the workers render the trace lines of every batch that needs nothing from the spans
  before (no leading untimed request), so the main process does little more than write: the bench
  measured it at 0.26-0.57 CPU-s per GB of text-heavy JSONL once started, against 2.3-2.9 for the
  single-process build, and 2.3-2.8 per GB of Azure CSV (mostly the copy below) against 14-16. A
  batch whose rows all have ids is rendered at once (``RenderedLines``). A batch whose ids are all
  generated — ``r<N>``, N the row's index in the trace, which no worker knows while the spans
  before it are still being read — is stored in an Arrow IPC file in the pool's scratch directory;
  when the writer reaches it, knowing the index, it starts a second task (``LinesToRender``) that
  renders those rows into a scratch file, which the writer copies into the trace in the kernel
  (``os.sendfile``). Any other batch (some ids given, some not; requests waiting for the previous
  span's time) is sent as columns (``Packed``: all-null columns left out) and rendered by the
  writer.
- **Whole files** (compressed inputs, vLLM logs, mapped JSONL — any reader): one worker
  reads the file and streams its batches into an Arrow IPC file in a scratch directory, which the
  main process reads back batch by batch (bounded memory) when the merge reaches that input;
  several inputs are thus read at once.

At most ``2 × workers`` spans are in flight, so memory stays bounded whatever the file's size.
Inputs below ``PARALLEL_MIN_BYTES`` stay single-process (starting workers costs more than it
saves; the bench measures the crossover), and so does everything in a process that gevent has
monkey-patched (Locust's), where the pool would block forever. Workers are started with ``spawn``
(the writer's render thread is already running when the pool starts, and forking a threaded
process is unsafe). What a worker runs is ``oomload.ingest.workertasks``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from oomload.errors import OomloadError, TraceFormatError
from oomload.ingest.inputs import iter_source_batches, with_pseudonyms
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import LogSource, ReadMeter
from oomload.ingest.tabular import csv_header, read_csv_batches
from oomload.ingest.tokens import TokenCounter
from oomload.ingest.untimed import LeadingUntimed, untimed_notes
from oomload.ingest.workertasks import (
    WORKER_SIGNALS,
    CounterRecipe,
    FileResult,
    SpanResult,
    Stored,
    counter_recipe,
    file_task,
    render_task,
    span_task,
    start_worker,
    worker_init,
)
from oomload.ingest.writer import LinesToRender, RenderedLines

SPAN_FORMATS = ("openai",)  # Mooncake spans measured slower: the main process renders all (no ids)
CSV_SPAN_FORMATS = ("azure", "burstgpt", "csv")  # CSV logs: spans of rows after the header line
PARALLEL_MIN_BYTES = 64 * 1024 * 1024
SPAN_BYTES = 32 * 1024 * 1024
FIRST_SPAN_BYTES = 1024 * 1024  # when workers render: read by the main process first (it holds the origin)

Progress = Callable[[int, int], None]  # (bytes read, requests read) since the last call


def default_workers() -> int:
    """One per CPU core — on 3 cores or more. On 2, the in-process build already keeps both busy (it
    parses while its writer thread renders): the bench measured 2 workers at 0.88-1.0x its time on a
    676 MB OpenAI log, 0.71-0.85x on 2 GB, 1.1-1.4x on a 364 MB Azure CSV, so the default there is
    this process only (``--workers 2`` still spreads)."""
    cores = os.cpu_count() or 1
    return cores if cores > 2 else 1


def pool_usable() -> bool:
    """False in a process gevent has patched (Locust's): its pool of processes would block forever."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is None or not monkey.is_module_patched("threading")


@dataclass(slots=True)
class ReadPool:
    """One process pool for every input of a build (spans of big files, and whole files)."""

    workers: int
    files: bool = False  # read whole inputs in workers too (several inputs: they are read at once)
    render: bool = False  # workers render trace lines (a build of one input: nothing merges them)
    min_bytes: int = PARALLEL_MIN_BYTES  # smaller inputs (all together, for files) stay in this process
    span_bytes: int = SPAN_BYTES
    _pool: ProcessPoolExecutor | None = None
    _scratch: Path | None = None  # named before it is made: an interrupt cannot orphan it
    _files: dict[Path, Future[FileResult]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how inputs were read (not part of the trace)
    counter: TokenCounter | None = None  # the build's ``--tokenizer``: workers load it once each
    scratch_in: Path | None = None  # where the scratch directory goes (None: the temporary directory)

    @property
    def pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            with _held_while_spawning():
                self._pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=worker_init,
                    initargs=(os.getpid(),),
                )  # kept before any worker starts: an interrupt in the spawns leaves it for ``close``
                for _ in range(self.workers):  # every worker starts now, at once (each submit starts one)
                    self._pool.submit(start_worker)
        return self._pool

    @property
    def scratch(self) -> str:
        """The pool's scratch directory, made on first use: a hidden one in ``scratch_in`` (a build's
        output directory), or one in the temporary directory (``TMPDIR``)."""
        if self._scratch is None:
            name = f"oomload-read-{os.getpid()}-{secrets.token_hex(4)}"
            parent = Path(tempfile.gettempdir()) if self.scratch_in is None else self.scratch_in
            self._scratch = parent / (name if self.scratch_in is None else f".{name}")
            self._scratch.mkdir(mode=0o700)
        return str(self._scratch)

    @property
    def recipe(self) -> CounterRecipe:
        return counter_recipe(self.counter)

    def file_future(self, plan: Any) -> Future[FileResult]:
        path = plan.source.path
        if path not in self._files:
            self._files[path] = self.pool.submit(file_task, plan, self.scratch, self.recipe)
        return self._files[path]

    def close(self) -> None:
        for future in self._files.values():
            if future.done() and future.exception() is None:
                Path(future.result().ipc_path).unlink(missing_ok=True)
        self._files.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> ReadPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def _held_while_spawning() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back while this thread spawns the pool's workers: each worker starts with
    both blocked until ``worker_init`` ignores them, and this process acts on one that came meanwhile
    once the spawns are done.

    A worker imports for a second or more before ``worker_init`` runs, and a Ctrl-C to the whole process
    group in that second would kill it with a traceback. A signal mask is inherited across fork and
    ``exec``, so both are blocked in this thread while it spawns: in a worker such a signal stays
    pending until ``worker_init``'s switch to ignoring drops it. This process must not act on one in
    the middle of a spawn either: a ``KeyboardInterrupt`` between a worker's start and the data it is
    sent killed that worker with a traceback (``EOFError``). A native thread (numpy's, Arrow's) that
    does not block them can still take one, so in the main thread their handlers only note it until
    the spawns are done; then the handlers are put back and the signals noted are raised again, the
    first whose handler raises (Ctrl-C's ``KeyboardInterrupt``) ending it. (Ignoring
    them here instead lost a Ctrl-C that came during the spawns.) The resource tracker is started
    first because its own start unblocks both: CPython guards the tracker's start with the same mask."""
    resource_tracker.ensure_running()
    noted: list[int] = []
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for number in WORKER_SIGNALS:
            if signal.getsignal(number) is not None:  # None: not set from Python, left as it is
                previous[number] = signal.signal(number, lambda signum, _: noted.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one still pending is noted now
        for number, handler in previous.items():
            signal.signal(number, handler)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)  # its own handler acts on it now (Ctrl-C: KeyboardInterrupt)


def plan_spans(path: Path, size: int, span_bytes: int, first: int = 0) -> list[tuple[int, int]]:
    """``[start, end)`` spans of about ``span_bytes`` from byte ``first``, each starting at a line start."""
    count = max(1, -(-(size - first) // span_bytes))
    starts = [first]
    with open(path, "rb") as fh:
        for index in range(1, count):
            fh.seek(max(first + (size - first) * index // count, starts[-1]))
            fh.readline()
            position = fh.tell()
            if position >= size:
                break
            if position > starts[-1]:
                starts.append(position)
    return [(start, end) for start, end in zip(starts, [*starts[1:], size], strict=True)]


def _line_start_after(path: Path, offset: int) -> int:
    """The start of the first line after byte ``offset`` (the file's size when there is none)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        fh.readline()
        return fh.tell()


def uses_spans(plan: Any, workers: int, min_bytes: int) -> bool:
    source: LogSource = plan.source
    spreads = plan.format in SPAN_FORMATS or (plan.layout is not None and plan.format in CSV_SPAN_FORMATS)
    if workers < 2 or not spreads or source.compression() is not None:
        return False
    try:
        return source.path.stat().st_size >= min_bytes
    except OSError:
        return False


def input_batches(
    plan: Any,
    skips: SkipLog,
    counter: TokenCounter | None,
    *,
    pool: ReadPool | None = None,
    progress: Progress | None = None,
) -> Iterator[pa.Table | RenderedLines]:
    """One input's batches — through ``pool`` when it is big enough (see the module docstring).

    With ``pool.render`` (a build of a single input), a worker renders the trace lines of its
    batches that need nothing from the spans before it (every id present, no request waiting for
    the previous one's time) and sends ``RenderedLines``; the first span is read alone, since its
    first request is the origin the others render with.
    """
    if pool is None or pool.counter is not counter or pool.workers < 2 or not pool_usable():
        yield from _counted(plan, skips, counter, progress)
    elif uses_spans(plan, pool.workers, pool.min_bytes):
        yield from _span_batches(plan, skips, pool, progress, pool.span_bytes)
    elif pool.files:
        yield from _file_batches(plan, skips, pool, progress)
    else:
        yield from _counted(plan, skips, counter, progress)


def _counted(
    plan: Any, skips: SkipLog, counter: TokenCounter | None, progress: Progress | None
) -> Iterator[pa.Table]:
    """The input read in this process; ``progress`` told the bytes read after each batch."""
    if progress is None:
        yield from iter_source_batches(plan, skips, counter)
        return
    meter = ReadMeter()
    metered = replace(plan, source=replace(plan.source, meter=meter))
    told = 0
    for batch in iter_source_batches(metered, skips, counter):
        progress(meter.bytes - told, batch.num_rows)
        told = meter.bytes
        yield batch
    progress(max(_size(plan.source) - told, 0), 0)


def _size(source: LogSource) -> int:
    try:
        return source.path.stat().st_size
    except OSError:
        return 0


def _span_batches(
    plan: Any, skips: SkipLog, pool: ReadPool, progress: Progress | None, span_bytes: int
) -> Iterator[pa.Table | RenderedLines]:
    source: LogSource = plan.source
    csv = plan.layout is not None
    first = _header_end(source.path) if csv else 0  # a CSV's header is line 1, then spans of rows
    size = source.path.stat().st_size
    spans: list[tuple[int, int]] = []
    spans_from = first
    if pool.render:  # the first span is read before the others (it holds the origin): a small one
        head_end = _line_start_after(source.path, first + min(FIRST_SPAN_BYTES, span_bytes))
        if head_end < size:
            spans, spans_from = [(first, head_end)], head_end
    spans += plan_spans(source.path, size, span_bytes, spans_from)
    pending: deque[tuple[tuple[int, int], Future[SpanResult]]] = deque()
    recipe = pool.recipe
    todo = iter(spans)
    rows_before = 1  # a CSV's lines: its header, then each span's rows
    jsonl_lines = _LineCount(source.path)  # a JSONL's lines: counted only when a span skipped one
    leading_untimed = LeadingUntimed()  # batches before the file's first timed request: they take its time
    untimed = unreadable = 0
    notes: list[str] = []
    origin_s: float | None = None  # the first request's time: workers render once it is known
    scratch = pool.scratch if pool.render else None

    def submit() -> bool:
        span = next(todo, None)
        if span is not None:
            pending.append(
                (
                    span,
                    pool.pool.submit(
                        span_task, plan, span, origin_s if pool.render else None, recipe, scratch
                    ),
                )
            )
        return span is not None

    if pool.render:  # the first span, small, read here while the workers start: it holds the origin
        pool.pool  # noqa: B018  # starts every worker now
        here = None if pool.counter is None else ("object", pool.counter)
        read_here: Future[SpanResult] = Future()
        read_here.set_result(span_task(plan, spans[0], None, here, None))
        pending.append((spans[0], read_here))
        next(todo)
    else:
        submit()
    while pending:
        span, future = pending.popleft()
        result = future.result()
        if result.quoted_newline:  # the rest in this process, from this span's start (a row start)
            for _, rest in pending:
                rest.cancel()
            pool.notes.append(
                f"{source.name}: a quoted value may span lines, so it was read in one process "
                f"from byte {span[0]:,} on, not in byte ranges"
            )
            yield from _rest_in_process(plan, skips, span[0], rows_before, progress)
            return
        if result.error is not None:
            raise TraceFormatError(result.error)
        if result.counts:
            before = rows_before if csv else jsonl_lines.before(span[0])
            _replay(skips, source.name, result.counts, result.examples, before)
        notes += [n for n in result.notes if n not in notes]
        rows_before += result.lines or 0
        untimed, unreadable = untimed + result.untimed, unreadable + result.unreadable_times
        for item in result.batches:
            if isinstance(item, RenderedLines):
                leading_untimed.last_s = item.last_s
                if progress is not None:
                    progress(0, item.rows)
                yield item
                continue
            if isinstance(item, Stored):
                leading_untimed.last_s = item.times.last_s
                if progress is not None:
                    progress(0, item.times.rows)
                yield LinesToRender(*item.times, start=_starter(pool, item.path, origin_s))
                continue
            batch = item.table()
            leading = int((batch.schema.metadata or {}).get(b"leading_untimed", b"0"))
            batch = batch.replace_schema_metadata(None)
            if progress is not None:
                progress(0, batch.num_rows)
            seen_timed = leading_untimed.seen_timed
            if leading and not seen_timed and leading == batch.num_rows:  # no time yet in the file
                released = leading_untimed.hold(batch)
                if released:  # none came in the bound: they keep 0 (bounded memory)
                    origin_s = 0.0 if origin_s is None else origin_s
                yield from released
                continue
            if leading:
                times = np.asarray(batch.column("time_s"), dtype=np.float64).copy()
                times[:leading] = leading_untimed.last_s if seen_timed else times[leading]
                batch = batch.set_column(batch.schema.get_field_index("time_s"), "time_s", pa.array(times))
            if origin_s is None and batch.num_rows:
                origin_s = float(batch.column("time_s")[0].as_py())
            first_s, last_s = (float(batch.column("time_s")[i].as_py()) for i in (0, -1))
            yield from leading_untimed.timed(first_s, last_s)
            yield batch
        if progress is not None:
            progress(span[1] - span[0], 0)
        # One span at a time until the origin is known (when workers render), then 2 per worker.
        while len(pending) < (2 * pool.workers if origin_s is not None or not pool.render else 1):
            if not submit():
                break
    yield from leading_untimed.finish()  # no time in the whole file: 0
    for note in [*notes, *untimed_notes(source.name, untimed, unreadable)]:
        skips.note(note)


def _starter(pool: ReadPool, stored: str, origin_s: float | None) -> Callable[[int], Future[str]]:
    assert origin_s is not None  # rows are stored only once the origin is known
    return lambda first_index: pool.pool.submit(render_task, stored, origin_s, first_index)


class _LineCount:
    """The lines of a file before a byte offset, counted when asked (at increasing offsets): a span's
    skipped lines are numbered from its start, and only such a span needs the lines before it."""

    def __init__(self, path: Path) -> None:
        self._path, self._offset, self._lines = path, 0, 0

    def before(self, offset: int) -> int:
        with open(self._path, "rb") as fh:
            fh.seek(self._offset)
            while self._offset < offset:
                block = fh.read(min(offset - self._offset, 16 * 1024 * 1024))
                if not block:
                    break
                self._lines += block.count(b"\n")
                self._offset += len(block)
        return self._lines


def _header_end(path: Path) -> int:
    with open(path, "rb") as fh:
        fh.readline()
        return fh.tell()


class _ShiftedSkips(SkipLog):
    """Skips of a read that starts ``offset`` lines into the file, passed on to ``skips``."""

    def __init__(self, skips: SkipLog, offset: int) -> None:
        super().__init__(strict=skips.strict, keep=skips.keep)
        self._skips, self._offset = skips, offset

    def skip(self, reason: str, path: str, line: int | None) -> None:
        self._skips.skip(reason, path, None if line is None else line + self._offset)

    def note(self, text: str) -> None:
        self._skips.note(text)


def _rest_in_process(
    plan: Any, skips: SkipLog, start: int, lines_before: int, progress: Progress | None
) -> Iterator[pa.Table]:
    """A CSV log from byte ``start`` (a row start, ``lines_before`` lines into it) to its end, here."""
    source: LogSource = plan.source
    rest = LogSource(source.path, span=(start, _size(source)))
    shifted = _ShiftedSkips(skips, lines_before)
    batches = read_csv_batches(rest, plan.layout, shifted, names=csv_header(source))
    for batch in with_pseudonyms(plan.pseudonyms, batches):
        if progress is not None:
            progress(0, batch.num_rows)
        yield batch
    if progress is not None:
        progress(max(_size(source) - start, 0), 0)


def _replay(
    skips: SkipLog, name: str, counts: dict[str, int], examples: dict[str, list[int]], offset: int
) -> None:
    """Add a span's skips to ``skips``, its example lines moved by the ``offset`` lines before the span."""
    if not counts:
        return
    if skips.strict:
        reason, line = min(
            ((r, lines[0]) for r, lines in examples.items() if lines), key=lambda item: item[1]
        )
        skips.skip(reason, name, line + offset)  # raises
    for reason, count in counts.items():
        shown = examples.get(reason, [])
        for line in shown:
            skips.skip(reason, name, line + offset)
        skips.counts[reason] = skips.counts.get(reason, 0) + count - len(shown)


def _file_batches(plan: Any, skips: SkipLog, pool: ReadPool, progress: Progress | None) -> Iterator[pa.Table]:
    result = pool.file_future(plan).result()
    try:
        if result.error is not None:
            raise (
                TraceFormatError(result.error) if result.error_kind == "trace" else OomloadError(result.error)
            )
        for reason, count in result.counts.items():
            skips.counts[reason] = skips.counts.get(reason, 0) + count
            shown = skips.examples.setdefault(reason, [])
            shown += result.examples.get(reason, [])[: skips.keep - len(shown)]
        for note in result.notes:
            skips.note(note)
        skips.truncated_requests += result.truncated_requests
        with pa.memory_map(result.ipc_path) as stream:
            for batch in pa.ipc.open_stream(stream):
                table = pa.Table.from_batches([batch])
                if progress is not None:
                    progress(0, table.num_rows)
                yield table
        if progress is not None:
            progress(_size(plan.source), 0)
    finally:
        Path(result.ipc_path).unlink(missing_ok=True)


def prefetch(plans: Sequence[Any], pool: ReadPool | None) -> None:
    """Start reading every whole-file input of ``plans`` at once (spans start when their input is read).

    Only for several inputs of at least ``pool.min_bytes`` together; otherwise ``pool.files`` is
    turned off and every input is read in this process (or in spans).
    """
    if pool is None or not pool.files:
        return
    if not pool_usable():
        pool.files = False
        return
    if len(plans) < 2 or sum(_size(plan.source) for plan in plans) < pool.min_bytes or pool.workers < 2:
        pool.files = False
        return
    for plan in plans:
        if not uses_spans(plan, pool.workers, pool.min_bytes):
            pool.file_future(plan)
