"""How one replayed request ended, and the per-request result every layer exchanges.

Every request ends in exactly one ``Outcome``. The client classifies it (``oomload.load``), the run
directory stores it (``requests*.jsonl``), the verdict counts it. Precedence when several signals
apply to one request: engine dead > context overflow > admission rejected > server error > timeout >
transport error > truncated output > ok. "Truncated" means the server answered 200 but produced fewer
tokens than asked (e.g. vLLM silently clamping ``max_tokens`` near ``max_model_len``, or a stream that
ended without its usage chunk).

``cancelled`` is not the server's doing: oomload itself abandoned the request (a user stopped at the end
of the run or by Ctrl-C while the request was in flight). It is recorded so that nothing sent is lost,
and it is neither a success nor an error: the verdict leaves it out of error rates.

A 200 whose ``usage`` contradicts the lengths sent is a ``server_error`` with the reason
``USAGE_DISAGREES`` (``oomload.load.classify``): the server did not run the trace's lengths, or
miscounts them, so that request is no evidence of the trace's load.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

USAGE_DISAGREES = "usage disagrees"  # the reason of a server_error whose usage contradicts the request


class Outcome(StrEnum):
    """The one way a request ended."""

    OK = "ok"
    CONTEXT_OVERFLOW = "context_overflow"  # HTTP 400 "maximum context length"
    ADMISSION_REJECTED = "admission_rejected"  # HTTP 503, or an error event inside a 200 SSE stream
    SERVER_ERROR = "server_error"  # HTTP 5xx other than 503 while the engine lives
    ENGINE_DEAD = "engine_dead"  # CUDA OOM text, EngineDeadError, refused after the server had answered
    TRANSPORT_ERROR = "transport_error"  # connection reset/closed before an answer (keep-alive race, …)
    TIMEOUT = "timeout"  # no answer within the request timeout
    TRUNCATED = "truncated"  # 200 with fewer tokens than asked (clamped max_tokens, stream cut short)
    CANCELLED = "cancelled"  # oomload abandoned it in flight (end of run, Ctrl-C); neither ok nor error

    @property
    def is_error(self) -> bool:
        return self not in (Outcome.OK, Outcome.CANCELLED)


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One replayed request as the run directory stores it (``requests*.jsonl``, one JSON object a line).

    Times are Unix seconds (``time.time()``) so every process and host shares one clock; durations are
    milliseconds. ``*_asked`` are what oomload requested; ``usage_*`` what the server's ``usage`` said
    (``None`` when the response carried no usage).
    """

    request_id: str
    step: int
    concurrency: int
    start_unix_s: float
    end_unix_s: float
    outcome: Outcome
    prompt_tokens_asked: int
    output_tokens_asked: int
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None  # mean inter-token latency after the first token
    itl_max_ms: float | None = None  # worst gap between two streamed tokens
    e2e_ms: float | None = None
    http_status: int | None = None
    error: str | None = None  # short reason, never request or response text

    def to_json(self) -> dict[str, Any]:
        obj = asdict(self)
        obj["outcome"] = self.outcome.value
        return {k: v for k, v in obj.items() if v is not None}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RequestResult:
        """A ``requests*.jsonl`` line; ``KeyError``/``ValueError``/``TypeError`` for one that is not a
        result — a missing field, an unknown outcome, or a field of another kind (``"x"`` for a time,
        ``null`` for a length): such a line would otherwise break the verdict's arithmetic."""
        data = dict(obj)
        data["outcome"] = Outcome(data["outcome"])
        known = cls.__dataclass_fields__
        for name, kind in _FIELD_KINDS.items():
            value = data.get(name)
            if (value is not None or name in _REQUIRED) and not _is_kind(value, kind):
                raise TypeError(f"{name} is {value!r}, not {kind}")
        return cls(**{k: v for k, v in data.items() if k in known})


_REQUIRED = frozenset(
    {
        "request_id",
        "step",
        "concurrency",
        "start_unix_s",
        "end_unix_s",
        "prompt_tokens_asked",
        "output_tokens_asked",
    }
)
_FIELD_KINDS = {
    "request_id": "str",
    "step": "int",
    "concurrency": "int",
    "start_unix_s": "number",
    "end_unix_s": "number",
    "prompt_tokens_asked": "int",
    "output_tokens_asked": "int",
    "usage_prompt_tokens": "int",
    "usage_completion_tokens": "int",
    "ttft_ms": "number",
    "tpot_ms": "number",
    "itl_max_ms": "number",
    "e2e_ms": "number",
    "http_status": "int",
    "error": "str",
}


def _is_kind(value: object, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) if kind == "int" else True
