"""Rates and means over a step's window (pure): the one definition of each, for every report.

``per_100`` — a count per 100 requests sent (the preemption rates of a step and of a level);
``per_second`` — a count over a step's duration (req/s and output tokens/s, in the live line and every
report); ``achieved_concurrency`` — the time-weighted mean number of requests in flight over a window,
from each request's own start and end times; ``share_crossing`` — the share of scrapes whose reading
crossed a line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from oomload.outcome import RequestResult


def share_crossing(readings: Sequence[float | None], crossed: Callable[[float], bool]) -> float | None:
    """The share of scrapes reporting a value whose value crossed the line (``None``: none reported)."""
    values = [v for v in readings if v is not None]
    return None if not values else sum(1 for v in values if crossed(v)) / len(values)


def per_100(count: int | None, requests: int) -> float | None:
    """``count`` per 100 requests (``None`` when the count is unknown or nothing was sent): the one
    definition behind the per-step and per-level preemption rates."""
    return None if count is None or not requests else 100.0 * count / requests


def per_second(count: int | None, duration_s: float | None) -> float | None:
    """A step's rate: ``count`` over ``duration_s`` (``None`` when either is unknown or the step had
    no duration). The one definition behind req/s and tok/s in the live line and every report."""
    if count is None or duration_s is None or duration_s <= 0:
        return None
    return count / duration_s


def achieved_concurrency(
    requests: Sequence[RequestResult], start_unix_s: float, end_unix_s: float
) -> float | None:
    """Time-weighted mean number of requests in flight within ``[start, end]`` (None for an empty window)."""
    span = end_unix_s - start_unix_s
    if not span > 0 or math.isinf(span):
        return None
    busy = 0.0
    for r in requests:
        lo = max(r.start_unix_s, start_unix_s)
        hi = min(r.end_unix_s, end_unix_s)
        if hi > lo:
            busy += hi - lo
    return busy / span
