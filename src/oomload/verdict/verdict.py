"""The verdict: the onsets, the last safe concurrency and how far to trust them (pure).

Input is a ``RunView`` (``runview``); output a frozen ``Verdict`` tree with ``to_json()``. The parts
live in their own modules of this package: per-step aggregation in ``stepfacts``, engine death and
its casualties in ``death``, the arithmetic check in ``prediction``, the caveats and the confidence
level in ``confidence``. This module puts them together.

Order: the engine death is found first (from the raw run), so each step knows whether the engine
died in it, after it (its casualties are excused) or before it (``after_death``: the step measured a
dead server and is left out of every finding). The *measured* steps are the non-warmup steps that
did not start after the death.

Onsets, each reported as the *lowest concurrency* at which it was seen (a refinement pass runs
lower levels after higher ones, and a run that ramps through preemption to the server's death
bisects the preemption onset afterwards, so "first in time" and "first in concurrency" differ):

* preemption onset — the lowest level at which at least half of its conclusive steps (with metrics)
  preempted: one step at a level is one draw of the trace's lengths, and the refinement repeats the
  two levels around the onset (``--repeats``), so the onset is what most repeats saw ("seen at 7 in
  3 of 3"). A clean step that sent fewer requests than the trace's odds asked for
  (``StepFacts.evidence_thin``) is not conclusive: it is no vote that the level is clean. The onset
  names the level's first preempting step, its request count and the KV usage of the scrape that
  first showed the preemption. A lower level that preempted in fewer than half of its steps is
  *sporadic*: named in the notes, and never safe;
* KV saturation — a step whose KV usage was ≥ 0.99, and queueing — a step whose waiting was > 0, each
  *sustained*: in at least two consecutive scrapes of the step (``oomload.verdict.gauges``; one momentary
  reading, such as a request caught between arrival and admission, is not a finding);
* engine death — ``oomload.verdict.death``.

Last safe concurrency: the highest level ``c`` below the first unsafe level and below the queueing
onset, with a *trusted* measured step at ``c`` (completed — not cut short — and holding ≥ 80 % of its
target concurrency, ``StepFacts.trusted``) that answered at least one request ok, and with enough
evidence: its steps together sent at least the requests the trace's odds ask for
(``LevelOdds.requests_for``: enough to see a preemption with 99 % probability if the level preempted
as the odds say); a clean level short of that is reported as "not enough evidence". A level is
unsafe when a step at it preempted (in any of its repeats) or had a charged engine death, admission
rejection, server error or timeout, or when the engine died in it — in any step, cut short or not:
a failure seen is a failure. Context overflow, truncation, client transport errors and cancelled
requests do not make a level unsafe; they are reported separately.

Queueing wins over last safe: a level where requests waited in the server's queue (sustained) did
not run its concurrency in the engine — vLLM held some requests back, for want of KV blocks or of
``max_num_seqs`` — so it cannot vouch that the engine survives that many requests at once, and the
last safe level is below it. (Before, "Queueing at concurrency 7" could stand beside "Last safe
concurrency 7".)

Per level (``LevelSummary``): the steps and how many preempted, the requests, preemptions per 100
requests, the share of scrapes with requests waiting and with KV ≥ 99 %, and the trace's odds beside
them: the odds' preemptions per 100 requests and the chance that this many requests see a
preemption. The observation *disagrees* with the odds when the odds made the observation less than
1 % likely: no preemption where the odds gave ≥ 99 % to see one, or one where they gave ≤ 1 %. The
odds' onset is the lowest measured level at which the requests the run sent there see a preemption
with ≥ 50 % probability; more than one measured level from the observed onset is a disagreement.

Cut short. The run was cut short when ``status.json`` is missing, says ``finished: false`` or ends
with a reason in ``runview.CUT_SHORT_REASONS``, when a step was cut short, or when the engine died;
``RunInfo.cut_short_detail`` says where (step, concurrency, seconds since the run started).

Failed run. A run whose decided requests mostly failed — more than half (``MIN_ANSWERED_SHARE``),
counting every failure but an engine death's own (its casualties and ``engine_dead`` answers: the
death is the finding), so ``ok`` and ``truncated`` answers are the evidence — put no load on the
server: ``Verdict.failed_run`` says so in one sentence naming the failures by outcome, the confidence
is low (``run_failed``), and the run exits 3 whatever its gate rules say (``oomload.report``). Each
step whose requests mostly failed is untrusted (``StepFacts.trusted``): no evidence that its level is
safe or that a gate passes there.

Context overflow: ``context_overflow`` outcomes are refusals; a ``truncated`` answer counts as
*clamped* only when its prompt + asked output exceeds ``max_model_len`` (that is what clamping is);
other truncated answers that were not casualties of an engine death are *short responses*.

The arithmetic prediction uses the lengths of the requests actually sent (``requests*.jsonl``),
falling back to ``trace.jsonl`` when no request was sent: a ``--tail-percentile`` run replays only the
trace's longest requests.

Both prompt shapes. The run sent either the trace's shared prefixes (``production``) or distinct prompts
(``worst-case``; ``config.json``). The odds and the arithmetic judged against the run are those of the
shape it sent; the other shape's odds onset (``odds.jsonl`` lines of that shape, over every level the
run computed) and arithmetic (``prediction.other``) stand beside them, so the verdict says what prefix
caching buys at this traffic. Nothing of the other shape decides the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from oomload.capacity import PromptShape
from oomload.odds import LevelOdds
from oomload.outcome import Outcome, RequestResult
from oomload.rundir.records import CUT_SHORT_REASONS, RunStatus
from oomload.stats import LengthSummary, summarize_lengths
from oomload.verdict.confidence import (
    ConfidenceNote,
    confidence_level,
    data_notes,
    evidence_notes,
    step_notes,
    worker_notes,
)
from oomload.verdict.death import EngineDeath, detect_engine_death
from oomload.verdict.prediction import Prediction, compare_prediction
from oomload.verdict.prefixrate import PrefixCheck, StepWindow, prefix_check
from oomload.verdict.runview import RunView
from oomload.verdict.stepfacts import (
    END_REASON_WORDS,
    KV_SATURATED,
    MIN_ANSWERED_SHARE,
    UNSAFE_OUTCOMES,
    LatencyStats,
    StepFacts,
    per_100,
    summarize_step,
)

DEFAULT_MIN_REQUESTS = 3
ODDS_UNLIKELY = 0.01  # an observation the odds gave less than this chance is a disagreement

__all__ = [
    "DEFAULT_MIN_REQUESTS",
    "KV_SATURATED",
    "UNSAFE_OUTCOMES",
    "ConfidenceNote",
    "ContextOverflow",
    "EngineDeath",
    "LatencyStats",
    "LevelOnset",
    "LevelSummary",
    "Prediction",
    "PreemptionOnset",
    "RunInfo",
    "StepFacts",
    "Verdict",
    "build_verdict",
    "first_unsafe_concurrency",
    "kv_peak_text",
    "last_safe_concurrency",
]


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

    @property
    def evidence_needed(self) -> int | None:
        """Requests the odds ask a clean level to send (``None``: no demand)."""
        return None if self.odds is None else self.odds.requests_for()

    @property
    def preemptions_per_100(self) -> float | None:
        return per_100(self.preemptions, self.requests)

    @property
    def odds_p_seen(self) -> float | None:
        """The odds' chance that the requests sent here see at least one preemption."""
        return None if self.odds is None else self.odds.p_seen(self.requests)

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
        if p is None or self.steps_with_metrics == 0:
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


@dataclass(frozen=True, slots=True)
class ContextOverflow:
    refused: int
    clamped: int  # truncated answers whose prompt + asked output exceeds max_model_len
    refused_total_tokens_min: int | None
    refused_total_tokens_max: int | None
    clamped_total_tokens_min: int | None
    clamped_total_tokens_max: int | None
    model_limit: int | None
    trace_over_limit: int  # trace requests whose total length exceeds the model limit
    trace_count: int
    short_responses: int = 0  # other truncated answers (not clamped, not casualties of a death)


@dataclass(frozen=True, slots=True)
class RunInfo:
    path: str
    model: str | None
    url: str | None
    simulated: bool | None
    trace_path: str | None
    started_unix_s: float | None
    finished: bool
    end_reason: str | None
    cut_short: bool
    cut_short_detail: str | None
    cache_config: Mapping[str, Any] | None
    max_model_len: int | None
    tail_percentile: float | None = None  # the order replayed only the trace's tail (config.json)
    open_loop: bool = False  # the trace's arrival times were replayed, not fixed concurrency levels
    config_note: str | None = None  # why config.json could not be read


@dataclass(frozen=True, slots=True)
class Verdict:
    run: RunInfo
    steps: tuple[StepFacts, ...]
    levels: tuple[int, ...]  # measured non-warmup concurrency levels, ascending
    preemption_onset: PreemptionOnset | None
    kv_saturation: LevelOnset | None
    queueing: LevelOnset | None
    engine_death: EngineDeath | None
    context_overflow: ContextOverflow
    last_safe_concurrency: int | None
    max_tested_concurrency: int | None  # highest trusted (completed, held) measured level
    prediction: Prediction | None
    confidence: str  # "high" | "medium" | "low"
    notes: tuple[ConfidenceNote, ...]
    trace_total: LengthSummary | None
    trace_prompt: LengthSummary | None
    trace_output: LengthSummary | None
    trace_total_tokens: tuple[int, ...] = field(default=(), repr=False)
    requests_total: int = 0
    requests_ok: int = 0

    requests_cancelled: int = 0
    requests_failed: int = 0  # every error outcome over the measured steps, casualties included
    requests_unexplained: int = 0  # decided, neither answered nor lost to an engine death (StepFacts)
    first_unsafe_concurrency: int | None = None  # lowest level that preempted or failed
    level_summaries: tuple[LevelSummary, ...] = ()
    odds_onset: int | None = None  # lowest measured level with non-negligible odds (module docstring)
    odds_onset_low: int | None = None  # one above the highest measured level with negligible odds below it
    prompt_shape: PromptShape = "worst-case"  # the prompts sent: the trace's shared prefixes or distinct
    # the odds for the other prompt shape, over every level the run computed them for (module docstring)
    other_odds_onset: int | None = None
    other_odds_onset_low: int | None = None
    other_odds_known: bool = False  # the run computed odds for the other prompt shape (its trace shares)
    prefix: PrefixCheck | None = None  # the prompt shape measured and the prefix-cache hit rates

    @property
    def odds_levels_apart(self) -> int | None:
        """Levels between the observed onset and the odds' onset range (``None``: one is missing)."""
        observed = None if self.preemption_onset is None else self.preemption_onset.concurrency
        return odds_distance(observed, self.odds_onset_low, self.odds_onset, self.levels)

    def level(self, concurrency: int) -> LevelSummary | None:
        return next((lv for lv in self.level_summaries if lv.concurrency == concurrency), None)

    @property
    def measured_steps(self) -> tuple[StepFacts, ...]:
        """Non-warmup steps that did not start after the engine died."""
        return tuple(s for s in self.steps if not s.warmup and not s.after_death)

    @property
    def preemptions_observed(self) -> bool:
        """Some measured step had a /metrics scrape that could show preemptions."""
        return any(s.preemptions is not None for s in self.measured_steps)

    @property
    def error_rate(self) -> float | None:
        """Failed / decided requests over the measured steps (cancelled ones are neither)."""
        decided = self.requests_total - self.requests_cancelled
        return None if decided == 0 else self.requests_failed / decided

    @property
    def failed_run(self) -> str | None:
        """Why the run is nothing to judge, in one sentence, when its requests mostly failed (module
        docstring, "Failed run"); ``None`` otherwise."""
        decided = self.requests_total - self.requests_cancelled
        if decided == 0 or self.requests_unexplained <= (1.0 - MIN_ANSWERED_SHARE) * decided:
            return None
        counts: dict[str, int] = {}
        for s in self.measured_steps:
            for name, n in s.unexplained_by_outcome().items():
                counts[name] = counts.get(name, 0) + n
        kinds = ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        return (
            f"{self.requests_unexplained} of {decided} requests failed ({kinds}): the server was not "
            "loaded, so nothing about its memory can be judged"
        )

    def steps_at(self, concurrency: int) -> tuple[StepFacts, ...]:
        return tuple(s for s in self.measured_steps if s.concurrency == concurrency)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (the ``verdict`` part of ``summary.json``; see docs/report.md)."""
        steps = []
        for s in self.steps:
            obj = asdict(s)
            obj["outcomes"] = dict(s.outcomes)
            obj["casualties"] = dict(s.casualties)
            obj["warmup"] = s.warmup
            obj["error_rate"] = s.error_rate
            obj["trusted"] = s.trusted
            obj["concurrency_held"] = s.concurrency_held
            obj["server"] = None if s.server is None else s.server.to_json()
            obj["server_share"] = None if s.server_share is None else round(s.server_share, 3)
            obj["delivered_concurrency"] = (
                None if s.delivered_concurrency is None else round(s.delivered_concurrency, 3)
            )
            obj["kv_usage_max_share"] = s.kv_usage_max
            obj["odds"] = None if s.odds is None else s.odds.to_json()
            obj["preemptions_per_100_requests"] = _round(s.preemptions_per_100)
            obj["waiting_share"] = _round(s.waiting_share)
            obj["kv_saturated_share"] = _round(s.kv_saturated_share)
            obj["evidence_thin"] = s.evidence_thin
            steps.append(obj)
        return {
            "run": {**asdict(self.run), "cache_config": _plain(self.run.cache_config)},
            "levels": list(self.levels),
            "steps": steps,
            "onsets": {
                "preemption": None
                if self.preemption_onset is None
                else {
                    **asdict(self.preemption_onset),
                    "kv_usage_at_onset_share": self.preemption_onset.kv_usage_at_onset,
                    "kv_usage_max_share": self.preemption_onset.kv_usage_max,
                    "seen": self.preemption_onset.seen_text,
                },
                "kv_saturation": None
                if self.kv_saturation is None
                else {**asdict(self.kv_saturation), "kv_usage_share": self.kv_saturation.value},
                "queueing": None
                if self.queueing is None
                else {**asdict(self.queueing), "waiting_requests": int(self.queueing.value)},
                "engine_death": None if self.engine_death is None else self.engine_death.to_json(),
            },
            "context_overflow": {
                **asdict(self.context_overflow),
                "model_limit_tokens": self.context_overflow.model_limit,
            },
            "level_summaries": [lv.to_json() for lv in self.level_summaries],
            "odds_onset": self.odds_onset,
            "odds_onset_low": self.odds_onset_low,
            "prompt_shape": self.prompt_shape,
            "other_odds_onset": self.other_odds_onset,
            "other_odds_onset_low": self.other_odds_onset_low,
            "other_odds_known": self.other_odds_known,
            "prefix": None if self.prefix is None else self.prefix.to_json(),
            "odds_levels_apart": self.odds_levels_apart,
            "last_safe_concurrency": self.last_safe_concurrency,
            "first_unsafe_concurrency": self.first_unsafe_concurrency,
            "max_tested_concurrency": self.max_tested_concurrency,
            "prediction": None if self.prediction is None else self.prediction.to_json(),
            "confidence": {"level": self.confidence, "notes": [asdict(n) for n in self.notes]},
            "requests": {
                "total": self.requests_total,
                "ok": self.requests_ok,
                "cancelled": self.requests_cancelled,
                "failed": self.requests_failed,
                "unexplained": self.requests_unexplained,
                "error_rate": self.error_rate,
                "failed_run": self.failed_run,
            },
            "trace": None
            if self.trace_total is None or self.trace_prompt is None or self.trace_output is None
            else {
                "total_tokens": self.trace_total.as_dict(),
                "prompt_tokens": self.trace_prompt.as_dict(),
                "output_tokens": self.trace_output.as_dict(),
            },
        }


def build_verdict(view: RunView, *, min_requests: int | None = None) -> Verdict:
    """Compute the verdict of one run (see the module docstring for every rule)."""
    if min_requests is None:
        configured = view.settings.min_requests
        min_requests = configured if configured is not None and configured > 0 else DEFAULT_MIN_REQUESTS
    death = detect_engine_death(view)
    died_at = None if death is None else death.step
    died_t = math.inf if death is None or death.t_unix_s is None else death.t_unix_s
    casualty_ids = frozenset() if death is None else death.casualty_ids
    steps = tuple(
        summarize_step(
            step,
            view.requests,
            casualty_ids=casualty_ids,
            died_here=step.boundary.index == died_at,
            after_death=step.boundary.index != died_at and step.boundary.start_unix_s > died_t,
            odds=view.odds_at(step.boundary.concurrency),
        )
        for step in view.steps
    )
    measured = [s for s in steps if not s.warmup and not s.after_death]
    levels = tuple(sorted({s.concurrency for s in measured}))

    summaries = level_summaries(measured)
    onset = _preemption_onset(view, measured)
    kv_sat = _level_onset(measured, lambda s: s.kv_usage_sustained, lambda v: v >= KV_SATURATED)
    queueing = _level_onset(measured, lambda s: s.waiting_sustained, lambda v: v > 0)
    last_safe = last_safe_concurrency(
        measured,
        death,
        queueing=None if queueing is None else queueing.concurrency,
        thin={lv.concurrency for lv in summaries if lv.evidence_thin},
    )
    odds_low, odds_onset = _odds_onset(summaries)
    trusted = [s.concurrency for s in measured if s.trusted]
    max_tested = max(trusted) if trusted else None

    other_shape: PromptShape = "worst-case" if view.prompt_shape == "production" else "production"
    other_level_odds = [o for o in view.odds if o.shape == other_shape]
    other_odds = odds_onset_of(other_level_odds)
    run = _run_info(view, steps, death)
    totals, basis = _kv_totals(view, run.max_model_len), "requests"
    if not totals:
        totals, basis = _kv_totals(view, run.max_model_len, of_trace=True), "trace"
    prediction = compare_prediction(
        view.pool,
        totals,
        basis=basis,
        observed_onset=None if onset is None else onset.concurrency,
        levels=levels,
        clean_levels=[s.concurrency for s in measured if s.trusted and s.preemptions == 0],
        shape=view.prompt_shape,
        trace_totals=_kv_totals(view, run.max_model_len, of_trace=True),
        trace_prefixes=view.trace_prefixes,
    )
    notes = [
        *step_notes(steps, min_requests),
        *evidence_notes(
            measured,
            onset_concurrency=None if onset is None else onset.concurrency,
            prediction=prediction,
            cut_short_detail=run.cut_short_detail if run.cut_short else None,
            died=_cut_only_by_death(run, steps, death),
        ),
        *data_notes(view),
        *worker_notes(view, steps),
        *_level_notes(summaries, onset, (odds_low, odds_onset), levels),
    ]
    prefix = prefix_check(
        view.config,
        view.cache_config,
        view.trace_records,
        [
            StepWindow(
                d.boundary.index,
                d.boundary.concurrency,
                d.requests,
                d.metrics,
                d.baseline_metric,
                preempted=bool(facts.preemptions),
            )
            for d, facts in zip(view.steps, steps, strict=True)
        ],
    )
    if prefix.problem is not None:
        notes.append(ConfidenceNote("prefix_mismatch", prefix.problem))
    key_levels = {c for c in (last_safe, None if onset is None else onset.concurrency) if c is not None}
    measured_ids = {s.index for s in measured}
    requests = [r for d in view.steps if d.boundary.index in measured_ids for r in d.requests]
    return Verdict(
        run=run,
        steps=steps,
        levels=levels,
        preemption_onset=onset,
        kv_saturation=kv_sat,
        queueing=queueing,
        engine_death=death,
        context_overflow=_context_overflow(view, run.max_model_len, death),
        last_safe_concurrency=last_safe,
        max_tested_concurrency=max_tested,
        prediction=prediction,
        confidence=confidence_level(notes, key_levels, measured),
        notes=tuple(notes),
        trace_total=_summary(view.trace_total_tokens),
        trace_prompt=_summary(view.trace_prompt_tokens),
        trace_output=_summary(view.trace_output_tokens),
        trace_total_tokens=view.trace_total_tokens,
        requests_total=len(requests),
        requests_ok=sum(1 for r in requests if r.outcome is Outcome.OK),
        requests_cancelled=sum(1 for r in requests if r.outcome is Outcome.CANCELLED),
        requests_failed=sum(1 for r in requests if r.outcome.is_error),
        requests_unexplained=sum(s.unexplained_failures for s in measured),
        first_unsafe_concurrency=first_unsafe_concurrency(measured, death),
        level_summaries=summaries,
        odds_onset=odds_onset,
        odds_onset_low=odds_low,
        prompt_shape=view.prompt_shape,
        other_odds_onset=other_odds[1],
        other_odds_onset_low=other_odds[0],
        other_odds_known=bool(other_level_odds),
        prefix=prefix,
    )


def _kv_totals(view: RunView, limit: int | None, *, of_trace: bool = False) -> tuple[int, ...]:
    """The KV tokens each request could hold at most: the ones sent without those the server refused
    (context overflow: they never held a block), or the trace's; clamped at ``max_model_len``."""
    if of_trace:
        totals = list(view.trace_total_tokens)
    else:
        totals = [
            r.prompt_tokens_asked + r.output_tokens_asked
            for r in view.requests
            if r.outcome is not Outcome.CONTEXT_OVERFLOW
        ]
    return tuple(totals if limit is None else (min(t, limit) for t in totals))


def first_unsafe_concurrency(measured: Sequence[StepFacts], death: EngineDeath | None) -> int | None:
    """The lowest level at which a step (cut short or not) preempted or failed, or the engine died."""
    unsafe_levels = {s.concurrency for s in measured if _unsafe(s)}
    if death is not None and death.concurrency is not None:
        unsafe_levels.add(death.concurrency)
    return min(unsafe_levels) if unsafe_levels else None


def last_safe_concurrency(
    measured: Sequence[StepFacts],
    death: EngineDeath | None,
    *,
    queueing: int | None = None,
    thin: Collection[int] = (),
) -> int | None:
    """Highest level below the first unsafe one and below ``queueing``, backed by a trusted step with
    ok answers, and not in ``thin`` (levels short of the evidence the trace's odds ask for)."""
    first = first_unsafe_concurrency(measured, death)
    ceiling = min(math.inf if first is None else first, math.inf if queueing is None else queueing)
    safe = [
        s.concurrency
        for s in measured
        if s.trusted and s.concurrency < ceiling and s.ok_requests > 0 and s.concurrency not in thin
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
            )
        )
    return tuple(out)


def _weighted(steps: Sequence[StepFacts], share_of: Callable[[StepFacts], float | None]) -> float | None:
    """A per-step share averaged over the steps' scrapes."""
    pairs = [(v, s.scrapes_ok) for s in steps if (v := share_of(s)) is not None and s.scrapes_ok]
    total = sum(n for _v, n in pairs)
    return None if not total else sum(v * n for v, n in pairs) / total


def _odds_onset(summaries: Sequence[LevelSummary]) -> tuple[int | None, int | None]:
    """``(low, onset)``: the lowest measured level with non-negligible odds, and one above the highest
    measured level below it whose odds are negligible (``None`` when there is none)."""
    with_odds = [lv for lv in summaries if lv.odds is not None]
    onset = next((lv.concurrency for lv in with_odds if lv.odds is not None and not lv.odds.negligible), None)
    if onset is None:
        return None, None
    below = [lv.concurrency for lv in with_odds if lv.concurrency < onset]
    return (max(below) + 1 if below else None), onset


def odds_onset_of(odds: Sequence[LevelOdds]) -> tuple[int | None, int | None]:
    """``(low, onset)`` of ``_odds_onset`` over odds alone (the other prompt shape's, never measured)."""
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


def _level_notes(
    summaries: Sequence[LevelSummary],
    onset: PreemptionOnset | None,
    odds_range: tuple[int | None, int | None],
    levels: Sequence[int],
) -> list[ConfidenceNote]:
    """Caveats from the per-level view: sporadic preemption below the onset, thin evidence, the odds."""
    notes: list[ConfidenceNote] = []
    onset_c = None if onset is None else onset.concurrency
    for lv in summaries:
        where = f"concurrency {lv.concurrency}"
        if onset_c is not None and lv.concurrency < onset_c and lv.steps_preempted:
            text = (
                f"preemption at {where} in {lv.steps_preempted} of {lv.steps_with_metrics} step(s), fewer "
                f"than half: sporadic below the onset {onset_c}, and not safe"
            )
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
                f"{where}: {lv.preemptions or 0} preemption(s) in {lv.requests} request(s), "
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


def _preemption_onset(view: RunView, measured: Sequence[StepFacts]) -> PreemptionOnset | None:
    """The lowest level preempting in at least half of its conclusive steps (module docstring)."""
    by_level: dict[int, list[StepFacts]] = {}
    for s in measured:
        if s.preemptions is not None and not s.evidence_thin:
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


def _level_onset(
    measured: Sequence[StepFacts],
    value_of: Callable[[StepFacts], float | int | None],
    crossed: Callable[[float], bool],
) -> LevelOnset | None:
    hits = [(s, v) for s in measured if (v := value_of(s)) is not None and crossed(v)]
    if not hits:
        return None
    step, value = min(hits, key=lambda h: (h[0].concurrency, h[0].start_unix_s))
    return LevelOnset(step=step.index, concurrency=step.concurrency, value=float(value))


def _run_info(view: RunView, steps: Sequence[StepFacts], death: EngineDeath | None) -> RunInfo:
    config = view.settings
    status = view.status
    finished = status is not None and status.finished
    end_reason = None if status is None else status.end_reason
    cut_steps = [s for s in steps if s.cut_short]
    cut_short = (
        status is None
        or not finished
        or end_reason in CUT_SHORT_REASONS
        or bool(cut_steps)
        or death is not None
    )
    detail = _cut_short_detail(view, steps, death, status, end_reason) if cut_short else None
    limit = config.max_model_len  # from /v1/models, else the cache config
    if limit is None and view.pool is not None:
        limit = view.pool.max_model_len
    return RunInfo(
        path=str(view.path),
        model=config.model,
        url=config.url,
        simulated=config.simulated,
        trace_path=config.trace_path,
        started_unix_s=config.started_unix_s,
        finished=finished,
        end_reason=end_reason,
        cut_short=cut_short,
        cut_short_detail=detail,
        cache_config=view.cache_config,
        max_model_len=limit,
        tail_percentile=config.tail_percentile,
        open_loop=config.open_loop,
        config_note=view.config_note,
    )


def _cut_only_by_death(run: RunInfo, steps: Sequence[StepFacts], death: EngineDeath | None) -> bool:
    """The run finished its own way and nothing but the engine's death cut it short."""
    if death is None or not run.finished:
        return False
    return all(s.after_death or s.index == death.step for s in steps if s.cut_short)


def _cut_short_detail(
    view: RunView,
    steps: Sequence[StepFacts],
    death: EngineDeath | None,
    status: RunStatus | None,
    end_reason: str | None,
) -> str:
    """Where and why the run was cut short: the step, its concurrency, seconds since the run started."""
    starts = [s.start_unix_s for s in steps]
    t0 = view.settings.started_unix_s
    if t0 is None and starts:
        t0 = min(starts)

    def at(t: float | None) -> str:
        return "" if t is None or t0 is None else f" at {max(t - t0, 0.0):.1f} s"

    parts = []
    if status is None:
        parts.append("no status.json (oomload itself stopped before writing it)")
    first_cut = min((s for s in steps if s.cut_short), key=lambda s: s.start_unix_s, default=None)
    if death is not None:
        where = "" if death.step is None else f" in step {death.step} (concurrency {death.concurrency})"
        parts.append(f"the server died{where}{at(death.t_unix_s)}")
    elif first_cut is not None:
        where = f"step {first_cut.index} (concurrency {first_cut.concurrency})"
        if first_cut.end_reason is None:
            parts.append(f"{where} started but never ended")
        else:
            cause = END_REASON_WORDS.get(
                first_cut.end_reason, f"the step ended with reason {first_cut.end_reason}"
            )
            parts.append(f"{cause} in {where}{at(first_cut.end_unix_s)}")
    elif status is not None:
        last = max(steps, key=lambda s: s.start_unix_s, default=None)
        after = "" if last is None else f" after step {last.index} (concurrency {last.concurrency})"
        parts.append(f"the run ended with reason {end_reason or 'unknown'}{after}")
    return "; ".join(parts) or "the run ended early"


def _context_overflow(view: RunView, limit: int | None, death: EngineDeath | None) -> ContextOverflow:
    refused = [_total(r) for r in view.requests if r.outcome is Outcome.CONTEXT_OVERFLOW]
    casualties = frozenset() if death is None else death.casualty_ids
    truncated = [
        r for r in view.requests if r.outcome is Outcome.TRUNCATED and r.request_id not in casualties
    ]
    clamped = [_total(r) for r in truncated if limit is not None and _total(r) > limit]
    totals = view.trace_total_tokens
    return ContextOverflow(
        refused=len(refused),
        clamped=len(clamped),
        refused_total_tokens_min=min(refused, default=None),
        refused_total_tokens_max=max(refused, default=None),
        clamped_total_tokens_min=min(clamped, default=None),
        clamped_total_tokens_max=max(clamped, default=None),
        model_limit=limit,
        trace_over_limit=0 if limit is None else sum(1 for t in totals if t > limit),
        trace_count=len(totals),
        short_responses=len(truncated) - len(clamped),
    )


def _total(r: RequestResult) -> int:
    return r.prompt_tokens_asked + r.output_tokens_asked


def kv_percent(share: float) -> str:
    """A KV usage share in whole percent, rounded *down*: 0.986 reads 98 %, never the 99 % of the
    saturation threshold (``KV_SATURATED``) that it did not reach."""
    return f"{math.floor(share * 100 + 1e-9)}%"


def kv_peak_text(kv_usage_max: float) -> str:
    """The one way every report states the KV usage at the preemption onset (``PreemptionOnset``)."""
    return f"KV usage peaked at {kv_percent(kv_usage_max)} in that step"


def _summary(values: Sequence[int]) -> LengthSummary | None:
    return summarize_lengths(values) if values else None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _plain(obj: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if obj is None else dict(obj)
