"""Whether a difference between two runs is evidence or one draw against another (pure; numpy only).

``oomload compare`` and the relative gate rules (``oomload.verdict.relative``) ask two questions of a
base run and a new one; each answer carries its test, its p-value and the sentence that says it.

**Did the preemption onset move?** One step at a level is one draw of the trace's lengths, so an
onset of 7 against 8 may be chance. The evidence is the steps of both runs at the levels *between*
the two onsets, ``[low, high)`` (``high`` open-ended when the higher run never preempted): the run
whose onset is lower preempted there, the other did not — each step a yes or a no. Fisher's exact
test (one-sided: the lower run's steps there preempt more often) on that 2×2 table gives the
p-value; the onsets are **separated** when ``p ≤ ALPHA_ONSET`` (0.05). Preemption is taken to grow
with concurrency (as the gate's absence rules do), so the steps of all those levels are pooled. The
steps counted are the verdict's conclusive ones: measured (not warmup, not after the engine's
death), with a ``/metrics`` scrape, and not a clean step short of the odds' evidence or untrusted
(``StepFacts.conclusive``). One step each
(1 of 1 against 0 of 1, p = 0.5) is *not separated*; the default refinement's three repeats on each
side (3 of 3 against 0 of 3) give p = 0.05.

A run without an onset is clean only up to its highest level judged for preemption (its highest
conclusive step, ``Verdict.preemption_judged_up_to``): a run cut short, one whose levels stopped below
the other's onset, or one without a ``/metrics`` scrape saw no onset because it did not look. Its onset
beside the other's is **not measured** (``direction`` ``"not measured"``) when it judged no level at
all, or none at or above the other run's onset: "8 → none" there would read as a rise, or as clean.

**Did a latency move?** At one level both runs measured, the per-request samples (ok requests) of
each run are compared: the P50 by the Mann–Whitney U test (two-sided, normal approximation with the
tie correction; at least ``MIN_SAMPLES_P50`` requests a side), the P99 by a bootstrap of the
difference of the two nearest-rank P99s (``BOOTSTRAP_RESAMPLES`` seeded resamples, two-sided; at
least ``MIN_SAMPLES_P99`` requests a side: with fewer the P99 is one of the last two requests).
A latency **moved** when ``p < ALPHA_LATENCY`` (0.01) *and* the statistic changed by at least
``EFFECT_FLOOR`` (10 %): a real but tiny shift is not a regression, and a large one on noise is not
evidence — it is *not separated* (changed by the floor or more, p ≥ 0.01), where a change under the
floor is *no change*. Identical samples never move (p = 1, ratio 1).

**One run against another is one draw of the host, too.** The requests of one step share the host's
state (its other load, the server's batch mix), so they are not independent draws: two runs of the
same configuration on a busy 2-core host moved P50 TPOT +21 % at one level (p < 1e-5) and −10 to −15 %
at others. A latency that moved *both ways* across the levels both runs measured is the host's
run-to-run noise, not a change of the server: ``across_levels`` marks every level of that statistic
``mixed``, and a mixed move is neither a regression nor an improvement ("moved both ways across
levels") — unless it is more than ``MIXED_FACTOR`` (2) times the largest opposite move, in log ratio:
+700 % at one level beside −15 % at another is a change, not noise (+21 % beside −15 % is noise). A
statistic that moved one way only (at one level or at all) keeps its verdict.

``level_shifts`` is the one computation of both uses: every statistic of every latency at every level
both runs measured, marked across levels; ``oomload compare`` shows it row by row, and a relative
latency rule (``p99-ttft-s@8<=baseline*1.10``) reads its own statistic there (``find_shift``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from oomload.trace.stats import percentile

ALPHA_ONSET = 0.05
ALPHA_LATENCY = 0.01
EFFECT_FLOOR = 0.10
MIXED_FACTOR = 2.0  # a move over twice the largest opposite one (log ratio) is not noise
MIN_SAMPLES_P50 = 8
MIN_SAMPLES_P99 = 100
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240601

Stat = Literal["p50", "p99"]
Direction = Literal["lower", "higher", "same", "not measured"]
LATENCIES = ("ttft", "tpot", "e2e")
STATS: tuple[Stat, ...] = ("p50", "p99")
# level → latency (``LATENCIES``) → the ms of each ok request of the level's trusted measured steps
LevelSamples = Mapping[int, Mapping[str, Sequence[float]]]


# ---------------------------------------------------------------------------------------------------
# Onset


def fisher_greater(a_hits: int, a_n: int, b_hits: int, b_n: int) -> float:
    """One-sided Fisher exact p: the chance, with the margins fixed, that group ``a`` shows at least
    ``a_hits`` of the ``a_hits + b_hits`` hits (so small when ``a`` hits more often than ``b``)."""
    hits, total = a_hits + b_hits, a_n + b_n
    denominator = math.comb(total, a_n)
    top = min(a_n, hits)
    numerator = sum(math.comb(hits, k) * math.comb(total - hits, a_n - k) for k in range(a_hits, top + 1))
    return numerator / denominator


@dataclass(frozen=True, slots=True)
class OnsetShift:
    """How the preemption onset of the new run stands to the base run's (module docstring).

    ``direction``: the new onset is ``lower`` (a regression), ``higher`` or the ``same``, or ``not
    measured`` (a run without an onset that did not judge the levels where the other preempted:
    ``unmeasured``); ``None`` for an onset means the run never preempted up to its ``*_top``, the
    highest level it judged (``None``: none judged). ``separated`` is ``None`` when there is no
    evidence either way (a run did not measure the levels between the onsets)."""

    base: int | None
    new: int | None
    direction: Direction
    separated: bool | None
    p_value: float | None
    base_top: int | None  # the highest level each run judged for preemption (a conclusive step)
    new_top: int | None
    low_hits: int = 0  # the lower-onset run's steps between the onsets that preempted …
    low_steps: int = 0  # … of its conclusive steps there
    high_hits: int = 0  # the same for the other run
    high_steps: int = 0

    @property
    def regression(self) -> bool:
        return self.direction == "lower" and self.separated is True

    @property
    def unmeasured(self) -> tuple[str, ...]:
        """The runs (``base``, ``new``) whose onset beside the other's was not measured: no onset, and no
        level judged for preemption, or none at or above the other run's onset."""
        sides = (("base", self.base, self.base_top, self.new), ("new", self.new, self.new_top, self.base))
        return tuple(
            name
            for name, onset, top, other in sides
            if onset is None and (top is None or (other is not None and top < other))
        )

    @property
    def sentence(self) -> str:
        base, new = _onset_text(self.base), _onset_text(self.new)
        if self.direction == "not measured":
            return f"preemption onset not measured: {self.unmeasured_reason()}"
        if self.direction == "same":
            return f"preemption onset unchanged ({new})"
        moved = "fell" if self.direction == "lower" else "rose"
        text = f"preemption onset {moved} from {base} to {new}"
        if self.separated is None:
            return text + ": no evidence either way (a run did not measure the levels between them)"
        lower, higher = ("new", "base") if self.direction == "lower" else ("base", "new")
        counts = (
            f"between them the {lower} run preempted in {self.low_hits} of {self.low_steps} step(s), the "
            f"{higher} run in {self.high_hits} of {self.high_steps}; Fisher's exact p = {self.p_value:.3g}"
        )
        if self.separated:
            return f"{text}, separated by the repeats ({counts})"
        return (
            f"{text}, but not separated by the repeats ({counts} > {ALPHA_ONSET}): one draw against another"
        )

    def unmeasured_reason(self, base_name: str = "the base run", new_name: str = "the new run") -> str:
        """Why the onsets were not compared, for each run in ``unmeasured`` ("" when both were judged)."""
        names = {"base": base_name, "new": new_name}
        texts = []
        for name in self.unmeasured:
            top, other = (self.base_top, self.new) if name == "base" else (self.new_top, self.base)
            other_name = names["new" if name == "base" else "base"]
            texts.append(
                f"{names[name]} judged no level for preemption (no /metrics scrape, or no clean step with "
                "the odds' evidence)"
                if top is None
                else f"{names[name]} judged preemption only up to concurrency {top}, below {other_name}'s "
                f"onset at {other} (measure higher)"
            )
        return "; ".join(texts)


def _onset_text(onset: int | None) -> str:
    return "none" if onset is None else f"concurrency {onset}"


def onset_cell(onset: int | None, top: int | None) -> str:
    """A run's onset as a table shows it: ``8``; ``none up to 16`` (clean up to its highest level judged
    for preemption); ``—`` (no level judged: not measured, never "none", which reads as clean)."""
    if onset is not None:
        return str(onset)
    return "—" if top is None else f"none up to {top}"


def onset_shift(
    base_steps: Sequence[tuple[int, bool]],
    base_onset: int | None,
    new_steps: Sequence[tuple[int, bool]],
    new_onset: int | None,
) -> OnsetShift:
    """Compare two onsets on the conclusive steps of each run, ``(level, preempted)`` (module docstring)."""
    base_top = max((c for c, _ in base_steps), default=None)
    new_top = max((c for c, _ in new_steps), default=None)
    unknown = OnsetShift(base_onset, new_onset, "not measured", None, None, base_top, new_top)
    if unknown.unmeasured:
        return unknown
    if base_onset == new_onset:
        return OnsetShift(base_onset, new_onset, "same", None, None, base_top, new_top)
    direction: Direction = (
        "lower" if new_onset is not None and (base_onset is None or new_onset < base_onset) else "higher"
    )
    low_run, high_run = (new_steps, base_steps) if direction == "lower" else (base_steps, new_steps)
    low = min(o for o in (base_onset, new_onset) if o is not None)
    high = math.inf if None in (base_onset, new_onset) else max(base_onset or 0, new_onset or 0)
    low_in = [hit for c, hit in low_run if low <= c < high]
    high_in = [hit for c, hit in high_run if low <= c < high]
    if not low_in or not high_in:
        return OnsetShift(base_onset, new_onset, direction, None, None, base_top, new_top)
    low_hits, high_hits = sum(low_in), sum(high_in)
    p = fisher_greater(low_hits, len(low_in), high_hits, len(high_in))
    return OnsetShift(
        base_onset,
        new_onset,
        direction,
        separated=p <= ALPHA_ONSET,
        p_value=p,
        base_top=base_top,
        new_top=new_top,
        low_hits=low_hits,
        low_steps=len(low_in),
        high_hits=high_hits,
        high_steps=len(high_in),
    )


# ---------------------------------------------------------------------------------------------------
# Latency


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of the Mann–Whitney U test (normal approximation, tie-corrected, continuity
    corrected); 1.0 when every value ties."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n1, n2 = x.size, y.size
    both = np.concatenate([x, y])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(both.size, dtype=float)
    sorted_values = both[order]
    _, first, counts = np.unique(sorted_values, return_index=True, return_counts=True)
    mid = first + (counts + 1) / 2.0  # the average rank of each run of ties (1-based)
    ranks[order] = np.repeat(mid, counts)
    u = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    ties = float(np.sum(counts.astype(float) ** 3 - counts))
    variance = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    delta = abs(u - n1 * n2 / 2.0)
    z = max(0.0, delta - 0.5) / math.sqrt(variance)
    return float(min(1.0, math.erfc(z / math.sqrt(2.0))))


def bootstrap_p99_p(a: Sequence[float], b: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES) -> float:
    """Two-sided bootstrap p that the nearest-rank P99s of ``a`` and ``b`` differ (seeded)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    diffs = _p99_of_resamples(y, rng, resamples) - _p99_of_resamples(x, rng, resamples)
    below, above = float(np.mean(diffs <= 0)), float(np.mean(diffs >= 0))
    return min(1.0, 2.0 * min(below, above))


def _p99_of_resamples(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    n = values.size
    rank = max(0, math.ceil(0.99 * n) - 1)  # nearest rank, 0-based
    drawn = values[rng.integers(0, n, size=(resamples, n))]
    return np.partition(drawn, rank, axis=1)[:, rank]


@dataclass(frozen=True, slots=True)
class LatencyShift:
    """One latency statistic at one level, base against new (module docstring)."""

    metric: str  # ttft | tpot | e2e
    stat: Stat
    concurrency: int
    base_ms: float | None
    new_ms: float | None
    base_n: int
    new_n: int
    p_value: float | None  # None: too few samples to test
    test: str
    mixed: bool = False  # the same statistic moved the other way at another level (module docstring)

    @property
    def ratio(self) -> float | None:
        if self.base_ms is None or self.new_ms is None or self.base_ms <= 0:
            return None
        return self.new_ms / self.base_ms

    @property
    def separated(self) -> bool:
        """The test separates the two runs (``p < ALPHA_LATENCY``), whatever the size of the change."""
        return self.p_value is not None and self.p_value < ALPHA_LATENCY

    @property
    def moved(self) -> bool:
        return self.separated and self.large

    @property
    def large(self) -> bool:
        """The statistic changed by at least ``EFFECT_FLOOR``, whatever the test says."""
        ratio = self.ratio
        return ratio is not None and abs(ratio - 1.0) >= EFFECT_FLOOR

    @property
    def regression(self) -> bool:
        return self.moved and not self.mixed and (self.ratio or 1.0) > 1.0

    @property
    def judgement(self) -> str:
        """``slower`` / ``faster`` (moved), ``not separated`` (a change of at least ``EFFECT_FLOOR`` the
        test does not carry: p ≥ ``ALPHA_LATENCY``), ``no change`` (under the floor) or ``too few
        samples``."""
        if self.p_value is None:
            return "too few samples"
        if not self.moved:
            return "not separated" if self.large else "no change"
        if self.mixed:
            return "moved both ways across levels"
        return "slower" if (self.ratio or 1.0) > 1.0 else "faster"

    @property
    def sentence(self) -> str:
        name = f"{self.stat.upper()} {self.metric.upper()} at concurrency {self.concurrency}"
        if self.base_ms is None or self.new_ms is None:
            return f"{name}: not measured in both runs"
        values = f"{format_ms(self.base_ms)} → {format_ms(self.new_ms)}"
        if self.p_value is None:
            need = MIN_SAMPLES_P50 if self.stat == "p50" else MIN_SAMPLES_P99
            return (
                f"{name}: {values}, too few requests to tell (n = {self.base_n}, {self.new_n}; {need} a side)"
            )
        change = f"{(self.ratio or 1.0) - 1.0:+.0%}"
        why = f"{self.test} p = {self.p_value:.2g}, n = {self.base_n}, {self.new_n}"
        if self.moved and self.mixed:
            return (
                f"{name}: {values} ({change}; {why}), but it moved the other way at another level: "
                "the host's run-to-run noise, not a change of the server"
            )
        if self.moved:
            return f"{name}: {values} ({change}, {self.judgement}; {why})"
        if self.large:  # a change the floor counts, that the test does not carry
            why = f"{self.test} p = {self.p_value:.2g} ≥ {ALPHA_LATENCY}, n = {self.base_n}, {self.new_n}"
            return f"{name}: {values} ({change}, not separated: {why})"
        return f"{name}: {values} ({change}, within noise: {why})"


def format_ms(value_ms: float) -> str:
    """``850 ms``, ``12.3 ms``, ``1.25 s``: a latency as the compare page shows it."""
    if value_ms >= 1000:
        return f"{value_ms / 1000:.2f} s"
    return f"{value_ms:.0f} ms" if value_ms >= 100 else f"{value_ms:.3g} ms"


def across_levels(shifts: Iterable[LatencyShift]) -> tuple[LatencyShift, ...]:
    """The same shifts, each one the test separates (``p < ALPHA_LATENCY``, a move or one under the
    floor, which a relative latency rule may still ask about) marked ``mixed`` when its metric and
    statistic moved the other way at another level by at least 1 / ``MIXED_FACTOR`` of its own size, in
    log ratio (module docstring)."""
    shifts = tuple(shifts)
    largest: dict[tuple[str, str, bool], float] = {}  # (metric, stat, slower) → the largest |log ratio|
    for s in shifts:
        if s.moved:
            key = (s.metric, s.stat, (s.ratio or 1.0) > 1.0)
            largest[key] = max(largest.get(key, 0.0), abs(math.log(s.ratio or 1.0)))

    def mixed(s: LatencyShift) -> bool:
        other = largest.get((s.metric, s.stat, not (s.ratio or 1.0) > 1.0))
        return other is not None and abs(math.log(s.ratio or 1.0)) <= MIXED_FACTOR * other

    return tuple(replace(s, mixed=mixed(s)) if s.separated else s for s in shifts)


def latency_shift(
    metric: str, stat: Stat, concurrency: int, base: Sequence[float], new: Sequence[float]
) -> LatencyShift:
    """Test one latency statistic at one level on the per-request samples of both runs."""
    q = 50.0 if stat == "p50" else 99.0
    base_ms = percentile(base, q) if base else None
    new_ms = percentile(new, q) if new else None
    need = MIN_SAMPLES_P50 if stat == "p50" else MIN_SAMPLES_P99
    test = "Mann–Whitney U" if stat == "p50" else "bootstrap"
    p: float | None = None
    if len(base) >= need and len(new) >= need:
        p = mann_whitney_p(base, new) if stat == "p50" else bootstrap_p99_p(base, new)
    return LatencyShift(metric, stat, concurrency, base_ms, new_ms, len(base), len(new), p, test)


def level_shifts(
    base: LevelSamples, new: LevelSamples, levels: Iterable[int] | None = None
) -> tuple[LatencyShift, ...]:
    """Every statistic (``STATS``) of every latency (``LATENCIES``) at each of ``levels`` (default: the
    levels both runs hold samples for), base against new, marked across levels (``across_levels``): what
    ``oomload compare`` shows and the relative latency rules read (module docstring)."""
    common = sorted(set(base) & set(new)) if levels is None else sorted(set(levels))
    return across_levels(
        latency_shift(metric, stat, c, base.get(c, {}).get(metric, ()), new.get(c, {}).get(metric, ()))
        for c in common
        for metric in LATENCIES
        for stat in STATS
    )


def find_shift(
    shifts: Iterable[LatencyShift], metric: str, stat: str, concurrency: int
) -> LatencyShift | None:
    """The shift of one latency statistic at one level among ``shifts`` (``None``: not among them)."""
    return next((s for s in shifts if (s.metric, s.stat, s.concurrency) == (metric, stat, concurrency)), None)
