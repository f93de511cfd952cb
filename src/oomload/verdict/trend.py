"""Is memory growing at a constant load? The trend of a soak's memory series, told honestly (pure).

``memory_trend(t_unix_s, used_bytes, limit_bytes=…)`` answers ``growing``, ``flat``, ``shrinking`` or
``inconclusive`` with the slope in bytes per hour, its confidence interval, and, for growth towards a
known limit, when the fitted line reaches it. Honesty comes before sensitivity: a steady server must
not raise an alarm, and "inconclusive" is a good answer when the data cannot tell. The method is
built against what makes least squares on raw samples alarm on a steady server:

- **Warm-up.** A server's memory steps up in its first minutes (allocator caches, CUDA graphs, the
  first long requests) and then plateaus. The first ``max(60 s, 20 %)`` of the series is dropped
  (``warmup_s`` overrides it).
- **Autocorrelation.** Consecutive samples are not independent (memory changes slowly, samplers are
  fast), so an interval over raw samples is far too narrow. The fit is a straight line through the
  means of equal-time bins: ``DEFAULT_BINS`` (12), fewer when samples are scarce (at least two a bin)
  or when the noise remembers long — each bin is at least ``BIN_MEMORY_MULTIPLE`` (2) × the noise's
  memory ``τ = −Δt / ln φ``, ``φ`` an *upper* estimate of the lag-1 autocorrelation of the samples'
  residuals around a line (estimate + its small-sample bias + two standard errors: a short series
  underestimates a long memory). The slope's interval is Student's t on the bins' ``n − 2`` degrees
  of freedom, its variance inflated by ``(1 + ρ) / (1 − ρ)``, ``ρ`` (at most 0.9) the larger of the
  bin residuals' lag-1 autocorrelation and the correlation of adjacent bin means that an AR(1) noise
  of that ``φ`` implies. When the span holds fewer than ``MIN_BINS`` (6) such bins, the memory
  "wanders" on the scale of the soak: ``inconclusive``, unless the line rises (or falls) by at least
  ``WANDER_RISE_MULTIPLE`` (8) × the residuals' standard deviation σ — a trend that dwarfs the
  wander — in which case 6 bins are fitted and the slope's standard error is at least ``Σ|w| σ``, the
  most a stationary noise of SD σ can move a least-squares slope whose weights on the bin means are
  ``w`` (about ``3 σ / span``), on the bins' 4 degrees of freedom. (It gave the interval only
  ``max(k − 2, 1)`` degrees of freedom, ``k`` the independent stretches ``span / (2 τ)``, before: on
  a real vLLM soak whose memory rose in a straight line, +154 MiB/h with residuals of 0.54 MiB and
  a lag-1 autocorrelation of 0.992 at 0.5 s, that was 1 degree of freedom and "inconclusive: −145 to
  +453 MiB/h"; now "grew 154 MiB/h (95 % CI 89–219)".)
- **One step.** A cache that fills once mid-run lifts memory by a step and leaves it flat; a line
  through it would extrapolate a leak. The first 12 bins are also fitted with two levels (at least
  ``STEP_MIN_BINS`` (3) bins each, the bin the step happened in left out); when that leaves at most
  ``STEP_SSE_RATIO`` (¼) of the line's squared residuals, the step is reported (``step``: where, how
  big) and the trend is judged on the plateau after it alone (the noise's memory still estimated
  around both levels) — ``inconclusive`` when that plateau is too short. Only one step is taken out:
  a staircase reads as growth when its stairs are short against the span, and as memory that wanders
  (``inconclusive``) when a few long stairs fill it.

The verdict is an equivalence test against ``M``, the material rate (``material_bytes_per_h``; by
default 1 % per hour of the limit — or, when less, the headroom the fitted samples' median level
leaves under it over ``MATERIAL_HORIZON_H`` (24 h): 600 MiB/h with 74 of 80 GiB used fills the card
in about 10 h, and is material — or, without a limit, 1 % per hour of that median level; at least
1 MiB/h), with ``[lo, hi]`` the slope's interval at ``confidence`` (95 %):

- ``growing`` — ``lo ≥ M``: growth, and material, both beyond the noise;
- ``shrinking`` — ``hi ≤ −M``;
- ``flat`` — ``−M < lo`` and ``hi < M``: every rate the data allow is immaterial, so the verdict can
  state "flat within ±max(|lo|, |hi|)" (``flat_within_bytes_per_h``) — or, when ``lo > 0`` (growth
  beyond the noise, only below ``M``), "grew S/h (CI …), below the material M", with the time to the
  limit;
- ``inconclusive`` — the interval reaches across ``±M`` (the data allow both a material and an
  immaterial rate), or fewer than ``MIN_SAMPLES`` (12) samples or ``MIN_FIT_SPAN_S`` (60 s) are left
  after the warm-up, or the memory wanders on the scale of the soak (above).

What it cannot do: memory that wanders on the scale of the whole run and happens to move in a straight
line looks like a trend; the upper ``φ``, the bin widths and the inflation make that rare, not
impossible. Short soaks of noisy memory mostly answer ``inconclusive``: that is the truth about them.

Projection (``growing`` with ``limit_bytes``): from the fitted line's level at the last sample, the
seconds until the line reaches the limit (0 when it already has); ``projected_s_to_limit_range``
uses the interval's ends (earliest with ``hi``, latest with ``lo``). It assumes the growth stays
linear: the sentence says "about".

The t quantile is ``oomload.verdict.studentt``'s: exact for integer degrees of freedom, no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from oomload.verdict.studentt import t_quantile

VERDICTS = ("growing", "flat", "shrinking", "inconclusive")
KIB = 1024
MIB = 1024**2
GIB = 1024**3
S_PER_H = 3600.0
DEFAULT_BINS = 12
MIN_BINS = 6
MIN_SAMPLES_PER_BIN = 2
MIN_SAMPLES = MIN_BINS * MIN_SAMPLES_PER_BIN
MIN_FIT_SPAN_S = 60.0
WARMUP_MIN_S = 60.0
WARMUP_FRACTION = 0.2
MATERIAL_FRACTION_PER_H = 0.01
MATERIAL_MIN_BYTES_PER_H = float(MIB)
MATERIAL_HORIZON_H = 24.0  # a rate that fills the headroom left within a day is material, however small
STEP_MIN_BINS = 3
BIN_MEMORY_MULTIPLE = 2.0
PHI_MAX = 0.9999
WANDER_RISE_MULTIPLE = 8.0
STEP_SSE_RATIO = 0.25
MAX_LAG1_AUTOCORRELATION = 0.9

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class MemoryStep:
    """The one step the fit took out: the plateau starts at ``t_unix_s``; ``size_bytes`` = after − before."""

    t_unix_s: float
    size_bytes: float
    t_before_unix_s: float  # the first sample of the bin the step happened in (left out of both levels)


@dataclass(frozen=True, slots=True)
class MemoryTrend:
    """The trend of one memory series (module docstring); rates in bytes per hour."""

    verdict: str  # one of VERDICTS
    sentence: str
    confidence: float
    material_bytes_per_h: float
    samples_total: int
    samples_used: int  # after the warm-up (and before a step) were dropped
    warmup_s: float  # the warm-up dropped from the start of the series
    slope_bytes_per_h: float | None = None
    ci_low_bytes_per_h: float | None = None
    ci_high_bytes_per_h: float | None = None
    flat_within_bytes_per_h: float | None = None  # flat only: max(|lo|, |hi|)
    limit_bytes: int | None = None
    projected_s_to_limit: float | None = None  # growing with a limit: seconds after the last sample
    projected_s_to_limit_range: tuple[float, float] | None = None  # (earliest, latest)
    fitted_from_unix_s: float | None = None
    fitted_to_unix_s: float | None = None
    bins: int = 0
    df: int = 0  # the interval's degrees of freedom (bins − 2)
    step: MemoryStep | None = None
    reason: str | None = None  # inconclusive only: why

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (the step as an object, the projection range as a list)."""
        data = asdict(self)
        if self.projected_s_to_limit_range is not None:
            data["projected_s_to_limit_range"] = list(self.projected_s_to_limit_range)
        return data


@dataclass(frozen=True, slots=True)
class _Fit:
    """A least-squares line through bin means; the time origin is ``t_ref_s``."""

    t_mid_s: FloatArray  # bin means of time, relative to t_ref_s
    y_mean: FloatArray
    edges_s: FloatArray  # each non-empty bin's first sample time (absolute)
    slope_per_s: float
    level_at_ref: float  # the line's value at t = t_ref_s + mean(t_mid_s)
    t_mean_s: float
    se_slope_per_s: float
    sse: float
    t_ref_s: float
    first_s: float
    last_s: float
    samples: int

    @property
    def df(self) -> int:
        """The interval's degrees of freedom: bins − 2."""
        return len(self.y_mean) - 2

    def level_at(self, t_unix_s: float) -> float:
        return self.level_at_ref + self.slope_per_s * (t_unix_s - self.t_ref_s - self.t_mean_s)


def memory_trend(
    t_unix_s: Sequence[float],
    used_bytes: Sequence[int],
    *,
    limit_bytes: int | None = None,
    confidence: float = 0.95,
    warmup_s: float | None = None,
    material_bytes_per_h: float | None = None,
    subject: str = "server memory",
) -> MemoryTrend:
    """The trend of a memory series at constant load (module docstring for the method and rules).

    Samples with a non-finite time or value are ignored; the rest are taken in time order.
    """
    if len(t_unix_s) != len(used_bytes):
        raise ValueError(f"{len(t_unix_s)} times but {len(used_bytes)} memory samples")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if warmup_s is not None and not warmup_s >= 0:
        raise ValueError(f"warmup_s must be >= 0, got {warmup_s}")
    if limit_bytes is not None and limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
    if material_bytes_per_h is not None and not material_bytes_per_h > 0:
        raise ValueError(f"material_bytes_per_h must be positive, got {material_bytes_per_h}")
    t = np.asarray(t_unix_s, dtype=np.float64)
    y = np.asarray(used_bytes, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(y)
    order = np.argsort(t[ok], kind="stable")
    t, y = t[ok][order], y[ok][order]
    total = len(t_unix_s)
    series_start = float(t[0]) if len(t) else 0.0
    span = float(t[-1] - t[0]) if len(t) else 0.0
    warmup = warmup_s if warmup_s is not None else max(WARMUP_MIN_S, WARMUP_FRACTION * span)
    keep = t >= (t[0] + warmup) if len(t) else np.zeros(0, dtype=bool)
    t, y = t[keep], y[keep]
    level = float(np.median(y)) if len(y) else 0.0
    material = material_bytes_per_h
    if material is None:
        reference = float(limit_bytes) if limit_bytes is not None else level
        material = MATERIAL_FRACTION_PER_H * reference
        if limit_bytes is not None:  # near the limit, less growth fills what is left
            material = min(material, max(limit_bytes - level, 0.0) / MATERIAL_HORIZON_H)
        material = max(material, MATERIAL_MIN_BYTES_PER_H)
    base = _Base(subject, confidence, material, total, warmup, limit_bytes, series_start)

    first = _fit_bins(t, y, _num_bins(len(t)))
    if isinstance(first, str):
        return base.inconclusive(f"{first}{_after_warmup(warmup)}", samples_used=len(t))
    step = _find_step(first)
    if step is None:
        noise = _Noise.of(t, [y - _line(t, y)])
    else:  # the noise's memory around both levels, on the whole series (the plateau alone is short)
        before, after = t < step.t_before_unix_s, t >= step.t_unix_s
        noise = _Noise.of(t, [y[before] - _line(t[before], y[before]), y[after] - _line(t[after], y[after])])
        t, y = t[after], y[after]
    fit = _fit(t, y, noise)
    if isinstance(fit, str):
        if step is None:
            reason = f"{fit}{_after_warmup(warmup)}"
        else:
            reason = f"after {base.step_text(step)}, the plateau cannot be judged: {fit}"
        return base.inconclusive(reason, samples_used=len(t), step=step)
    return base.judge(fit, step)


@dataclass(frozen=True, slots=True)
class _Base:
    subject: str
    confidence: float
    material: float
    total: int
    warmup: float
    limit: int | None
    series_start_s: float

    @property
    def ci_name(self) -> str:
        return f"{self.confidence * 100:g} %"

    def step_text(self, step: MemoryStep) -> str:
        """``a 200 MiB step up 30 min in`` (from the series' first sample)."""
        way = "up" if step.size_bytes >= 0 else "down"
        when = _duration(step.t_unix_s - self.series_start_s)
        return f"a {_bytes(abs(step.size_bytes))} step {way} {when} in"

    def inconclusive(
        self, reason: str, *, samples_used: int, step: MemoryStep | None = None, fit: _Fit | None = None
    ) -> MemoryTrend:
        extra: dict[str, Any] = {}
        if fit is not None:
            extra = _fit_fields(fit, self.confidence)
        return MemoryTrend(
            verdict="inconclusive",
            sentence=f"{self.subject} trend inconclusive: {reason}",
            confidence=self.confidence,
            material_bytes_per_h=self.material,
            samples_total=self.total,
            samples_used=samples_used,
            warmup_s=self.warmup,
            limit_bytes=self.limit,
            step=step,
            reason=reason,
            **extra,
        )

    def judge(self, fit: _Fit, step: MemoryStep | None) -> MemoryTrend:
        fields = _fit_fields(fit, self.confidence)
        slope, lo, hi = (
            fields["slope_bytes_per_h"],
            fields["ci_low_bytes_per_h"],
            fields["ci_high_bytes_per_h"],
        )
        m = self.material
        over = f"over {_duration(fit.last_s - fit.first_s)}"
        if step is not None:
            over += f" after {self.step_text(step)}"
        elif self.warmup > 0:
            over += f" after a {_duration(self.warmup)} warm-up"
        common = {
            "confidence": self.confidence,
            "material_bytes_per_h": m,
            "samples_total": self.total,
            "samples_used": fit.samples,
            "warmup_s": self.warmup,
            "limit_bytes": self.limit,
            "step": step,
            **fields,
        }
        if lo >= m:
            sentence = f"{self.subject} grew {_rates(slope, lo, hi, self.ci_name)} {over}"
            projection: dict[str, Any] = {}
            if self.limit is not None:
                remaining = self.limit - fit.level_at(fit.last_s)
                s_mid, s_early, s_late = (
                    max(remaining, 0.0) / (rate / S_PER_H) for rate in (slope, hi, lo)
                )  # fmt: skip
                projection = {"projected_s_to_limit": s_mid, "projected_s_to_limit_range": (s_early, s_late)}
                if remaining <= 0:
                    sentence += f" and has reached its {_bytes(self.limit)} limit"
                else:
                    sentence += f" and reaches its {_bytes(self.limit)} limit in about {_duration(s_mid)}"
            return MemoryTrend(verdict="growing", sentence=sentence, **common, **projection)
        if hi <= -m:
            sentence = f"{self.subject} fell {_rates(-slope, -hi, -lo, self.ci_name)} {over}"
            return MemoryTrend(verdict="shrinking", sentence=sentence, **common)
        if -m < lo and hi < m:
            within = max(abs(lo), abs(hi))
            sentence = f"{self.subject} was flat within ±{_rate(within)} ({self.ci_name} CI) {over}"
            if lo > 0:  # growth beyond the noise, but below the material rate: say so, and where it leads
                sentence = (
                    f"{self.subject} grew {_rates(slope, lo, hi, self.ci_name)} {over}, below the material "
                    f"{_rate(m)}"
                )
                if self.limit is not None and (left := self.limit - fit.level_at(fit.last_s)) > 0:
                    sentence += (
                        f": its {_bytes(self.limit)} limit in about {_duration(left / (slope / S_PER_H))}"
                    )
            return MemoryTrend(verdict="flat", sentence=sentence, flat_within_bytes_per_h=within, **common)
        unit = _rate_unit(max(abs(lo), abs(hi), m))
        reason = (
            f"the slope could be anything from {_in(lo, unit, signed=True)} to {_in(hi, unit, signed=True)} "
            f"{unit[0]}/h ({self.ci_name} CI) {over}: both immaterial and material (≥ {_rate(m)}) rates fit"
        )
        return self.inconclusive(reason, samples_used=fit.samples, step=step, fit=fit)


def _fit_fields(fit: _Fit, confidence: float) -> dict[str, Any]:
    half = t_quantile(0.5 + confidence / 2.0, fit.df) * fit.se_slope_per_s * S_PER_H
    slope = fit.slope_per_s * S_PER_H
    return {
        "slope_bytes_per_h": slope,
        "ci_low_bytes_per_h": slope - half,
        "ci_high_bytes_per_h": slope + half,
        "fitted_from_unix_s": fit.first_s,
        "fitted_to_unix_s": fit.last_s,
        "bins": len(fit.y_mean),
        "df": fit.df,
    }


def _num_bins(samples: int) -> int:
    return min(DEFAULT_BINS, samples // MIN_SAMPLES_PER_BIN)


@dataclass(frozen=True, slots=True)
class _Noise:
    """How long the noise around the trend remembers (module docstring, "Autocorrelation").

    ``phi``: an upper estimate of the residuals' lag-1 autocorrelation — the estimate, plus its
    small-sample bias ``(1 + 3φ) / n``, plus two of its standard errors ``√((1 − φ²) / n)`` — because a
    short series underestimates a long memory, and an underestimate fakes precision. ``memory_s``:
    ``−Δt / ln φ`` with ``Δt`` the median sampling interval (0 when ``φ ≤ 0``, ∞ when ``φ ≈ 1``).
    """

    phi: float
    memory_s: float
    sd: float  # the residuals' standard deviation

    @classmethod
    def of(cls, t: FloatArray, pieces: Sequence[FloatArray]) -> _Noise:
        """From residuals in ``pieces`` (each a run of consecutive samples) of the samples at ``t``."""
        n = sum(len(r) for r in pieces)
        sse = sum(float((r * r).sum()) for r in pieces)
        if sse <= 0 or n < 3:
            return cls(0.0, 0.0, 0.0)
        sd = math.sqrt(sse / n)
        estimate = sum(float((r[:-1] * r[1:]).sum()) for r in pieces) / sse
        if estimate <= 0:
            return cls(0.0, 0.0, sd)
        phi = min(estimate + (1 + 3 * estimate) / n + 2 * math.sqrt(max(1 - estimate**2, 0.0) / n), PHI_MAX)
        if phi >= PHI_MAX:
            return cls(PHI_MAX, math.inf, sd)
        return cls(phi, float(np.median(np.diff(t))) / -math.log(phi), sd)


def _fit(t: FloatArray, y: FloatArray, noise: _Noise) -> _Fit | str:
    """The line through bin means, each bin ``BIN_MEMORY_MULTIPLE`` × longer than the noise's memory."""
    if len(t) < MIN_SAMPLES:
        return f"{len(t)} samples left (needs {MIN_SAMPLES})"
    span = float(t[-1] - t[0])
    tau = noise.memory_s
    num_bins = _num_bins(len(t))
    if tau > 0:
        num_bins = min(num_bins, int(span / (BIN_MEMORY_MULTIPLE * tau)) if math.isfinite(tau) else 0)
    if span >= MIN_FIT_SPAN_S and num_bins < MIN_BINS:
        line = _line(t, y)
        if abs(float(line[-1] - line[0])) >= WANDER_RISE_MULTIPLE * noise.sd:  # the trend dwarfs the wander
            return _dwarfed_fit(t, y, noise)
        if not math.isfinite(tau):
            return f"memory wanders on the scale of the whole {_duration(span)}: no trend can be told from it"
        return (
            f"memory wanders on a scale of {_duration(tau)} (samples stay correlated that long): "
            f"{_duration(span)} holds fewer than {MIN_BINS} independent stretches (a trend needs "
            f"{_duration(MIN_BINS * BIN_MEMORY_MULTIPLE * tau)})"
        )
    return _fit_bins(t, y, num_bins, noise.phi)


def _dwarfed_fit(t: FloatArray, y: FloatArray, noise: _Noise) -> _Fit | str:
    """A trend that dwarfs the wander (module docstring): the line through ``MIN_BINS`` bin means, its
    standard error at least ``Σ|w| σ`` — the most a stationary noise of the residuals' SD ``σ`` can
    move a least-squares slope whose weights on the bin means are ``w`` — on the bins' own degrees of
    freedom."""
    fit = _fit_bins(t, y, min(_num_bins(len(t)), MIN_BINS), noise.phi)
    if isinstance(fit, str):
        return fit
    x = fit.t_mid_s - fit.t_mean_s
    bound = noise.sd * float(np.abs(x).sum() / (x * x).sum())
    return replace(fit, se_slope_per_s=max(fit.se_slope_per_s, bound))


def _line(t: FloatArray, y: FloatArray) -> FloatArray:
    """The least-squares line through the raw samples, evaluated at ``t``."""
    x = t - t.mean()
    sxx = float((x * x).sum())
    slope = float((x * (y - y.mean())).sum() / sxx) if sxx > 0 else 0.0
    line: FloatArray = y.mean() + slope * x
    return line


def _fit_bins(t: FloatArray, y: FloatArray, num_bins: int, phi: float = 0.0) -> _Fit | str:
    """The least-squares line through ``num_bins`` equal-time bin means, or why there is none."""
    if len(t) < MIN_SAMPLES:
        return f"{len(t)} samples left (needs {MIN_SAMPLES})"
    span = float(t[-1] - t[0])
    if span < MIN_FIT_SPAN_S:
        return f"{_duration(span)} left (needs {_duration(MIN_FIT_SPAN_S)})"
    edges = np.linspace(t[0], t[-1], num_bins + 1)
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, num_bins - 1)
    counts = np.bincount(index, minlength=num_bins)
    full = counts > 0
    if int(full.sum()) < MIN_BINS:
        return f"samples in only {int(full.sum())} of {num_bins} time bins (needs {MIN_BINS})"
    t_ref = float(t[0])
    t_mid = (np.bincount(index, weights=t - t_ref, minlength=num_bins)[full] / counts[full]).astype(
        np.float64
    )
    y_mean = (np.bincount(index, weights=y, minlength=num_bins)[full] / counts[full]).astype(np.float64)
    starts = np.searchsorted(index, np.flatnonzero(full), side="left")
    first_times = t[starts].astype(np.float64)
    t_mean = float(t_mid.mean())
    x = t_mid - t_mean
    sxx = float((x * x).sum())
    y_bar = float(y_mean.mean())
    slope = float((x * (y_mean - y_bar)).sum() / sxx)
    resid = y_mean - (y_bar + slope * x)
    sse = float((resid * resid).sum())
    dof = len(y_mean) - 2
    rho = _bin_correlation(resid, phi, len(t) / num_bins)
    variance = sse / dof / sxx * (1 + rho) / (1 - rho)
    return _Fit(
        t_mid_s=t_mid,
        y_mean=y_mean,
        edges_s=first_times,
        slope_per_s=slope,
        level_at_ref=y_bar,
        t_mean_s=t_mean,
        se_slope_per_s=math.sqrt(variance),
        sse=sse,
        t_ref_s=t_ref,
        first_s=float(t[0]),
        last_s=float(t[-1]),
        samples=len(t),
    )


def _bin_correlation(bin_resid: FloatArray, phi: float, per_bin: float) -> float:
    """The correlation of adjacent bin means' residuals, the larger of two estimates, in [0, 0.9].

    From the bins: the lag-1 autocorrelation of their residuals (biased low with a dozen bins). From
    the raw samples: their residuals read as an AR(1) process of lag-1 autocorrelation ``phi``
    (``_Noise``), which puts the correlation of two adjacent means of ``W`` samples at
    ``φ (1 − φ^W)² / (W (1 − φ²) − 2 φ (1 − φ^W))``.
    """
    estimates = [0.0]
    bin_sse = float((bin_resid * bin_resid).sum())
    if bin_sse > 0:
        estimates.append(float((bin_resid[:-1] * bin_resid[1:]).sum() / bin_sse))
    if phi > 0:
        w = max(per_bin, 1.0)
        decay = 1.0 - phi**w
        estimates.append(phi * decay * decay / (w * (1.0 - phi * phi) - 2.0 * phi * decay))
    return min(max(estimates), MAX_LAG1_AUTOCORRELATION)


def _find_step(fit: _Fit) -> MemoryStep | None:
    """The one step that explains the bins far better than the line, if any (module docstring).

    Two levels, each over at least ``STEP_MIN_BINS`` bins, with the bin between them left out: the
    step happens inside it, so its mean is a mix of both levels. The plateau starts after it.
    """
    y = fit.y_mean
    n = len(y)
    if n < 2 * STEP_MIN_BINS + 1 or fit.sse <= 0:
        return None
    best: tuple[float, int] | None = None
    for k in range(STEP_MIN_BINS, n - STEP_MIN_BINS):
        left, right = y[:k], y[k + 1 :]
        sse = float(((left - left.mean()) ** 2).sum() + ((right - right.mean()) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, k)
    assert best is not None
    sse, k = best
    if sse > STEP_SSE_RATIO * fit.sse:
        return None
    return MemoryStep(
        t_unix_s=float(fit.edges_s[k + 1]),
        size_bytes=float(y[k + 1 :].mean() - y[:k].mean()),
        t_before_unix_s=float(fit.edges_s[k]),
    )


# -- words ----------------------------------------------------------------------------------------
def _rate_unit(bytes_per_h: float) -> tuple[str, float]:
    size = abs(bytes_per_h)
    if size >= GIB:
        return ("GiB", GIB)
    if size >= MIB:
        return ("MiB", MIB)
    return ("KiB", KIB)


def _in(value: float, unit: tuple[str, float], *, signed: bool = False) -> str:
    scaled = value / unit[1]
    text = f"{scaled:.0f}" if abs(scaled) >= 10 else f"{scaled:.1f}"
    if signed and scaled > 0:
        text = "+" + text
    return text.replace("-", "−")


def _rate(bytes_per_h: float) -> str:
    unit = _rate_unit(bytes_per_h)
    return f"{_in(bytes_per_h, unit)} {unit[0]}/h"


def _rates(slope: float, lo: float, hi: float, level: str) -> str:
    """``38 MiB/h (95 % CI 30–46)``: every number in the slope's unit."""
    unit = _rate_unit(max(abs(slope), abs(hi)))
    return f"{_in(slope, unit)} {unit[0]}/h ({level} CI {_in(lo, unit)}–{_in(hi, unit)})"


def _bytes(num_bytes: float) -> str:
    if abs(num_bytes) >= GIB:
        return f"{num_bytes / GIB:.1f} GiB"
    if abs(num_bytes) >= MIB:
        return f"{num_bytes / MIB:.0f} MiB"
    return f"{num_bytes / KIB:.0f} KiB"


def _after_warmup(warmup_s: float) -> str:
    return f"; the first {_duration(warmup_s)} were dropped as warm-up" if warmup_s > 0 else ""


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * S_PER_H:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * S_PER_H:
        hours = seconds / S_PER_H
        return f"{hours:.1f} h" if hours < 10 else f"{hours:.0f} h"
    return f"{seconds / 86400:.1f} d"
