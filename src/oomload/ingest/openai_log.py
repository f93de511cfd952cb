"""OpenAI-style request/response logs (JSONL), as API gateways and proxies write them.

One JSON object per line. The reader looks for, in order:

- **request body**: ``request`` (or ``request.body``), or the line itself when it has ``messages`` /
  ``prompt``; a body logged as a JSON *string* (an API gateway's access log: Kong's or APISIX's
  http-logger) is decoded a second time; gives ``model``, ``max_tokens`` (or
  ``max_completion_tokens`` / ``max_output_tokens``), and the prompt (text, chat messages, or token
  ids);
- **response**: ``response`` — the OpenAI Batch output shape ``response.status_code`` +
  ``response.body`` is unwrapped, and so is an access log's ``response.status`` + ``response.body``
  (a string, decoded) — or a list of streamed chunks (``response`` / ``chunks``);
- **token counts**: ``usage.prompt_tokens`` / ``usage.completion_tokens`` (or ``input_tokens`` /
  ``output_tokens``), in the response, the last streamed chunk, or the line itself; else the
  line's own ``prompt_tokens`` / ``completion_tokens`` (LiteLLM's StandardLoggingPayload);
- **status**: ``status_code`` / ``status`` (line or Batch response) — an HTTP code, or a word:
  ``"failure"``, ``"failed"``, ``"error"`` (LiteLLM's ``status``) fail, any other (``"success"``)
  does not — and a non-null ``error``; a failed request is kept with ``ok=false`` and its output
  counted as 0 tokens;
- **time**: ``timestamp``, ``created_at``, ``start_time``, ``request_time``, ``time``, ``startTime``
  (LiteLLM's spend log), ``started_at``, ``@timestamp`` (an access log; epoch s/ms/µs — a number
  or a numeric string — or ISO-8601), else the response's ``created`` (``created_at`` in the
  Responses API). A request without a time takes the time of the request before
  it; those before the first timed request take its time (0 when no request has one), so a log
  that opens with untimed requests does not start at the epoch; a time that is there but cannot
  be read (not ISO-8601 or a number; a negative one) is treated so too, and counted apart
  (``oomload.ingest.untimed``);
- **id**: ``custom_id``, ``request_id``, ``id``, or the response's ``id``.

When a count is missing but the text is there (streaming logs often lack ``usage``), the text is
counted with the ``--tokenizer`` the user named; without one the line is skipped with the reason
"no token counts (give --tokenizer)". A prompt given as token ids is counted exactly without one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson

from oomload.ingest.skips import NO_TOKEN_COUNTS, SkipLog
from oomload.ingest.source import LogSource, iter_json_objects
from oomload.ingest.tabular import parse_datetime_s
from oomload.ingest.tokens import TokenCounter
from oomload.ingest.untimed import UNREADABLE_S, UNTIMED_HOLD_ROWS, UNTIMED_S, untimed_notes
from oomload.trace.model import TraceRecord, bounds_reason

TIME_KEYS = (
    "timestamp",
    "created_at",
    "start_time",
    "request_time",
    "time",
    "startTime",
    "started_at",
    "@timestamp",
)
ID_KEYS = ("custom_id", "request_id", "id")
MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
FAILED_STATUS = frozenset({"failure", "failed", "error"})  # a status in words (lower case)
INT64_LIMIT = 2**63


def read_openai_records(
    source: LogSource, skips: SkipLog, counter: TokenCounter | None
) -> Iterator[TraceRecord]:
    """Records (``arrival_s`` on the log's clock, ``id`` ``""`` when absent) from an OpenAI-style log."""
    last_time: float | None = None  # None until the first timed request
    held: list[TraceRecord] = []  # requests before the first timed one: they take its time
    untimed = unreadable = 0
    for number, obj in iter_json_objects(source, skips):
        try:
            record, reason = parse_openai_line(obj, counter)
        except (TypeError, ValueError, AttributeError):
            record, reason = None, "unexpected shape of request/response"
        if record is None:
            skips.skip(reason or "unexpected shape of request/response", source.name, number)
            continue
        if record.arrival_s < 0:
            if record.arrival_s == UNTIMED_S:
                untimed += 1
            else:
                unreadable += 1
            if last_time is None and len(held) < UNTIMED_HOLD_ROWS:
                held.append(record)
                continue
            if last_time is None:  # no time in the first UNTIMED_HOLD_ROWS: they keep 0
                yield from (replace(r, arrival_s=0.0) for r in held)
                held, last_time = [], 0.0
            record = replace(record, arrival_s=last_time)
        elif held:
            yield from (replace(r, arrival_s=record.arrival_s) for r in held)
            held = []
        last_time = record.arrival_s
        yield record
    yield from (replace(r, arrival_s=0.0) for r in held)  # no time in the whole log
    for note in untimed_notes(source.name, untimed, unreadable):
        skips.note(note)


def parse_openai_line(
    obj: dict[str, Any], counter: TokenCounter | None
) -> tuple[TraceRecord | None, str | None]:
    """One log object → a record, or ``(None, reason)``. ``arrival_s`` is ``UNTIMED_S`` (−1) when the
    line has no time, ``UNREADABLE_S`` (−2) when the time it has cannot be read."""
    request = obj.get("request")
    if isinstance(request, dict) and isinstance(body := _body(request.get("body")), dict):
        request = body
    if not isinstance(request, dict):
        request = obj if ("messages" in obj or "prompt" in obj) else {}
    response = obj.get("response")
    status = obj.get("status_code", obj.get("status"))
    chunks: list[Any] = []
    if (
        isinstance(response, dict)
        and "body" in response
        and ("status_code" in response or "status" in response)
    ):
        # the Batch output (status_code), or an access log (status, and the body as a string)
        status = response.get("status_code", response.get("status"))
        response = _body(response.get("body"))
    if isinstance(response, list):
        chunks, response = response, {}
    elif isinstance(obj.get("chunks"), list):
        chunks = obj["chunks"]
    if not isinstance(response, dict):
        response = {}
    failed = status_failed(status) or bool(obj.get("error")) or bool(response.get("error"))

    usage = response.get("usage") or obj.get("usage") or _chunk_usage(chunks) or _line_counts(obj)
    prompt_tokens = _int_or_none(usage.get("prompt_tokens", usage.get("input_tokens")))
    output_tokens = _int_or_none(usage.get("completion_tokens", usage.get("output_tokens")))
    if prompt_tokens is None:
        prompt_tokens = _count_prompt(request, counter)
    if output_tokens is None:
        output_tokens = 0 if failed else _count_output(response, chunks, counter)
    if prompt_tokens is None or output_tokens is None:
        return None, NO_TOKEN_COUNTS
    if prompt_tokens < 0 or output_tokens < 0:
        return None, "negative token count"

    record = TraceRecord(
        id=_first_str(obj, ID_KEYS) or _first_str(response, ("id",)) or "",
        arrival_s=_time_s(obj, response, chunks),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        max_tokens=_first_int(request, MAX_TOKENS_KEYS),
        ok=not failed,
        model=_first_str(request, ("model",)) or _first_str(response, ("model",)),
    )
    reason = bounds_reason(record)
    return (None, reason) if reason is not None else (record, None)


def status_failed(value: Any) -> bool:
    """Whether a status says the request failed: an HTTP code outside 2xx (a number, or digits), or
    one of ``FAILED_STATUS`` (LiteLLM's ``"failure"``); anything else (``"success"``, none) says no."""
    if isinstance(value, str) and not value.isdigit():
        return value.strip().lower() in FAILED_STATUS
    code = _int_or_none(value)
    return code is not None and not 200 <= code < 300


def _line_counts(obj: dict[str, Any]) -> dict[str, Any]:
    """The counts a line gives at its top level (LiteLLM's ``prompt_tokens`` / ``completion_tokens``)."""
    return {key: obj[key] for key in ("prompt_tokens", "completion_tokens") if key in obj}


def _body(value: Any) -> Any:
    """A body an access log wrote as a JSON string, decoded (``value`` itself when it is not one)."""
    if isinstance(value, str) and value[:1] == "{":
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _chunk_usage(chunks: list[Any]) -> dict[str, Any] | None:
    for chunk in reversed(chunks):
        if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
            usage: dict[str, Any] = chunk["usage"]
            return usage
    return None


def _count_prompt(request: dict[str, Any], counter: TokenCounter | None) -> int | None:
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)  # token ids: exact without a tokenizer
    if counter is None:
        return None
    if isinstance(prompt, str):
        return counter.count(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return counter.count(prompt[0])
    messages = request.get("messages") or request.get("input")
    if isinstance(messages, str):
        return counter.count(messages)
    if isinstance(messages, list):
        return sum(counter.count(message_text(m)) for m in messages if isinstance(m, dict))
    return None


def _count_output(response: dict[str, Any], chunks: list[Any], counter: TokenCounter | None) -> int | None:
    if counter is None:
        return None
    parts: list[str] = []
    for choice in response.get("choices") or ():
        message = choice.get("message") or {}
        parts.append(message_text(message) or choice.get("text") or "")
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            parts.append(_content_text(delta.get("content")) or choice.get("text") or "")
    if not parts and "choices" not in response and not chunks:
        return None
    return counter.count("".join(parts))


def message_text(message: dict[str, Any]) -> str:
    """The text a chat message carries: its content, then each tool call's function name and arguments
    (a chat template renders both; the role and the template's own tokens are not counted)."""
    text = _content_text(message.get("content"))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                text += "".join(
                    v for v in (function.get("name"), function.get("arguments")) if isinstance(v, str)
                )
    return text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _time_s(obj: dict[str, Any], response: dict[str, Any], chunks: list[Any]) -> float:
    unreadable = False  # a time was there that could not be read
    for key in TIME_KEYS:
        if key in obj:
            value = _to_seconds(obj[key])
            if value is not None:
                return value
            unreadable = unreadable or time_given(obj[key])
    for holder in (response, chunks[0] if chunks and isinstance(chunks[0], dict) else {}):
        for key in ("created", "created_at"):  # chat/completions', the Responses API's
            value = _to_seconds(holder.get(key))
            if value is not None:
                return value
            unreadable = unreadable or time_given(holder.get(key))
    return UNREADABLE_S if unreadable else UNTIMED_S


def time_given(value: Any) -> bool:
    """Whether a time key's value says a time was given: anything but nothing (absent, ``null``, ``""``)."""
    return value is not None and value != ""


def _to_seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
        if number > 1e17:
            return number / 1e9
        if number > 1e14:
            return number / 1e6
        if number > 1e11:
            return number / 1e3
        return number
    if isinstance(value, str):
        seconds = parse_datetime_s(value)  # ISO-8601 first: "20240101" is a date
        if seconds is None and value[:1].isdigit() and _is_number(value):  # an epoch as a string
            return _to_seconds(float(value))
        return seconds
    return None


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _first_str(obj: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _first_int(obj: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = _int_or_none(obj.get(key))
        if value is not None:
            return value
    return None


def _int_or_none(value: Any) -> int | None:
    """An integer, or ``None`` for anything else (also past int64: a column cannot hold it)."""
    if isinstance(value, bool) or value is None:
        return None
    number = None
    if isinstance(value, int):
        number = value
    elif (isinstance(value, float) and value.is_integer()) or (isinstance(value, str) and value.isdigit()):
        number = int(value)
    return number if number is not None and -INT64_LIMIT <= number < INT64_LIMIT else None
