"""Every request ends in exactly one ``Outcome`` (pure).

``Observation`` is what the HTTP adapter saw; ``classify`` applies the precedence documented in
``oomload.outcome`` — engine dead > context overflow > admission rejected > rate limited > server error >
timeout > transport error > truncated > ok — to these rules:

=================================================  =======================================
observation                                        outcome
=================================================  =======================================
CUDA OOM / EngineDeadError / "engine dead" text    engine_dead (any status, or a stream
in an error body or SSE error event                error event)
HTTP 500 with an empty body or vLLM's engine-      engine_dead (what vLLM 0.10 / 0.33
death message ("The server had an error while      answer for a dead engine)
processing your request.")
connection refused after the server had answered   engine_dead (the API server exited)
HTTP 400 (or an error event) with "maximum context  context_overflow
length" / "longer than the maximum model length" /
"cannot be greater than max_model_len"
vLLM's own queue-limit answer: "engine is          admission_rejected
currently busy" in the text, or the error type
"Service Unavailable" (HTTP 503, or an SSE error
event with code 503)
HTTP 429, or an SSE error event with code 429;     rate_limited (a rate or concurrency
a 503 without vLLM's answer (nginx's limit_req     limit in front of the engine, a gateway's
and limit_conn, Envoy's overflow, HAProxy's        or a proxy's, turned it away)
"no server is available" all answer a bare 503)
any other HTTP status ≥ 400, an other SSE error,   server_error
a 200 that is neither JSON nor an event stream,     (reason "malformed event stream" for
an event stream with a malformed event               the last: an answer that is not one;
                                                     "400 inside a 200 stream" for an event
                                                     with a status code, as vLLM streams a
                                                     refusal)
the request timeout elapsed                        timeout
connect failed / reset / closed before an answer   transport_error
a 200 whose stream (or body) broke — EOF or reset  transport_error, reason "stream broke"
before ``[DONE]`` and without a usage chunk        (a dying server cuts its streams)
a complete 200 whose usage contradicts what was    server_error, reason "usage disagrees"
sent: ``completion_tokens`` > ``max_tokens``, or   (the server did not run the lengths
``prompt_tokens`` ≠ the prompt sent beyond the     sent, or its usage is wrong: either
request's slack (``PreparedRequest``)              way the load was not the trace's)
a complete 200 (``[DONE]`` seen or usage present)  truncated
without usage, or with ``usage.completion_tokens``  (e.g. max_tokens clamped silently
< what was asked (exact output only)               near max_model_len)
everything else                                    ok
=================================================  =======================================

The ``reason`` returned is short and stable (no numbers) so Locust's error table groups well; the
``detail`` adds what is safe to keep: the matched marker, the token counts of the server's message
(``maximum context length (2048, 3000)``), the server's error *type* when it is an error class name
(``BadRequestError``).
Neither ever contains prompt, completion or free server text: an error message may echo the input
(pydantic validation errors do), so it is never copied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from oomload.outcome import USAGE_DISAGREES, Outcome, status_reason

ENGINE_DEAD_MARKS = (
    "cuda out of memory",
    "outofmemoryerror",
    "enginedeaderror",
    "engine dead",
    "enginecore encountered an issue",
    "engine loop is not running",
    "mqenginedeaderror",
    "the server had an error while processing your request",
)
CONTEXT_MARKS = (
    "maximum context length",
    "longer than the maximum model length",
    "cannot be greater than max_model_len",
)
ADMISSION_MARK = "engine is currently busy"  # vLLM's queue-limit message (``--max-num-queued-reqs``)
ADMISSION_TYPE = "service unavailable"  # the error ``type`` vLLM gives it (never matched in free text)
# a limit in front of the engine: a 429, or a 503 that is not vLLM's own answer (``ADMISSION_MARK``)
TURNED_AWAY_STATUSES = frozenset({429, 503})
MAX_DETAIL_NUMBERS = 4
# token counts only ("2048 tokens", "200 input tokens"): other numbers may be a token-id prompt echoed
_NUMBER = re.compile(r"(?<![\w.])(\d{1,9})(?=\s+(?:input\s+|prompt\s+|output\s+)?tokens?\b)")
# an error class name (BadRequestError, invalid_request_error, …), never free text
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,59}(?:Error|_error|Exception)")


@dataclass(frozen=True, slots=True)
class Observation:
    """What one request looked like from the client side."""

    http_status: int | None = None  # None: no HTTP answer at all
    error_text: str | None = None  # error message from the body or from an SSE error event
    error_code: int | None = None  # "code" of an SSE error event
    error_type: str | None = None  # "type" of the error object (e.g. BadRequestError)
    stream_error: bool = False  # the error came as an event inside a 200 stream
    timed_out: bool = False
    transport_error: str | None = None  # e.g. "connection refused", "connection reset"
    refused: bool = False  # the connection was refused (nothing reached the server)
    server_answered_before: bool = False  # the server had answered some earlier request
    body_ok: bool = True  # a 200 body was an event stream or JSON
    malformed: bool = False  # an event of the stream was neither [DONE] nor a JSON object
    stream_complete: bool = True  # [DONE] seen (streaming) / full body read
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    output_tokens_asked: int = 0
    exact_output: bool = True
    prompt_tokens_sent: int | None = None  # what usage.prompt_tokens must say (None: not known)
    prompt_slack_tokens: int = 0  # how far it may be off (a calibrated chat prompt)


def classify(obs: Observation) -> tuple[Outcome, str | None, str | None]:
    """``(outcome, reason, detail)``; reason and detail are ``None`` for ok."""
    text = (obs.error_text or "").lower()
    status = obs.http_status
    dead_mark = next((m for m in ENGINE_DEAD_MARKS if m in text), None)
    if dead_mark is not None or (status == 500 and not text.strip()):
        return Outcome.ENGINE_DEAD, "engine dead", _detail(obs, dead_mark)
    if obs.refused and obs.server_answered_before:
        return Outcome.ENGINE_DEAD, "connection refused after the server had answered", None
    context_mark = next((m for m in CONTEXT_MARKS if m in text), None)
    if context_mark is not None:
        return Outcome.CONTEXT_OVERFLOW, "maximum context length", _detail(obs, context_mark)
    busy_mark = ADMISSION_MARK if ADMISSION_MARK in text else None
    if busy_mark is not None or (obs.error_type or "").lower() == ADMISSION_TYPE:
        where = status_reason(503, streamed=obs.stream_error)
        return Outcome.ADMISSION_REJECTED, where, _detail(obs, busy_mark)
    if status is not None and status in TURNED_AWAY_STATUSES:
        return Outcome.RATE_LIMITED, status_reason(status), _detail(obs, None)
    code = obs.error_code
    if obs.stream_error and code is not None and code in TURNED_AWAY_STATUSES:
        return Outcome.RATE_LIMITED, status_reason(code, streamed=True), _detail(obs, None)
    if status is not None and status >= 400:
        return Outcome.SERVER_ERROR, status_reason(status), _detail(obs, None)
    if obs.stream_error:  # vLLM streams a refusal (a bad token id, …) as an event with its status code
        code = obs.error_code
        where = (
            status_reason(code, streamed=True)
            if code is not None and 400 <= code < 600
            else "error event in stream"
        )
        return Outcome.SERVER_ERROR, where, _detail(obs, None)
    if status is not None and not obs.body_ok:
        return Outcome.SERVER_ERROR, "not json or an event stream", None
    if status is not None and obs.malformed:
        return Outcome.SERVER_ERROR, "malformed event stream", None
    if obs.timed_out:
        return Outcome.TIMEOUT, "request timeout", None
    if status is None:
        reason = obs.transport_error or "no answer"
        return Outcome.TRANSPORT_ERROR, reason, None
    if not obs.stream_complete and obs.usage_completion_tokens is None:
        return Outcome.TRANSPORT_ERROR, "stream broke", obs.transport_error or "EOF before [DONE]"
    if obs.usage_completion_tokens is None:
        return Outcome.TRUNCATED, "no usage", None
    disagreement = _usage_disagreement(obs)
    if disagreement is not None:
        return Outcome.SERVER_ERROR, USAGE_DISAGREES, disagreement
    if obs.exact_output and obs.usage_completion_tokens < obs.output_tokens_asked:
        detail = f"completion_tokens {obs.usage_completion_tokens} < max_tokens {obs.output_tokens_asked}"
        return Outcome.TRUNCATED, "fewer tokens than asked", detail
    return Outcome.OK, None, None


def _usage_disagreement(obs: Observation) -> str | None:
    """How the answer's usage contradicts what was sent (token counts only), or ``None``."""
    completion = obs.usage_completion_tokens
    if completion is not None and completion > obs.output_tokens_asked:
        return f"completion_tokens {completion} > max_tokens {obs.output_tokens_asked}"
    prompt, sent = obs.usage_prompt_tokens, obs.prompt_tokens_sent
    if prompt is not None and sent is not None and abs(prompt - sent) > obs.prompt_slack_tokens:
        return f"prompt_tokens {prompt}, {sent} sent"
    return None


def _detail(obs: Observation, mark: str | None) -> str | None:
    """What is safe to keep of a server's error: the marker, its numbers, a short error type."""
    parts: list[str] = []
    if mark is not None:
        numbers = _NUMBER.findall(obs.error_text or "")[:MAX_DETAIL_NUMBERS]
        parts.append(f"{mark} ({', '.join(numbers)})" if numbers else mark)
    kind = obs.error_type
    if kind is not None and _IDENTIFIER.fullmatch(kind) and kind.lower() != (mark or ""):
        parts.append(kind)
    return "; ".join(parts) or None


def error_fields(error: Any) -> tuple[str | None, int | None, str | None]:
    """``(message, code, type)`` of an error object from an SSE event or a JSON body.

    The message is only ever matched against markers (never stored); the type is kept when short.
    """
    if not isinstance(error, dict):
        return (None if error is None else str(error)), None, None
    message = error.get("message")
    code = error.get("code")
    kind = error.get("type")
    parts = [str(message) if message is not None else "", str(kind or "")]
    return (
        " ".join(p for p in parts if p) or None,
        code if isinstance(code, int) else None,
        kind if isinstance(kind, str) else None,
    )
