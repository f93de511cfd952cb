"""Opening a log or trace file as the bytes its readers parse: decompressed, a leading BOM skipped.

Compression is told by the file's first bytes, never its name (``1f 8b``: gzip, ``28 b5 2f fd``:
zstd, which needs the optional ``zstandard`` package), so a renamed file still reads — a trace
written as ``p.trace.zst`` or a gzip file without ``.gz`` too. ``ZstdStream`` raises ``EOFError``
when a file stops inside a frame, where ``zstandard``'s own reader would return half a log without
a word.

Editors on Windows and spreadsheet exports ("CSV UTF-8") start a file with a UTF-8 byte-order mark
(``EF BB BF``); a JSON parser, a CSV header check or a trace header would take it as part of the
first key or column name, so every reader opens its file past it (``skip_bom``).

``oomload.ingest.source.LogSource`` (logs) and ``oomload.trace.model`` (traces) both open files
through this module.
"""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path
from typing import IO, Any, cast

from oomload.errors import TraceFormatError

UTF8_BOM = b"\xef\xbb\xbf"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
READ_BUFFER_BYTES = 1024 * 1024  # a line of a vLLM request log (its id list) can run to 100 KB: one fill

# Errors a decompressing or plain stream raises on a damaged file while being read.
READ_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, UnicodeDecodeError)


def read_errors() -> tuple[type[BaseException], ...]:
    """``READ_ERRORS`` plus zstandard's own error class when the package is installed."""
    try:
        from zstandard import ZstdError
    except ImportError:
        return READ_ERRORS
    return (*READ_ERRORS, ZstdError)


def skip_bom(stream: IO[bytes]) -> IO[bytes]:
    """``stream`` (at its start, with ``peek``: a buffered or gzip stream) past a leading UTF-8 BOM."""
    head: bytes = stream.peek(len(UTF8_BOM))  # type: ignore[attr-defined]
    if head[: len(UTF8_BOM)] == UTF8_BOM:
        stream.read(len(UTF8_BOM))
    return stream


def open_decompressed(path: str | Path) -> IO[bytes]:
    """The file's content, decompressed as its first bytes say, past a leading BOM. ``OSError`` when
    it cannot be opened; ``TraceFormatError`` for zstd without ``zstandard``; a damaged start raises
    one of ``read_errors()``."""
    raw = cast(io.BufferedReader, open(path, "rb", buffering=READ_BUFFER_BYTES))  # noqa: SIM115  # closed by the caller
    try:
        magic = raw.peek(len(ZSTD_MAGIC))[: len(ZSTD_MAGIC)]
        if magic.startswith(GZIP_MAGIC):
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
            stream.myfileobj = raw  # type: ignore[assignment]  # closed with the stream, as gzip.open does
            return skip_bom(cast(IO[bytes], stream))
        if magic == ZSTD_MAGIC:
            return skip_bom(zstd_stream(cast(IO[bytes], raw), path))
        return skip_bom(cast(IO[bytes], raw))
    except BaseException:
        raw.close()
        raise


def zstd_stream(raw: IO[bytes], path: str | Path) -> IO[bytes]:
    """``raw`` (zstd frames) decompressed; without the ``zstandard`` package, ``raw`` closed and a
    ``TraceFormatError`` saying what to install."""
    try:
        import zstandard
    except ImportError as err:
        raw.close()
        raise TraceFormatError(
            "is zstd-compressed, but the zstandard package is not installed "
            "(pip install zstandard, or decompress it first with `zstd -d`)",
            path,
        ) from err
    return cast(IO[bytes], io.BufferedReader(ZstdStream(raw, zstandard), 1024 * 1024))


class ZstdStream(io.RawIOBase):
    """Decompressed zstd frames (one after another) that raise ``EOFError`` when the file stops mid-frame.

    ``zstandard``'s own stream reader returns a truncated file's data without a word; a replay of
    half a log would then look like a whole one.
    """

    def __init__(self, raw: IO[bytes], zstandard: Any, chunk_bytes: int = 64 * 1024) -> None:
        super().__init__()
        self._raw = raw
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._frame = self._new()
        self._in_frame = False
        self._pending = memoryview(b"")
        self._chunk_bytes = chunk_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            compressed = self._raw.read(self._chunk_bytes)
            if not compressed:
                if self._in_frame:
                    raise EOFError("the data ends inside a zstd frame")
                return 0
            self._pending = memoryview(self._decompress(compressed))
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _decompress(self, compressed: bytes) -> bytes:
        parts = []
        while compressed:
            parts.append(self._frame.decompress(compressed))
            self._in_frame = not self._frame.eof
            if self._in_frame:
                break
            compressed = self._frame.unused_data
            self._frame = self._new()
        return b"".join(parts)

    def close(self) -> None:
        self._raw.close()
        super().close()
