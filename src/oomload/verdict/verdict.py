"""The verdict: the onsets, the last safe concurrency and how far to trust them (pure).

Input is a ``RunView`` (``runview``); output a frozen ``Verdict`` tree with ``to_json()``. The parts
live in their own modules of this package: per-step aggregation in ``stepfacts``, engine death and
its casualties in ``death``, the arithmetic check in ``prediction``, the caveats and the confidence
level in ``confidence``, the per-level view (level summaries, onsets, last safe) in ``levels``, the
run as a whole (cut short, context overflow) in ``runinfo``. This module puts them together and
states every rule.

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
  (``StepFacts.evidence_thin``), or that is not trusted (its requests mostly failed, it was cut short
  or did not hold its level), is not conclusive (``StepFacts.conclusive``): it is no vote that the
  level is clean. The same steps decide the knee's caveats (a clean level above the onset, repeats
  that disagree) and whether a clean level saw fewer preemptions than the odds. The onset
  names the level's first preempting step, its request count and the KV usage of the scrape that
  first showed the preemption. A lower level that preempted in fewer than half of its steps is
  *sporadic*: named in the notes, and never safe — as is a level that preempted in fewer than half of
its steps in a run with no onset. How far "no preemption" reaches is
``Verdict.preemption_judged_up_to``: the highest level with a conclusive step;
* KV saturation — a step whose KV usage was ≥ 0.99, and queueing — a step whose waiting was > 0, each
  *sustained*: in at least two consecutive scrapes of the step (``oomload.verdict.gauges``; one momentary
  reading, such as a request caught between arrival and admission, is not a finding) — or, for
  queueing, at least one request waiting on average by vLLM's queue-time sum, with a scrape that saw
  the queue (``StepFacts.queue_depth``: a short step's two scrapes can miss a standing queue);
* engine death — ``oomload.verdict.death``.

Last safe concurrency: the highest level ``c`` below the first unsafe level and below the queueing
onset, with a *trusted* measured step at ``c`` (completed — not cut short — and holding ≥ 80 % of its
target concurrency, ``StepFacts.trusted``) that answered at least one request ok and whose ``/metrics``
scrape read the preemption counter (a level where preemption was not observable is unjudged, not
safe), and with enough evidence: its steps together sent at least the requests the trace's odds ask for
(``LevelOdds.requests_for``: enough to see a preemption with 99 % probability if the level preempted
as the odds say); a clean level short of that is reported as "not enough evidence". A level is
unsafe when a step at it preempted (in any of its repeats) or had a charged engine death, admission
rejection, server error or timeout, or when the engine died in it — in any step, cut short or not:
a failure seen is a failure. Context overflow, truncation, client transport errors and cancelled
requests do not make a level unsafe; they are reported separately. An open loop (``--open-loop``)
has no last safe concurrency: the trace's arrival times set its load, and its level only capped the
requests in flight (nor does it judge whether a step held that cap: ``StepFacts.concurrency_held``),
and its onset is not compared with the arithmetic's or the odds' (both are per level of a closed loop).

Queueing wins over last safe: a level where requests waited in the server's queue (sustained) did
not run its concurrency in the engine — vLLM held some requests back, for want of KV blocks or of
``max_num_seqs`` — so it cannot vouch that the engine survives that many requests at once, and the
last safe level is below it.

Per level (``LevelSummary``): the steps and how many preempted, the requests, preemptions per 100
requests, the share of scrapes with requests waiting and with KV ≥ 99 %, and the trace's odds beside
them: the odds' preemptions per 100 requests and the chance that this many requests see a
preemption. The observation *disagrees* with the odds when the odds made the observation less than
1 % likely: no preemption where the odds gave ≥ 99 % to see one, or one where they gave ≤ 1 %. The
odds' onset is the lowest measured level at which the requests the run sent there see a preemption
with ≥ 50 % probability; more than one measured level from the observed onset is a disagreement.

Cut short. The run was cut short when ``status.json`` is missing, says ``finished: false`` or ends
with a reason in ``runview.CUT_SHORT_REASONS``, when a step was cut short, or when the engine died;
``RunInfo.cut_short_detail`` says where (step, concurrency, seconds from the first step's start).

Failed run. A run whose requests mostly failed — more than half (``MIN_ANSWERED_SHARE``) of those that ran,
counting every failure but an engine death's own (its casualties and ``engine_dead`` answers: the death is
the finding), so ``ok`` and ``truncated`` answers are the evidence — is nothing to judge: ``failed_run``
says why in one sentence naming the failures by outcome (``RanTally.unloaded_text``), confidence is low
(``run_failed``), and the run exits 3 whatever its gate rules say (``oomload.report``). So is a run where no
measured step decided a request (every one cancelled, or none sent), or where none ran. Requests turned away
before they ran (``stepfacts.ran_tally``: by a limit in front of the engine, ``rate_limited``, or by vLLM's
own queue limit, ``admission_rejected``: the engine was full, so the run did load it) are left out of that
share. Each step whose requests mostly failed, rejections included, is untrusted (``StepFacts.trusted``):
no evidence that its level is safe or that a gate passes there.

Usage. Every answer's ``usage`` is held to what its request sent (``oomload.load.classify``): an
answer whose usage contradicts it is a ``server_error`` with the reason "usage disagrees", counted in
``usage_disagrees`` with the first one's token counts; when they are most of a failed run's failures
its sentence says so (``USAGE_HINT``).

Context overflow: ``context_overflow`` outcomes are refusals; a ``truncated`` answer counts as
*clamped* only when its prompt + asked output exceeds ``max_model_len`` (that is what clamping is);
other truncated answers that were not casualties of an engine death are *short responses*. The
trace's requests longer than ``max_model_len`` are counted, and marked ``left_out`` when
``--only-fitting`` did not send them. A failed run whose failures were mostly refusals as too long
says so: ``--only-fitting`` replays what fits.

The arithmetic prediction uses the lengths of the requests actually sent (``requests*.jsonl``),
falling back, when no request was sent, to the trace's requests the run replayed (``replayed``: the
selection of ``--only-fitting`` and ``--tail-percentile`` that ``config.json`` records, applied to
``trace.jsonl``); the production shape's shared prefix blocks come from those same requests. A request
the run never sent holds no block, so it is no part of any prediction.

Both prompt shapes. The run sent either the trace's shared prefixes (``production``) or distinct prompts
(``worst-case``; ``config.json``). The odds and the arithmetic judged against the run are those of the
shape it sent; the other shape's odds onset (``odds.jsonl`` lines of that shape, over every level the
run computed) and arithmetic (``prediction.other``) stand beside them, so the verdict says what prefix
caching buys at this traffic. Nothing of the other shape decides the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from oomload.capacity.blocks import PromptShape
from oomload.outcome import REFUSED_REASONS, USAGE_DISAGREES, Outcome
from oomload.trace.stats import LengthSummary, summarize_lengths
from oomload.verdict.confidence import (
    ConfidenceNote,
    confidence_level,
    data_notes,
    evidence_notes,
    step_notes,
    worker_notes,
)
from oomload.verdict.death import EngineDeath, detect_engine_death
from oomload.verdict.failures import (
    RATE_LIMIT_HINT,
    USAGE_HINT,
    detail_of,
    failure_texts,
    outcome_count,
    reason_of,
)
from oomload.verdict.levels import (
    LevelOnset,
    LevelSummary,
    PreemptionOnset,
    first_unsafe_concurrency,
    last_safe_concurrency,
    level_notes,
    level_onset,
    level_summaries,
    measured_odds_onset,
    odds_distance,
    odds_onset_of,
    preemption_onset,
)
from oomload.verdict.prediction import Prediction, compare_prediction
from oomload.verdict.prefixrate import PrefixCheck, StepWindow, prefix_check
from oomload.verdict.replayed import kv_lengths, shared_prefixes
from oomload.verdict.runinfo import ContextOverflow, RunInfo, context_overflow, cut_only_by_death, run_info
from oomload.verdict.runview import RunView
from oomload.verdict.servermem import ServerMemory, soak_trends, summarize_server_memory
from oomload.verdict.stepfacts import (
    KV_SATURATED,
    UNSAFE_OUTCOMES,
    LatencyStats,
    StepFacts,
    kv_percent,
    ran_tally,
)
from oomload.verdict.stepsummary import summarize_step
from oomload.verdict.trend import MemoryTrend

DEFAULT_MIN_REQUESTS = 3

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
    "kv_percent",
    "last_safe_concurrency",
]


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
    usage_disagrees: int = 0  # server errors whose usage contradicted the lengths sent (oomload.outcome)
    usage_disagrees_example: str | None = None  # the first one's counts ("prompt_tokens 9, 8 sent")
    failure_texts: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # failures.failure_texts
    refused_requests: int = 0  # server errors that were a 400 (REFUSED_REASONS): the request itself refused
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
    server_memory: ServerMemory | None = None  # the server's host memory (None: not sampled)
    memory_trends: tuple[MemoryTrend, ...] = ()  # --soak: each memory series' trend over the held level

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
    def preemption_judged_up_to(self) -> int | None:
        """How far "no preemption" reaches: the highest measured level with a conclusive step
        (``StepFacts.conclusive``: a ``/metrics`` scrape, and a preemption or a trusted clean run with the
        requests the trace's odds ask for). A level without one was not judged for preemption."""
        judged = [s.concurrency for s in self.measured_steps if s.conclusive]
        return max(judged) if judged else None

    @property
    def unobserved_levels(self) -> tuple[int, ...]:
        """Levels with a trusted step where no step's ``/metrics`` scrape read the preemption counter."""
        observed = {s.concurrency for s in self.measured_steps if s.preemptions is not None}
        return tuple(sorted({s.concurrency for s in self.measured_steps if s.trusted} - observed))

    @property
    def unloaded_steps(self) -> tuple[str, ...]:
        """Why each measured step that did not load the engine is no evidence (``StepFacts.distrust``): its
        requests mostly failed, or a limit in front of the engine turned them away. A rule over the whole
        run is not judged beside one: the run's totals miss what that level would have added."""
        unloaded = (s for s in self.measured_steps if s.mostly_failed or s.rate_limited)
        return tuple(d for s in unloaded if (d := s.distrust) is not None)

    @property
    def preempted_levels(self) -> tuple[LevelSummary, ...]:
        """The levels where some step preempted: the onset's and those above it, and the sporadic ones
        (below the onset, or in a run with none)."""
        return tuple(lv for lv in self.level_summaries if lv.steps_preempted)

    @property
    def error_rate(self) -> float | None:
        """Failed / decided requests over the measured steps (cancelled ones are neither)."""
        decided = self.requests_total - self.requests_cancelled
        return None if decided == 0 else self.requests_failed / decided

    @property
    def requests_rate_limited(self) -> int:
        """Requests a limit in front of the engine turned away (``rate_limited``) over the measured steps."""
        return sum(s.rate_limited_requests for s in self.measured_steps)

    @property
    def failed_run(self) -> str | None:
        """Why the run is nothing to judge, in one sentence, when its requests mostly failed (module
        docstring, "Failed run") or no measured step decided one; ``None`` otherwise."""
        if not any(s.decided_requests for s in self.measured_steps):
            sent = f"all {self.requests_total} cancelled" if self.requests_total else "none was sent"
            return f"no measured step decided a request ({sent}), so nothing about the server can be judged"
        tally = ran_tally(self.measured_steps)  # what ran: the limits are findings of their own
        if not tally.nothing_to_judge:
            return None
        unexplained, ran = tally.failed, tally.ran
        if ran == 0:
            return self._turned_away_run()
        counts: dict[str, int] = {}
        for s in self.measured_steps:
            for name, n in s.unexplained_by_outcome().items():
                if name != Outcome.ADMISSION_REJECTED.value:
                    counts[name] = counts.get(name, 0) + n
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        kinds = ", ".join(outcome_count(name, n, self.failure_texts) for name, n in ranked)
        failed = f"{unexplained} of {ran} requests failed ({kinds})"
        if 2 * self.usage_disagrees > unexplained:  # loaded, but not with the trace
            return (
                f"{failed}: {self.usage_disagrees} answers' usage contradicted the lengths sent "
                f"({USAGE_HINT}), so the load was not the trace's and nothing about the server's memory "
                "under it can be judged"
            )
        text = f"{failed}: {tally.unloaded_text}"
        if ranked and ranked[0][0] == Outcome.CONTEXT_OVERFLOW.value:  # the trace, not the server
            text += "; --only-fitting replays only the requests within its max_model_len"
        elif 2 * self.refused_requests > unexplained and self.run.api == "completions":
            text += (
                f"; {self.refused_requests} were refused with a 400 (the request itself): every token id "
                "sent (--token-id-range, default 100:2000) must be inside the model's vocabulary"
            )
        return text

    def _turned_away_run(self) -> str:
        """``failed_run``'s sentence for a run whose every decided request was turned away before it ran."""
        limited = self.requests_rate_limited
        rejected = sum(s.queue_rejected_requests for s in self.measured_steps)
        turned = [(Outcome.RATE_LIMITED.value, limited), (Outcome.ADMISSION_REJECTED.value, rejected)]
        kinds = ", ".join(outcome_count(name, n, self.failure_texts) for name, n in turned if n)
        everything = f"all {limited + rejected} requests were turned away"
        if limited:
            return f"{everything} ({kinds}), so none reached the engine — {RATE_LIMIT_HINT}"
        return (
            f"{everything} by vLLM's own queue limit ({kinds}), so none ran: the engine was full before "
            "this load reached it (another client's requests, or --max-num-queued-reqs / "
            "--max-num-queued-tokens below the lowest level), and nothing about its memory can be judged"
        )

    @property
    def traffic(self) -> str:
        """What the run sent from its trace, in words: the prompts, how (chat text, outputs the model
        ended) and the selection of requests. Two runs compare (``compare``, a rule relative to a
        baseline) only when theirs is the same."""
        parts = ["shared prefixes" if self.prompt_shape == "production" else "distinct prompts"]
        if self.run.api == "chat":
            parts.append("calibrated chat text (--api chat)")
        if not self.run.exact_output:
            parts.append("outputs the model ended (--no-exact-output)")
        if self.context_overflow.left_out:
            parts.append("only requests within max_model_len (--only-fitting)")
        if self.run.tail_percentile:
            parts.append(f"only requests ≥ P{self.run.tail_percentile:g} (--tail-percentile)")
        if self.run.open_loop:
            parts.append("the trace's arrival times (--open-loop)")
        return ", ".join(parts)

    def steps_at(self, concurrency: int) -> tuple[StepFacts, ...]:
        return tuple(s for s in self.measured_steps if s.concurrency == concurrency)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (the ``verdict`` part of ``summary.json``; see docs/report.md)."""
        return {
            "run": {**asdict(self.run), "cache_config": _plain(self.run.cache_config)},
            "levels": list(self.levels),
            "steps": [s.to_json() for s in self.steps],
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
            "server_memory": None if self.server_memory is None else self.server_memory.to_json(),
            "memory_trends": [t.to_json() for t in self.memory_trends],
            "odds_levels_apart": self.odds_levels_apart,
            "last_safe_concurrency": self.last_safe_concurrency,
            "first_unsafe_concurrency": self.first_unsafe_concurrency,
            "max_tested_concurrency": self.max_tested_concurrency,
            "preemption_judged_up_to": self.preemption_judged_up_to,
            "prediction": None if self.prediction is None else self.prediction.to_json(),
            "confidence": {"level": self.confidence, "notes": [asdict(n) for n in self.notes]},
            "requests": {
                "total": self.requests_total,
                "ok": self.requests_ok,
                "cancelled": self.requests_cancelled,
                "failed": self.requests_failed,
                "unexplained": self.requests_unexplained,
                "rate_limited": self.requests_rate_limited,
                "usage_disagrees": self.usage_disagrees,
                "error_rate": self.error_rate,
                "failed_run": self.failed_run,
                "top_errors": {k: {"error": e, "requests": n} for k, (e, n) in self.failure_texts.items()},
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
            open_loop=view.settings.open_loop,
        )
        for step in view.steps
    )
    measured = [s for s in steps if not s.warmup and not s.after_death]
    levels = tuple(sorted({s.concurrency for s in measured}))

    summaries = level_summaries(measured)
    onset = preemption_onset(view, measured)
    kv_sat = level_onset(measured, lambda s: s.kv_usage_sustained, lambda v: v >= KV_SATURATED)
    queueing = level_onset(measured, lambda s: s.queue_depth, lambda v: v > 0)
    last_safe = None  # an open loop ran no concurrency level: its cap vouches for nothing
    if not view.settings.open_loop:
        last_safe = last_safe_concurrency(
            measured,
            death,
            queueing=None if queueing is None else queueing.concurrency,
            thin={lv.concurrency for lv in summaries if lv.evidence_thin},
        )
    odds_low, odds_onset = measured_odds_onset(summaries)
    trusted = [s.concurrency for s in measured if s.trusted]
    max_tested = max(trusted) if trusted else None

    other_shape: PromptShape = "worst-case" if view.prompt_shape == "production" else "production"
    other_level_odds = [o for o in view.odds if o.shape == other_shape]
    other_odds = odds_onset_of(other_level_odds)
    run = run_info(view, steps, death)
    sent = kv_lengths(view, run.max_model_len)
    trace_lengths = kv_lengths(view, run.max_model_len, of_trace=True)  # the requests replayed
    (totals, prompts), basis = (sent, "requests") if sent[0] else (trace_lengths, "trace")
    open_loop = view.settings.open_loop  # its in-flight count followed the arrivals: no level to compare
    prediction = compare_prediction(
        view.pool,
        totals,
        prompts=prompts,
        basis=basis,
        observed_onset=None if onset is None or open_loop else onset.concurrency,
        levels=levels,
        clean_levels=[]
        if open_loop
        else [s.concurrency for s in measured if s.trusted and s.preemptions == 0],
        shape=view.prompt_shape,
        trace_totals=trace_lengths[0],
        trace_prompts=trace_lengths[1],
        trace_prefixes=shared_prefixes(view),
        max_num_seqs=run.max_num_seqs,
    )
    notes = [
        *step_notes(steps, min_requests),
        *evidence_notes(
            measured,
            onset_concurrency=None if onset is None else onset.concurrency,
            prediction=prediction,
            cut_short_detail=run.cut_short_detail if run.cut_short else None,
            died=cut_only_by_death(run, steps, death),
        ),
        *data_notes(view, trends := soak_trends(view)),  # --soak: an inconclusive trend is a caveat
        *worker_notes(view, steps),
        *([] if open_loop else level_notes(summaries, onset, (odds_low, odds_onset), levels)),
    ]
    prefix = prefix_check(
        view.settings,
        view.pool,
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
    disagreeing = [r for r in requests if reason_of(r) == USAGE_DISAGREES]
    return Verdict(
        run=run,
        steps=steps,
        levels=levels,
        preemption_onset=onset,
        kv_saturation=kv_sat,
        queueing=queueing,
        engine_death=death,
        context_overflow=context_overflow(view, run.max_model_len, death),
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
        usage_disagrees=len(disagreeing),
        usage_disagrees_example=detail_of(disagreeing[0]) if disagreeing else None,
        failure_texts=failure_texts(requests),
        refused_requests=sum(1 for r in requests if reason_of(r) in REFUSED_REASONS),
        first_unsafe_concurrency=first_unsafe_concurrency(measured, death),
        level_summaries=summaries,
        odds_onset=odds_onset,
        odds_onset_low=odds_low,
        prompt_shape=view.prompt_shape,
        other_odds_onset=other_odds[1],
        other_odds_onset_low=other_odds[0],
        other_odds_known=bool(other_level_odds),
        prefix=prefix,
        server_memory=summarize_server_memory(view),
        memory_trends=trends,
    )


def kv_peak_text(kv_usage_max: float) -> str:
    """The one way every report states the KV usage at the preemption onset (``PreemptionOnset``)."""
    return f"KV usage peaked at {kv_percent(kv_usage_max)} in that step"


def _summary(values: Sequence[int]) -> LengthSummary | None:
    return summarize_lengths(values) if values else None


def _plain(obj: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if obj is None else dict(obj)
