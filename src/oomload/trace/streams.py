"""Opening a log or trace file as the bytes its readers parse: a leading UTF-8 byte-order mark skipped.

Editors on Windows and spreadsheet exports ("CSV UTF-8") start a file with ``EF BB BF``; a JSON
parser, a CSV header check or a trace header would take it as part of the first key or column name.
Every reader opens its file through ``skip_bom`` (``oomload.ingest.source.LogSource``, the trace
reader of ``oomload.trace.model``), so a BOM never reaches them; only the file's first bytes are
looked at.
"""

from __future__ import annotations

from typing import IO

UTF8_BOM = b"\xef\xbb\xbf"


def skip_bom(stream: IO[bytes]) -> IO[bytes]:
    """``stream`` (at its start, with ``peek``: a buffered or gzip stream) past a leading UTF-8 BOM."""
    head: bytes = stream.peek(len(UTF8_BOM))  # type: ignore[attr-defined]
    if head[: len(UTF8_BOM)] == UTF8_BOM:
        stream.read(len(UTF8_BOM))
    return stream
