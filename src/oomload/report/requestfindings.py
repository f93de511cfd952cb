"""The findings about the requests themselves: refused or clamped for their length, short answers,
answers whose usage contradicted what was sent, requests a limit in front of the engine turned away,
and the failures no other finding explains."""

from __future__ import annotations

from oomload.outcome import Outcome
from oomload.report.finding import Finding, not_judged
from oomload.verdict import Verdict
from oomload.verdict.failures import RATE_LIMIT_HINT, USAGE_HINT, outcome_count

# outcomes that are not failures, or that a finding of their own already tells
NOT_FAILURES = frozenset(
    o.value
    for o in (
        Outcome.OK,
        Outcome.CANCELLED,
        Outcome.CONTEXT_OVERFLOW,
        Outcome.TRUNCATED,
        Outcome.RATE_LIMITED,
    )
)


def context_overflow(verdict: Verdict) -> Finding:
    ctx = verdict.context_overflow
    if not (ctx.refused or ctx.clamped or ctx.trace_over_limit):
        if unjudged := not_judged(verdict, "context_overflow", "Context overflow"):
            return unjudged  # requests that failed otherwise never reached the length check
        limit = "" if ctx.model_limit is None else f" (max_model_len {ctx.model_limit})"
        return Finding("context_overflow", "Context overflow", f"none{limit}", "ok")
    parts = []
    if ctx.refused:
        lengths = _token_range(ctx.refused_total_tokens_min, ctx.refused_total_tokens_max)
        parts.append(f"{ctx.refused} refused at {lengths} total tokens (prompt + output)")
    if ctx.clamped:
        lengths = _token_range(ctx.clamped_total_tokens_min, ctx.clamped_total_tokens_max)
        parts.append(
            f"{ctx.clamped} clamped (asked {lengths} total tokens, over max_model_len {ctx.model_limit})"
        )
    if ctx.trace_over_limit:
        parts.append(
            f"{ctx.trace_over_limit} of {ctx.trace_count} trace requests "
            f"exceed max_model_len {ctx.model_limit}"
            + (": left out of the replay (--only-fitting)" if ctx.left_out else "")
        )
    return Finding("context_overflow", "Context overflow", "; ".join(parts), "warn")


def short_responses(verdict: Verdict) -> Finding | None:
    short = verdict.context_overflow.short_responses
    if not short:
        return None
    return Finding(
        "short_responses",
        "Short responses",
        f"{short} response(s) ended with fewer tokens than asked "
        "(within max_model_len, not casualties of an engine death)",
        "warn",
    )


def usage_disagrees(verdict: Verdict) -> Finding | None:
    """Answers whose usage contradicted the lengths sent: server errors, and why they matter."""
    n = verdict.usage_disagrees
    if not n:
        return None
    example = "" if verdict.usage_disagrees_example is None else f", e.g. {verdict.usage_disagrees_example}"
    return Finding(
        "usage_disagrees",
        "Usage",
        f"{n} of {verdict.requests_total} answers reported other lengths than were sent{example}; "
        f"counted as server errors: {USAGE_HINT}",
        "bad",
    )


def rate_limited(verdict: Verdict) -> Finding | None:
    """Requests a limit in front of the engine turned away (``rate_limited``), where it began, and what the
    engine's own counters saw running there: the most the limit let through."""
    total = verdict.requests_rate_limited
    if not total:
        return None
    limited = [s for s in verdict.measured_steps if s.rate_limited_requests]
    kind = outcome_count(Outcome.RATE_LIMITED.value, total, verdict.failure_texts)
    running = max((s.running_max or 0 for s in limited), default=0)  # 0: no scrape caught one running
    engine = f" (its own counters saw at most {running} running there)" if running else ""
    return Finding(
        "rate_limited",
        "Rate limit",
        f"{total} of {verdict.requests_total} requests turned away ({kind}) from concurrency "
        f"{min(s.concurrency for s in limited)}, so the load there did not reach the engine{engine} — "
        f"{RATE_LIMIT_HINT}",
        "warn",
    )


def failed_requests(verdict: Verdict) -> Finding | None:
    failed = _failed_by_outcome(verdict)
    if not failed:
        return None
    first_at = min(c for c, _ in failed.values())
    ranked = sorted(failed.items(), key=lambda kv: -kv[1][1])
    by_outcome = ", ".join(outcome_count(name, n, verdict.failure_texts) for name, (_, n) in ranked)
    total = sum(n for _, n in failed.values())
    none_ok = " — no request succeeded" if verdict.requests_ok == 0 else ""
    return Finding(
        "failed_requests",
        "Failed requests",
        f"{total} of {verdict.requests_total}: {by_outcome}; first at concurrency {first_at}"
        f"{none_ok} (reasons per request in requests.jsonl)",
        "bad",
    )


def _failed_by_outcome(verdict: Verdict) -> dict[str, tuple[int, int]]:
    """Failures over the measured steps that no other finding explains, by outcome: (lowest level seen
    at, count). Context overflow and short answers have findings of their own; casualties of an engine
    death are told with the death."""
    failed: dict[str, tuple[int, int]] = {}
    for s in verdict.measured_steps:
        for name, n in s.outcomes.items():
            charged = n - int(s.casualties.get(name, 0))
            if name in NOT_FAILURES or charged <= 0:
                continue
            first, count = failed.get(name, (s.concurrency, 0))
            failed[name] = (min(first, s.concurrency), count + charged)
    return failed


def _token_range(low: int | None, high: int | None) -> str:
    """``16536`` when both ends agree, else ``524–1325``."""
    return str(low) if low == high else f"{low}–{high}"
