"""Requests in columns: the batch every reader produces, and its conversion to trace lines and records.

A batch is a ``pyarrow.Table`` with ``BATCH_SCHEMA`` — one row per request, ``time_s`` on the log's
own clock (epoch seconds, or the log's relative seconds), ``id`` null where the log has none. Table
formats (CSV, Mooncake JSONL) are parsed straight into batches by pyarrow's C++ readers, OpenAI-style
and vLLM logs gather their columns directly; the others build ``TraceRecord`` objects, packed into
batches by ``batch_from_records``.
Everything downstream — merging, writing, statistics — works on batches, so memory stays flat
(one batch at a time) and the per-request Python work is confined to the formats that need it.

``format_lines`` renders a batch as trace lines with vectorized pyarrow string kernels (no Python
loop per request): the same JSON that ``TraceRecord.to_json`` describes, optional keys omitted,
``arrival_s`` = ``time_s − origin_s`` rounded to 1 µs, null ids replaced by ``r<N>`` (N = position
in the trace). ``read_trace_columns`` reads an oomload trace back the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from oomload.errors import TraceFormatError
from oomload.ingest.source import LogSource
from oomload.trace.model import (
    MAX_HASH_IDS,
    MAX_ID_CHARS,
    MAX_TIME_S,
    MAX_TOKENS,
    MAX_TURN,
    TraceRecord,
    iter_trace,
)

BATCH_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("time_s", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("max_tokens", pa.int64()),
        ("ok", pa.bool_()),
        ("model", pa.string()),
        ("hash_ids", pa.list_(pa.int64())),
        ("session", pa.string()),
        ("parent", pa.string()),
        ("turn", pa.int64()),
    ]
)
RECORDS_PER_BATCH = 16_384

# Columns of an oomload trace line, for reading a trace back with pyarrow.
TRACE_SCHEMA = pa.schema(
    [("arrival_s" if f.name == "time_s" else f.name, f.type) for f in BATCH_SCHEMA]  # same columns
)


def make_batch(length: int, **columns: Any) -> pa.Table:
    """A batch of ``length`` rows from the given columns; missing columns are all-null (``ok`` all true)."""
    arrays = []
    for schema_field in BATCH_SCHEMA:
        value = columns.get(schema_field.name)
        if value is None:
            if schema_field.name == "ok":
                arrays.append(pa.array(np.ones(length, dtype=bool)))
            else:
                arrays.append(pa.nulls(length, schema_field.type))
        elif isinstance(value, pa.ChunkedArray | pa.Array):
            arrays.append(value.cast(schema_field.type))
        else:
            arrays.append(pa.array(value, type=schema_field.type))
    return pa.Table.from_arrays(arrays, schema=BATCH_SCHEMA)


def batch_from_records(records: list[TraceRecord]) -> pa.Table:
    """Pack reader records (``arrival_s`` on the log's clock, ``id`` ``""`` = none) into a batch."""
    columns: dict[str, list[Any]] = {
        "time_s": [r.arrival_s for r in records],
        "prompt_tokens": [r.prompt_tokens for r in records],
        "output_tokens": [r.output_tokens for r in records],
    }
    # Optional columns are built only when some record has a value (most logs fill few of them).
    if any(r.id for r in records):
        columns["id"] = [r.id or None for r in records]
    if not all(r.ok for r in records):
        columns["ok"] = [r.ok for r in records]
    if any(r.hash_ids for r in records):
        columns["hash_ids"] = [list(r.hash_ids) for r in records]
    for name in ("max_tokens", "model", "session", "parent", "turn"):
        values = [getattr(r, name) for r in records]
        if any(v is not None for v in values):
            columns[name] = values
    return make_batch(len(records), **columns)


def batches_from_records(records: Iterable[TraceRecord], size: int = RECORDS_PER_BATCH) -> Iterator[pa.Table]:
    """Group a record stream into batches of ``size`` rows."""
    pending: list[TraceRecord] = []
    for record in records:
        pending.append(record)
        if len(pending) >= size:
            yield batch_from_records(pending)
            pending = []
    if pending:
        yield batch_from_records(pending)


def records_from_batch(batch: pa.Table, *, origin_s: float = 0.0) -> Iterator[TraceRecord]:
    """The rows of a batch as records, ``arrival_s = time_s − origin_s``; null ids become ``""``."""
    cols = {name: batch.column(name).to_pylist() for name in BATCH_SCHEMA.names}
    for i in range(batch.num_rows):
        hash_ids = cols["hash_ids"][i]
        yield TraceRecord(
            id=cols["id"][i] or "",
            arrival_s=cols["time_s"][i] - origin_s,
            prompt_tokens=cols["prompt_tokens"][i],
            output_tokens=cols["output_tokens"][i],
            max_tokens=cols["max_tokens"][i],
            ok=cols["ok"][i] is not False,
            model=cols["model"][i],
            hash_ids=tuple(hash_ids) if hash_ids else (),
            session=cols["session"][i],
            parent=cols["parent"][i],
            turn=cols["turn"][i],
        )


def format_lines(batch: pa.Table, *, origin_s: float, first_index: int) -> pa.Array:
    """Trace lines (each ending in ``\\n``) for the rows of ``batch``, as one pyarrow string array.

    A row without an id gets ``r<N>``, N its index in the trace (``first_index`` for the batch's first).
    """
    n = batch.num_rows
    id_column = batch.column("id")
    pieces: list[pa.Array | pa.ChunkedArray | str]
    if id_column.null_count == n:  # all generated: r<N> needs no escaping, joined in the one pass below
        pieces = ['{"id":"r', _numbers(first_index, n), '"']
    else:
        generated = pc.binary_join_element_wise("r", _numbers(first_index, n), "")
        pieces = _json_string_pieces('{"id":', pc.if_else(pc.is_null(id_column), generated, id_column), "")
    return _joined(pieces + _tail_pieces(batch, origin_s))


def _numbers(first_index: int, n: int) -> pa.Array:
    return pc.cast(pa.array(np.arange(first_index, first_index + n, dtype=np.int64)), pa.string())


def _joined(pieces: list[pa.Array | pa.ChunkedArray | str]) -> pa.Array:
    merged: list[pa.Array | pa.ChunkedArray | str] = []
    for piece in pieces:  # adjacent literals as one (each piece costs the kernel a pass)
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    # An optional key's piece is null where the row has no value: joined as "" (no copy to fill it)
    line_array = pc.binary_join_element_wise(*merged, "", null_handling="replace", null_replacement="")
    if isinstance(line_array, pa.ChunkedArray):
        line_array = line_array.combine_chunks()
    return line_array


def _tail_pieces(batch: pa.Table, origin_s: float) -> list[pa.Array | pa.ChunkedArray | str]:
    arrival = pc.round(pc.subtract(batch.column("time_s"), origin_s), 6)
    pieces: list[pa.Array | pa.ChunkedArray | str] = [
        ',"arrival_s":',
        pc.cast(arrival, pa.string()),
        ',"prompt_tokens":',
        pc.cast(batch.column("prompt_tokens"), pa.string()),
        ',"output_tokens":',
        pc.cast(batch.column("output_tokens"), pa.string()),
    ]
    _optional_number(pieces, batch, "max_tokens")
    ok = batch.column("ok")
    if pc.any(pc.invert(pc.fill_null(ok, True))).as_py():
        pieces.append(pc.if_else(pc.fill_null(ok, True), "", ',"ok":false'))
    _optional_string(pieces, batch, "model")
    hash_ids = batch.column("hash_ids")
    lengths = pc.list_value_length(hash_ids)  # null for a null list
    if pc.any(pc.greater(pc.fill_null(lengths, 0), 0)).as_py():
        fixed = _sixteen_digit_lists(hash_ids)
        if fixed is not None:  # the key and the bracket as pieces of their own: the ids' text is copied once
            filled = pc.is_valid(fixed)
            pieces += [
                pc.if_else(filled, ',"hash_ids":', _NULL_TEXT),
                fixed,
                pc.if_else(filled, "]", _NULL_TEXT),
            ]
        else:
            if pc.any(pc.equal(lengths, 0)).as_py():  # an empty list is written as none
                hash_ids = pc.if_else(pc.equal(lengths, 0), pa.scalar(None, hash_ids.type), hash_ids)
            joined = pc.binary_join(pc.cast(hash_ids, pa.list_(pa.string())), ",")
            pieces.append(pc.binary_join_element_wise(',"hash_ids":[', joined, "]", ""))  # null: no ids
    _optional_string(pieces, batch, "session")
    _optional_string(pieces, batch, "parent")
    _optional_number(pieces, batch, "turn")
    pieces.append("}\n")
    return pieces


_NULL_TEXT = pa.scalar(None, pa.string())
_SIXTEEN_DIGITS = (10**15, 10**16)  # the range of derived prefix ids (blockhash.ID_BASE)
_FOUR_DIGITS = np.frombuffer("".join(f"{i:04d}" for i in range(10_000)).encode(), dtype="<u4")
_ID_CELL = np.dtype([("separator", "u1"), *((f"digits{row}", "<u4") for row in range(4))])  # packed: 17 bytes


def _sixteen_digit_lists(hash_ids: pa.Array | pa.ChunkedArray) -> pa.Array | None:
    """``"[id,id,…"`` for each row's list (null for a null or empty list) when every id has 16 digits,
    as the prefix ids derived from logs do; ``None`` otherwise (the generic cast renders them).

    Fixed width makes the text a numpy job: each id is four table lookups of four digits, written as
    17 bytes (a separator, 16 digits) into one buffer in the lists' order, so a row's text is one
    stretch of it; the separator that opens a row is ``[`` instead of ``,``. The result is a string
    array over that buffer, built with no per-row work."""
    lists = hash_ids.combine_chunks() if isinstance(hash_ids, pa.ChunkedArray) else hash_ids
    offsets = np.asarray(lists.offsets, dtype=np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    values = lists.values.slice(first, last - first)
    if values.null_count or (last - first) * 17 >= 2**31:
        return None
    ids = values.to_numpy()
    if not len(ids) or not (_SIXTEEN_DIGITS[0] <= ids.min() and ids.max() < _SIXTEEN_DIGITS[1]):
        return None
    # the id's four 4-digit groups, high first: floor division by a constant then a multiply-subtract,
    # each into a contiguous row (numpy divides by a scalar with libdivide, a multiply; np.divmod, or an
    # output with a stride, divides element by element: ~3x the time, 8.1 ms against 2.6 for 481k ids);
    # each 8-digit half fits 32 bits, where a division costs less than in 64
    high = ids // 10**8
    groups = np.empty((4, len(ids)), dtype=np.int32)
    for row, value in ((0, high.astype(np.int32)), (2, (ids - high * 10**8).astype(np.int32))):
        np.floor_divide(value, 10**4, out=groups[row])
        np.subtract(value, groups[row] * 10**4, out=groups[row + 1])
    cells = np.empty(len(ids), dtype=_ID_CELL)  # 17 bytes an id: a separator, then 16 digits
    cells["separator"] = ord(",")
    for row in range(4):
        cells[f"digits{row}"] = _FOUR_DIGITS[groups[row]]
    text = cells.view(np.uint8)
    starts = (offsets - first) * 17
    filled = np.diff(offsets) > 0
    if lists.null_count:
        filled &= np.asarray(lists.is_valid())
    text[starts[:-1][filled]] = ord("[")
    return pa.StringArray.from_buffers(
        len(lists),
        pa.py_buffer(starts.astype(np.int32)),
        pa.py_buffer(text),
        pa.py_buffer(np.packbits(filled, bitorder="little")),
        null_count=int(len(filled) - np.count_nonzero(filled)),
    )


def _optional_number(pieces: list[pa.Array | pa.ChunkedArray | str], batch: pa.Table, name: str) -> None:
    column = batch.column(name)
    if column.null_count == len(column):
        return
    pieces.append(pc.binary_join_element_wise(f',"{name}":', pc.cast(column, pa.string()), ""))  # null: none


def _optional_string(pieces: list[pa.Array | pa.ChunkedArray | str], batch: pa.Table, name: str) -> None:
    column = batch.column(name)
    if column.null_count == len(column):
        return
    pieces.append(
        pc.binary_join_element_wise(*_json_string_pieces(f',"{name}":', column, ""), "")
    )  # null: none


def _json_string_pieces(
    before: str, column: pa.Array | pa.ChunkedArray, after: str
) -> list[pa.Array | pa.ChunkedArray | str]:
    """``before``, the column as JSON string literals (quoted, escaped; nulls stay null), ``after``: the
    pieces of a join, the quotes merged into the literals around the text (one pass fewer).

    What each string needs is read from the bytes its chunk's strings span, one numpy pass each: no
    control character (the usual id or model) means none of the strings has one, and no ``\\`` or
    ``"`` means nothing to escape — the regex and the two replacements, which cost a pass over every
    string each, run only when a byte says they may be needed; the text is the same either way."""
    # ensure_ascii=False: the same text as the kernels below give, so a line does not depend on
    # whether another string of its batch held a control character (the parallel build relies on it).
    spans = _spanned_bytes(column)
    if (spans is None or bool((spans < 0x20).any())) and pc.any(
        pc.match_substring_regex(column, r"[\x00-\x1f]")
    ).as_py():
        literals = pa.array(
            [None if v is None else json.dumps(v, ensure_ascii=False) for v in column.to_pylist()],
            pa.string(),
        )
        return [before, literals, after]
    escaped = column
    if spans is None or bool(np.isin(spans, _ESCAPED_BYTES).any()):
        escaped = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')
    return [before + '"', escaped, '"' + after]


_ESCAPED_BYTES = np.frombuffer(b'\\"', dtype=np.uint8)


def _spanned_bytes(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint8] | None:
    """The bytes from each chunk's first string to its last (``lines_bytes``: a null's span included, so
    never fewer than its strings hold), joined; ``None`` for a column that is not plain or large strings."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    spans = []
    for chunk in chunks:
        if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
            return None
        if len(chunk):
            spans.append(np.frombuffer(lines_bytes(chunk), dtype=np.uint8))
    if len(spans) == 1:
        return spans[0]
    return np.concatenate(spans) if spans else np.empty(0, dtype=np.uint8)


def lines_bytes(lines: pa.Array) -> memoryview:
    """The concatenated UTF-8 bytes of a string array (a slice's own strings; zero copy), as
    ``format_lines`` builds them."""
    offsets_buffer, data_buffer = lines.buffers()[1], lines.buffers()[2]
    offset_type = np.int64 if pa.types.is_large_string(lines.type) else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[lines.offset : lines.offset + len(lines) + 1]
    if data_buffer is None:
        return memoryview(b"")
    return memoryview(data_buffer)[int(offsets[0]) : int(offsets[-1])]


def read_trace_columns(path: str | Path, chunk_bytes: int = 8 * 1024 * 1024) -> Iterator[pa.Table]:
    """Stream an oomload trace as tables with ``TRACE_SCHEMA`` (header checked; records validated).

    Fast path: pyarrow's JSON reader per chunk. On any chunk it cannot take — or on negative
    lengths — the file is re-read with ``iter_trace``, which raises ``TraceFormatError`` at the exact line.
    """
    from oomload.trace.model import read_trace_header

    read_trace_header(path)
    source = LogSource(Path(path))
    options = pa_json.ParseOptions(explicit_schema=TRACE_SCHEMA, unexpected_field_behavior="ignore")
    for first_line, chunk in source.iter_chunks(chunk_bytes):
        body = chunk.split(b"\n", 1)[1] if first_line == 1 else chunk
        if not body.strip():
            continue
        try:
            table = pa_json.read_json(pa.py_buffer(body), parse_options=options)
            _check_trace_table(table)
        except (pa.ArrowInvalid, ValueError) as err:
            for _ in iter_trace(path):  # raises at the exact line
                pass
            raise TraceFormatError(f"malformed trace ({err})", path) from err
        yield table


def _check_trace_table(table: pa.Table) -> None:
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "id"):
        if table.column(name).null_count:
            raise ValueError(f"a record lacks {name}")
    for name in ("prompt_tokens", "output_tokens"):
        if table.num_rows and pc.min(table.column(name)).as_py() < 0:
            raise ValueError(f"negative {name}")
    if table.num_rows and not batch_within_bounds(table, time_column="arrival_s"):
        raise ValueError("a value over the trace's bounds")


def batch_within_bounds(batch: pa.Table, *, time_column: str = "time_s") -> bool:
    """True when every row of a batch (``BATCH_SCHEMA``, or ``TRACE_SCHEMA`` with ``arrival_s``) keeps the
    trace format's bounds (``oomload.trace.model``); a reader redoes a batch that does not line by line, so
    each bad row is named (``values_bounds_reason``)."""
    times = batch.column(time_column)
    if times.null_count < len(times):
        finite = pc.is_finite(times)
        if not pc.all(pc.fill_null(finite, True)).as_py():
            return False
        extremes = pc.min_max(times)
        if max(abs(extremes["min"].as_py()), abs(extremes["max"].as_py())) > MAX_TIME_S:
            return False
    for name in ("prompt_tokens", "output_tokens", "max_tokens"):
        column = batch.column(name)
        if column.null_count < len(column) and pc.max(column).as_py() > MAX_TOKENS:
            return False
    for name in ("id", "model", "session", "parent"):
        column = batch.column(name)
        if column.null_count < len(column) and pc.max(pc.utf8_length(column)).as_py() > MAX_ID_CHARS:
            return False
    hash_ids = batch.column("hash_ids")
    if hash_ids.null_count < len(hash_ids) and pc.max(pc.list_value_length(hash_ids)).as_py() > MAX_HASH_IDS:
        return False
    turn = batch.column("turn")
    return turn.null_count == len(turn) or bool(pc.max(pc.abs(turn)).as_py() <= MAX_TURN)
