"""Length-distribution statistics and the ``max_model_len`` a trace implies (pure, numpy only).

Percentile method — **nearest rank** (numpy ``method="inverted_cdf"``, Hyndman & Fan type 1): the
P-th percentile is the smallest observed value ``v`` such that at least P % of the requests are ``≤ v``.
It is always a length that really occurred, and it carries the guarantee capacity planning needs:
"P99 = 5,312" means at least 99 % of requests fit in 5,312 tokens. (numpy's default linear
interpolation can land between two observations and cover slightly less than P %.)

``recommend_max_model_len`` turns a total-length distribution (prompt + output per request) into a
setting: ``ceil(P99 × (1 + margin))`` rounded up to a multiple of ``round_to`` (256 by default, and of
the KV block size when given, so no block is left partly unusable), then limited three ways, each
flagged in the advice: by the model's own limit; by the KV cache (vLLM refuses to start when one
``max_model_len`` request does not fit the pool, so the setting becomes the pool's size in whole
blocks); and by the current setting when that already covers the P99 (raising it would only shrink the
worst-case concurrency the pool guarantees, so the advice is to keep it).
It also reports the share of the trace the setting would refuse, and — given the KV-cache size in
tokens — how many worst-case full-length sequences fit at once (vLLM's "Maximum concurrency for N
tokens per request"), compared with the current setting.

**Constant memory** (``LengthCounts``, ``ArrivalCounter``): token lengths are integers bounded by
the model's window, so a trace of any length is summarized from *counts per length* (a dense
array up to the longest length seen, ~8 bytes per distinct length below ``DENSE_LENGTHS``; a dict
above it) instead of one array element per request. The nearest-rank percentile is then the value
at sorted index ``max(0, ceil(n · p/100 − 1))`` — numpy's ``inverted_cdf`` index, computed with
the same floating-point steps — found by a search in the cumulative counts; the mean is the exact
integer sum over the count. Arrivals in time order are summarized on the fly: the busiest
window ``[t, t + W)`` is counted over the requests of the last ``W`` seconds only, and the gaps'
mean and variance are combined batch by batch (Chan et al.), so memory is bounded by the busiest
minute, not the length of the log.

``summarize_trace`` adds what ``oomload trace stats`` reports about arrivals — the mean rate
((count − 1) / span), the peak rate in the busiest 1 s and 60 s windows, and burstiness (coefficient
of variation of inter-arrival gaps: 1 for Poisson) — and the share of requests above common context
limits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

import numpy as np
import numpy.typing as npt

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
PERCENTILE_METHOD = "nearest-rank (numpy method='inverted_cdf')"
COMMON_CONTEXT_LIMITS: tuple[int, ...] = (4096, 8192, 16384, 32768, 131072)

IntArray = npt.NDArray[np.int64]
DENSE_LENGTHS = 1 << 22  # lengths below this are counted in an array (32 MiB at most), above in a dict


def percentile(values: Sequence[float] | npt.NDArray[np.generic], p: float) -> float:
    """The nearest-rank ``p``-th percentile (0 < p ≤ 100) of a non-empty sample."""
    arr = np.asarray(values)
    if arr.size == 0:
        raise ValueError("percentile of an empty sample")
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    return float(np.percentile(arr, p, method="inverted_cdf"))


@dataclass(frozen=True, slots=True)
class LengthSummary:
    """Count, mean, nearest-rank percentiles and max of one length distribution (tokens)."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return {
            "count": self.count,
            "mean": self.mean,
            "p50": self.p50,
            "p90": self.p90,
            "p95": self.p95,
            "p99": self.p99,
            "p99.9": self.p999,
            "max": self.max,
        }


def summarize_lengths(values: Sequence[float] | npt.NDArray[np.generic]) -> LengthSummary:
    """Summarize a non-empty sample with ``PERCENTILES`` (nearest rank)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("cannot summarize an empty sample")
    p50, p90, p95, p99, p999 = (float(v) for v in np.percentile(arr, PERCENTILES, method="inverted_cdf"))
    return LengthSummary(
        count=int(arr.size),
        mean=float(arr.mean()),
        p50=p50,
        p90=p90,
        p95=p95,
        p99=p99,
        p999=p999,
        max=float(arr.max()),
    )


def share_above(values: Sequence[float] | npt.NDArray[np.generic], limit: float) -> float:
    """Fraction of requests strictly longer than ``limit`` (0.0 for an empty sample)."""
    arr = np.asarray(values)
    return 0.0 if arr.size == 0 else float(np.count_nonzero(arr > limit) / arr.size)


@dataclass(frozen=True, slots=True)
class MaxModelLenAdvice:
    """A recommended ``max_model_len`` and what it costs and frees."""

    max_model_len: int
    basis_percentile: float
    basis_tokens: float  # the percentile of total tokens the setting was derived from
    margin: float
    round_to: int
    capped_by_model_limit: bool
    refused_share: float  # share of the trace longer than the setting
    refused_count: int
    max_concurrency: float | None = None  # full-length sequences the KV cache holds at once
    current_max_model_len: int | None = None
    current_max_concurrency: float | None = None
    capped_by_kv_cache: bool = False  # the KV pool cannot hold one request of the P99 length
    kept_current: bool = False  # the current setting already covers the basis percentile

    @property
    def freed_concurrency(self) -> float | None:
        """Extra worst-case concurrent sequences compared with the current setting."""
        if self.max_concurrency is None or self.current_max_concurrency is None:
            return None
        return self.max_concurrency - self.current_max_concurrency


def round_up(value: float, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ≥ ``value``."""
    if multiple <= 0:
        raise ValueError(f"rounding multiple must be positive, got {multiple}")
    return int(math.ceil(value / multiple) * multiple)


def recommend_max_model_len(
    total_tokens: Sequence[int] | IntArray | LengthCounts,
    *,
    percentile_p: float = 99.0,
    margin: float = 0.10,
    round_to: int = 256,
    block_size: int | None = None,
    model_limit: int | None = None,
    kv_cache_tokens: int | None = None,
    current_max_model_len: int | None = None,
) -> MaxModelLenAdvice:
    """The ``max_model_len`` a trace implies: P99 of total tokens plus a margin, rounded up.

    Never below the basis percentile itself (a recommendation that refuses more than the trace's
    tail is wrong by construction) unless the model's limit or the KV cache forces it, which is then
    flagged; never above the current setting when that already covers the basis percentile.
    """
    counts = total_tokens if isinstance(total_tokens, LengthCounts) else LengthCounts.of(total_tokens)
    if counts.count == 0:
        raise ValueError("cannot recommend max_model_len from an empty trace")
    if margin < 0:
        raise ValueError(f"margin must be ≥ 0, got {margin}")
    basis = counts.percentiles([percentile_p])[0]
    multiple = round_to if block_size is None else math.lcm(round_to, block_size)
    value = round_up(max(basis * (1.0 + margin), 1.0), multiple)
    capped = kv_capped = kept = False
    if model_limit is not None and value > model_limit:
        value, capped = model_limit, True
    if kv_cache_tokens is not None and value > kv_cache_tokens:
        kv_limit = kv_cache_tokens if block_size is None else (kv_cache_tokens // block_size) * block_size
        value, kv_capped = max(kv_limit, 1), True
    if current_max_model_len is not None and basis <= current_max_model_len < value:
        value, kept = current_max_model_len, True
    refused = counts.count_above(value)
    return MaxModelLenAdvice(
        max_model_len=value,
        basis_percentile=percentile_p,
        basis_tokens=basis,
        margin=margin,
        round_to=multiple,
        capped_by_model_limit=capped,
        refused_share=refused / counts.count,
        refused_count=refused,
        max_concurrency=None if kv_cache_tokens is None else kv_cache_tokens / value,
        current_max_model_len=current_max_model_len,
        current_max_concurrency=(
            None
            if kv_cache_tokens is None or current_max_model_len is None
            else kv_cache_tokens / current_max_model_len
        ),
        capped_by_kv_cache=kv_capped,
        kept_current=kept,
    )


def nearest_rank_index(count: int, p: float) -> int:
    """The 0-based sorted index numpy's ``inverted_cdf`` picks for the ``p``-th percentile of ``count``."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    virtual = float(np.float64(count) * np.true_divide(np.float64(p), 100) - 1)
    return int(min(max(math.ceil(virtual), 0), count - 1))


class LengthCounts:
    """How many requests had each length (tokens): exact percentiles in memory bounded by the lengths."""

    __slots__ = ("_dense", "_sparse", "count", "total")

    def __init__(self) -> None:
        self._dense = np.zeros(0, dtype=np.int64)
        self._sparse: dict[int, int] = {}
        self.count = 0
        self.total = 0  # the exact sum of all lengths (a Python int)

    @classmethod
    def of(cls, values: Sequence[int] | npt.NDArray[np.generic]) -> LengthCounts:
        counts = cls()
        counts.add(values)
        return counts

    def add(self, values: Sequence[int] | npt.NDArray[np.generic]) -> None:
        arr = np.asarray(values, dtype=np.int64)
        if arr.size == 0:
            return
        self.count += int(arr.size)
        self.total += int(arr.sum(dtype=np.int64))
        dense = (arr >= 0) & (arr < DENSE_LENGTHS)
        inside = arr if bool(dense.all()) else arr[dense]
        if inside.size:
            counts = np.bincount(inside)
            if counts.size > self._dense.size:
                grown = np.zeros(counts.size, dtype=np.int64)
                grown[: self._dense.size] = self._dense
                self._dense = grown
            self._dense[: counts.size] += counts
        if inside.size < arr.size:
            values_out, counts_out = np.unique(arr[~dense], return_counts=True)
            for value, n in zip(values_out.tolist(), counts_out.tolist(), strict=True):
                self._sparse[value] = self._sparse.get(value, 0) + n

    def merge(self, other: LengthCounts) -> None:
        """Add ``other``'s counts to these."""
        if other._dense.size > self._dense.size:
            grown = np.zeros(other._dense.size, dtype=np.int64)
            grown[: self._dense.size] = self._dense
            self._dense = grown
        self._dense[: other._dense.size] += other._dense
        for value, n in other._sparse.items():
            self._sparse[value] = self._sparse.get(value, 0) + n
        self.count += other.count
        self.total += other.total

    def distinct(self) -> tuple[IntArray, IntArray]:
        """The lengths that occurred, ascending, and how many requests had each."""
        values = np.flatnonzero(self._dense).astype(np.int64)
        counts = self._dense[values]
        if self._sparse:
            keys = np.array(sorted(self._sparse), dtype=np.int64)
            extra = np.array([self._sparse[k] for k in keys.tolist()], dtype=np.int64)
            low = keys < 0
            values = np.concatenate([keys[low], values, keys[~low]])
            counts = np.concatenate([extra[low], counts, extra[~low]])
        return values, counts

    def percentiles(self, ps: Sequence[float]) -> list[float]:
        """Nearest-rank percentiles (numpy ``inverted_cdf``), as floats like ``np.percentile`` gives."""
        if self.count == 0:
            raise ValueError("percentile of an empty sample")
        values, counts = self.distinct()
        cumulative = np.cumsum(counts)
        ranks = [nearest_rank_index(self.count, p) for p in ps]
        return [float(values[int(np.searchsorted(cumulative, rank, side="right"))]) for rank in ranks]

    def count_above(self, limit: float) -> int:
        """How many lengths are strictly above ``limit``."""
        values, counts = self.distinct()
        return int(counts[values > limit].sum())

    @property
    def max(self) -> int:
        values, _ = self.distinct()
        return int(values[-1])


def summarize_counts(counts: LengthCounts) -> LengthSummary:
    """``summarize_lengths`` of the lengths ``counts`` holds (the same numbers, from the counts)."""
    if counts.count == 0:
        raise ValueError("cannot summarize an empty sample")
    p50, p90, p95, p99, p999 = counts.percentiles(PERCENTILES)
    return LengthSummary(
        count=counts.count,
        mean=counts.total / counts.count,
        p50=p50,
        p90=p90,
        p95=p95,
        p99=p99,
        p999=p999,
        max=float(counts.max),
    )


# --- arrivals and whole-trace summary (``oomload trace stats``) ------------------------------------
#
# Arrival rate: the mean is (count − 1) / span, i.e. one over the mean inter-arrival gap; the peak
# over a W-second window is the largest number of requests arriving in any half-open window
# [t, t + W) that starts at a request, divided by W (a trace shorter than W reports its count / W).
# Burstiness is the coefficient of variation of the inter-arrival gaps (population standard
# deviation / mean): 1 for a Poisson process, above 1 for bursty traffic, 0 for a fixed rate.

RATE_WINDOWS_S: tuple[float, ...] = (1.0, 60.0)


@dataclass(frozen=True, slots=True)
class ArrivalStats:
    """Count, span, mean and peak arrival rates, and inter-arrival burstiness of a trace."""

    count: int
    span_s: float
    mean_rps: float | None  # None when all requests arrive at once
    peak_rps_1s: float
    peak_rps_60s: float
    burstiness_cv: float | None  # None with fewer than two gaps or a zero mean gap

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "count": self.count,
            "span_s": self.span_s,
            "mean_rps": self.mean_rps,
            "peak_rps_1s": self.peak_rps_1s,
            "peak_rps_60s": self.peak_rps_60s,
            "burstiness_cv": self.burstiness_cv,
        }


def peak_rate(arrival_s: Sequence[float] | npt.NDArray[np.generic], window_s: float) -> float:
    """Most requests in any window ``[t_i, t_i + window_s)`` starting at a request, per second."""
    if window_s <= 0:
        raise ValueError(f"window must be positive, got {window_s}")
    times = np.sort(np.asarray(arrival_s, dtype=np.float64))
    if times.size == 0:
        return 0.0
    ends = np.searchsorted(times, times + window_s, side="left")
    return float((ends - np.arange(times.size)).max() / window_s)


def burstiness(arrival_s: Sequence[float] | npt.NDArray[np.generic]) -> float | None:
    """Coefficient of variation of the inter-arrival gaps (``None`` below two gaps or at zero mean)."""
    times = np.sort(np.asarray(arrival_s, dtype=np.float64))
    if times.size < 3:
        return None
    gaps = np.diff(times)
    mean = float(gaps.mean())
    return None if mean <= 0 else float(gaps.std() / mean)


def summarize_arrivals(arrival_s: Sequence[float] | npt.NDArray[np.generic]) -> ArrivalStats:
    """``ArrivalStats`` of a non-empty sample of arrival times (any order)."""
    times = np.asarray(arrival_s, dtype=np.float64)
    if times.size == 0:
        raise ValueError("cannot summarize the arrivals of an empty trace")
    span = float(times.max() - times.min())
    return ArrivalStats(
        count=int(times.size),
        span_s=span,
        mean_rps=None if span <= 0 else (times.size - 1) / span,
        peak_rps_1s=peak_rate(times, 1.0),
        peak_rps_60s=peak_rate(times, 60.0),
        burstiness_cv=burstiness(times),
    )


def context_limit_shares(
    total_tokens: Sequence[int] | IntArray, limits: Sequence[int] = COMMON_CONTEXT_LIMITS
) -> dict[int, float]:
    """For each limit, the share of requests whose total length is strictly above it."""
    arr = np.asarray(total_tokens)
    return {int(limit): share_above(arr, limit) for limit in limits}


class SizingOptions(TypedDict, total=False):
    """The keyword options of ``recommend_max_model_len`` that ``summarize_trace`` passes on."""

    percentile_p: float
    margin: float
    round_to: int
    block_size: int | None
    model_limit: int | None
    kv_cache_tokens: int | None
    current_max_model_len: int | None


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Everything ``oomload trace stats`` reports about one trace."""

    arrivals: ArrivalStats
    failed_count: int
    prompt: LengthSummary
    output: LengthSummary
    total: LengthSummary
    above_limits: dict[int, float]
    advice: MaxModelLenAdvice
    method: str = PERCENTILE_METHOD


def summarize_trace(
    arrival_s: Sequence[float] | npt.NDArray[np.generic],
    prompt_tokens: Sequence[int] | IntArray,
    output_tokens: Sequence[int] | IntArray,
    ok: Sequence[bool] | npt.NDArray[np.bool_] | None = None,
    **sizing: Unpack[SizingOptions],
) -> TraceStats:
    """Arrival statistics, length percentiles, context-limit shares and the implied ``max_model_len``.

    ``sizing`` goes to ``recommend_max_model_len`` as is.
    """
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    output = np.asarray(output_tokens, dtype=np.int64)
    if prompt.shape != output.shape or prompt.size != np.asarray(arrival_s).size:
        raise ValueError("arrival, prompt and output columns must have the same length")
    return summarize_trace_counts(
        summarize_arrivals(arrival_s),
        0 if ok is None else int(np.count_nonzero(~np.asarray(ok, dtype=bool))),
        LengthCounts.of(prompt),
        LengthCounts.of(output),
        LengthCounts.of(prompt + output),
        **sizing,
    )


def summarize_trace_counts(
    arrivals: ArrivalStats,
    failed_count: int,
    prompt: LengthCounts,
    output: LengthCounts,
    total: LengthCounts,
    **sizing: Unpack[SizingOptions],
) -> TraceStats:
    """``summarize_trace`` from arrival statistics and counts per length (constant memory)."""
    return TraceStats(
        arrivals=arrivals,
        failed_count=failed_count,
        prompt=summarize_counts(prompt),
        output=summarize_counts(output),
        total=summarize_counts(total),
        above_limits={int(limit): total.count_above(limit) / total.count for limit in COMMON_CONTEXT_LIMITS},
        advice=recommend_max_model_len(total, **sizing),
    )


GAP_BLOCK = 1 << 16  # gaps are merged into the running moments in blocks of this many, from the first


def _merge_gaps(moments: tuple[int, float, float], gaps: npt.NDArray[np.float64]) -> tuple[int, float, float]:
    """Chan et al.'s update of (count, mean, sum of squared deviations) with a block of gaps."""
    count, mean, m2 = moments
    block_mean = float(gaps.mean())
    block_m2 = float(((gaps - block_mean) ** 2).sum())
    total = count + gaps.size
    delta = block_mean - mean
    return total, mean + delta * gaps.size / total, m2 + block_m2 + delta * delta * count * gaps.size / total


class ArrivalCounter:
    """``summarize_arrivals`` of arrival times fed in time order, batch by batch, in bounded memory.

    The gaps' moments are merged in fixed blocks of ``GAP_BLOCK`` gaps counted from the first, not
    per batch, so the result is the same to the last bit however the times are batched (one
    process, byte ranges read by workers, any block size).

    ``add`` returns False (and the counter is of no further use) as soon as a time goes backwards:
    the caller then needs every time at once (``summarize_arrivals``).
    """

    def __init__(self, windows_s: Sequence[float] = RATE_WINDOWS_S) -> None:
        self.windows_s = tuple(windows_s)
        self.count = 0
        self.in_order = True
        self._first = math.nan
        self._last = -math.inf
        self._carry = [np.empty(0, dtype=np.float64) for _ in self.windows_s]
        self._peak = [0 for _ in self.windows_s]
        self._gap_moments = (0, 0.0, 0.0)  # count, mean and sum of squared deviations of the gaps
        self._pending_gaps = np.empty(0, dtype=np.float64)  # fewer than GAP_BLOCK, not yet merged

    def add(self, arrival_s: Sequence[float] | npt.NDArray[np.generic]) -> bool:
        times = np.asarray(arrival_s, dtype=np.float64)
        if not self.in_order or times.size == 0:
            return self.in_order
        if times[0] < self._last or (times.size > 1 and bool((np.diff(times) < 0).any())):
            self.in_order = False
            return False
        gaps = np.diff(times) if self.count == 0 else np.diff(np.concatenate([[self._last], times]))
        if self.count == 0:
            self._first = float(times[0])
        self.count += int(times.size)
        self._last = float(times[-1])
        if gaps.size:
            pending = np.concatenate([self._pending_gaps, gaps])
            full = pending.size - pending.size % GAP_BLOCK
            for start in range(0, full, GAP_BLOCK):
                self._gap_moments = _merge_gaps(self._gap_moments, pending[start : start + GAP_BLOCK])
            self._pending_gaps = pending[full:]
        for index, window_s in enumerate(self.windows_s):
            buffer = np.concatenate([self._carry[index], times])
            closed = int(np.count_nonzero(buffer + window_s <= buffer[-1]))  # their windows are complete
            if closed:
                ends = np.searchsorted(buffer, buffer[:closed] + window_s, side="left")
                self._peak[index] = max(self._peak[index], int((ends - np.arange(closed)).max()))
            self._carry[index] = buffer[closed:]
        return True

    def result(self) -> ArrivalStats:
        if not self.in_order:
            raise ValueError("the arrival times went backwards; summarize them with summarize_arrivals")
        if self.count == 0:
            raise ValueError("cannot summarize the arrivals of an empty trace")
        peaks = []
        for index, window_s in enumerate(self.windows_s):
            carry = self._carry[index]
            ends = np.searchsorted(carry, carry + window_s, side="left")
            peak = max(self._peak[index], int((ends - np.arange(carry.size)).max()) if carry.size else 0)
            peaks.append(peak / window_s)
        span = self._last - self._first
        cv = None
        gaps, gap_mean, gap_m2 = self._gap_moments
        if self._pending_gaps.size:
            gaps, gap_mean, gap_m2 = _merge_gaps(self._gap_moments, self._pending_gaps)
        if self.count >= 3 and gap_mean > 0:
            cv = math.sqrt(gap_m2 / gaps) / gap_mean
        by_window = dict(zip(self.windows_s, peaks, strict=True))
        return ArrivalStats(
            count=self.count,
            span_s=span,
            mean_rps=None if span <= 0 else (self.count - 1) / span,
            peak_rps_1s=by_window.get(1.0, 0.0),
            peak_rps_60s=by_window.get(60.0, 0.0),
            burstiness_cv=cv,
        )
