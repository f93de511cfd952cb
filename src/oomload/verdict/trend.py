"""Is memory growing at a constant load? The trend of a soak's memory series, told honestly (pure).

``memory_trend(t_unix_s, used_bytes, limit_bytes=…)`` answers ``growing``, ``levelled``, ``flat``,
``shrinking`` or ``inconclusive`` with the slope in bytes per hour, its confidence interval, and, for
growth towards a known limit, when the fitted line reaches it. Honesty comes before sensitivity: a
steady server must not raise an alarm, and "inconclusive" is a good answer when the data cannot tell.

- **Warm-up.** A server's memory steps up in its first minutes (allocator caches, CUDA graphs, the
  first long requests) and then plateaus. The first ``max(60 s, 20 %)`` of the series is dropped
  (``warmup_s`` overrides it). With the ``MIN_FIT_SPAN_S`` (60 s) a fit needs after it, no series of
  ``MIN_JUDGED_SPAN_S`` (120 s) or less can be judged: ``replay --soak`` refuses a soak that short.
- **The fit.** The slope and its interval come from a straight line through equal-time bin means,
  its interval widened for noise that remembers (``oomload.verdict.trendfit`` has the method): when
  the span holds too few independent stretches, memory "wanders" on the scale of the soak and the
  answer is ``inconclusive``, unless the trend dwarfs the wander.
- **One step.** A cache that fills once mid-run lifts memory by a step and leaves it flat; a line
  through it would extrapolate a leak. When two levels explain the bins far better than a line
  (``trendfit.find_step``), the step is reported (``step``: where, how big) and the trend is judged on
  the plateau after it alone (the noise's memory still estimated around both levels) —
  ``inconclusive`` when that plateau is too short.

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
  immaterial rate), or too few samples (12) or too short a span (60 s) are left after the warm-up,
  or the memory wanders on the scale of the soak (above);
- ``levelled`` — memory rose and then levelled off (below).

**Levelling off.** A cache or an allocator pool that fills up gradually lifts memory along a curve
that flattens towards a plateau, more slowly than the warm-up: a line through the span reads it as
growth, or — the bend taken for noise that remembers — as memory that wanders. So when the span reads
``growing`` or ``inconclusive``, its two halves (``LATE_SHARE``: the later half of the span judged) are
fitted apart by the same method, both with the noise's memory estimated around a line through the
late half (where a line fits best; pieces any shorter would absorb a wander that lasts minutes and
fake precision). With ``[lo₁, hi₁]`` the early half's interval and ``[lo₂, hi₂]`` the late half's:

- ``levelled`` — ``lo₁ > 0`` (memory rose beyond the noise) and ``−M < lo₂``, ``hi₂ < M`` (then every
  rate the data allow is immaterial): "rose S₁/h (CI) over …, then levelled off: S₂/h (CI) over the
  last N min, from T in, below the material M" ("slowed to" when ``lo₂ > 0``). The trend's slope,
  interval and span are the late half's, ``flat_within_bytes_per_h`` is ``max(|lo₂|, |hi₂|)``,
  ``rise`` holds the early half's; no projection;
- ``inconclusive`` — memory slowed (the early slope exceeds the late one by more than the t quantile,
  on the smaller degrees of freedom, × ``√(se₁² + se₂²)``) and ``lo₂ < M ≤ hi₂``: the late half is too
  short or too noisy to tell levelling off from growth, and the reason says so with both slopes; or,
  when the span did not read ``growing``, memory rose (``lo₁ > 0``) and the late half cannot be
  fitted (the reason says why);
- otherwise the span's own verdict stands: a steady leak grows in both halves alike and keeps it.

Calling a leak "levelled off" is the worse error: a leak of rate ``r ≥ M`` reads ``levelled`` only
when the late half's upper bound falls below ``M ≤ r``, which its interval allows with probability
``(1 − confidence) / 2`` (nominally) at ``r = M`` and less above. A curve still bending in the late
half is read as a wide interval there (or as wander): slow saturation over a short soak answers
``inconclusive``. Memory that rose and then fell in the late half keeps the span's verdict.

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
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from oomload.verdict.studentt import t_quantile
from oomload.verdict.trendfit import (
    MIN_FIT_SPAN_S,
    S_PER_H,
    Fit,
    FloatArray,
    MemoryStep,
    Noise,
    bin_count,
    duration_text,
    find_step,
    fit_bins,
    fit_line,
    raw_line,
)

VERDICTS = ("growing", "levelled", "flat", "shrinking", "inconclusive")
KIB = 1024
MIB = 1024**2
GIB = 1024**3
WARMUP_MIN_S = 60.0
WARMUP_FRACTION = 0.2
MATERIAL_FRACTION_PER_H = 0.01
MATERIAL_MIN_BYTES_PER_H = float(MIB)
MATERIAL_HORIZON_H = 24.0  # a rate that fills the headroom left within a day is material, however small
LATE_SHARE = 0.5  # levelling off: the later half of the judged span is judged alone
# a series must span more than this to leave MIN_FIT_SPAN_S after its default warm-up
MIN_JUDGED_SPAN_S = max(WARMUP_MIN_S + MIN_FIT_SPAN_S, MIN_FIT_SPAN_S / (1.0 - WARMUP_FRACTION))


@dataclass(frozen=True, slots=True)
class MemoryRise:
    """The early part of the judged span when memory rose and then levelled off or slowed (module
    docstring, "Levelling off"): its slope and interval; the trend's own slope is the late part's."""

    from_unix_s: float
    to_unix_s: float
    slope_bytes_per_h: float
    ci_low_bytes_per_h: float
    ci_high_bytes_per_h: float


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
    flat_within_bytes_per_h: float | None = None  # flat and levelled: max(|lo|, |hi|)
    limit_bytes: int | None = None
    projected_s_to_limit: float | None = None  # growing with a limit: seconds after the last sample
    projected_s_to_limit_range: tuple[float, float] | None = None  # (earliest, latest)
    fitted_from_unix_s: float | None = None
    fitted_to_unix_s: float | None = None
    bins: int = 0
    df: int = 0  # the interval's degrees of freedom (bins − 2)
    step: MemoryStep | None = None
    rise: MemoryRise | None = None  # levelled, or inconclusive because memory slowed: the early part
    reason: str | None = None  # inconclusive only: why

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (the step and the rise as objects, the projection range as a list)."""
        data = asdict(self)
        if self.projected_s_to_limit_range is not None:
            data["projected_s_to_limit_range"] = list(self.projected_s_to_limit_range)
        return data


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

    first = fit_bins(t, y, bin_count(len(t)))
    if isinstance(first, str):
        return base.inconclusive(f"{first}{_after_warmup(warmup)}", samples_used=len(t))
    step = find_step(first)
    if step is None:
        noise = Noise.of(t, [y - raw_line(t, y)])
    else:  # the noise's memory around both levels, on the whole series (the plateau alone is short)
        before, after = t < step.t_before_unix_s, t >= step.t_unix_s
        noise = Noise.of(
            t, [y[before] - raw_line(t[before], y[before]), y[after] - raw_line(t[after], y[after])]
        )
        t, y = t[after], y[after]
    fit = fit_line(t, y, noise)
    if isinstance(fit, str):
        if step is None:
            reason = f"{fit}{_after_warmup(warmup)}"
        else:
            reason = f"after {base.step_text(step)}, the plateau cannot be judged: {fit}"
        whole = base.inconclusive(reason, samples_used=len(t), step=step)
    else:
        whole = base.judge(fit, step)
    if whole.verdict in ("growing", "inconclusive"):
        return base.settle(t, y, step, growing=whole.verdict == "growing") or whole
    return whole


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
        when = duration_text(step.t_unix_s - self.series_start_s)
        return f"a {_bytes(abs(step.size_bytes))} step {way} {when} in"

    def over_text(self, fit: Fit, step: MemoryStep | None) -> str:
        """``over 96 min after a 24 min warm-up`` (or ``after a 200 MiB step up 30 min in``)."""
        over = f"over {duration_text(fit.last_s - fit.first_s)}"
        if step is not None:
            over += f" after {self.step_text(step)}"
        elif self.warmup > 0:
            over += f" after a {duration_text(self.warmup)} warm-up"
        return over

    def inconclusive(
        self,
        reason: str,
        *,
        samples_used: int,
        step: MemoryStep | None = None,
        fit: Fit | None = None,
        rise: MemoryRise | None = None,
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
            rise=rise,
            reason=reason,
            **extra,
        )

    def judge(self, fit: Fit, step: MemoryStep | None) -> MemoryTrend:
        fields = _fit_fields(fit, self.confidence)
        slope, lo, hi = _interval(fields)
        m = self.material
        over = self.over_text(fit, step)
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
                    sentence += f" and reaches its {_bytes(self.limit)} limit in about {duration_text(s_mid)}"
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
                        f": its {_bytes(self.limit)} limit in about {duration_text(left / (slope / S_PER_H))}"
                    )
            return MemoryTrend(verdict="flat", sentence=sentence, flat_within_bytes_per_h=within, **common)
        unit = _rate_unit(max(abs(lo), abs(hi), m))
        reason = (
            f"the slope could be anything from {_in(lo, unit, signed=True)} to {_in(hi, unit, signed=True)} "
            f"{unit[0]}/h ({self.ci_name} CI) {over}: both immaterial and material (≥ {_rate(m)}) rates fit"
        )
        return self.inconclusive(reason, samples_used=fit.samples, step=step, fit=fit)

    def settle(
        self, t: FloatArray, y: FloatArray, step: MemoryStep | None, *, growing: bool
    ) -> MemoryTrend | None:
        """The judged span in two halves (module docstring, "Levelling off"): ``levelled``, or
        ``inconclusive`` when memory rose but its late half cannot tell (or, unless the whole span
        reads ``growing``, cannot be judged); ``None`` when the halves change nothing."""
        if len(t) < 2:
            return None
        late = t >= float(t[-1]) - LATE_SHARE * float(t[-1] - t[0])
        noise = Noise.of(t[late], [y[late] - raw_line(t[late], y[late])])  # where a line fits best
        early_fit, late_fit = fit_line(t[~late], y[~late], noise), fit_line(t[late], y[late], noise)
        if isinstance(early_fit, str):
            return None
        e_slope, e_lo, e_hi = _interval(_fit_fields(early_fit, self.confidence))
        rise = MemoryRise(early_fit.first_s, early_fit.last_s, e_slope, e_lo, e_hi)
        rose = f"rose {_rates(e_slope, e_lo, e_hi, self.ci_name)} {self.over_text(early_fit, step)}"
        if isinstance(late_fit, str):
            if growing or e_lo <= 0:
                return None
            late_span_s = float(t[late][-1] - t[late][0])
            reason = f"memory {rose}, then its last {duration_text(late_span_s)} cannot be judged: {late_fit}"
            return self.inconclusive(reason, samples_used=int(late.sum()), step=step, rise=rise)
        fields = _fit_fields(late_fit, self.confidence)
        slope, lo, hi = _interval(fields)
        m = self.material
        below = f"below the material {_rate(m)}"
        late_span_s, late_start_s = late_fit.last_s - late_fit.first_s, late_fit.first_s - self.series_start_s
        late_text = (
            f"{_rates(slope, lo, hi, self.ci_name)} over the last {duration_text(late_span_s)}, "
            f"from {duration_text(late_start_s)} in"
        )
        if -m < lo and hi < m and e_lo > 0:  # rose beyond the noise, then every rate allowed is immaterial
            settled = "slowed to" if lo > 0 else "levelled off:"
            return MemoryTrend(
                verdict="levelled",
                sentence=f"{self.subject} {rose}, then {settled} {late_text}, {below}",
                confidence=self.confidence,
                material_bytes_per_h=m,
                samples_total=self.total,
                samples_used=late_fit.samples,
                warmup_s=self.warmup,
                limit_bytes=self.limit,
                step=step,
                rise=rise,
                flat_within_bytes_per_h=max(abs(lo), abs(hi)),
                **fields,
            )
        se_difference = math.hypot(early_fit.se_slope_per_s, late_fit.se_slope_per_s) * S_PER_H
        t_value = t_quantile(0.5 + self.confidence / 2.0, min(early_fit.df, late_fit.df))
        slowed = e_slope - slope > t_value * se_difference
        if not (slowed and lo < m <= hi):  # the late half's interval must reach across M
            return None
        reason = (
            f"memory {rose}, then slowed to {late_text}: too short or too noisy to tell levelling off "
            f"({below}) from growth"
        )
        return self.inconclusive(reason, samples_used=late_fit.samples, step=step, fit=late_fit, rise=rise)


def _interval(fields: dict[str, Any]) -> tuple[float, float, float]:
    """The slope and its interval's ends, from ``_fit_fields``."""
    return fields["slope_bytes_per_h"], fields["ci_low_bytes_per_h"], fields["ci_high_bytes_per_h"]


def _fit_fields(fit: Fit, confidence: float) -> dict[str, Any]:
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
    return f"; the first {duration_text(warmup_s)} were dropped as warm-up" if warmup_s > 0 else ""
