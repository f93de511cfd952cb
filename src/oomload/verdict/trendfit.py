"""The line through a memory series' bin means, and how far its slope can be trusted (pure).

``oomload.verdict.trend`` judges a soak's memory by the slope of this line; this module fits it. The
method is built against what makes least squares on raw samples alarm on a steady server:

- **Autocorrelation.** Consecutive samples are not independent (memory changes slowly, samplers are
  fast), so an interval over raw samples is far too narrow. The fit (``fit_line``) is a straight
  line through the means of equal-time bins: ``DEFAULT_BINS`` (12), fewer when samples are scarce (at
  least two a bin) or when the noise remembers long — each bin is at least ``BIN_MEMORY_MULTIPLE``
  (2) × the noise's memory ``τ = −Δt / ln φ``, ``φ`` an *upper* estimate of the lag-1
  autocorrelation of the samples' residuals around a line (``Noise``: estimate + its small-sample
  bias + two standard errors: a short series underestimates a long memory). The slope's interval is
  Student's t on the bins' ``n − 2`` degrees of freedom, its variance inflated by ``(1 + ρ) / (1 −
  ρ)``, ``ρ`` (at most 0.9) the larger of the bin residuals' lag-1 autocorrelation and the
  correlation of adjacent bin means that an AR(1) noise of that ``φ`` implies.
- **Wander.** When the span holds fewer than ``MIN_BINS`` (6) such bins, the memory "wanders" on the
  scale of the soak and no line is fitted (the reason is returned instead), unless the line rises (or
  falls) by at least ``WANDER_RISE_MULTIPLE`` (8) × the residuals' standard deviation σ — a trend
  that dwarfs the wander — in which case 6 bins are fitted and the slope's standard error is at least
  ``Σ|w| σ``, the most a stationary noise of SD σ can move a least-squares slope whose weights on the
  bin means are ``w`` (about ``3 σ / span``), on the bins' 4 degrees of freedom. (It gave the
  interval only ``max(k − 2, 1)`` degrees of freedom, ``k`` the independent stretches ``span / (2
  τ)``, before: on a real vLLM soak whose memory rose in a straight line, +154 MiB/h with residuals
  of 0.54 MiB and a lag-1 autocorrelation of 0.992 at 0.5 s, that was 1 degree of freedom and
  "inconclusive: −145 to +453 MiB/h"; now "grew 154 MiB/h (95 % CI 89–219)".)
- **One step.** A cache that fills once mid-run lifts memory by a step and leaves it flat; a line
  through it would extrapolate a leak. ``find_step`` fits the first 12 bins also with two levels (at
  least ``STEP_MIN_BINS`` (3) bins each, the bin the step happened in left out); when that leaves at
  most ``STEP_SSE_RATIO`` (¼) of the line's squared residuals, the step is returned (where, how big)
  and the trend judges the plateau after it. Only one step is taken out: a staircase reads as growth
  when its stairs are short against the span, and as memory that wanders when a few long stairs fill
  it.

The reasons a line cannot be fitted are sentences (``duration_text`` writes their durations, and the
trend's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

S_PER_H = 3600.0
DEFAULT_BINS = 12
MIN_BINS = 6
MIN_SAMPLES_PER_BIN = 2
MIN_SAMPLES = MIN_BINS * MIN_SAMPLES_PER_BIN
MIN_FIT_SPAN_S = 60.0
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
class Fit:
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


def bin_count(samples: int) -> int:
    """How many bins ``samples`` fill: ``DEFAULT_BINS``, fewer when that leaves under two samples a bin."""
    return min(DEFAULT_BINS, samples // MIN_SAMPLES_PER_BIN)


@dataclass(frozen=True, slots=True)
class Noise:
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
    def of(cls, t: FloatArray, pieces: Sequence[FloatArray]) -> Noise:
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


def fit_line(t: FloatArray, y: FloatArray, noise: Noise) -> Fit | str:
    """The line through bin means, each bin ``BIN_MEMORY_MULTIPLE`` × longer than the noise's memory."""
    if len(t) < MIN_SAMPLES:
        return f"{len(t)} samples left (needs {MIN_SAMPLES})"
    span = float(t[-1] - t[0])
    tau = noise.memory_s
    num_bins = bin_count(len(t))
    if tau > 0:
        num_bins = min(num_bins, int(span / (BIN_MEMORY_MULTIPLE * tau)) if math.isfinite(tau) else 0)
    if span >= MIN_FIT_SPAN_S and num_bins < MIN_BINS:
        line = raw_line(t, y)
        if abs(float(line[-1] - line[0])) >= WANDER_RISE_MULTIPLE * noise.sd:  # the trend dwarfs the wander
            return _dwarfed_fit(t, y, noise)
        if not math.isfinite(tau):
            whole = duration_text(span)
            return f"memory wanders on the scale of the whole {whole}: no trend can be told from it"
        return (
            f"memory wanders on a scale of {duration_text(tau)} (samples stay correlated that long): "
            f"{duration_text(span)} holds fewer than {MIN_BINS} independent stretches (a trend needs "
            f"{duration_text(MIN_BINS * BIN_MEMORY_MULTIPLE * tau)})"
        )
    return fit_bins(t, y, num_bins, noise.phi)


def _dwarfed_fit(t: FloatArray, y: FloatArray, noise: Noise) -> Fit | str:
    """A trend that dwarfs the wander (module docstring): the line through ``MIN_BINS`` bin means, its
    standard error at least ``Σ|w| σ`` — the most a stationary noise of the residuals' SD ``σ`` can
    move a least-squares slope whose weights on the bin means are ``w`` — on the bins' own degrees of
    freedom."""
    fit = fit_bins(t, y, min(bin_count(len(t)), MIN_BINS), noise.phi)
    if isinstance(fit, str):
        return fit
    x = fit.t_mid_s - fit.t_mean_s
    bound = noise.sd * float(np.abs(x).sum() / (x * x).sum())
    return replace(fit, se_slope_per_s=max(fit.se_slope_per_s, bound))


def raw_line(t: FloatArray, y: FloatArray) -> FloatArray:
    """The least-squares line through the raw samples, evaluated at ``t``."""
    x = t - t.mean()
    sxx = float((x * x).sum())
    slope = float((x * (y - y.mean())).sum() / sxx) if sxx > 0 else 0.0
    line: FloatArray = y.mean() + slope * x
    return line


def fit_bins(t: FloatArray, y: FloatArray, num_bins: int, phi: float = 0.0) -> Fit | str:
    """The least-squares line through ``num_bins`` equal-time bin means, or why there is none."""
    if len(t) < MIN_SAMPLES:
        return f"{len(t)} samples left (needs {MIN_SAMPLES})"
    span = float(t[-1] - t[0])
    if span < MIN_FIT_SPAN_S:
        return f"{duration_text(span)} left (needs {duration_text(MIN_FIT_SPAN_S)})"
    edges = np.linspace(t[0], t[-1], num_bins + 1)
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, num_bins - 1)
    counts = np.bincount(index, minlength=num_bins)
    full = counts > 0
    if int(full.sum()) < MIN_BINS:  # only a gap longer than a bin empties one: the longest names it
        gaps = np.diff(t)
        at = int(gaps.argmax())
        gap, start = duration_text(float(gaps[at])), duration_text(float(t[at] - t[0]))
        return (
            f"samples in only {int(full.sum())} of {num_bins} time bins (needs {MIN_BINS}): none for "
            f"{gap} from {start} into the samples judged"
        )
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
    return Fit(
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
    (``Noise``), which puts the correlation of two adjacent means of ``W`` samples at
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


def find_step(fit: Fit) -> MemoryStep | None:
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


def duration_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``, ``2.1 d``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * S_PER_H:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * S_PER_H:
        hours = seconds / S_PER_H
        return f"{hours:.1f} h" if hours < 10 else f"{hours:.0f} h"
    return f"{seconds / 86400:.1f} d"
