"""Per-level findings of the verdict: each level over its steps, the onsets, the last safe level (pure).

One concurrency level is every measured step that ran at it (a refinement pass repeats levels), so
the findings here read the steps of ``stepfacts`` level by level: ``LevelSummary`` (steps, requests,
preemptions per 100 requests, the shares of scrapes waiting and KV-saturated, the trace's odds beside
them), the preemption onset (the lowest level preempting in at least half of its conclusive steps),
the gauge onsets (KV saturation, queueing: the lowest level a sustained gauge crossed its line), the
first unsafe and the last safe level, the odds' own onset and how far the observed one is from it,
and the caveats of the per-level view. Every rule, with its reason, is in ``oomload.verdict.verdict``'s
module docstring; ``build_verdict`` there puts these pieces together.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from oomload.capacity.odds import LevelOdds
from oomload.verdict.confidence import ConfidenceNote
from oomload.verdict.death import EngineDeath
from oomload.verdict.rates import per_100
from oomload.verdict.runview import RunView
from oomload.verdict.stepfacts import StepFacts

ODDS_UNLIKELY = 0.01  # an observation the odds gave less than this chance is a disagreement


@dataclass(frozen=True, slots=True)
class PreemptionOnset:
    """The lowest preempting level. The KV figure shown everywhere is ``kv_usage_max`` (the step's
    highest scraped KV usage); ``kv_usage_at_onset`` (the scrape that first showed a preemption,
    often lower: preemption frees blocks) is kept in the JSON only."""

    step: int
    concurrency: int
    t_unix_s: float | None
    requests_in_step: int
    preemptions_in_step: int
    kv_usage_at_onset: float | None
    kv_usage_max: float | None
    seen_in: int = 1  # steps at this level that preempted …
    measurements: int = 1  # … of its conclusive steps (with metrics, not clean-but-thin)
    short_of_evidence: int = 0  # clean steps at this level that sent too few requests to count

    @property
    def seen_text(self) -> str:
        """``"seen at 7 in 3 of 3"`` (``"…, 1 more clean step short of evidence"``)."""
        text = f"seen at {self.concurrency} in {self.seen_in} of {self.measurements}"
        if self.short_of_evidence:
            text += f", {self.short_of_evidence} more clean step(s) short of evidence"
        return text


@dataclass(frozen=True, slots=True)
class LevelSummary:
    """One concurrency level over all of its measured steps, beside the trace's odds (module doc)."""

    concurrency: int
    steps: int
    steps_preempted: int
    steps_with_metrics: int
    requests: int
    preemptions: int | None
    waiting_share: float | None
    kv_saturated_share: float | None
    odds: LevelOdds | None
    trusted_requests: int = 0  # of its trusted steps with a scrape: what a clean level's absence rests on

    @property
    def evidence_needed(self) -> int | None:
        """Requests the odds ask a clean level to send (``None``: no demand)."""
        return None if self.odds is None else self.odds.requests_for()

    @property
    def preemptions_per_100(self) -> float | None:
        return per_100(self.preemptions, self.requests)

    @property
    def preempted_text(self) -> str:
        """``"at concurrency 8 in 1 of 3 step(s)"``: where and how often the level preempted."""
        c, preempted, of = self.concurrency, self.steps_preempted, self.steps_with_metrics
        return f"at concurrency {c} in {preempted} of {of} step(s)"

    @property
    def judged_requests(self) -> int:
        """The requests the odds are held against: every one sent at a level that preempted (a
        preemption is one wherever it was seen), only the trusted steps' at a clean level (a step whose
        requests mostly failed, or that was cut short or not held, is no evidence of a clean level)."""
        return self.requests if self.steps_preempted else self.trusted_requests

    @property
    def odds_p_seen(self) -> float | None:
        """The odds' chance that ``judged_requests`` see at least one preemption."""
        return None if self.odds is None else self.odds.p_seen(self.judged_requests)

    @property
    def evidence_thin(self) -> bool:
        """Clean over all its steps but short of the requests the odds ask for."""
        return (
            self.steps_with_metrics > 0
            and self.steps_preempted == 0
            and self.evidence_needed is not None
            and self.requests < self.evidence_needed
        )

    @property
    def agreement(self) -> str | None:
        """``"agrees"``, ``"fewer than the odds"``, ``"more than the odds"``; ``None`` without odds."""
        p = self.odds_p_seen
        if p is None or self.steps_with_metrics == 0 or self.judged_requests == 0:
            return None
        if self.steps_preempted == 0 and p >= 1.0 - ODDS_UNLIKELY:
            return "fewer than the odds"
        if self.steps_preempted > 0 and p <= ODDS_UNLIKELY:
            return "more than the odds"
        return "agrees"

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "steps": self.steps,
            "steps_preempted": self.steps_preempted,
            "requests": self.requests,
            "preemptions": self.preemptions,
            "preemptions_per_100_requests": _round(self.preemptions_per_100),
            "waiting_share": _round(self.waiting_share),
            "kv_saturated_share": _round(self.kv_saturated_share),
            "odds": None if self.odds is None else self.odds.to_json(),
            "trusted_requests": self.trusted_requests,
            "odds_p_seen": _round(self.odds_p_seen),
            "evidence_needed_requests": self.evidence_needed,
            "evidence_thin": self.evidence_thin,
            "agreement": self.agreement,
        }


@dataclass(frozen=True, slots=True)
class LevelOnset:
    """The lowest level at which a gauge crossed its line (KV saturation, queueing)."""

    step: int
    concurrency: int
    value: float


def first_unsafe_concurrency(measured: Sequence[StepFacts], death: EngineDeath | None) -> int | None:
    """The lowest level at which a step (cut short or not) preempted or failed, or the engine died."""
    unsafe_levels = {s.concurrency for s in measured if _unsafe(s)}
    if death is not None and death.concurrency is not None:
        unsafe_levels.add(death.concurrency)
    return min(unsafe_levels) if unsafe_levels else None


def broke_at_lowest(last_safe: int | None, first_unsafe: int | None, levels: Sequence[int]) -> int | None:
    """The lowest level a run measured, when it already broke there: the run has no last safe level
    because that level is below every one it measured (``None`` otherwise)."""
    if last_safe is None and first_unsafe is not None and levels and first_unsafe <= min(levels):
        return min(levels)
    return None


def last_safe_concurrency(
    measured: Sequence[StepFacts],
    death: EngineDeath | None,
    *,
    queueing: int | None = None,
    thin: Collection[int] = (),
) -> int | None:
    """Highest level below the first unsafe one and below ``queueing``, backed by a trusted step with
    ok answers whose ``/metrics`` scrape read the preemption counter (a level where preemption was not
    observable is not safe, only unjudged), and not in ``thin`` (levels short of the evidence the
    trace's odds ask for)."""
    first = first_unsafe_concurrency(measured, death)
    ceiling = min(math.inf if first is None else first, math.inf if queueing is None else queueing)
    safe = [
        s.concurrency
        for s in measured
        if s.trusted
        and s.preemptions is not None
        and s.concurrency < ceiling
        and s.ok_requests > 0
        and s.concurrency not in thin
    ]
    return max(safe) if safe else None


def level_summaries(measured: Sequence[StepFacts]) -> tuple[LevelSummary, ...]:
    """One ``LevelSummary`` per measured level, ascending."""
    by_level: dict[int, list[StepFacts]] = {}
    for s in measured:
        by_level.setdefault(s.concurrency, []).append(s)
    out = []
    for c in sorted(by_level):
        steps = by_level[c]
        with_metrics = [s for s in steps if s.preemptions is not None]
        odds = next((s.odds for s in steps if s.odds is not None), None)
        out.append(
            LevelSummary(
                concurrency=c,
                steps=len(steps),
                steps_preempted=sum(1 for s in with_metrics if (s.preemptions or 0) > 0),
                steps_with_metrics=len(with_metrics),
                requests=sum(s.requests for s in steps),
                preemptions=sum(s.preemptions or 0 for s in with_metrics) if with_metrics else None,
                waiting_share=_weighted(steps, lambda s: s.waiting_share),
                kv_saturated_share=_weighted(steps, lambda s: s.kv_saturated_share),
                odds=odds,
                trusted_requests=sum(s.requests for s in with_metrics if s.trusted),
            )
        )
    return tuple(out)


def _weighted(steps: Sequence[StepFacts], share_of: Callable[[StepFacts], float | None]) -> float | None:
    """A per-step share averaged over the steps' scrapes."""
    pairs = [(v, s.scrapes_ok) for s in steps if (v := share_of(s)) is not None and s.scrapes_ok]
    total = sum(n for _v, n in pairs)
    return None if not total else sum(v * n for v, n in pairs) / total


def measured_odds_onset(summaries: Sequence[LevelSummary]) -> tuple[int | None, int | None]:
    """``(low, onset)``: the lowest measured level with non-negligible odds, and one above the highest
    measured level below it whose odds are negligible (``None`` when there is none)."""
    with_odds = [lv for lv in summaries if lv.odds is not None]
    onset = next((lv.concurrency for lv in with_odds if lv.odds is not None and not lv.odds.negligible), None)
    if onset is None:
        return None, None
    below = [lv.concurrency for lv in with_odds if lv.concurrency < onset]
    return (max(below) + 1 if below else None), onset


def odds_onset_of(odds: Sequence[LevelOdds]) -> tuple[int | None, int | None]:
    """``(low, onset)`` of ``odds_onset`` over odds alone (the other prompt shape's, never measured)."""
    ordered = sorted(odds, key=lambda o: o.concurrency)
    onset = next((o.concurrency for o in ordered if not o.negligible), None)
    if onset is None:
        return None, None
    below = [o.concurrency for o in ordered if o.concurrency < onset]
    return (max(below) + 1 if below else None), onset


def odds_distance(
    observed: int | None, low: int | None, onset: int | None, levels: Sequence[int]
) -> int | None:
    """Levels from ``observed`` to the odds' range ``[low, onset]``, counted on the measured levels
    with ``low`` added (0 inside the range; ``None`` when either side is missing)."""
    if observed is None or onset is None:
        return None
    lo = onset if low is None else low
    if lo <= observed <= onset:
        return 0
    grid = sorted({*levels, lo, onset, observed})
    edge = lo if observed < lo else onset
    return abs(grid.index(observed) - grid.index(edge))


def level_notes(
    summaries: Sequence[LevelSummary],
    onset: PreemptionOnset | None,
    odds_range: tuple[int | None, int | None],
    levels: Sequence[int],
) -> list[ConfidenceNote]:
    """Caveats from the per-level view: sporadic preemption (below the onset, or with none), thin
    evidence, the odds."""
    notes: list[ConfidenceNote] = []
    onset_c = None if onset is None else onset.concurrency
    for lv in summaries:
        where = f"concurrency {lv.concurrency}"
        if (onset_c is None or lv.concurrency < onset_c) and lv.steps_preempted:
            below = "with no onset" if onset_c is None else f"below the onset {onset_c}"
            text = f"preemption {lv.preempted_text}, fewer than half: sporadic {below}, and not safe"
            notes.append(ConfidenceNote("sporadic_preemption", text))
        if lv.evidence_thin and lv.odds is not None:
            text = (
                f"not enough evidence at {where}: {lv.requests} request(s) without a preemption, but the "
                f"trace's odds ({lv.odds.per_100:.1f} preemptions per 100 requests) need "
                f"{lv.evidence_needed} to see one with 99 % probability; not counted as safe"
            )
            notes.append(ConfidenceNote("thin_evidence", text))
        if lv.agreement not in (None, "agrees") and lv.odds is not None:
            text = (
                f"{where}: {lv.preemptions or 0} preemption(s) in {lv.judged_requests} request(s), "
                f"{lv.agreement}: they expected {lv.odds.per_100:.1f} per 100 requests and gave "
                f"{lv.odds_p_seen:.0%} to see at least one"
            )
            notes.append(ConfidenceNote("odds_disagree_level", text))
    apart = odds_distance(onset_c, *odds_range, levels)
    if apart is not None and apart > 1:
        low, odds_onset = odds_range
        where = f"{odds_onset}" if low is None or low == odds_onset else f"{low}–{odds_onset}"
        text = (
            f"the observed onset {onset_c} is {apart} levels from the trace's odds ({where}): the server "
            "is not the pool cache_config_info describes, or the lengths were not replayed as the trace "
            "has them"
        )
        notes.append(ConfidenceNote("odds_disagree", text))
    return notes


def _unsafe(s: StepFacts) -> bool:
    return (s.preemptions or 0) > 0 or s.unsafe_requests > 0


def preemption_onset(view: RunView, measured: Sequence[StepFacts]) -> PreemptionOnset | None:
    """The lowest level preempting in at least half of its conclusive steps (module docstring)."""
    by_level: dict[int, list[StepFacts]] = {}
    for s in measured:
        if s.conclusive:
            by_level.setdefault(s.concurrency, []).append(s)
    onset_level = next(
        (
            c
            for c in sorted(by_level)
            if 2 * sum(1 for s in by_level[c] if (s.preemptions or 0) > 0) >= len(by_level[c])
        ),
        None,
    )
    if onset_level is None:
        return None
    at_level = by_level[onset_level]
    preempting = [s for s in at_level if (s.preemptions or 0) > 0]
    thin = sum(1 for s in measured if s.concurrency == onset_level and s.evidence_thin)
    first = min(preempting, key=lambda s: s.start_unix_s)
    data = next(d for d in view.steps if d.boundary.index == first.index)
    hit = next((m for m in data.metrics if m.ok and (m.preemptions_delta or 0) > 0), None)
    return PreemptionOnset(
        step=first.index,
        concurrency=first.concurrency,
        t_unix_s=None if hit is None else hit.t_unix_s,
        requests_in_step=first.requests,
        preemptions_in_step=first.preemptions or 0,
        kv_usage_at_onset=None if hit is None else hit.kv_cache_usage,
        kv_usage_max=first.kv_usage_max,
        seen_in=len(preempting),
        measurements=len(at_level),
        short_of_evidence=thin,
    )


def level_onset(
    measured: Sequence[StepFacts],
    value_of: Callable[[StepFacts], float | int | None],
    crossed: Callable[[float], bool],
) -> LevelOnset | None:
    hits = [(s, v) for s in measured if (v := value_of(s)) is not None and crossed(v)]
    if not hits:
        return None
    step, value = min(hits, key=lambda h: (h[0].concurrency, h[0].start_unix_s))
    return LevelOnset(step=step.index, concurrency=step.concurrency, value=float(value))


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
