"""OpenAI-style logs straight to columns, without paying for the prompt and completion text.

A gateway log line is mostly text (messages, choices) around a few small fields that matter: the
``usage`` counts, a time, an id, the model, ``max_tokens`` and the status. ``read_openai_batches``
decodes each line with msgspec against ``_Line``, a schema that declares *only* those fields with
their usual types: every other key (the text) is skipped while the line is scanned — no Python
string is built for it — and the values land in columns, no ``TraceRecord`` per request.

Exactness: the schema is a filter. A line whose declared fields hold anything else (a string
count, a list-shaped response of streamed chunks, an ``error`` that is not null, counts to be
taken from the text with a tokenizer, a token count past 2**53, …) fails to decode, or
``_fast_row`` declines it, and that one line goes through ``openai_log.parse_openai_line`` on the
full object, exactly as before. For every line the fast path takes, it computes what
``parse_openai_line`` computes (``tests/unit/ingest/test_openai_fast.py`` checks this on
generated lines). One difference is deliberate: text that is not valid UTF-8 inside a skipped
field no longer makes the line unusable — that text is never read.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Annotated, Any, cast

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from oomload.ingest.columns import make_batch
from oomload.ingest.openai_log import _content_text, _int_or_none, _to_seconds, parse_openai_line
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import NOT_JSON_OBJECT, LogSource
from oomload.ingest.tokens import TokenCounter
from oomload.prefix import BlockHasher, chain_marks, message_block_ids, part_marks
from oomload.trace import MAX_ID_CHARS, MAX_TIME_S, MAX_TOKENS, values_bounds_reason

UNSET = msgspec.UNSET
Unset = msgspec.UnsetType
INT64_MAX = 2**63 - 1
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]  # negative or past int64: the exact path decides
Number = Annotated[int, msgspec.Meta(ge=-INT64_MAX, le=INT64_MAX)] | float
Time = Number | str | None | Unset
Key = str | Number | None | Unset  # an id-like value; only a non-empty string is used
IntLike = Number | str | None | Unset  # what ``_int_or_none`` may turn into an int


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: Count | Unset = UNSET
    completion_tokens: Count | Unset = UNSET
    input_tokens: Count | Unset = UNSET
    output_tokens: Count | Unset = UNSET


class _Body(msgspec.Struct, gc=False):
    """A response body (chat/completions response, or the Batch output's ``body``)."""

    id: Key = UNSET
    model: Key = UNSET
    usage: _Usage | Unset | None = UNSET
    created: Time = UNSET
    error: msgspec.Raw | Unset = UNSET  # any but null: the exact path decides (``_fast_row``)


class _Response(_Body):
    body: _Body | Unset | None = UNSET
    status_code: IntLike = UNSET


class _RequestBody(msgspec.Struct, gc=False):
    model: Key = UNSET
    max_tokens: IntLike = UNSET
    max_completion_tokens: IntLike = UNSET
    max_output_tokens: IntLike = UNSET


class _Request(_RequestBody):
    body: _RequestBody | Unset = UNSET


class _PartsBody(msgspec.Struct, gc=False):
    """The parts of a prompt, as raw JSON (``_prompt_parts``): never decoded into text."""

    system: msgspec.Raw | Unset = UNSET
    tools: msgspec.Raw | Unset = UNSET
    messages: list[msgspec.Raw] | Unset = UNSET
    prompt: msgspec.Raw | Unset = UNSET


class _PartsRequest(_PartsBody):
    body: _PartsBody | Unset = UNSET


class _PartsLine(_PartsBody):
    request: _PartsRequest | Unset = UNSET


_PARTS_DECODER = msgspec.json.Decoder(_PartsLine)
CHARS_PER_TOKEN = 4  # the estimate of a message's tokens without --tokenizer (its JSON's bytes / 4)


class _Line(msgspec.Struct, gc=False):
    request: _Request | Unset | None = UNSET
    response: _Response | Unset | None = UNSET
    status_code: IntLike = UNSET
    status: IntLike = UNSET
    chunks: Unset | None = UNSET
    error: msgspec.Raw | Unset = UNSET  # any but null: the exact path decides (``_fast_row``)
    usage: _Usage | Unset | None = UNSET
    timestamp: Time = UNSET
    created_at: Time = UNSET
    start_time: Time = UNSET
    request_time: Time = UNSET
    time: Time = UNSET
    custom_id: Key = UNSET
    request_id: Key = UNSET
    id: Key = UNSET
    messages: msgspec.Raw | Unset = UNSET
    prompt: msgspec.Raw | Unset = UNSET
    model: Key = UNSET
    max_tokens: IntLike = UNSET
    max_completion_tokens: IntLike = UNSET
    max_output_tokens: IntLike = UNSET


class _RequestBodyParts(_RequestBody):
    """``_RequestBody`` with the prompt parts (``_PartsBody``'s): one decode gives the row and its parts."""

    system: msgspec.Raw | Unset = UNSET
    tools: msgspec.Raw | Unset = UNSET
    messages: list[msgspec.Raw] | Unset = UNSET
    prompt: msgspec.Raw | Unset = UNSET


class _RequestParts(_RequestBodyParts):
    body: _RequestBodyParts | Unset = UNSET


class _LineParts(_Line):
    """``_Line`` with the prompt parts, for a build that derives prefix chains (``_line_parts``)."""

    request: _RequestParts | Unset | None = UNSET  # type: ignore[assignment]
    system: msgspec.Raw | Unset = UNSET
    tools: msgspec.Raw | Unset = UNSET
    messages: list[msgspec.Raw] | Unset = UNSET  # type: ignore[assignment]


_DECODER = msgspec.json.Decoder(_Line)
_NULL = msgspec.Raw(b"null")
_PARTS_LINE_DECODER = msgspec.json.Decoder(_LineParts)


def _line_parts(line: _LineParts) -> list[Any]:
    """``_prompt_parts`` of a line decoded as ``_LineParts`` (which ``_PartsLine`` decodes too, but for a
    null ``request``, which it refuses: no parts)."""
    request = line.request
    if request is None:
        return []
    if request is not UNSET:
        return _parts_of(request.body if request.body is not UNSET else request)
    return _parts_of(line)


_Row = tuple[str | None, float, int, int, int | None, bool, str | None]


def _parts_of(body: _PartsBody | _PlainPartsRequest | _RequestBodyParts | _LineParts) -> list[Any]:
    """A request's prompt parts (raw JSON, not copied) in a chat template's order: system, tools, messages."""
    messages = body.messages
    if body.system is UNSET and body.tools is UNSET and body.prompt is UNSET:
        return [] if messages is UNSET else messages  # the usual chat request
    parts: list[Any] = [p for p in (body.system, body.tools) if p is not UNSET]
    if messages is not UNSET:
        parts += messages
    if body.prompt is not UNSET:
        parts.append(body.prompt)
    return parts


def _prompt_parts(line: bytes) -> list[Any]:
    """The prompt parts of a line read by the slower paths (empty when it has none or another shape)."""
    try:
        obj = _PARTS_DECODER.decode(line)
    except msgspec.DecodeError:
        return []
    request = obj.request
    if isinstance(request, _PartsRequest):
        return _parts_of(request.body if isinstance(request.body, _PartsBody) else request)
    return _parts_of(obj)


def _part_tokens(part: Any, counter: TokenCounter) -> int:
    """A part's tokens counted with ``--tokenizer`` (its text; tool definitions: their JSON)."""
    try:
        value = orjson.loads(memoryview(part))
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return counter.count(_content_text(value.get("content")))
    if isinstance(value, str):
        return counter.count(value)
    return counter.count(bytes(part).decode("utf-8", errors="replace"))


def _chains(
    prompts: list[list[Any]], limits: list[int], hasher: BlockHasher, counter: TokenCounter | None
) -> pa.Array:
    """The ``hash_ids`` column of prompts given as parts (``oomload.prefix``), each cut at its limit.

    A part's tokens are counted with ``counter``, else estimated as its JSON's bytes /
    ``CHARS_PER_TOKEN`` — the same for the same message in every request.
    """
    flat = list(chain.from_iterable(prompts))
    sizes = np.array(list(map(len, flat)), dtype=np.int64)
    marks = part_marks(sizes, np.array(list(map(zlib.crc32, flat)), dtype=np.uint64))
    if counter is None:
        tokens = -(-sizes // CHARS_PER_TOKEN)
    else:
        tokens = np.array([_part_tokens(part, counter) for part in flat], dtype=np.int64)
    per_prompt = np.array(list(map(len, prompts)), dtype=np.int64)
    keys = chain_marks(hasher.sip_key, marks, per_prompt)
    values, offsets = message_block_ids(
        keys, tokens, per_prompt, np.asarray(limits, dtype=np.int64), hasher.block_tokens
    )
    chains = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int64()))
    empty = np.diff(offsets) == 0  # no full block: null, as the other readers leave it
    return pc.if_else(pa.array(empty), pa.nulls(len(prompts), chains.type), chains) if empty.any() else chains


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _seconds(value: Any) -> float | None:
    return None if value is UNSET else _to_seconds(value)


def _first_int(*values: Any) -> int | None:
    for value in values:
        if value is not UNSET:
            number = _int_or_none(value)
            if number is not None:
                return number
    return None


def _counts(usage: _Usage) -> tuple[int, int] | None:
    prompt = usage.prompt_tokens if usage.prompt_tokens is not UNSET else usage.input_tokens
    output = usage.completion_tokens if usage.completion_tokens is not UNSET else usage.output_tokens
    if prompt is UNSET or output is UNSET:
        return None
    return prompt, output


def _fast_row(line: _Line) -> _Row | None:
    """``parse_openai_line``'s record for a decoded line, or ``None`` when the exact path must decide.

    Written for speed (it runs once per line of every shape but the usual one): identity tests
    against ``UNSET`` and ``None`` where ``parse_openai_line`` tests types, which the schema
    already fixed."""
    if line.error is not UNSET and line.error != _NULL:
        return None  # a failed request: its counts may be the text's, or 0
    status = line.status_code
    if status is UNSET:
        status = line.status
    status_code = None if status is UNSET else (status if status.__class__ is int else _int_or_none(status))
    response: Any = line.response
    if response is UNSET:
        response = None
    elif response is not None and response.body is not UNSET and response.status_code is not UNSET:
        status_code = _int_or_none(response.status_code)  # the Batch API's output shape
        response = response.body
    if response is not None and response.error is not UNSET and response.error != _NULL:
        return None
    usage: Any = None if response is None else response.usage
    if usage is None or usage is UNSET:
        usage = line.usage
        if usage is None or usage is UNSET:
            return None  # counted from the text, or 0 for a failed request: the exact path
    prompt_tokens = usage.prompt_tokens
    if prompt_tokens is UNSET:
        prompt_tokens = usage.input_tokens
    output_tokens = usage.completion_tokens
    if output_tokens is UNSET:
        output_tokens = usage.output_tokens
    if prompt_tokens is UNSET or output_tokens is UNSET:
        return None
    arrival_s = None
    for value in (line.timestamp, line.created_at, line.start_time, line.request_time, line.time):
        if value is not UNSET and (arrival_s := _to_seconds(value)) is not None:
            break
    if arrival_s is None:
        arrival_s = -1.0 if response is None else _seconds(response.created)
        if arrival_s is None:
            arrival_s = -1.0
    record_id = None
    for key in (line.custom_id, line.request_id, line.id, UNSET if response is None else response.id):
        if key.__class__ is str and key:
            record_id = key
            break
    request: Any = line.request
    if request is UNSET or request is None:
        request = line if (line.messages is not UNSET or line.prompt is not UNSET) else None
    elif request.body is not UNSET:
        request = request.body
    model = None
    max_tokens = None
    if request is not None:
        model = request.model if request.model.__class__ is str and request.model else None
        max_tokens = _first_int(request.max_tokens, request.max_completion_tokens, request.max_output_tokens)
    if model is None and response is not None:
        model = _str(response.model)
    failed = status_code is not None and not 200 <= status_code < 300
    return record_id, arrival_s, prompt_tokens, output_tokens, max_tokens, not failed, model


def _exact_row(line: bytes, counter: TokenCounter | None) -> tuple[_Row | None, str]:
    """``parse_openai_line`` on the whole object (the reason when the line is unusable)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, NOT_JSON_OBJECT
    if not isinstance(obj, dict):
        return None, NOT_JSON_OBJECT
    try:
        record, reason = parse_openai_line(obj, counter)
    except (TypeError, ValueError, AttributeError):
        record, reason = None, "unexpected shape of request/response"
    if record is None:
        return None, reason or "unexpected shape of request/response"
    row = (
        record.id or None,
        record.arrival_s,
        record.prompt_tokens,
        record.output_tokens,
        record.max_tokens,
        record.ok,
        record.model,
    )
    return row, ""


class _PlainUsage(msgspec.Struct, gc=False):
    prompt_tokens: Count
    completion_tokens: Count


class _PlainResponse(msgspec.Struct, gc=False):
    usage: _PlainUsage
    id: str | Unset | None = UNSET
    model: str | Unset | None = UNSET
    error: Unset | None = UNSET
    body: Unset = UNSET


class _PlainRequest(msgspec.Struct, gc=False):
    model: str | Unset | None = UNSET
    max_tokens: Count | Unset | None = UNSET
    max_completion_tokens: Count | Unset | None = UNSET
    max_output_tokens: Count | Unset | None = UNSET
    body: Unset = UNSET


class _PlainPartsRequest(_PlainRequest):
    """``_PlainRequest`` with the prompt parts (a build that derives prefix chains: ``_PartsBody``'s)."""

    system: msgspec.Raw | Unset = UNSET
    tools: msgspec.Raw | Unset = UNSET
    messages: list[msgspec.Raw] | Unset = UNSET
    prompt: msgspec.Raw | Unset = UNSET


Success = Annotated[int, msgspec.Meta(ge=200, le=299)]


class _Plain(msgspec.Struct, gc=False):
    """The usual gateway line, every field of one type: read in columns (``_plain_columns``)."""

    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    request: _PlainRequest
    response: _PlainResponse
    status_code: Success | Unset = UNSET
    status: Success | Unset = UNSET
    error: Unset | None = UNSET
    chunks: Unset | None = UNSET
    custom_id: str | Unset | None = UNSET
    request_id: str | Unset | None = UNSET
    id: str | Unset | None = UNSET


class _PlainParts(_Plain):
    request: _PlainPartsRequest


_PLAIN_DECODER = msgspec.json.Decoder(_Plain)
_PLAIN_PARTS_DECODER = msgspec.json.Decoder(_PlainParts)


def _plain_columns(lines: list[_Plain], columns: dict[str, list[Any]]) -> None:
    """Append the columns of ``_Plain`` lines (what ``parse_openai_line`` gives), a comprehension a field."""
    requests = [line.request for line in lines]
    responses = [line.response for line in lines]
    usages = [response.usage for response in responses]
    columns["time_s"] += [t if (t := line.timestamp) <= 1e11 else _to_seconds(t) for line in lines]
    columns["prompt_tokens"] += [usage.prompt_tokens for usage in usages]
    columns["output_tokens"] += [usage.completion_tokens for usage in usages]
    columns["id"] += [
        line.custom_id or line.request_id or line.id or response.id or None
        for line, response in zip(lines, responses, strict=True)
    ]
    columns["model"] += [
        request.model or response.model or None for request, response in zip(requests, responses, strict=True)
    ]
    columns["max_tokens"] += [
        first
        if (first := request.max_tokens).__class__ is int
        else (
            second
            if (second := request.max_completion_tokens).__class__ is int
            else (third if (third := request.max_output_tokens).__class__ is int else None)
        )
        for request in requests
    ]
    columns["ok"] += [True] * len(lines)


_COLUMNS = ("id", "time_s", "prompt_tokens", "output_tokens", "max_tokens", "ok", "model")
PIECE_BYTES = 256 * 1024  # decoded at once: small enough to stay in the CPU cache
PLAIN_RETRY_PIECES = 8  # after a piece that was not all ``_Plain`` lines, the next 8 are read as ``_Line``s


def _plain_piece(
    piece: memoryview, decode_lines: Callable[[Any], list[Any]], with_parts: bool
) -> tuple[dict[str, list[Any]], list[list[Any]]] | None:
    """The columns of a piece of ``_Plain`` lines only (and their prompt parts), else ``None``."""
    plain: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    try:
        lines = decode_lines(piece)
    except msgspec.DecodeError:
        return None
    _plain_columns(lines, plain)
    if not _plain_within_bounds(plain):
        return None
    return plain, ([_parts_of(line.request) for line in lines] if with_parts else [])


def _general_rows(
    piece: bytes,
    first_line: int,
    source: LogSource,
    skips: SkipLog,
    counter: TokenCounter | None,
    parts: list[list[Any]] | None,
) -> list[_Row] | None:
    """``_line_rows`` of a piece whose lines all decode as ``_Line`` (no blank line), at once: one
    ``decode_lines`` call, ``_fast_row`` mapped over it, the bounds checked on the columns; only the
    lines ``_fast_row`` declines (or over a bound) are taken one by one, in line order. ``None``
    when a line does not decode (or a line is blank): the piece goes through ``_line_rows``."""
    try:
        decoded: list[Any] = (_DECODER if parts is None else _PARTS_LINE_DECODER).decode_lines(piece)
    except msgspec.DecodeError:
        return None
    raw_lines = piece.split(b"\n")
    if raw_lines and not raw_lines[-1]:
        raw_lines.pop()
    if len(decoded) != len(raw_lines):
        return None  # a blank line: decode_lines skipped it
    rows = list(map(_fast_row, decoded))
    if None not in rows:
        columns = dict(zip(_COLUMNS, map(list, zip(*rows, strict=True)), strict=True)) if rows else {}
        if not rows or _plain_within_bounds(columns):
            if parts is not None:
                parts += map(_line_parts, decoded)
            return rows  # type: ignore[return-value]
    kept: list[_Row] = []
    for offset, row in enumerate(rows):
        if row is None:
            raw = raw_lines[offset]
            row, reason = _exact_row(raw.rstrip(b"\r"), counter)
            if row is None:
                skips.skip(reason, source.name, first_line + offset)
                continue
            if parts is not None:
                parts.append(_prompt_parts(raw))
        else:
            if not _row_within_bounds(row):
                bound = _row_bounds_reason(row)
                if bound is not None:
                    skips.skip(bound, source.name, first_line + offset)
                    continue
            if parts is not None:
                parts.append(_line_parts(decoded[offset]))
        kept.append(row)
    return kept


def _line_rows(
    piece: bytes,
    first_line: int,
    source: LogSource,
    skips: SkipLog,
    counter: TokenCounter | None,
    parts: list[list[Any]] | None = None,
) -> Iterator[_Row]:
    """The rows of a piece that does not decode as ``_Plain`` lines only, line by line (and, given
    ``parts``, each row's prompt parts appended to it): each line is decoded once, as ``_Line`` (with
    its parts, ``_LineParts``, given ``parts``)."""
    decode = (_DECODER if parts is None else _PARTS_LINE_DECODER).decode
    for offset, raw in enumerate(piece.split(b"\n")):
        try:
            decoded = decode(raw)
            row = _fast_row(decoded)
        except msgspec.DecodeError:
            row = None
        if row is None:
            line = raw.rstrip(b"\r")
            if not line.strip():
                continue
            row, reason = _exact_row(line, counter)
            if row is None:
                skips.skip(reason, source.name, first_line + offset)
                continue
            if parts is not None:
                parts.append(_prompt_parts(raw))
        else:
            if not _row_within_bounds(row):
                bound = _row_bounds_reason(row)
                if bound is not None:
                    skips.skip(bound, source.name, first_line + offset)
                    continue
            if parts is not None:
                parts.append(_line_parts(cast(_LineParts, decoded)))
        yield row


def _row_within_bounds(row: _Row) -> bool:
    """The usual row's bounds at a glance (a NaN time fails it): ``_row_bounds_reason`` decides the rest."""
    record_id, time_s, prompt_tokens, output_tokens, max_tokens, _ok, model = row
    return (
        -MAX_TIME_S <= time_s <= MAX_TIME_S
        and prompt_tokens <= MAX_TOKENS
        and output_tokens <= MAX_TOKENS
        and (max_tokens is None or max_tokens <= MAX_TOKENS)
        and (record_id is None or len(record_id) <= MAX_ID_CHARS)
        and (model is None or len(model) <= MAX_ID_CHARS)
    )


def _row_bounds_reason(row: _Row) -> str | None:
    record_id, time_s, prompt_tokens, output_tokens, max_tokens, _ok, model = row
    return values_bounds_reason(
        time_s=time_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        max_tokens=max_tokens,
        texts={"id": record_id, "model": model},
    )


def _plain_within_bounds(columns: dict[str, list[Any]]) -> bool:
    """The bounds (``oomload.trace``) on a piece read in columns; a piece over them is read line by line.
    C-level passes only (``max``, ``sum``), so the usual piece costs little more than it did."""
    for name in ("prompt_tokens", "output_tokens"):
        if max(columns[name], default=0) > MAX_TOKENS:
            return False
    if max(filter(None, columns["max_tokens"]), default=0) > MAX_TOKENS:
        return False
    times = columns["time_s"]
    try:  # a NaN or an infinity makes the sum non-finite (min and max do not see NaN)
        if times and not (
            math.isfinite(sum(times)) and min(times) >= -MAX_TIME_S and max(times) <= MAX_TIME_S
        ):
            return False
    except TypeError:
        return False
    return all(
        max(map(len, filter(None, columns[name])), default=0) <= MAX_ID_CHARS for name in ("id", "model")
    )


def _batch(columns: dict[str, list[Any]], chains: pa.Array | None = None) -> pa.Table:
    """A batch with the optional columns left out (all null) when no row has a value."""
    kept: dict[str, Any] = {}
    if chains is not None:
        kept["hash_ids"] = chains
    for name, values in columns.items():
        if name in ("id", "max_tokens", "model") and all(v is None for v in values):
            continue
        if name == "ok" and all(values):
            continue
        kept[name] = values
    return make_batch(len(columns["time_s"]), **kept)


def read_openai_batches(
    source: LogSource,
    skips: SkipLog,
    counter: TokenCounter | None,
    *,
    on_untimed: Callable[[int], None] | None = None,
    hasher: BlockHasher | None = None,
) -> Iterator[pa.Table]:
    """Batches (``time_s`` on the log's clock) from an OpenAI-style log, one per chunk of lines.

    Each piece of ``PIECE_BYTES`` is decoded at once as ``_Plain`` lines and read in columns; a
    piece holding another line goes line by line through ``_fast_row`` on the wider ``_Line``
    schema and, failing that, ``parse_openai_line``. A request without a time gets the previous
    request's time (0 at the start of ``source``); the batch's metadata ``leading_untimed`` counts
    the rows at its start that had none before any timed row of ``source`` (the caller of a
    byte-range reader patches those from the range before).

    With ``hasher``, each request's prompt parts (``system``, ``tools``, each message, or the
    ``prompt``: their raw JSON, never decoded into text) give its ``hash_ids``: a part's tokens are
    counted with ``counter`` when given, else estimated as its bytes / ``CHARS_PER_TOKEN`` — the same
    for the same message in every request, so identical histories line up block for block — and the
    chain stops at ``usage.prompt_tokens``.
    """
    decode_plain = (_PLAIN_DECODER if hasher is None else _PLAIN_PARTS_DECODER).decode_lines
    plain_again_in = 0  # pieces to read before trying ``_Plain`` again (after one that was not)
    last_time = 0.0
    untimed = 0
    seen_timed = False
    for chunk in source.iter_views():
        columns: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        prompts: list[list[Any]] = []  # each row's prompt parts (with ``hasher``): chained per chunk
        limits: list[int] = []  # each row's usage.prompt_tokens
        data, start = chunk.data, chunk.start
        view = memoryview(data)
        while start < chunk.stop:
            end = data.find(b"\n", min(start + PIECE_BYTES, chunk.stop) - 1, chunk.stop)
            end = chunk.stop if end < 0 else end + 1
            piece = view[start:end]
            plain = None
            if plain_again_in == 0:
                plain = _plain_piece(piece, decode_plain, hasher is not None)
                plain_again_in = 0 if plain is not None else PLAIN_RETRY_PIECES
            else:
                plain_again_in -= 1
            if plain is not None:
                plain_columns, plain_parts = plain
                for name in _COLUMNS:
                    columns[name] += plain_columns[name]
                prompts += plain_parts
                limits += plain_columns["prompt_tokens"] if hasher is not None else []
            else:
                line = chunk.line_at(start)
                parts: list[list[Any]] | None = None if hasher is None else []
                raw = bytes(piece)
                rows = _general_rows(raw, line, source, skips, counter, parts)
                if rows is None:
                    if parts is not None:
                        parts.clear()
                    rows = list(_line_rows(raw, line, source, skips, counter, parts))
                if rows:
                    for name, values in zip(_COLUMNS, zip(*rows, strict=True), strict=True):
                        columns[name] += values
                    if hasher is not None and parts is not None:
                        prompts += parts
                        limits += [row[2] for row in rows]
            start = end
        view.release()
        if not columns["time_s"]:
            continue
        chains = None if hasher is None else _chains(prompts, limits, hasher, counter)
        batch = _batch(columns, chains)
        times = np.asarray(batch.column("time_s"), dtype=np.float64)
        missing = times < 0
        leading = 0
        if missing.any():
            untimed += int(missing.sum())
            timed_at = np.where(missing, -1, np.arange(len(times)))
            np.maximum.accumulate(timed_at, out=timed_at)
            times = np.where(timed_at >= 0, times[np.maximum(timed_at, 0)], last_time)
            if not seen_timed:
                leading = int(np.count_nonzero(timed_at < 0))
            batch = batch.set_column(batch.schema.get_field_index("time_s"), "time_s", pa.array(times))
        if not missing.all():
            seen_timed = True
        last_time = float(times[-1])
        if leading:
            batch = batch.replace_schema_metadata({b"leading_untimed": str(leading).encode()})
        yield batch
    if untimed and on_untimed is not None:
        on_untimed(untimed)  # a span of the file: its caller notes the file's total
    elif untimed:
        skips.note(untimed_note_text(source.name, untimed))


def untimed_note_text(name: str, untimed: int) -> str:
    return f"{name}: {untimed} requests had no timestamp (each given the previous one's time)"
