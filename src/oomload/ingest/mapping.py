"""Any CSV or JSONL log through an explicit column mapping: ``--map input=COL,output=COL,time=COL``.

Keys: ``input`` and ``output`` (token counts, required), ``time`` (optional; seconds by default,
``time=COL:ms`` / ``:us`` / ``:ns`` for other units, ``:datetime`` (or ``:iso``) for ISO-8601 text —
detected from the first value when no unit is given; the text after the last ``:`` must be a unit,
so a time column whose name holds ``:`` is written with its unit, ``time=a:b:s``), and optional
``id``, ``max_tokens``, ``model``, ``ok`` (a boolean or an HTTP status column), ``conversation`` (a
conversation / session id, JSONL only: ``session``, ``turn`` and prefix chains, see
``read_mapped_jsonl_records``). In JSONL a column
may be a dotted path into nested objects (``usage.prompt_tokens``). A mapping that names a column
the file lacks is refused before anything is read, with the file's actual columns listed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from oomload.errors import ConfigError, TraceFormatError, names_shown
from oomload.ingest.openai_log import time_given
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import LogSource, iter_json_objects
from oomload.ingest.tabular import TIME_UNITS_S, CsvLayout, check_layout, csv_header, parse_datetime_s
from oomload.trace.model import TraceRecord, bounds_reason
from oomload.trace.prefix import BlockHasher

MAP_KEYS = ("input", "output", "time", "id", "max_tokens", "model", "ok", "conversation")
TIME_UNIT_ALIASES = {"iso": "datetime"}
ALLOWED_TIME_UNITS = (*TIME_UNITS_S, "datetime", *TIME_UNIT_ALIASES)
MAP_HELP = (
    "--map input=COL,output=COL[,time=COL[:s|ms|us|ns|datetime]][,id=COL][,max_tokens=COL][,model=COL]"
    "[,conversation=COL]"
)


@dataclass(frozen=True, slots=True)
class ColumnMapping:
    """Which column of a generic log holds what (``time_unit`` ``None`` = detect from the data)."""

    input: str
    output: str
    time: str | None = None
    time_unit: str | None = None
    id: str | None = None
    max_tokens: str | None = None
    model: str | None = None
    ok: str | None = None
    conversation: str | None = None

    def columns(self) -> list[str]:
        named = [self.input, self.output, self.time, self.id, self.max_tokens, self.model, self.ok]
        named.append(self.conversation)
        return [c for c in named if c is not None]


def parse_mapping(text: str) -> ColumnMapping:
    """Parse ``--map``; raises ``ConfigError`` naming the bad key."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ConfigError(f"bad --map entry {part!r}; use {MAP_HELP}")
        if key not in MAP_KEYS:
            raise ConfigError(f"unknown --map key {key!r}; allowed: {', '.join(MAP_KEYS)}")
        fields[key] = value
    for required in ("input", "output"):
        if required not in fields:
            raise ConfigError(f"--map needs {required}=COLUMN; use {MAP_HELP}")
    time_unit = None
    if "time" in fields and ":" in fields["time"]:
        column, _, unit = fields["time"].rpartition(":")
        unit = unit.strip()
        if unit not in ALLOWED_TIME_UNITS:
            raise ConfigError(
                f"unknown time unit {unit!r} in --map time={fields['time']} (allowed: "
                f"{', '.join(ALLOWED_TIME_UNITS)}; a column whose name holds ':' needs its unit, "
                "e.g. time=a:b:s)"
            )
        if not column.strip():
            raise ConfigError(f"--map time={fields['time']} names no column before the unit")
        fields["time"], time_unit = column.strip(), TIME_UNIT_ALIASES.get(unit, unit)
    return ColumnMapping(
        input=fields["input"],
        output=fields["output"],
        time=fields.get("time"),
        time_unit=time_unit,
        id=fields.get("id"),
        max_tokens=fields.get("max_tokens"),
        model=fields.get("model"),
        ok=fields.get("ok"),
        conversation=fields.get("conversation"),
    )


def csv_layout(source: LogSource, mapping: ColumnMapping) -> CsvLayout:
    """The ``CsvLayout`` for a mapped CSV (time unit detected from the first row when not given)."""
    if mapping.ok is not None:
        raise ConfigError("--map ok=COL is supported for JSONL logs only")
    if mapping.conversation is not None:
        raise ConfigError("--map conversation=COL is supported for JSONL logs only")
    unit = mapping.time_unit or "s"
    if mapping.time is not None and mapping.time_unit is None:
        header = csv_header(source)
        lines = source.head().splitlines()
        if len(lines) > 1 and mapping.time in header:
            cells = lines[1].decode("utf-8", errors="replace").split(",")
            index = header.index(mapping.time)
            if index < len(cells) and _is_number(cells[index].strip().strip('"')) is False:
                unit = "datetime"
    layout = CsvLayout(
        prompt=mapping.input,
        output=mapping.output,
        time=mapping.time,
        time_unit=unit,
        id=mapping.id,
        max_tokens=mapping.max_tokens,
        model=mapping.model,
    )
    check_layout(source, layout, "--map")
    return layout


def check_jsonl_mapping(source: LogSource, mapping: ColumnMapping) -> None:
    """Refuse a mapping whose columns the file's first object lacks (read whole: a line may be longer
    than the sniffed head)."""
    tried = 0
    for _, line in source.iter_lines():
        if not line.strip():
            continue
        tried += 1
        if tried > 5:
            break
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            for column in mapping.columns():
                if _lookup(obj, column) is _MISSING:
                    keys = names_shown(list(obj), "keys")
                    raise TraceFormatError(
                        f"--map names column {column!r}, but the first record has {keys}", source.path
                    )
            return
    raise TraceFormatError("no JSON object in the first lines", source.path)


def read_mapped_jsonl_records(
    source: LogSource, mapping: ColumnMapping, skips: SkipLog, hasher: BlockHasher | None = None
) -> Iterator[TraceRecord]:
    """Records from a JSONL log through ``mapping`` (``arrival_s`` on the log's clock).

    With ``conversation=COL``, a request's ``session`` is that column and its ``turn`` counts the
    conversation's requests so far (in file order); with ``hasher`` its ``hash_ids`` are the first
    blocks of its conversation's token stream (``BlockHasher.conversation_chain``): each turn's prompt
    is taken to start with the conversation's earlier turns, verbatim.
    """
    scale = TIME_UNITS_S.get(mapping.time_unit or "s", 1.0)
    turns: dict[str, int] = {}
    for number, obj in iter_json_objects(source, skips):
        prompt = _count(_lookup(obj, mapping.input))
        output = _count(_lookup(obj, mapping.output))
        if prompt is None or output is None:
            column = mapping.input if prompt is None else mapping.output
            skips.skip(f"not a non-negative integer in {column!r}", source.name, number)
            continue
        time_s = 0.0
        if mapping.time is not None:
            raw = _lookup(obj, mapping.time)
            parsed = _time_value(raw, mapping.time_unit, scale)
            if parsed is None:  # a time that is missing is counted apart from one that cannot be read
                given = raw is not _MISSING and time_given(raw)
                what = "not a time in" if given else "no time in"
                skips.skip(f"{what} {mapping.time!r}", source.name, number)
                continue
            time_s = parsed
        max_tokens = None if mapping.max_tokens is None else _count(_lookup(obj, mapping.max_tokens))
        session = None if mapping.conversation is None else _text(_lookup(obj, mapping.conversation))
        record = TraceRecord(
            id="" if mapping.id is None else _text(_lookup(obj, mapping.id)) or "",
            arrival_s=time_s,
            prompt_tokens=prompt,
            output_tokens=output,
            max_tokens=max_tokens,
            ok=True if mapping.ok is None else _ok(_lookup(obj, mapping.ok)),
            model=None if mapping.model is None else _text(_lookup(obj, mapping.model)),
            session=session,
        )
        reason = bounds_reason(record)  # before the chain: its length follows the prompt's
        if reason is not None:
            skips.skip(reason, source.name, number)
            continue
        if session is not None:
            turn = turns.get(session, 0)
            turns[session] = turn + 1
            hash_ids = () if hasher is None else hasher.conversation_chain(session, prompt)
            record = dataclasses.replace(record, turn=turn, hash_ids=hash_ids)
        yield record


_MISSING = object()


def _lookup(obj: dict[str, Any], path: str) -> Any:
    if path in obj:
        return obj[path]
    value: Any = obj
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and value >= 0 and value == int(value):
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _time_value(value: Any, unit: str | None, scale: float) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) * scale
    if isinstance(value, str):
        if _is_number(value):
            return float(value) * scale
        return parse_datetime_s(value)
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _text(value: Any) -> str | None:
    if value is _MISSING or value is None:
        return None
    return str(value)


def _ok(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return 200 <= value < 300
    if isinstance(value, str):
        return value.strip().lower() in ("true", "ok", "success", "1") or value.strip().startswith("2")
    return value is not _MISSING and value is not None
