"""Writing a trace file from batches: a streamed body, a header known only at the end, an atomic rename.

1. ``write_body`` writes a guessed header line — the header of a clean build: nothing skipped, in
   time order — then renders each batch to trace lines with vectorized kernels
   (``columns.format_lines``) and writes them, one large write per batch, into the final scratch file
   — a worker thread renders and writes each batch while the next one is parsed; the first
   request's time is the origin (``arrival_s = 0``). It notes whether the times ever went backwards.
   While it runs, the interpreter's thread switch interval is ``RENDER_SWITCH_S`` (1 ms, not
   5 ms): the render thread needs the GIL back between its kernels and waited on the parsing
   thread. Best of 3 interleaved builds on 2 busy cores, 5 / 0.2 / 1 ms: OpenAI log 2.89 / 2.50 /
   1.94 s, Mooncake 7.88 / 6.44 / 4.16 s, Azure 2.87 / 3.47 / 1.98 s.
2. ``finish_trace`` knows the real header — it needs the skip counts and clock alignment, known only
   after the last batch. When it is the guessed one and the body was in time order (the usual
   case), the file is already complete. Otherwise the header is written into the other scratch file
   followed by the body: copied as is, in the kernel (``sendfile``), when it was in time order —
   a log with skipped lines gets a header the guess did not have — otherwise its lines sorted by
   time (stable) and rebased on the earliest request: only each line's ``arrival_s`` number is
   rendered again, no line is parsed (``_write_sorted``). The complete scratch file is then renamed
   into place, so a failed build never leaves a half-written trace and never damages an older file
   at that path.

``check_output_path`` refuses an output path that cannot be a trace file (a directory, a device, a
parent that cannot be created), or that is one of the inputs (the same file by device and inode, so
also through a symbolic or hard link: renaming the new trace onto it would destroy that input),
before any input is read. ``TraceScratch`` creates the two scratch
files with unique hidden names in the output's own directory (so the rename is atomic), renames the
final one into place on ``commit`` and removes both whatever happens. Every ``OSError`` while writing
becomes a ``ConfigError`` naming the output path (``output_error``): one sentence, exit 2.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import shutil
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, NamedTuple, cast

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from oomload.errors import ConfigError
from oomload.ingest.columns import format_lines, lines_bytes
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

RENDER_SWITCH_S = 0.001


@dataclass(frozen=True, slots=True)
class BodyWritten:
    """How many requests ``write_body`` wrote, how many of them with prefix ids (``hash_ids``), and
    whether their times never went backwards."""

    count: int
    in_order: bool
    header_line: bytes = b""  # the guessed header line written before the body
    chained: int = 0  # requests written with at least one prefix id


def output_error(out: Path, err: OSError) -> ConfigError:
    """One sentence for an ``OSError`` met while writing ``out``."""
    if isinstance(err, IsADirectoryError):
        return ConfigError(f"cannot write to {out}: it is a directory; name a file")
    reason = err.strerror or str(err) or type(err).__name__
    return ConfigError(f"cannot write to {out}: {reason}")


def check_output_path(
    out: str | Path, example: str = "trace.jsonl", inputs: Iterable[str | Path] = ()
) -> Path:
    """``out`` as a ``Path`` once it can be an output file: not a directory or device, not one of
    ``inputs`` (the files it is made from); parents created.

    ``example`` is the file name suggested when ``out`` is a directory.
    """
    if not str(out).strip():
        raise ConfigError(f"the output path is empty; name a file, e.g. {example}")
    path = Path(out)
    for source in inputs:
        if same_file(path, source):
            raise ConfigError(
                f"the output {path} is one of the inputs ({source}): writing it would destroy that "
                "input; name another output file"
            )
    if path.is_dir():
        raise ConfigError(f"cannot write to {path}: it is a directory; name a file, e.g. {path / example}")
    if path.exists() and not path.is_file():
        raise ConfigError(f"cannot write to {path}: it exists and is not a regular file (a device or a pipe)")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as err:
        raise ConfigError(f"cannot write to {path}: {parent} exists and is not a directory") from err
    except OSError as err:
        reason = err.strerror or str(err)
        raise ConfigError(f"cannot write to {path}: cannot create the directory {parent} ({reason})") from err
    if not parent.is_dir():
        raise ConfigError(f"cannot write to {path}: {parent} is not a directory")
    return path


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one file: the same device and inode, whatever links lead to it
    (``False`` when either cannot be looked at, e.g. does not exist yet)."""
    try:
        first, second = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


INTERRUPTED = threading.Event()
"""Set by the CLI's Ctrl-C / SIGTERM handler (``cli.trace.interrupts_latched``) before it raises
``KeyboardInterrupt``. Python drops an exception raised while it runs a weakref callback or a
``__del__`` ("Exception ignored in …"), so a Ctrl-C that lands there would be lost and the build would
finish; ``TraceScratch.commit`` checks this latch, so no trace is put in place after a Ctrl-C."""


class TraceScratch:
    """The scratch files of one output (``with`` removes them, whether the write succeeded or not)."""

    __slots__ = ("_body", "_final", "out")

    def __init__(self, out: Path) -> None:
        self.out = out
        self._body: Path | None = None
        self._final: Path | None = None

    @property
    def body(self) -> Path:
        if self._body is None:
            raise RuntimeError("TraceScratch used outside its with block")
        return self._body

    @property
    def final(self) -> Path:
        if self._final is None:
            raise RuntimeError("TraceScratch used outside its with block")
        return self._final

    def swap(self) -> None:
        """Exchange the two scratch files: ``commit`` then renames the one that was ``body``."""
        self._body, self._final = self._final, self._body

    def __enter__(self) -> TraceScratch:
        self.out = check_output_path(self.out)
        try:
            self._body = self._name(".body.tmp")  # named before it is made: an interrupt between
            _create(self._body)  # the two cannot leave a file nobody knows to remove
            self._final = self._name(".tmp")
            _create(self._final)
        except OSError as err:
            self._remove()
            raise output_error(self.out, err) from err
        except BaseException:  # Ctrl-C here: ``__exit__`` will not run
            self._remove()
            raise
        return self

    def commit(self) -> None:
        """Rename the final scratch file onto the output (readable as a normal new file would be)."""
        if INTERRUPTED.is_set():  # a Ctrl-C whose KeyboardInterrupt Python dropped (``INTERRUPTED``)
            raise KeyboardInterrupt
        try:
            if self.out.is_file():
                shutil.copymode(self.out, self.final)
            else:
                os.chmod(self.final, 0o644)
            os.replace(self.final, self.out)
        except OSError as err:
            raise output_error(self.out, err) from err

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._remove()

    def _name(self, suffix: str) -> Path:
        return self.out.parent / f".{self.out.name}.{secrets.token_hex(6)}{suffix}"

    def _remove(self) -> None:
        for temp in (self._body, self._final):
            if temp is None:
                continue
            try:
                temp.unlink(missing_ok=True)
            except OSError:  # a read-only file system refuses even a file that was never made
                if temp.exists():
                    raise


def _create(path: Path) -> None:
    """A new empty file, readable by its owner only (``tempfile.mkstemp``'s mode)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def header_line(header: TraceHeader) -> bytes:
    """The first line of a trace file for ``header``."""
    return orjson.dumps(header.to_json()) + b"\n"


class RowTimes(NamedTuple):
    """A batch's rows and times, as ``WorkerRows`` holds them (its first fields, in order)."""

    rows: int
    first_s: float
    last_s: float
    max_s: float
    in_order: bool
    chained: int  # rows with at least one prefix id


@dataclass(frozen=True, slots=True)
class WorkerRows:
    """Rows whose lines a worker process renders (see ``oomload.ingest.parallel``), and their times."""

    rows: int
    first_s: float
    last_s: float
    max_s: float
    in_order: bool
    chained: int

    @staticmethod
    def times_of(batch: pa.Table) -> RowTimes:
        times = np.asarray(batch.column("time_s"), dtype=np.float64)
        in_order = not (len(times) > 1 and bool((np.diff(times) < 0).any()))
        return RowTimes(
            len(times), float(times[0]), float(times[-1]), float(times.max()), in_order, chained_rows(batch)
        )


def chained_rows(batch: pa.Table) -> int:
    """The rows of ``batch`` with at least one prefix id (a ``hash_ids`` list neither null nor empty)."""
    if "hash_ids" not in batch.schema.names:
        return 0
    lengths = pc.list_value_length(batch.column("hash_ids"))
    return int(pc.sum(pc.greater(pc.fill_null(lengths, 0), 0)).as_py() or 0)


@dataclass(frozen=True, slots=True)
class RenderedLines(WorkerRows):
    """Trace lines a worker rendered: every row had its id, and the worker knew the origin."""

    text: bytes

    @classmethod
    def of(cls, batch: pa.Table, origin_s: float) -> RenderedLines:
        return cls(
            *cls.times_of(batch), bytes(lines_bytes(format_lines(batch, origin_s=origin_s, first_index=0)))
        )


@dataclass(frozen=True, slots=True)
class LinesToRender(WorkerRows):
    """Rows a worker parsed whose ids are generated: ``r<N>``, N their index in the trace, which only the
    writer knows. ``start(first_index)`` has a worker render them into a scratch file, whose path the
    future gives; the writer copies that file into the trace in the kernel (``os.sendfile``)."""

    start: Callable[[int], Future[str]]


def write_body(
    scratch: TraceScratch, batches: Iterable[pa.Table | WorkerRows], guess: TraceHeader
) -> BodyWritten:
    """``guess``'s line then ``batches`` as trace lines into ``scratch.final`` (overwritten).

    The origin is the first request (a ``WorkerRows`` item never comes first: its worker was given
    the origin of the batches before it). A ``LinesToRender`` item is started here, in order, with
    the index of its first row (its generated ids start there).
    """
    first_line = header_line(guess)
    count = chained = 0
    origin_s: float | None = None
    last_s = -np.inf
    in_order = True
    pending: Future[None] | None = None
    switch_s = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_s, RENDER_SWITCH_S))
    with _open_scratch(scratch.final, scratch.out) as body, ThreadPoolExecutor(max_workers=1) as renderer:
        try:
            body.write(first_line)
            for batch in batches:
                if isinstance(batch, WorkerRows):
                    if origin_s is None:
                        raise RuntimeError("lines rendered by a worker came before the first batch")
                    if in_order and (batch.first_s < last_s or not batch.in_order):
                        in_order = False
                    last_s = max(last_s, batch.max_s)
                    written = (
                        renderer.submit(_copy_rendered, body, batch.start(count))
                        if isinstance(batch, LinesToRender)
                        else renderer.submit(_write_text, body, cast(RenderedLines, batch).text)
                    )
                    if pending is not None:
                        pending.result()
                    pending = written
                    count += batch.rows
                    chained += batch.chained
                    continue
                times = np.asarray(batch.column("time_s"), dtype=np.float64)
                if origin_s is None:
                    origin_s = float(times[0])
                if in_order and (times[0] < last_s or (len(times) > 1 and bool((np.diff(times) < 0).any()))):
                    in_order = False
                last_s = max(last_s, float(times.max()))
                # Rendered and written by one worker, in order, while the next batch is parsed.
                rendered = renderer.submit(_render, body, batch, origin_s, count)
                if pending is not None:
                    pending.result()
                pending = rendered
                count += batch.num_rows
                chained += chained_rows(batch)
            if pending is not None:
                pending.result()
        except OSError as err:
            raise output_error(scratch.out, err) from err
        finally:
            sys.setswitchinterval(switch_s)
    return BodyWritten(count, in_order, first_line, chained)


def _render(body: IO[bytes], batch: pa.Table, origin_s: float, first_index: int) -> None:
    body.write(lines_bytes(format_lines(batch, origin_s=origin_s, first_index=first_index)))


def _write_text(body: IO[bytes], text: bytes) -> None:
    body.write(text)


def _copy_rendered(body: IO[bytes], rendered: Future[str]) -> None:
    """The scratch file a worker rendered lines into, appended to ``body`` in the kernel, then removed."""
    path = rendered.result()
    try:
        with open(path, "rb") as lines:
            _send(lines, 0, body)
    finally:
        os.unlink(path)


def _send(source: IO[bytes], offset: int, target: IO[bytes]) -> None:
    """``source`` from ``offset`` to its end appended to ``target``, copied in the kernel (``sendfile``:
    no trip through this process's memory)."""
    size = os.fstat(source.fileno()).st_size
    target.flush()
    while offset < size:
        step = os.sendfile(target.fileno(), source.fileno(), offset, size - offset)
        if step == 0:
            raise OSError(f"{source.name} ended at byte {offset} of {size}")
        offset += step


def _open_scratch(path: Path, out: Path) -> IO[bytes]:
    try:
        return open(path, "wb")
    except OSError as err:
        raise output_error(out, err) from err


def finish_trace(scratch: TraceScratch, header: TraceHeader, written: BodyWritten) -> None:
    """Header + body (sorted when it was not in time order) into ``scratch.out``, atomically."""
    first_line = header_line(header)
    if not (written.in_order and first_line == written.header_line):
        scratch.swap()  # the written file becomes the body; the header goes into the other one
        try:
            with open(scratch.final, "wb") as final:
                final.write(first_line)
                if written.in_order:
                    with open(scratch.body, "rb") as body_in:
                        _send(body_in, len(written.header_line), final)
                else:
                    _write_sorted(scratch.body, len(written.header_line), final)
        except OSError as err:
            raise output_error(scratch.out, err) from err
    scratch.commit()


SORT_ROWS = 8192  # lines re-rendered at a time when a body is sorted (a few MB: reused, not faulted in)
NEWLINE_SCAN_BYTES = 1 << 20  # the body's newlines are found a block at a time (a small scratch array)
ARRIVAL_KEY = ',"arrival_s":'
AFTER_ARRIVAL_KEY = ',"prompt_tokens":'


def _write_sorted(body_path: Path, skip_bytes: int, final: IO[bytes]) -> None:
    """The body's lines in time order (stable), ``arrival_s`` rebased on the earliest, into ``final``.

    No line is parsed as JSON: every line ``format_lines`` writes is ``{"id":<string>,"arrival_s":``,
    a number, then ``,"prompt_tokens":`` and the rest — and the first ``,"arrival_s":`` of a line is
    that key (inside a JSON string a quote is escaped, so an id cannot hold it), as is the first
    ``,"prompt_tokens":``. Found in each line (``find_substring``), they cut the body in place into
    (head, number, tail) strings, one array over the body's own bytes; the numbers give the order,
    and the output is each head, its number rendered again (as ``format_lines`` renders it), its
    tail. The body is mapped, not read into this process, and its newlines are found
    ``NEWLINE_SCAN_BYTES`` at a time; beside it about 50 bytes a request are held, and the output is
    rendered ``SORT_ROWS`` lines at a time — so the memory a sort takes is reused from one block to
    the next rather than faulted in anew (on a 48 MB log whose trace is 8 MB, a fresh process's sort
    had cost 30 MB of new memory and 2,000 page faults). When rebasing would render every number as
    it is written (``_numbers_stay``: the first line is the earliest, as in most out-of-order logs),
    the lines move whole and no number is rendered again.
    """
    with open(body_path, "rb") as body_in:
        if os.fstat(body_in.fileno()).st_size <= skip_bytes:
            return
        mapped = mmap.mmap(body_in.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        _write_sorted_lines(pa.py_buffer(memoryview(mapped)[skip_bytes:]), final)
    finally:
        with contextlib.suppress(BufferError):  # an exception's frames may still hold a view of it
            mapped.close()


def _write_sorted_lines(data: pa.Buffer, final: IO[bytes]) -> None:
    """``_write_sorted`` of the body's bytes ``data`` (whole lines, each ending in a newline)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.concatenate(
        [
            np.flatnonzero(raw[at : at + NEWLINE_SCAN_BYTES] == ord("\n")) + (at + 1)
            for at in range(0, len(raw), NEWLINE_SCAN_BYTES)
        ]
    )
    if not len(ends):
        return
    starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1].astype(np.int64)])
    lines = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(np.append(starts, len(data))), data)
    number_at = np.asarray(pc.find_substring(lines, ARRIVAL_KEY), dtype=np.int64)
    tail_at = np.asarray(pc.find_substring(lines, AFTER_ARRIVAL_KEY), dtype=np.int64)
    if len(lines) and (number_at.min() < 0 or tail_at.min() < 0):
        raise RuntimeError("a trace line without arrival_s and prompt_tokens after it")
    cuts = np.empty(3 * len(lines) + 1, dtype=np.int64)  # head, number, tail of each line, in order
    cuts[0:-1:3] = starts
    cuts[1:-1:3] = starts + number_at + len(ARRIVAL_KEY)
    cuts[2:-1:3] = starts + tail_at
    cuts[-1] = len(data)
    pieces = pa.LargeStringArray.from_buffers(3 * len(lines), pa.py_buffer(cuts), data)
    line_index = np.arange(len(lines), dtype=np.int64)
    arrival_s = np.asarray(pc.cast(pieces.take(pa.array(3 * line_index + 1)), pa.float64()))
    order = np.argsort(arrival_s, kind="stable")
    origin_s = float(arrival_s.min()) if len(arrival_s) else 0.0
    if _numbers_stay(arrival_s, origin_s):
        for start in range(0, len(order), SORT_ROWS):
            final.write(lines_bytes(lines.take(pa.array(order[start : start + SORT_ROWS]))))
        return
    empty = pa.scalar("", pa.large_string())
    for start in range(0, len(order), SORT_ROWS):
        rows = order[start : start + SORT_ROWS]
        rebased = pc.round(pc.subtract(pa.array(arrival_s[rows]), origin_s), 6)
        number = pc.cast(pc.cast(rebased, pa.string()), pa.large_string())
        heads, tails = pieces.take(pa.array(3 * rows)), pieces.take(pa.array(3 * rows + 2))
        final.write(lines_bytes(pc.binary_join_element_wise(heads, number, tails, empty)))


def _numbers_stay(arrival_s: npt.NDArray[np.float64], origin_s: float) -> bool:
    """Whether rebasing on ``origin_s`` renders every number as it is written: the earliest line is
    already at +0 (the usual out-of-order log: its first request is its earliest, and only later
    ones are out of order), no number is -0, and each is already rounded to the µs. Then
    ``round(x - 0, 6)`` is ``x``, and ``format_lines``'s rendering of ``x`` is the text ``x`` was parsed
    from (the shortest text that parses back to it), so the sort writes whole lines in the new order."""
    if origin_s != 0.0 or bool(np.signbit(arrival_s).any()):
        return False
    numbers = pa.array(arrival_s)
    return bool(pc.all(pc.equal(pc.round(numbers, 6), numbers)).as_py())


def write_trace_file(out: str | Path, records: Iterable[TraceRecord], header: TraceHeader) -> int:
    """``oomload.trace.model.write_trace`` into ``out`` through a scratch file renamed into place."""
    with TraceScratch(check_output_path(out)) as scratch:
        try:
            with open(scratch.final, "w", encoding="utf-8") as final:
                count = write_trace(final, records, header)
        except OSError as err:
            raise output_error(scratch.out, err) from err
        scratch.commit()
    return count
