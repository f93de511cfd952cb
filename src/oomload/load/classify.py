"""Every request ends in exactly one ``Outcome`` (pure).

``Observation`` is what the HTTP adapter saw; ``classify`` applies the precedence documented in
``oomload.outcome`` — engine dead > context overflow > admission rejected > server error > timeout >
transport error > truncated > ok — to these rules:

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
HTTP 503, or an SSE error event with code 503 /    admission_rejected
"Service Unavailable" / "engine is currently busy"
any other HTTP status ≥ 400, an other SSE error,   server_error
a 200 that is neither JSON nor an event stream
the request timeout elapsed                        timeout
connect failed / reset / closed before an answer   transport_error
200 stream cut before ``[DONE]`` or without usage  truncated
``usage.completion_tokens`` < what was asked       truncated (e.g. max_tokens clamped
(exact output only)                                silently near max_model_len)
everything else                                    ok
=================================================  =======================================

The ``reason`` returned is short and stable (no numbers) so Locust's error table groups well; the
``detail`` adds the numbers for the run directory. Neither ever contains prompt or completion text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomload.outcome import Outcome

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
ADMISSION_MARKS = ("engine is currently busy", "service unavailable")


@dataclass(frozen=True, slots=True)
class Observation:
    """What one request looked like from the client side."""

    http_status: int | None = None  # None: no HTTP answer at all
    error_text: str | None = None  # error message from the body or from an SSE error event
    error_code: int | None = None  # "code" of an SSE error event
    stream_error: bool = False  # the error came as an event inside a 200 stream
    timed_out: bool = False
    transport_error: str | None = None  # e.g. "connection refused", "connection reset"
    refused: bool = False  # the connection was refused (nothing reached the server)
    server_answered_before: bool = False  # the server had answered some earlier request
    body_ok: bool = True  # a 200 body was an event stream or JSON
    stream_complete: bool = True  # [DONE] seen (streaming) / full body read
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    output_tokens_asked: int = 0
    exact_output: bool = True


def classify(obs: Observation) -> tuple[Outcome, str | None, str | None]:
    """``(outcome, reason, detail)``; reason and detail are ``None`` for ok."""
    text = (obs.error_text or "").lower()
    status = obs.http_status
    if any(mark in text for mark in ENGINE_DEAD_MARKS) or (status == 500 and not text.strip()):
        return Outcome.ENGINE_DEAD, "engine dead", _detail(obs)
    if obs.refused and obs.server_answered_before:
        return Outcome.ENGINE_DEAD, "connection refused after the server had answered", None
    if any(mark in text for mark in CONTEXT_MARKS):
        return Outcome.CONTEXT_OVERFLOW, "maximum context length", _detail(obs)
    if status == 503 or obs.error_code == 503 or any(mark in text for mark in ADMISSION_MARKS):
        where = "503 inside a 200 stream" if obs.stream_error else "http 503"
        return Outcome.ADMISSION_REJECTED, where, _detail(obs)
    if status is not None and status >= 400:
        return Outcome.SERVER_ERROR, f"http {status}", _detail(obs)
    if obs.stream_error:
        return Outcome.SERVER_ERROR, "error event in stream", _detail(obs)
    if status is not None and not obs.body_ok:
        return Outcome.SERVER_ERROR, "not json or an event stream", None
    if obs.timed_out:
        return Outcome.TIMEOUT, "request timeout", None
    if status is None:
        reason = obs.transport_error or "no answer"
        return Outcome.TRANSPORT_ERROR, reason, None
    if not obs.stream_complete:
        return Outcome.TRUNCATED, "stream cut", obs.transport_error
    if obs.usage_completion_tokens is None:
        return Outcome.TRUNCATED, "no usage", None
    if obs.exact_output and obs.usage_completion_tokens < obs.output_tokens_asked:
        detail = f"completion_tokens {obs.usage_completion_tokens} < max_tokens {obs.output_tokens_asked}"
        return Outcome.TRUNCATED, "fewer tokens than asked", detail
    return Outcome.OK, None, None


def _detail(obs: Observation) -> str | None:
    if not obs.error_text:
        return None
    text = " ".join(obs.error_text.split())
    return text[:200]


def error_fields(error: Any) -> tuple[str | None, int | None]:
    """``(message, code)`` of an error object from an SSE event or a JSON body."""
    if not isinstance(error, dict):
        return (None if error is None else str(error)), None
    message = error.get("message")
    code = error.get("code")
    parts = [str(message) if message is not None else "", str(error.get("type") or "")]
    return " ".join(p for p in parts if p) or None, code if isinstance(code, int) else None
