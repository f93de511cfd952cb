"""OpenAI-style logs straight to columns, without paying for the prompt and completion text.

A gateway log line is mostly text (messages, choices) around a few small fields that matter: the
``usage`` counts, a time, an id, the model, ``max_tokens`` and the status. ``read_openai_batches``
decodes the lines with msgspec against schemas that declare *only* those fields
(``openai_schema``): every other key (the text) is skipped while the line is scanned — no Python
string is built for it — and the values land in columns, no ``TraceRecord`` per request.

A chunk of the file is read in pieces of ``PIECE_BYTES``, each the fastest way it allows:

1. a piece of the usual gateway line only (``Plain``: one ``decode_lines`` call, a comprehension
   per column); after a piece that was not, the next ``PLAIN_RETRY_PIECES`` skip this attempt;
2. a piece whose lines all decode as ``Line`` — any shape ``parse_openai_line`` knows, each field
   with the types it takes (chat under ``request``/``response`` with an ISO ``created_at``,
   completions, Batch output, the Responses API, request bodies with ``usage`` beside them):
   one ``decode_lines`` call, ``_fast_row`` mapped over it, the bounds checked on the columns;
   only the lines ``_fast_row`` declines are taken one by one (``_general_rows``), found by a
   ``find`` a line only then, and a skipped line's number is counted only when the skip log keeps
   it (its first examples) — nearly every piece of a real log holds a failed request or one
   without usage, so this is the path most lines take;
3. else line by line (``_line_rows``): each line decoded once as ``Line``, else the exact path.

Exactness: the schemas are filters. A line whose declared fields hold anything else (a string
count, a list-shaped response of streamed chunks, counts to be taken from the text with a
tokenizer, a token count past 2**53, …) fails to decode, or ``_fast_row`` declines it (a non-null
``error``, no usage), and that one line goes through ``openai_log.parse_openai_line`` on the full
object, exactly as before. For every line the fast paths take, they compute what
``parse_openai_line`` computes (``tests/unit/ingest/test_openai_fast.py`` checks this on generated
lines, ``test_openai_shapes.py`` on every shape of ``bench/logshapes.py``), and with a
``BlockHasher`` they take the prompt parts the exact path reads (``openai_parts``). One difference
is deliberate: text that is not valid UTF-8 inside a skipped field does not make the line unusable
here — that text is never read.
"""

from __future__ import annotations

import functools
import math
import mmap
import operator
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgspec
import numpy as np
import orjson
import pyarrow as pa

from oomload.ingest.columns import make_batch
from oomload.ingest.openai_log import _int_or_none, _to_seconds, parse_openai_line, status_failed, time_given
from oomload.ingest.openai_parts import PartMarks, Parts, line_parts, parts_of, prompt_parts
from oomload.ingest.openai_schema import (
    BODY_DECODER,
    LINE_DECODER,
    NULL,
    PARTS_LINE_DECODER,
    PLAIN_DECODER,
    PLAIN_PARTS_DECODER,
    REQUEST_BODY_DECODER,
    REQUEST_BODY_PARTS_DECODER,
    UNSET,
    Line,
    LineParts,
    Plain,
    Usage,
)
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import NOT_JSON_OBJECT, LogSource, unparsed_reason
from oomload.ingest.tokens import TokenCounter
from oomload.ingest.untimed import UNREADABLE_S, UNTIMED_S, LeadingUntimed, split_untimed, untimed_notes
from oomload.trace.model import MAX_ID_CHARS, MAX_TIME_S, MAX_TOKENS, values_bounds_reason
from oomload.trace.prefix import BlockHasher

_Row = tuple[str | None, float, int, int, int | None, bool, str | None]  # what a line gives


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


def _counts(usage: Usage) -> tuple[int, int] | None:
    prompt = usage.prompt_tokens if usage.prompt_tokens is not UNSET else usage.input_tokens
    output = usage.completion_tokens if usage.completion_tokens is not UNSET else usage.output_tokens
    if prompt is UNSET or output is UNSET:
        return None
    return prompt, output


def _fast_row(line: Line) -> _Row | None:
    """``parse_openai_line``'s record for a decoded line, or ``None`` when the exact path must decide.

    A request body written as a string (an access log's) is decoded here; on a ``LineParts`` line it is
    decoded with its prompt parts and put in the line's place of the string, so ``line_parts`` reads
    them without decoding the body a second time.

    Written for speed (it runs once per line of every shape but the usual one): identity tests
    against ``UNSET`` and ``None`` where ``parse_openai_line`` tests types, which the schema
    already fixed (an ``int`` here is never a bool and fits in int64: ``_int_or_none`` would return
    it as it is); the usual case of each field first, the general one after it."""
    error = line.error
    if error is not UNSET and error != NULL:
        return None  # a failed request: its counts may be the text's, or 0
    status = line.status_code
    if status is UNSET:
        status = line.status
    failed = (
        not 200 <= status < 300 if status.__class__ is int else status is not UNSET and status_failed(status)
    )
    response: Any = line.response
    if response is UNSET:
        response = None
    elif response is not None and response.body is not UNSET:
        status = response.status_code
        if status is UNSET:
            status = response.status
        if status is not UNSET:  # the Batch API's output shape, or an access log's
            failed = not 200 <= status < 300 if status.__class__ is int else status_failed(status)
            response = response.body
            if response.__class__ is str and (response := _in_string(response, BODY_DECODER)) is None:
                return None
    usage: Any = None
    if response is not None:
        error = response.error
        if error is not UNSET and error != NULL:
            return None
        usage = response.usage
    if usage is None or usage is UNSET:
        usage = line.usage
    if usage is None or usage is UNSET:
        prompt_tokens = line.prompt_tokens  # LiteLLM's, at the top level
        output_tokens = line.completion_tokens
        if prompt_tokens.__class__ is not int or output_tokens.__class__ is not int:
            return None  # counted from the text, or 0 for a failed request: the exact path
    else:
        prompt_tokens = usage.prompt_tokens
        if prompt_tokens is UNSET:
            prompt_tokens = usage.input_tokens
        output_tokens = usage.completion_tokens
        if output_tokens is UNSET:
            output_tokens = usage.output_tokens
        if prompt_tokens is UNSET or output_tokens is UNSET:
            return None
    arrival_s = line.timestamp
    if arrival_s.__class__ is not float or not arrival_s <= 1e11:  # else seconds already
        arrival_s = _line_time(line)
        if arrival_s is None:
            arrival_s = None if response is None else _seconds(response.created)
            if arrival_s is None:
                arrival_s = None if response is None else _seconds(response.created_at)
                if arrival_s is None:
                    arrival_s = _untimed_s(line, response)
    record_id = line.custom_id
    if record_id.__class__ is not str or not record_id:
        record_id = None
        for key in (line.request_id, line.id, UNSET if response is None else response.id):
            if key.__class__ is str and key:
                record_id = key
                break
    request: Any = line.request
    if request is UNSET or request is None:
        request = line if (line.messages is not UNSET or line.prompt is not UNSET) else None
    elif request.body is not UNSET:
        text = request.body
        if text.__class__ is str:  # an access log's: decoded once, with its parts when the line has them
            parts = line.__class__ is LineParts
            body = _in_string(text, REQUEST_BODY_PARTS_DECODER if parts else REQUEST_BODY_DECODER)
            if body is None:
                return None
            if parts:
                request.body = body  # ``line_parts`` reads the parts from it
            request = body
        else:
            request = text
    model = None
    max_tokens = None
    if request is not None:
        model = request.model if request.model.__class__ is str and request.model else None
        max_tokens = request.max_tokens
        if max_tokens.__class__ is not int:
            max_tokens = _first_int(max_tokens, request.max_completion_tokens, request.max_output_tokens)
    if model is None and response is not None:
        model = _str(response.model)
    return record_id, arrival_s, prompt_tokens, output_tokens, max_tokens, not failed, model


def _in_string(text: str, decoder: msgspec.json.Decoder[Any]) -> Any:
    """An access log's body, JSON written as a string, decoded; ``None`` when it is not that shape (the
    exact path decides the line)."""
    try:
        return decoder.decode(text)
    except msgspec.DecodeError:
        return None


# A line's time keys, in ``parse_openai_line``'s order (``TIME_KEYS``), read in one C call
_LINE_TIMES = operator.attrgetter(
    "timestamp", "created_at", "start_time", "request_time", "time", "startTime", "started_at", "at_timestamp"
)


def _line_time(line: Line) -> float | None:
    """``_to_seconds`` of the first time key a line has, in ``parse_openai_line``'s order; a number
    (the usual time) converted here, without the call."""
    value: Any
    for value in _LINE_TIMES(line):
        if value is UNSET:
            continue
        kind = value.__class__
        if kind is float or kind is int:  # never a bool here: the schema refuses it
            number = float(value)
            return (
                number / 1e9
                if number > 1e17
                else number / 1e6
                if number > 1e14
                else number / 1e3
                if number > 1e11
                else number
            )
        if (seconds := _to_seconds(value)) is not None:
            return seconds
    return None


def _untimed_s(line: Line, response: Any) -> float:
    """``UNREADABLE_S`` when the line (or its response) has a time that could not be read, else
    ``UNTIMED_S``: ``parse_openai_line``'s mark, for a line without a usable time (the rare case)."""
    values = (
        *_LINE_TIMES(line),
        *(() if response is None else (response.created, response.created_at)),
    )
    given = any(value is not UNSET and time_given(value) for value in values)
    return UNREADABLE_S if given else UNTIMED_S


def _exact_row(line: bytes, counter: TokenCounter | None) -> tuple[_Row | None, str]:
    """``parse_openai_line`` on the whole object (the reason when the line is unusable)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, unparsed_reason(line)
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


def _plain_columns(lines: list[Plain], columns: dict[str, list[Any]]) -> None:
    """Append the columns of ``Plain`` lines (what ``parse_openai_line`` gives), a comprehension a field."""
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
PLAIN_RETRY_PIECES = 8  # after a piece that was not all ``Plain`` lines, the next 8 are read as ``Line``s


def _plain_piece(
    piece: memoryview, decode_lines: Callable[[Any], list[Any]], with_parts: bool
) -> tuple[dict[str, list[Any]], list[Parts]] | None:
    """The columns of a piece of ``Plain`` lines only (and their prompt parts), else ``None``."""
    plain: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    try:
        lines = decode_lines(piece)
    except msgspec.DecodeError:
        return None
    _plain_columns(lines, plain)
    if not _plain_within_bounds(plain):
        return None
    return plain, ([parts_of(line.request) for line in lines] if with_parts else [])


class _Piece(NamedTuple):
    """A piece of a chunk: ``data[start:stop]``, whole lines; ``view`` is that slice (no copy)."""

    data: bytes | mmap.mmap
    start: int
    stop: int
    view: memoryview
    first_line: Callable[[], int]  # the line number of its first line (counted when asked)

    def line_spans(self) -> list[tuple[int, int]]:
        """Each line's ``(start, stop)`` in ``data``, newline excluded (one ``find`` a line, no copy)."""
        spans = []
        start, stop, data = self.start, self.stop, self.data
        while start < stop:
            end = data.find(b"\n", start, stop)
            end = stop if end < 0 else end
            spans.append((start, end))
            start = end + 1
        return spans


def _general_rows(
    piece: _Piece,
    source: LogSource,
    skips: SkipLog,
    counter: TokenCounter | None,
    parts: list[Parts] | None,
) -> list[_Row] | None:
    """``_line_rows`` of a piece whose lines all decode as ``Line``, at once: one ``decode_lines``
    call, ``_fast_row`` mapped over it, the bounds checked on the columns. When every row is taken,
    that is all (a blank line, which ``decode_lines`` skips, is skipped by ``_line_rows`` too);
    else the piece's lines are found (``_Piece.line_spans``: no split, no copy) and the rows
    ``_fast_row`` declines (or over a bound) are settled one by one, in line order. ``None`` when
    a line does not decode, or a blank line would shift the lines: the piece goes through
    ``_line_rows``."""
    try:
        decoded: list[Any] = (LINE_DECODER if parts is None else PARTS_LINE_DECODER).decode_lines(piece.view)
    except msgspec.DecodeError:
        return None
    rows = list(map(_fast_row, decoded))
    if None not in rows:
        columns = dict(zip(_COLUMNS, map(list, zip(*rows, strict=True)), strict=True)) if rows else {}
        if not rows or _plain_within_bounds(columns):
            if parts is not None:
                parts += map(line_parts, decoded)
            return rows  # type: ignore[return-value]  # no None in it
    lines = piece.line_spans()
    if len(decoded) != len(lines):
        return None  # a blank line: decode_lines skipped it
    kept: list[_Row] = []
    for offset, row in enumerate(rows):
        if row is not None and _row_within_bounds(row):  # the usual row, as in ``_settled``
            kept.append(row)
            if parts is not None:
                parts.append(line_parts(decoded[offset]))
            continue
        raw = b"" if row is not None else bytes(piece.data[slice(*lines[offset])])  # the exact path's
        taken = _settled(row, decoded[offset], raw, piece.first_line, offset, source, skips, counter, parts)
        if taken is not None:
            kept.append(taken)
    return kept


def _line_rows(
    piece: _Piece,
    source: LogSource,
    skips: SkipLog,
    counter: TokenCounter | None,
    parts: list[Parts] | None = None,
) -> Iterator[_Row]:
    """The rows of a piece that ``_general_rows`` could not take at once, line by line (and, given
    ``parts``, each row's prompt parts appended to it): each line is decoded once, as ``Line`` (with
    its parts, ``LineParts``, given ``parts``)."""
    decode = (LINE_DECODER if parts is None else PARTS_LINE_DECODER).decode
    for offset, raw in enumerate(bytes(piece.view).split(b"\n")):
        try:
            decoded = decode(raw)
            row = _fast_row(decoded)
        except msgspec.DecodeError:
            decoded, row = None, None
        if row is None and not raw.strip():
            continue  # a blank line
        taken = _settled(row, decoded, raw, piece.first_line, offset, source, skips, counter, parts)
        if taken is not None:
            yield taken


def _settled(
    row: _Row | None,
    decoded: Any,  # a ``LineParts`` when ``parts`` is given
    raw: bytes,
    first_line: Callable[[], int],
    offset: int,
    source: LogSource,
    skips: SkipLog,
    counter: TokenCounter | None,
    parts: list[Parts] | None,
) -> _Row | None:
    """A line's row once settled: the exact path's when ``_fast_row`` declined it (``raw``: the line,
    read only then), ``None`` (and the skip noted at its line) when the line is unusable or over a
    bound; its prompt parts appended."""
    if row is None:
        row, reason = _exact_row(raw.rstrip(b"\r"), counter)
        if row is None:
            skips.skip_at(reason, source.name, lambda: first_line() + offset)
            return None
        if parts is not None:  # from the line as decoded already, when it was (the same parts)
            parts.append(prompt_parts(raw) if decoded is None else line_parts(decoded))
        return row
    if not _row_within_bounds(row):
        bound = _row_bounds_reason(row)
        if bound is not None:
            skips.skip_at(bound, source.name, lambda: first_line() + offset)
            return None
    if parts is not None:
        parts.append(line_parts(decoded))
    return row


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
    """The bounds (``oomload.trace.model``) on a piece read in columns; a piece over them is read
    line by line. C-level passes only (``max``, ``sum``), so the usual piece costs little more than it did."""
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
    on_untimed: Callable[[int, int], None] | None = None,
    hasher: BlockHasher | None = None,
) -> Iterator[pa.Table]:
    """Batches (``time_s`` on the log's clock) from an OpenAI-style log, one per chunk of lines.

    Each piece of ``PIECE_BYTES`` is decoded at once as ``Plain`` lines and read in columns; a
    piece holding another line goes line by line through ``_fast_row`` on the wider ``Line``
    schema and, failing that, ``parse_openai_line``. A request without a time gets the previous
    request's time; those before the first timed request of ``source`` get its time (their batches
    held until it comes; 0 when none does, or none in ``UNTIMED_HOLD_ROWS``). The batch's metadata
    ``leading_untimed`` counts the rows at its start that had none before any timed row of ``source``
    (the caller of a byte-range reader patches those from the range before).

    With ``hasher``, each request's prompt parts (``system``, ``tools``, each message, or the
    ``prompt``: their raw JSON, never decoded into text) give its ``hash_ids``: a part's tokens are
    counted with ``counter`` when given, else estimated as its bytes / ``CHARS_PER_TOKEN`` — the same
    for the same message in every request, so identical histories line up block for block — and the
    chain stops at ``usage.prompt_tokens``.
    """
    decode_plain = (PLAIN_DECODER if hasher is None else PLAIN_PARTS_DECODER).decode_lines
    plain_again_in = 0  # pieces to read before trying ``Plain`` again (after one that was not)
    untimed = unreadable = 0  # requests without a time, and with one that could not be read
    leading_untimed = LeadingUntimed()  # batches before the first timed request: they take its time
    for chunk in source.iter_views():
        columns: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        marks = PartMarks(counter)  # each row's prompt parts (with ``hasher``): chained per chunk
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
                if hasher is not None:
                    marks.add(plain_parts)
            else:
                general = _Piece(data, start, end, piece, functools.partial(chunk.line_at, start))
                parts: list[Parts] | None = None if hasher is None else []
                rows = _general_rows(general, source, skips, counter, parts)
                if rows is None:
                    if parts is not None:
                        parts.clear()
                    rows = list(_line_rows(general, source, skips, counter, parts))
                if rows:
                    for name, values in zip(_COLUMNS, zip(*rows, strict=True), strict=True):
                        columns[name] += values
                    if parts is not None:
                        marks.add(parts)
            start = end
        view.release()
        if not columns["time_s"]:
            continue
        hash_ids = None if hasher is None else marks.chains(columns["prompt_tokens"], hasher)
        batch = _batch(columns, hash_ids)
        times = np.asarray(batch.column("time_s"), dtype=np.float64)
        missing = times < 0
        leading = 0
        if missing.any():
            without, unread = split_untimed(times)
            untimed, unreadable = untimed + without, unreadable + unread
            timed_at = np.where(missing, -1, np.arange(len(times)))
            np.maximum.accumulate(timed_at, out=timed_at)
            seen_timed = leading_untimed.seen_timed
            before_s = (
                leading_untimed.last_s if seen_timed or missing.all() else float(times[np.argmin(missing)])
            )
            times = np.where(timed_at >= 0, times[np.maximum(timed_at, 0)], before_s)
            if not seen_timed:
                leading = int(np.count_nonzero(timed_at < 0))
            batch = batch.set_column(batch.schema.get_field_index("time_s"), "time_s", pa.array(times))
        if leading:
            batch = batch.replace_schema_metadata({b"leading_untimed": str(leading).encode()})
        if not leading_untimed.seen_timed and missing.all():  # no time yet in ``source``: wait for one
            yield from leading_untimed.hold(batch)
            continue
        yield from leading_untimed.timed(float(times[0]), float(times[-1]))
        yield batch
    yield from leading_untimed.finish()  # no time in the whole of ``source``: 0
    if (untimed or unreadable) and on_untimed is not None:
        on_untimed(untimed, unreadable)  # a span of the file: its caller notes the file's totals
    else:
        for note in untimed_notes(source.name, untimed, unreadable):
            skips.note(note)
