"""Incremental Server-Sent Events parsing of an OpenAI-style stream, on bytes (pure).

``SseStream`` is fed raw lines (``feed_line``, what a socket ``readline`` returns) or arbitrary
chunks (``feed``); it dispatches each event at its blank line, as the SSE spec says, joining
multi-line ``data:`` fields with ``\\n``. Only what the measurement needs is JSON-parsed:

* a chunk with non-empty ``choices`` and a non-empty text delta is a *token event*: its arrival time
  gives TTFT (first), the inter-token gaps (max) and the decode time (last) — found by byte search,
  without parsing the JSON (vLLM sends compact JSON; a chunk that escapes the test only costs precision);
* a chunk that carries ``"usage":{`` is parsed for ``prompt_tokens`` / ``completion_tokens``;
* a chunk that carries ``"error"`` is parsed: vLLM sends admission rejections (503) and engine
  death as an error event inside an HTTP 200 stream;
* ``data: [DONE]`` marks a complete stream;
* any other payload that is not a JSON object (``{…}``; for the chunks parsed, one that does not
  parse) is *malformed*: counted in ``malformed``, and the request is a failure (``classify``), never
  an answer.

The token count that matters is the server's ``usage.completion_tokens``: vLLM may coalesce several
tokens into one chunk when the client lags, so counting chunks is only a fallback.
"""

from __future__ import annotations

import json
from typing import Any

_EMPTY_TEXT = (b'"text":""', b'"content":""')
_NO_CHOICES = b'"choices":[]'
_ROLE_ONLY_MARK = b'"role"'


class SseStream:
    """Accumulates one streamed response; times are the caller's clock (seconds)."""

    __slots__ = (
        "_buffer",
        "_data",
        "done",
        "error",
        "events",
        "first_token_s",
        "last_token_s",
        "malformed",
        "max_gap_s",
        "token_events",
        "usage_completion_tokens",
        "usage_prompt_tokens",
    )

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self.done = False
        self.error: dict[str, Any] | None = None
        self.events = 0
        self.malformed = 0  # data payloads that are neither [DONE] nor a JSON object
        self.token_events = 0
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.max_gap_s = 0.0
        self.usage_prompt_tokens: int | None = None
        self.usage_completion_tokens: int | None = None

    def feed(self, chunk: bytes, now_s: float) -> None:
        """Feed an arbitrary piece of the body (lines may be split anywhere)."""
        buffer = self._buffer + chunk
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            self.feed_line(buffer[start : end + 1], now_s)
            start = end + 1
        self._buffer = buffer[start:]

    def feed_line(self, line: bytes, now_s: float) -> None:
        """Feed one complete line (with or without its line ending)."""
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            self._data.append(payload)
            return
        if line.strip():
            return  # "event:", "id:", "retry:" or a ":" comment: nothing we measure
        if self._data:
            payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
            self._data = []
            self.on_event(payload, now_s)

    def close(self, now_s: float) -> None:
        """End of body: a last event without its blank line still counts."""
        if self._buffer:
            self.feed_line(self._buffer, now_s)
            self._buffer = b""
        if self._data:
            self.feed_line(b"\n", now_s)

    def on_event(self, payload: bytes, now_s: float) -> None:
        """One dispatched ``data`` payload."""
        self.events += 1
        if payload == b"[DONE]":
            self.done = True
            return
        if not (payload.startswith(b"{") and payload.endswith(b"}")):
            self.malformed += 1
            return
        if b'"error"' in payload:
            obj = _loads(payload)
            if obj is None:
                self.malformed += 1
                return
            if obj.get("error") is not None:
                err = obj["error"]
                self.error = err if isinstance(err, dict) else {"message": str(err)}
                return
        if b'"usage":{' in payload or b'"usage": {' in payload:
            obj = _loads(payload)
            if obj is None:
                self.malformed += 1
                return
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self.usage_prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
                self.usage_completion_tokens = _int_or_none(usage.get("completion_tokens"))
        if _NO_CHOICES in payload or b'"choices"' not in payload:
            return
        if (_EMPTY_TEXT[0] in payload or _EMPTY_TEXT[1] in payload) and (
            _ROLE_ONLY_MARK in payload or b'"finish_reason":null' in payload
        ):
            return  # a role-only or empty delta carries no token
        if self.first_token_s is None:
            self.first_token_s = now_s
        elif self.last_token_s is not None:
            gap = now_s - self.last_token_s
            if gap > self.max_gap_s:
                self.max_gap_s = gap
        self.last_token_s = now_s
        self.token_events += 1


def parse_json_body(body: bytes) -> tuple[int | None, int | None, dict[str, Any] | None, bool]:
    """A non-streamed answer: ``(prompt_tokens, completion_tokens, error, has_choices)``."""
    obj = _loads(body)
    if obj is None:
        return None, None, None, False
    err = obj.get("error")
    error = err if isinstance(err, dict) else ({"message": str(err)} if err else None)
    usage = obj.get("usage")
    prompt = completion = None
    if isinstance(usage, dict):
        prompt = _int_or_none(usage.get("prompt_tokens"))
        completion = _int_or_none(usage.get("completion_tokens"))
    choices = obj.get("choices")
    return prompt, completion, error, bool(choices)


def error_message(body: bytes) -> str:
    """The ``message`` of an OpenAI/vLLM error body (both shapes), or the start of the raw text."""
    obj = _loads(body)
    if obj is not None:
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message") is not None:
            return str(err["message"])
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if obj.get(key) is not None:
                return str(obj[key])
    return body[:300].decode("utf-8", errors="replace")


def error_type(body: bytes) -> str | None:
    """The ``type`` of an OpenAI/vLLM error body (``BadRequestError``, …), or ``None``."""
    obj = _loads(body)
    err = obj.get("error") if obj is not None else None
    kind = err.get("type") if isinstance(err, dict) else (obj or {}).get("type")
    return kind if isinstance(kind, str) else None


def _loads(payload: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
