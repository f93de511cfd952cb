"""One input file: open it (decompressing ``.gz`` / ``.zst``), sniff its first lines, read it in chunks.

Compression is chosen by the file's magic bytes, not its name (``.gz`` = ``1f 8b``, ``.zst`` =
``28 b5 2f fd``), so a renamed file still reads. zstd needs the optional ``zstandard`` package; without
it a ``.zst`` input is refused with a sentence saying what to install. Every ``OSError`` on open
becomes a ``TraceFormatError`` naming the path, so the CLI prints a sentence, never a traceback.
A leading UTF-8 byte-order mark is skipped on every path (``oomload.trace.streams``).
A compressed stream that fails to decompress is "a damaged gzip/zstd file"; so is a file named
``.gz`` / ``.zst`` that lacks the signature and does not read as text either (``misnamed``).
``iter_json_objects`` is the line loop of the JSONL readers: it yields each line's object and
counts every other non-blank line as "not a JSON object" — or, when what stops it from parsing is a
number (``1e400``, past a float's range; ``NaN``, ``Infinity``, which JSON does not have), as
``BAD_NUMBER`` (``unparsed_reason``, which only a line that does not parse pays for).

A source may be a byte **span** of an uncompressed file (``LogSource(path, span=(start, end))``,
both at line starts): the parallel build hands each worker one (``oomload.ingest.parallel``). Its
line numbers count from the span's first line (1); the caller adds the lines before it.
``iter_views`` reads an uncompressed file through ``mmap`` without copying it (the OpenAI reader
decodes straight from the page cache); a compressed one in chunks.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import mmap
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import orjson

from oomload.errors import TraceFormatError
from oomload.ingest.skips import SkipLog
from oomload.trace.streams import (
    GZIP_MAGIC,
    READ_BUFFER_BYTES,
    UTF8_BOM,
    ZSTD_MAGIC,
    read_errors,
    skip_bom,
    zstd_stream,
)

SNIFF_BYTES = 256 * 1024
CHUNK_BYTES = 8 * 1024 * 1024

NOT_JSON_OBJECT = "not a JSON object"
BAD_NUMBER = "a number out of range or not JSON (1e400, NaN)"
_NEWLINE = ord("\n")

COMPRESSED_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}


@dataclass(frozen=True, slots=True)
class LogSource:
    """A log or trace file named by the user (or the ``span`` ``[start, end)`` of its bytes)."""

    path: Path
    span: tuple[int, int] | None = None
    meter: ReadMeter | None = field(default=None, compare=False, repr=False)  # bytes read, for progress

    @property
    def name(self) -> str:
        return str(self.path)

    def compression(self) -> str | None:
        """``"gzip"``, ``"zstd"`` or ``None``, from the first bytes (``TraceFormatError`` if unreadable)."""
        with self._open_raw() as raw:
            magic = raw.read(4)
        if magic.startswith(GZIP_MAGIC):
            return "gzip"
        if magic.startswith(ZSTD_MAGIC):
            return "zstd"
        return None

    def open_binary(self) -> IO[bytes]:
        """The decompressed content as a binary stream (only the span's bytes for a span), past a
        leading UTF-8 byte-order mark."""
        if self.span is not None:
            raw = self._open_raw()
            raw.seek(self.span[0])
            spanned = cast(IO[bytes], io.BufferedReader(_SpanStream(raw, self.span[1] - self.span[0])))
            return skip_bom(spanned) if self.span[0] == 0 else spanned
        kind = self.compression()
        if kind is None:
            return skip_bom(self._open_raw())
        if kind == "gzip":
            raw = self._open_raw()
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
            stream.myfileobj = raw  # type: ignore[assignment]  # closed with the stream, as gzip.open does
            return skip_bom(cast(IO[bytes], stream))
        return skip_bom(zstd_stream(self._open_raw(), self.path))

    def head(self, max_bytes: int = SNIFF_BYTES) -> bytes:
        """Up to ``max_bytes`` of decompressed content; raises ``TraceFormatError`` when empty or damaged."""
        try:
            with self.open_binary() as fh:
                data = fh.read(max_bytes)
        except read_errors() as err:
            raise self._damaged(err, "cannot read") from err
        if not data.strip():
            raise TraceFormatError("empty file: it holds no requests", self.path)
        if (named := self.misnamed()) is not None and not _looks_like_text(data):
            raise TraceFormatError(
                f"is a damaged {named} file: its name ends in {self.path.suffix} but it does not start "
                f"with the {named} signature, and it is not text either",
                self.path,
            )
        return data

    def misnamed(self) -> str | None:
        """The compression the file's name promises when its first bytes lack that signature."""
        named = COMPRESSED_SUFFIXES.get(self.path.suffix.lower())
        return None if named is None or self.compression() == named else named

    def head_lines(self, count: int = 20) -> list[bytes]:
        """The first ``count`` non-blank lines (the last one may be cut if the line is very long)."""
        lines = [line.strip() for line in self.head().splitlines()]
        return [line for line in lines if line][:count]

    def iter_lines(self) -> Iterator[tuple[int, bytes]]:
        """``(line number, line without its end)`` for every line, 1-based; blank lines included."""
        with self.open_binary() as fh:
            try:
                for number, line in enumerate(fh, start=1):
                    yield number, line.rstrip(b"\r\n")
            except read_errors() as err:
                raise self._damaged(err, "cannot read to the end") from err

    def iter_chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
        """``(number of the chunk's first line, chunk)`` — chunks of whole lines of about ``chunk_bytes``."""
        first_line = 1
        with self.open_binary() as fh:
            try:
                while True:
                    chunk = fh.read(chunk_bytes)
                    if not chunk:
                        return
                    if not chunk.endswith(b"\n"):
                        chunk += fh.readline()
                    yield first_line, chunk
                    first_line += chunk.count(b"\n")
            except read_errors() as err:
                raise self._damaged(err, "cannot read to the end") from err

    def iter_views(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Chunk]:
        """Chunks of whole lines, without copying the file when it is not compressed.

        An uncompressed file (or span) is mapped into memory and each ``Chunk`` is a stretch of
        the map; line numbers are counted only when ``Chunk.line_at`` is called (in increasing order).
        """
        if self.span is None and self.compression() is not None:
            for first_line, chunk in self.iter_chunks(chunk_bytes):
                yield Chunk(chunk, 0, len(chunk), _ChunkLines(chunk, 0, first_line))
            return
        with self._open_raw() as raw:
            size = raw.seek(0, io.SEEK_END)
            start, end = (0, size) if self.span is None else self.span
            if end <= start:
                return
            try:
                data = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as err:
                raise TraceFormatError(f"cannot read ({_describe(err)})", self.path) from err
        if start == 0 and data[: len(UTF8_BOM)] == UTF8_BOM:
            start = len(UTF8_BOM)
        lines = _ChunkLines(data, start, 1)
        data.madvise(mmap.MADV_SEQUENTIAL)
        page = mmap.PAGESIZE
        while start < end:
            stop = data.find(b"\n", min(start + chunk_bytes, end) - 1, end)
            stop = end if stop < 0 else stop + 1
            if self.meter is not None:
                self.meter.bytes += stop - start
            yield Chunk(data, start, stop, lines)
            # Read pages leave this process's resident set (they stay in the page cache).
            first, last = start - start % page, stop - stop % page
            if last > first:
                data.madvise(mmap.MADV_DONTNEED, first, last - first)
            start = stop

    def _damaged(self, err: BaseException, what: str) -> TraceFormatError:
        plain = isinstance(err, UnicodeDecodeError) or (
            isinstance(err, OSError) and not isinstance(err, gzip.BadGzipFile)
        )
        kind = None if plain else self.compression()
        if kind is not None:
            return TraceFormatError(f"is a damaged {kind} file ({_describe(err)})", self.path)
        return TraceFormatError(f"{what} ({_describe(err)})", self.path)

    def _open_raw(self) -> IO[bytes]:
        try:
            raw = open(self.path, "rb", buffering=READ_BUFFER_BYTES)  # noqa: SIM115  # the caller closes it
            return raw if self.meter is None else cast(IO[bytes], _MeteredFile(raw, self.meter))
        except FileNotFoundError as err:
            raise TraceFormatError("no such file", self.path) from err
        except IsADirectoryError as err:
            raise TraceFormatError("is a directory, not a log file", self.path) from err
        except PermissionError as err:
            raise TraceFormatError("cannot read: permission denied", self.path) from err
        except OSError as err:
            raise TraceFormatError(f"cannot open ({err.strerror or err})", self.path) from err


@dataclass(slots=True)
class ReadMeter:
    """Bytes of the file read so far (the compressed bytes of a compressed file)."""

    bytes: int = 0


class _MeteredFile(io.RawIOBase):
    """A raw file that adds the bytes read from it to a ``ReadMeter``."""

    def __init__(self, raw: IO[bytes], meter: ReadMeter) -> None:
        super().__init__()
        self._raw, self._meter = raw, meter

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def fileno(self) -> int:
        return self._raw.fileno()

    def peek(self, size: int = 0) -> bytes:
        return self._raw.peek(size)  # type: ignore[attr-defined,no-any-return]

    def readinto(self, buffer: Any) -> int:
        count = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        self._meter.bytes += count or 0
        return int(count or 0)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _ChunkLines:
    """Line numbers of offsets in ``data``, counted lazily from ``start`` (line ``first_line``)."""

    __slots__ = ("_data", "_line", "_offset")

    def __init__(self, data: bytes | mmap.mmap, start: int, first_line: int) -> None:
        self._data, self._offset, self._line = data, start, first_line

    def at(self, offset: int) -> int:
        if offset > self._offset:  # counted in place (a slice of a map or of bytes would copy it)
            between = np.frombuffer(self._data, np.uint8, offset - self._offset, self._offset)
            self._line += int(np.count_nonzero(between == _NEWLINE))
            self._offset = offset
        return self._line


@dataclass(frozen=True, slots=True)
class Chunk:
    """``data[start:stop]``: whole lines of a source (``data`` is the file's map, or a read chunk)."""

    data: bytes | mmap.mmap
    start: int
    stop: int
    lines: _ChunkLines

    def line_at(self, offset: int) -> int:
        """The line number of the line that starts at ``offset`` (an offset into ``data``)."""
        return self.lines.at(offset)


class _SpanStream(io.RawIOBase):
    """At most ``size`` bytes of ``raw`` from where it stands."""

    def __init__(self, raw: IO[bytes], size: int) -> None:
        super().__init__()
        self._raw = raw
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(buffer)[: self._left]
        count = self._raw.readinto(view)  # type: ignore[attr-defined]
        self._left -= count or 0
        return count or 0

    def close(self) -> None:
        self._raw.close()
        super().close()


def iter_json_objects(source: LogSource, skips: SkipLog) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each JSON-object line; other non-blank lines go to ``skips``."""
    for number, line in source.iter_lines():
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            skips.skip(unparsed_reason(line), source.name, number)
            continue
        if isinstance(obj, dict):
            yield number, obj
        else:
            skips.skip(NOT_JSON_OBJECT, source.name, number)


class _NumberRefused(Exception):
    """Raised from inside ``json.loads`` at a number orjson cannot take."""


def _finite(text: str) -> float:
    value = float(text)  # an integer's digits too: a float of 400 digits is infinite, not an error
    if not math.isfinite(value):
        raise _NumberRefused
    return value


def _refused(text: str) -> float:
    raise _NumberRefused


def unparsed_reason(line: bytes) -> str:
    """Why a line orjson refused is unusable: ``BAD_NUMBER`` when a number stops it (a float past
    ±1.8e308, ``NaN``, ``Infinity``: Python's parser reads the line up to it), else ``NOT_JSON_OBJECT``.
    Run only for a line that did not parse, so the lines that do pay nothing for it."""
    try:
        json.loads(line.decode("utf-8"), parse_float=_finite, parse_int=_finite, parse_constant=_refused)
    except _NumberRefused:
        return BAD_NUMBER
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError too)
        pass
    return NOT_JSON_OBJECT


def _looks_like_text(data: bytes) -> bool:
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.start >= len(data) - 4  # a character cut at the end of the sniffed block
    return True


def _describe(err: BaseException) -> str:
    if isinstance(err, EOFError):
        return f"truncated: {err}"
    if isinstance(err, gzip.BadGzipFile | zlib.error):
        return f"damaged or truncated compressed data: {err}"
    if isinstance(err, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__
