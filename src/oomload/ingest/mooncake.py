"""Mooncake and Bailian JSONL traces: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

Bailian adds ``chat_id``, ``parent_chat_id`` (−1 = none), ``turn`` and ``type``; they become the
record's ``session``, ``parent`` and ``turn``. A line whose ``turn`` is not an integer (a bool, a
string, ``2.5``; ``3.0`` and ``2e6`` are integers) or beyond ±``MAX_TURN`` is skipped with that
reason, like any invalid field. ``hash_ids`` (prefix block ids, 512-token blocks in
the published traces) are kept for prefix-sharing replays.

Speed: the file is read in chunks of whole lines and each chunk goes through pyarrow's JSON reader
(C++) with an explicit schema. A chunk pyarrow rejects, or one with an invalid value, is parsed again
line by line with orjson, so every bad line is skipped with its number and reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from oomload.ingest.columns import batch_within_bounds, make_batch
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import NOT_JSON_OBJECT, LogSource, unparsed_reason
from oomload.trace.model import values_bounds_reason

MOONCAKE_SCHEMA = pa.schema(
    [
        ("timestamp", pa.float64()),
        ("input_length", pa.int64()),
        ("output_length", pa.int64()),
        ("hash_ids", pa.list_(pa.int64())),
        ("turn", pa.int64()),
    ]
)
BAILIAN_ID_KEYS = ("chat_id", "parent_chat_id")


def read_mooncake_batches(source: LogSource, skips: SkipLog) -> Iterator[pa.Table]:
    """Stream a Mooncake/Bailian JSONL file as batches (``time_s`` = ``timestamp`` / 1000)."""
    options = pa_json.ParseOptions(explicit_schema=MOONCAKE_SCHEMA, unexpected_field_behavior="infer")
    for first_line, chunk in source.iter_chunks():
        if not chunk.strip():
            continue
        try:
            table = pa_json.read_json(pa.py_buffer(chunk), parse_options=options)
            batch = _batch_from_table(table)
            if not batch_within_bounds(batch):
                raise _InvalidRowsError("over the trace's bounds")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, _InvalidRowsError):
            batch = _batch_from_lines(chunk, first_line, source, skips)
        if batch.num_rows:
            yield batch


class _InvalidRowsError(Exception):
    """A chunk holds a row with a missing or negative value: redo it line by line."""


def _batch_from_table(table: pa.Table) -> pa.Table:
    for name in ("timestamp", "input_length", "output_length"):
        column = table.column(name)
        if column.null_count or (name != "timestamp" and pc.min(column).as_py() < 0):
            raise _InvalidRowsError(name)
    n = table.num_rows
    columns: dict[str, Any] = {
        "time_s": np.asarray(table.column("timestamp"), dtype=np.float64) / 1000.0,
        "prompt_tokens": table.column("input_length"),
        "output_tokens": table.column("output_length"),
        "hash_ids": table.column("hash_ids"),
        "turn": table.column("turn"),
    }
    names = table.column_names
    if "chat_id" in names:
        columns["session"] = pc.cast(table.column("chat_id"), pa.string())
    if "parent_chat_id" in names:
        parent = pc.cast(table.column("parent_chat_id"), pa.string())
        columns["parent"] = pc.if_else(pc.equal(parent, "-1"), pa.scalar(None, pa.string()), parent)
    return make_batch(n, **columns)


def _batch_from_lines(chunk: bytes, first_line: int, source: LogSource, skips: SkipLog) -> pa.Table:
    rows: dict[str, list[Any]] = {
        k: [] for k in ("time_s", "prompt_tokens", "output_tokens", "hash_ids", "session", "parent", "turn")
    }
    for offset, line in enumerate(chunk.split(b"\n")):
        if not line.strip():
            continue
        number = first_line + offset
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            skips.skip(unparsed_reason(line), source.name, number)
            continue
        reason = _invalid_reason(obj)
        if reason is None:
            reason = _bounds_reason(obj)
        if reason is not None:
            skips.skip(reason, source.name, number)
            continue
        rows["time_s"].append(float(obj["timestamp"]) / 1000.0)
        rows["prompt_tokens"].append(int(obj["input_length"]))
        rows["output_tokens"].append(int(obj["output_length"]))
        rows["hash_ids"].append([int(h) for h in obj.get("hash_ids") or ()])
        chat_id, parent = obj.get("chat_id"), obj.get("parent_chat_id")
        rows["session"].append(None if chat_id is None else str(chat_id))
        rows["parent"].append(None if parent is None or parent == -1 else str(parent))
        turn = obj.get("turn")
        rows["turn"].append(None if turn is None else int(turn))
    return make_batch(len(rows["time_s"]), **rows)


def _bounds_reason(obj: dict[str, Any]) -> str | None:
    """The trace's bounds (``oomload.trace.model``) on a valid line (``_invalid_reason`` found nothing)."""
    chat_id, parent, turn = obj.get("chat_id"), obj.get("parent_chat_id"), obj.get("turn")
    return values_bounds_reason(
        time_s=float(obj["timestamp"]) / 1000.0,
        prompt_tokens=int(obj["input_length"]),
        output_tokens=int(obj["output_length"]),
        texts={
            "session": None if chat_id is None else str(chat_id),
            "parent": None if parent is None else str(parent),
        },
        hash_ids=len(obj.get("hash_ids") or ()),
        turn=None if turn is None else int(turn),  # an integer (``_invalid_reason``): within ±MAX_TURN?
    )


def _invalid_reason(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return NOT_JSON_OBJECT
    for key in ("timestamp", "input_length", "output_length"):
        value = obj.get(key)
        if value is None:
            return f"missing {key}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{key} is not a number"
        if key != "timestamp" and (value < 0 or value != int(value)):
            return f"{key} is not a non-negative integer"
    hash_ids = obj.get("hash_ids")
    if hash_ids is not None and (
        not isinstance(hash_ids, list)
        or not all(isinstance(h, int) and not isinstance(h, bool) for h in hash_ids)
    ):
        return "hash_ids is not a list of integers"
    turn = obj.get("turn")
    integral = isinstance(turn, int) and not isinstance(turn, bool)
    if turn is not None and not (integral or (isinstance(turn, float) and turn.is_integer())):
        return "turn is not an integer"  # a bool, a string, 2.5: never a turn number
    return None
