"""Findings drawn from a gauge must be sustained: one momentary reading never trips them (pure).

vLLM's gauges (``num_requests_waiting``, ``kv_cache_usage_perc``) are read one scrape at a time. A
single scrape can catch a request in the instant between its arrival and its admission (``waiting
1`` at 9 % KV usage) — not queueing. So a gauge finding (queueing: waiting > 0; KV saturation: usage
≥ 99 %) holds in a step only when **at least ``SUSTAINED_SCRAPES`` (2) consecutive successful scrapes
of that step** show it. A step's *sustained* value is the highest level that many consecutive scrapes
all reached: the maximum, over every run of ``SUSTAINED_SCRAPES`` consecutive scrapes, of the run's
minimum. A step with fewer successful scrapes than that has a sustained value of 0 (nothing was seen
twice in a row; the gauge was still observed); with none it is ``None`` (not observed).

A step's opening admission is not queueing either (``past_admission``): a ramp step starts its new
users at once, and their prompts can take more than one engine step to admit. On the real vLLM (6 users
of 1,792-token prompts, the first step of a ramp, a busy host) the scrapes read 3 then 1 waiting, then
0 for the rest of the 8 s step, with 6 running: two consecutive scrapes, so "queueing at 6", and the
run's last safe level was lost. A first run of waiting readings that begins in the step's first quarter,
only drains, ends in a reading of 0 and covers less than half the step's scrapes is read as 0.

The per-step peak (``waiting_max``, ``kv_usage_max``) is still reported as measured, and the
``max-waiting`` / ``max-kv-usage`` gate thresholds, which name a peak, still use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

SUSTAINED_SCRAPES = 2
OPENING_SHARE = 0.25  # a step's opening admission: its first quarter (``past_admission``)


def sustained_level(values: Sequence[float | None], scrapes: int = SUSTAINED_SCRAPES) -> float | None:
    """The highest level ``scrapes`` consecutive readings all reached (readings in time order;
    ``None`` readings, i.e. a gauge missing from a scrape, break a run). ``None`` without readings."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    best = 0.0
    for i in range(len(values) - scrapes + 1):
        window = values[i : i + scrapes]
        if all(v is not None for v in window):
            best = max(best, min(float(v) for v in window if v is not None))
    return best


def waiting_sustained(
    readings: Sequence[tuple[float, float | None]], start_s: float, duration_s: float | None
) -> float | None:
    """The sustained level of a step's ``(time, waiting)`` readings past its opening admission."""
    opening_end_s = start_s + (duration_s or 0.0) * OPENING_SHARE
    return sustained_level(past_admission([v for _, v in readings], [t for t, _ in readings], opening_end_s))


def past_admission(
    values: Sequence[float | None], times_s: Sequence[float], opening_end_s: float
) -> list[float | None]:
    """The waiting readings (taken at ``times_s``) with the step's opening admission burst read as 0
    (module docstring): the first run of readings above 0, after readings of 0 only, that starts by
    ``opening_end_s``, never rises, ends in a 0 and covers less than half the readings. Anything else is
    returned as it was."""
    out = list(values)
    start = next((i for i, v in enumerate(out) if v != 0), len(out))
    end = next((i for i in range(start, len(out)) if out[i] is None or out[i] == 0), len(out))
    run = [float(v) for v in out[start:end] if v is not None]
    drains = all(b <= a for a, b in pairwise(run))
    if not run or end == len(out) or out[end] is None or not drains or 2 * len(run) >= len(out):
        return out
    if times_s[start] > opening_end_s:
        return out
    out[start:end] = [0.0] * len(run)
    return out
