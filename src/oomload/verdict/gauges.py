"""Findings drawn from a gauge must be sustained: one momentary reading never trips them (pure).

vLLM's gauges (``num_requests_waiting``, ``kv_cache_usage_perc``) are read one scrape at a time. A
single scrape can catch a request in the instant between its arrival and its admission (``waiting
1`` at 9 % KV usage) — not queueing. So a gauge finding (queueing: waiting > 0; KV saturation: usage
≥ 99 %) holds in a step only when **at least ``SUSTAINED_SCRAPES`` (2) consecutive successful scrapes
of that step** show it. A step's *sustained* value is the highest level that many consecutive scrapes
all reached: the maximum, over every run of ``SUSTAINED_SCRAPES`` consecutive scrapes, of the run's
minimum. A step with fewer successful scrapes than that has a sustained value of 0 (nothing was seen
twice in a row; the gauge was still observed); with none it is ``None`` (not observed).

The per-step peak (``waiting_max``, ``kv_usage_max``) is still reported as measured, and the
``max-waiting`` / ``max-kv-usage`` gate thresholds, which name a peak, still use it.
"""

from __future__ import annotations

from collections.abc import Sequence

SUSTAINED_SCRAPES = 2


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
