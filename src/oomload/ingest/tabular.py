"""CSV request logs — Azure LLM inference traces, BurstGPT, and any CSV through a column mapping.

The file is streamed by pyarrow's CSV reader (``pyarrow.csv.open_csv``, C++, block by block) with
every needed column read as text; each block is then validated and converted with vectorized
kernels, so a bad cell costs one skipped row instead of the whole file, and no Python code runs
per row unless a block holds a bad timestamp.

- **Azure** (``TIMESTAMP,ContextTokens,GeneratedTokens[,NumImages]``): timestamps with 7 fractional
  digits, with or without a zone offset (naive = UTC), CRLF, no final newline. ``NumImages`` is ignored.
- **BurstGPT** (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``): seconds
  since the trace start; a row with 0 response tokens is a failed request, kept with ``ok=false``.
- **Mapped CSV**: columns named by ``--map`` (see ``oomload.ingest.mapping``).

Line numbers for skipped rows count the header as line 1 and one line per row; they are exact unless
the file has blank lines or quoted values spanning lines.
"""

from __future__ import annotations

import bisect
import csv
import functools
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from oomload.errors import TraceFormatError, names_shown
from oomload.ingest.columns import make_batch
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import LogSource
from oomload.trace.model import (
    MAX_ID_CHARS,
    MAX_TIME_S,
    MAX_TOKENS,
    TIME_BOUND_REASON,
    text_bound_reason,
    tokens_bound_reason,
)
from oomload.trace.streams import READ_ERRORS

INT_PATTERN = r"^\s*[0-9]+(\.0*)?\s*$"
FLOAT_PATTERN = r"^\s*-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?\s*$"
TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BLOCK_BYTES = 512 * 1024  # pyarrow reads up to 32 blocks ahead: 16 MiB in flight, whatever the file's size
BATCH_BYTES = 4 * 1024 * 1024  # blocks are gathered into batches of about this size before converting


@dataclass(frozen=True, slots=True)
class CsvLayout:
    """Which CSV column holds what; ``time_unit`` is ``"datetime"`` or a unit of ``TIME_UNITS_S``."""

    prompt: str
    output: str
    time: str | None = None
    time_unit: str = "s"
    id: str | None = None
    max_tokens: str | None = None
    model: str | None = None
    failed_when_no_output: bool = False

    def columns(self) -> list[str]:
        named = [self.time, self.prompt, self.output, self.id, self.max_tokens, self.model]
        return list(dict.fromkeys(c for c in named if c is not None))


AZURE = CsvLayout(prompt="ContextTokens", output="GeneratedTokens", time="TIMESTAMP", time_unit="datetime")
BURSTGPT = CsvLayout(
    prompt="Request tokens",
    output="Response tokens",
    time="Timestamp",
    time_unit="s",
    model="Model",
    failed_when_no_output=True,
)


def csv_header(source: LogSource) -> list[str]:
    """The column names of a CSV file's first line."""
    first = source.head().splitlines()[0].decode("utf-8", errors="replace")
    return [name.strip() for name in next(csv.reader(io.StringIO(first)))]


def check_layout(source: LogSource, layout: CsvLayout, what: str) -> None:
    """Raise ``TraceFormatError`` naming the first column of ``layout`` the file lacks."""
    header = csv_header(source)
    for column in layout.columns():
        if column not in header:
            raise TraceFormatError(
                f"{what} names column {column!r}, but the file has {names_shown(header, 'columns')}",
                source.path,
            )


def read_csv_batches(
    source: LogSource, layout: CsvLayout, skips: SkipLog, *, names: list[str] | None = None
) -> Iterator[pa.Table]:
    """Stream ``source`` as batches (``time_s`` on the log's clock; see the module docstring).

    ``names``: the columns of a span of a CSV file (``LogSource.span``, which holds rows only);
    its line numbers then count the span's first row as line 1. Otherwise the file's first line
    is its header (line 1).
    """
    wanted = layout.columns()
    invalid_lines: list[int] = []
    first_line = 2 if names is None else 1  # the line of the first row

    def on_invalid_row(row: pa_csv.InvalidRow) -> str:
        line = None if row.number is None else int(row.number)  # the header is row 1
        if line is not None:
            invalid_lines.append(line)
        # Reported with the rows of its batch, in line order (an error raised here would be lost).
        pending.append((line, f"wrong number of columns (expected {row.expected_columns})"))
        return "skip"

    pending: list[tuple[int | None, str]] = []
    # One thread: pyarrow then numbers the rows it skips (and calls back in file order).
    read_options = pa_csv.ReadOptions(block_size=BLOCK_BYTES, use_threads=False, column_names=names)
    parse_options = pa_csv.ParseOptions(invalid_row_handler=on_invalid_row)
    convert_options = pa_csv.ConvertOptions(
        include_columns=wanted,
        column_types={name: pa.string() for name in wanted},
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )
    row_offset = 0
    with source.open_binary() as stream:
        try:
            reader = pa_csv.open_csv(
                stream,
                read_options=read_options,
                parse_options=parse_options,
                convert_options=convert_options,
            )
            for table in _gathered(reader, BATCH_BYTES):
                rows_before = (row_offset, first_line)
                batch = _convert(table, layout, source, skips, rows_before, invalid_lines, pending)
                row_offset += table.num_rows
                if batch.num_rows:
                    yield batch
            _report(pending, [], skips, source, None)
        except pa.ArrowInvalid as err:
            # pyarrow ends a parse error with the row ("…, got 2: <the row>"): never shown
            reason = ": ".join(str(err).split(": ")[:2])
            raise TraceFormatError(f"is not a readable CSV file ({reason})", source.path) from err
        except READ_ERRORS as err:
            raise TraceFormatError(f"cannot read to the end ({err})", source.path) from err


def _gathered(reader: pa_csv.CSVStreamingReader, batch_bytes: int) -> Iterator[pa.Table]:
    """The reader's small record batches gathered into tables of about ``batch_bytes``.

    pyarrow's streaming reader keeps up to 32 blocks read ahead, so its blocks are kept small
    (``BLOCK_BYTES``) to bound memory; the conversion runs on bigger tables to spend less time per row.
    """
    parts: list[pa.RecordBatch] = []
    size = 0
    for record_batch in reader:
        if record_batch.num_rows == 0:
            continue
        parts.append(record_batch)
        size += record_batch.nbytes
        if size >= batch_bytes:
            yield pa.Table.from_batches(parts).combine_chunks()
            parts, size = [], 0
    if parts:
        yield pa.Table.from_batches(parts).combine_chunks()


def _report(
    pending: list[tuple[int | None, str]],
    found: list[tuple[int, str]],
    skips: SkipLog,
    source: LogSource,
    last_line: int | None,
) -> None:
    """Skip the rows ``found`` in a batch and those ``pending`` (wrong columns) up to ``last_line``, in
    line order — the same order however the file is cut into batches or spans (``--strict`` stops at
    the first)."""
    due = [(line, reason) for line, reason in pending if last_line is None or (line or 0) <= last_line]
    if due:
        del pending[: len(due)]  # pyarrow meets them in line order
    for line, reason in sorted([*due, *found], key=lambda item: item[0] or 0):
        skips.skip(reason, source.name, line)


def _convert(
    table: pa.Table,
    layout: CsvLayout,
    source: LogSource,
    skips: SkipLog,
    rows_before: tuple[int, int],
    invalid_lines: list[int],
    pending: list[tuple[int | None, str]],
) -> pa.Table:
    row_offset, first_line = rows_before  # rows before this table, and the line of the input's first row
    n = table.num_rows
    good = np.ones(n, dtype=bool)
    reasons: list[tuple[np.ndarray, str]] = []

    def integers(column: str, *, optional: bool = False) -> pa.Array:
        text = table.column(column)
        if not optional and _plain_digits(text):  # the usual column: no regex needed to know it is valid
            try:
                return pc.cast(text, pa.int64())
            except pa.ArrowInvalid:  # too large for int64: the general route below
                pass
        valid = pc.match_substring_regex(text, INT_PATTERN)
        if optional:
            empty = pc.equal(pc.utf8_trim_whitespace(text), "")
            bad = np.asarray(pc.invert(pc.or_(valid, empty)))
            values = pc.if_else(valid, text, pa.scalar(None, pa.string()))
        else:
            bad = np.asarray(pc.invert(valid))
            values = pc.if_else(valid, text, "0")
        if bad.any():
            reasons.append((bad, f"not a non-negative integer in column {column!r}"))
        elif not optional:  # fast path: plain digits cast straight to int64 (same values up to 2**53)
            try:
                return pc.cast(text, pa.int64())
            except pa.ArrowInvalid:  # spaces, "12.0" or too large: the general route below
                pass
        return pc.cast(pc.cast(pc.utf8_trim_whitespace(values), pa.float64()), pa.int64())

    prompt = integers(layout.prompt)
    output = integers(layout.output)
    max_tokens = None if layout.max_tokens is None else integers(layout.max_tokens, optional=True)
    time_s = (
        np.zeros(n, dtype=np.float64)
        if layout.time is None
        else _times(table.column(layout.time), layout, reasons)
    )
    _bounds(reasons, table, layout, time_s, prompt_tokens=prompt, output_tokens=output, max_tokens=max_tokens)
    found: list[tuple[int, str]] = []
    for bad, reason in reasons:
        for index in np.flatnonzero(bad & good):
            found.append((_line_number(row_offset + int(index), invalid_lines, first_line), reason))
        good &= ~bad
    _report(pending, found, skips, source, _line_number(row_offset + n - 1, invalid_lines, first_line))
    columns: dict[str, object] = {
        "time_s": time_s,
        "prompt_tokens": prompt,
        "output_tokens": output,
    }
    if max_tokens is not None:
        columns["max_tokens"] = max_tokens
    if layout.model is not None:
        columns["model"] = pc.utf8_trim_whitespace(table.column(layout.model))
    if layout.id is not None:
        columns["id"] = table.column(layout.id)
    if layout.failed_when_no_output:
        columns["ok"] = pc.greater(output, 0)
    batch = make_batch(n, **columns)
    return batch if good.all() else batch.filter(pa.array(good))


def _bounds(
    reasons: list[tuple[np.ndarray, str]],
    table: pa.Table,
    layout: CsvLayout,
    time_s: np.ndarray,
    **counts: pa.Array | None,
) -> None:
    """Rows over the trace's bounds (``oomload.trace.model``), with the reasons
    ``values_bounds_reason`` gives."""
    for name, values in counts.items():
        if values is not None:
            over = np.asarray(pc.fill_null(pc.greater(values, MAX_TOKENS), False))
            if over.any():
                reasons.append((over, tokens_bound_reason(name)))
    times = np.asarray(time_s, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        odd_time = ~np.isfinite(times) | (np.abs(times) > MAX_TIME_S)
    if odd_time.any():
        reasons.append((odd_time, TIME_BOUND_REASON))
    for name, column in (("model", layout.model), ("id", layout.id)):
        if column is not None:
            long = np.asarray(
                pc.fill_null(pc.greater(pc.utf8_length(table.column(column)), MAX_ID_CHARS), False)
            )
            if long.any():
                reasons.append((long, text_bound_reason(name)))


def _plain_digits(text: pa.ChunkedArray) -> bool:
    """Whether every value is one or more ASCII digits and nothing else (checked on the raw bytes)."""
    for chunk in text.chunks:
        if chunk.null_count or not pa.types.is_string(chunk.type):
            return False
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[
            chunk.offset : chunk.offset + len(chunk) + 1
        ]
        if len(chunk) and (np.diff(offsets) <= 0).any():
            return False
        data = chunk.buffers()[2]
        if data is not None and len(chunk):
            raw = np.frombuffer(data, dtype=np.uint8)[int(offsets[0]) : int(offsets[-1])]
            if ((raw < 48) | (raw > 57)).any():
                return False
    return True


def _times(text: pa.ChunkedArray, layout: CsvLayout, reasons: list[tuple[np.ndarray, str]]) -> np.ndarray:
    if layout.time_unit != "datetime":
        valid = pc.match_substring_regex(text, FLOAT_PATTERN)
        bad = np.asarray(pc.invert(valid))
        if bad.any():
            empty = _empty_cells(text)
            reasons.append((bad & empty, f"no time in column {layout.time!r}"))
            reasons.append((bad & ~empty, f"not a number in time column {layout.time!r}"))
        seconds = pc.cast(pc.utf8_trim_whitespace(pc.if_else(valid, text, "0")), pa.float64())
        return np.asarray(seconds, dtype=np.float64) * TIME_UNITS_S[layout.time_unit]
    stamps = _cast_stamps(text)  # trimmed only when the text as read does not parse (rarely needed)
    if stamps is None:
        stamps = _cast_stamps(pc.utf8_trim_whitespace(text))
    if stamps is not None:
        return np.asarray(pc.cast(stamps, pa.int64()), dtype=np.int64) / 1e9
    # Mixed or bad values: parse one by one to find the rows to skip.
    values = np.zeros(len(text), dtype=np.float64)
    bad = np.zeros(len(text), dtype=bool)
    for index, value in enumerate(text.to_pylist()):
        parsed = parse_datetime_ns(value)
        if parsed is None:
            bad[index] = True
        else:
            values[index] = parsed / 1e9  # as the vectorized cast gives it, bit for bit
    empty = _empty_cells(text)
    reasons.append((bad & empty, f"no time in column {layout.time!r}"))
    reasons.append((bad & ~empty, f"not a timestamp in column {layout.time!r}"))
    return values


def _empty_cells(text: pa.ChunkedArray) -> np.ndarray:
    """Which cells hold nothing but blanks: a time that is missing, counted apart from one that is
    there but cannot be read (as the OpenAI-style readers do)."""
    return np.asarray(pc.equal(pc.utf8_trim_whitespace(text), ""), dtype=bool)


def _cast_stamps(text: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """``text`` as nanosecond timestamps (naive, else with a zone); ``None`` when a value does not parse."""
    for unit in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
        try:
            return pc.cast(text, unit)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


def parse_datetime_ns(text: str | None) -> int | None:
    """``parse_datetime_s`` in whole nanoseconds (fractional digits past 9 are dropped), exactly."""
    parts = _iso_parts(text)
    if parts is None:
        return None
    stamp, digits = parts
    whole_s = (stamp - EPOCH) // timedelta(seconds=1)
    if digits is None:
        return whole_s * 1_000_000_000 + stamp.microsecond * 1000
    return whole_s * 1_000_000_000 + int((digits + "0" * 9)[:9])


# The usual stamp: date, time to the second, an optional fraction and zone (ASCII digits only).
_USUAL_STAMP = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?(Z|[+-][0-9]{2}:[0-9]{2})?"
)


def parse_datetime_s(text: str | None) -> float | None:
    """Seconds since the epoch of an ISO-8601 timestamp (≤ 9 fractional digits; naive = UTC).

    A log's stamps share their second with their neighbours, so the usual stamp
    (``_USUAL_STAMP``) is split into its whole second and zone, parsed once per second
    (``_whole_seconds``, cached), and its fraction added: the same sum, to the bit, that
    ``_iso_parts`` gives (the time without the fraction, plus ``float("0." + digits)``).
    """
    if isinstance(text, str) and (usual := _USUAL_STAMP.fullmatch(text)) is not None:
        head, digits, zone = usual.groups()
        whole_s = _whole_seconds(head, zone or "")
        if whole_s is None or digits is None:
            return whole_s
        return whole_s + float("0." + digits)
    return _parse_datetime_s(text)


@functools.lru_cache(maxsize=1024)
def _whole_seconds(head: str, zone: str) -> float | None:
    return _parse_datetime_s(head + zone)


def _parse_datetime_s(text: str | None) -> float | None:
    parts = _iso_parts(text)
    if parts is None:
        return None
    stamp, digits = parts
    return stamp.timestamp() + (0.0 if digits is None else float("0." + digits))


def _iso_parts(text: str | None) -> tuple[datetime, str | None] | None:
    """An ISO-8601 timestamp as (its time without the fraction after a ``.``, naive = UTC; the
    fraction's digits, ``None`` without one) — ``datetime`` keeps 6 digits, logs may carry 9."""
    if not text:
        return None
    value = text.strip().replace("Z", "+00:00")
    date_part, dot, rest = value.partition(".")
    digits = None
    if dot:
        digits, zone = rest, ""
        for sign in ("+", "-"):
            if sign in rest:
                digits, zone = rest.split(sign, 1)
                zone = sign + zone
                break
        if not digits.isdigit():
            return None
        value = date_part + zone
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)), digits


def _line_number(row_index: int, invalid_lines: list[int], first_line: int = 2) -> int:
    """The line of the ``row_index``-th row read, counting the rows skipped for their number of columns.

    ``invalid_lines`` (ascending, as pyarrow meets them): lines of rows skipped before.
    """
    line = row_index + first_line
    before = bisect.bisect_right(invalid_lines, line)
    while (more := bisect.bisect_right(invalid_lines, row_index + first_line + before)) > before:
        before = more
    return row_index + first_line + before
