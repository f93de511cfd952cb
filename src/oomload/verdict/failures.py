"""Failed requests in words: the most common reason of each failed outcome (``Verdict.failure_texts``),
named beside the outcome's count in the verdict's sentences, and what to do about the two kinds that are no
failure of the engine (``RATE_LIMIT_HINT``: a limit in front of it; ``USAGE_HINT``: lengths other than the
trace's).

A request's ``error`` is oomload's own short reason, never the server's text (``oomload.load.classify``):
``http 500: InternalServerError``, ``not json or an event stream``, ``stream broke: EOF before [DONE]``.
The outcome alone (``server_error 4660``) does not tell a 404 from a proxy's HTML page; its most common
reason does, so both are named: ``server_error 4660 [http 500: InternalServerError]``, or with how many
had it when the failures of one outcome differ: ``server_error 4660 [4000 × http 500: …]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from oomload.outcome import RequestResult

# what to do about the failures that are no failure of the engine, named where they are counted
RATE_LIMIT_HINT = (
    "a rate or concurrency limit in front of the engine (a gateway's or a proxy's) answers HTTP 429, or a "
    "503 that is not vLLM's own: point --url at the vLLM server itself, or raise that limit for the test"
)
USAGE_HINT = (
    "the server ran other lengths than the trace's or miscounts them — a proxy that rewrites prompts, "
    "max_tokens or usage (point --url at the vLLM server itself), or a server that is not vLLM"
)


def failure_texts(requests: Iterable[RequestResult]) -> dict[str, tuple[str, int]]:
    """Each failed outcome's most common reason (``reason_of``: short, without numbers) and how many
    requests had it, with its detail when every one of those had the same (``InternalServerError``; a
    detail with counts in it differs from request to request); outcomes whose requests carry no
    ``error`` are left out. Ties: the reason met first."""
    reasons: dict[str, Counter[str]] = {}
    details: dict[tuple[str, str], set[str | None]] = {}
    for r in requests:
        reason = reason_of(r)
        if r.outcome.is_error and reason:
            reasons.setdefault(r.outcome.value, Counter())[reason] += 1
            details.setdefault((r.outcome.value, reason), set()).add(detail_of(r))
    texts: dict[str, tuple[str, int]] = {}
    for name, counts in reasons.items():
        reason, n = counts.most_common(1)[0]
        (detail, *others) = details[name, reason]
        texts[name] = (f"{reason}: {detail}" if detail and not others else reason, n)
    return texts


def outcome_count(name: str, n: int, texts: Mapping[str, tuple[str, int]]) -> str:
    """``server_error 4660`` with its most common reason: ``[http 500: …]`` when every one of the ``n``
    had it, else ``[4000 × http 500: …]``."""
    text, count = texts.get(name, (name, 0))
    if text == name:  # nothing the outcome does not say
        return f"{name} {n}"
    return f"{name} {n} [{text}]" if count >= n else f"{name} {n} [{count} × {text}]"


def reason_of(r: RequestResult) -> str | None:
    """A failed request's short reason (``error`` is "reason" or "reason: detail")."""
    return None if r.error is None else r.error.partition(": ")[0]


def detail_of(r: RequestResult) -> str | None:
    return None if r.error is None else r.error.partition(": ")[2] or None
