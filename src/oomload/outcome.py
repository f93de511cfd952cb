"""How one replayed request ended, and the per-request result every layer exchanges.

Every request ends in exactly one ``Outcome``. The client classifies it (``oomload.load``), the run
directory stores it (``requests*.jsonl``), the verdict counts it. Precedence when several signals
apply to one request: engine dead > context overflow > admission rejected > rate limited > server error >
timeout > transport error > truncated output > ok. "Truncated" means the server answered 200 but
produced fewer tokens than asked (e.g. vLLM silently clamping ``max_tokens`` near ``max_model_len``, or
a stream that ended without its usage chunk). "Rate limited" is an HTTP 429, or a 503 that is not vLLM's
own queue-limit answer ("engine is currently busy"): a limit in front of the engine (a gateway's or a
proxy's) turned the request away; the engine never saw it.

``cancelled`` is not the server's doing: oomload itself abandoned the request (a user stopped at the end
of the run or by Ctrl-C while the request was in flight). It is recorded so that nothing sent is lost,
and it is neither a success nor an error: the verdict leaves it out of error rates.

A 200 whose ``usage`` contradicts the lengths sent is a ``server_error`` with the reason
``USAGE_DISAGREES`` (``oomload.load.classify``): the server did not run the trace's lengths, or
miscounts them, so that request is no evidence of the trace's load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

USAGE_DISAGREES = "usage disagrees"  # the reason of a server_error whose usage contradicts the request


def status_reason(status: int, *, streamed: bool = False) -> str:
    """The reason of a request failed with an HTTP status: ``"http 400"`` as the answer's status, or
    ``"400 inside a 200 stream"`` as the code of an error event (vLLM streams a refusal so)."""
    return f"{status} inside a 200 stream" if streamed else f"http {status}"


# the reasons of a server_error the server gave for refusing the request itself: HTTP 400 as the status,
# or inside a 200 stream (vLLM streams a bad token id's 400 as an error event)
REFUSED_REASONS = frozenset({status_reason(400), status_reason(400, streamed=True)})


class Outcome(StrEnum):
    """The one way a request ended."""

    OK = "ok"
    CONTEXT_OVERFLOW = "context_overflow"  # HTTP 400 "maximum context length"
    ADMISSION_REJECTED = "admission_rejected"  # vLLM's 503 "engine is currently busy" (its queue limit)
    RATE_LIMITED = "rate_limited"  # HTTP 429, a 503 not vLLM's: a limit in front of the engine turned it away
    SERVER_ERROR = "server_error"  # HTTP 5xx other than 503 while the engine lives
    ENGINE_DEAD = "engine_dead"  # CUDA OOM text, EngineDeadError, refused after the server had answered
    TRANSPORT_ERROR = "transport_error"  # connection reset/closed before an answer (keep-alive race, …)
    TIMEOUT = "timeout"  # no answer within the request timeout
    TRUNCATED = "truncated"  # 200 with fewer tokens than asked (clamped max_tokens, stream cut short)
    CANCELLED = "cancelled"  # oomload abandoned it in flight (end of run, Ctrl-C); neither ok nor error

    @property
    def is_error(self) -> bool:
        return self not in (Outcome.OK, Outcome.CANCELLED)


# the ways a request ends that are not a failure without an answer: an answer (short or not), the engine's
# death (a finding of its own) and oomload's own cancellation (``capacity.schedule``, "No answer")
ANSWERED_OR_EXCUSED = frozenset(
    o.value for o in (Outcome.OK, Outcome.TRUNCATED, Outcome.ENGINE_DEAD, Outcome.CANCELLED)
)


def unanswered(outcomes: Mapping[str, int]) -> tuple[int, int]:
    """``(failed without an answer, ended)`` of requests counted by outcome value (``ANSWERED_OR_EXCUSED``;
    cancelled requests did not end: oomload abandoned them)."""
    failed = sum(n for name, n in outcomes.items() if name not in ANSWERED_OR_EXCUSED)
    return failed, sum(outcomes.values()) - outcomes.get(Outcome.CANCELLED.value, 0)


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
    def from_json(cls, obj: Mapping[str, Any]) -> RequestResult:
        """A ``requests*.jsonl`` line; ``KeyError``/``ValueError``/``TypeError`` for one that is not a
        result — a missing field, an unknown outcome, or a field of another kind (``"x"`` for a time,
        ``null`` for a length): such a line would otherwise break the verdict's arithmetic. Unknown keys
        are left out. One pass over the fields, each checked by its exact JSON type (a report reads
        every line of a run)."""
        fields: dict[str, Any] = {"outcome": Outcome(obj["outcome"])}
        for name, kinds, required in _CHECKS:
            value = obj.get(name)
            if value is None and not required:
                continue
            if type(value) not in kinds:
                raise TypeError(f"{name} is {value!r}, not {_KIND_WORDS[kinds]}")
            fields[name] = value
        return cls(**fields)


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
_INT: frozenset[type] = frozenset({int})  # a JSON integer (``type`` is exact: ``True`` is no count)
_NUMBER: frozenset[type] = frozenset({int, float})
_STR: frozenset[type] = frozenset({str})
_KIND_WORDS = {_INT: "int", _NUMBER: "number", _STR: "str"}
_FIELD_KINDS = {
    "request_id": _STR,
    "step": _INT,
    "concurrency": _INT,
    "start_unix_s": _NUMBER,
    "end_unix_s": _NUMBER,
    "prompt_tokens_asked": _INT,
    "output_tokens_asked": _INT,
    "usage_prompt_tokens": _INT,
    "usage_completion_tokens": _INT,
    "ttft_ms": _NUMBER,
    "tpot_ms": _NUMBER,
    "itl_max_ms": _NUMBER,
    "e2e_ms": _NUMBER,
    "http_status": _INT,
    "error": _STR,
}
_CHECKS = tuple((name, kinds, name in _REQUIRED) for name, kinds in _FIELD_KINDS.items())
