"""How far to trust a verdict: notes on weak evidence, and one confidence level (pure).

Warnings (they lower the level):

* ``no_steps`` — no measured step; ``cut_short`` — the run was cut short (by Ctrl-C, the time limit,
  an error, a kill of the server from outside: levels the schedule asked for are missing. A run
  ended by any other engine death is information instead: the death is the finding, and the steps
  before it stand);
* ``few_requests`` — a step decided fewer requests than the schedule's ``min_requests``;
* ``requests_failed`` — a step's requests mostly failed (``StepFacts.mostly_failed``): it is no
  evidence; ``run_failed`` — the run's requests mostly failed (``Verdict.failed_run``): nothing to judge;
* ``rate_limited`` — a limit in front of the engine turned a step's requests away (HTTP 429 or
  a 503 not vLLM's own, ``StepFacts.rate_limited``): its level did not reach the engine, so it is no evidence;
* ``concurrency_not_held`` — the delivered concurrency below 80 % of the target (the note names the
  figure that decided: the server's when its counters scaled the client's mean down, else the load
  generator's; a saturated server holds its level, ``StepFacts.server_saturated``);
  ``loadgen_starved`` — a step whose client delivered below that line while its load generator
  waited for a CPU or for its event loop (``oomload.verdict.loadgen``; also when vLLM's queue held
  the level): the client could not send, with what to do;
* ``metrics_missing`` — a step (or the whole run) without a successful ``/metrics`` scrape;
* ``non_monotone`` — a clean level above the onset; ``noisy_repeat`` — repeats at one level disagree
  (one step at a level is one draw of the trace: the onset is what most repeats saw, ``oomload.verdict``);
  both read the conclusive steps only (``StepFacts.conclusive``: a clean step that was not trusted or
  was short of the odds' evidence is no vote);
* ``sporadic_preemption`` — a level below the onset (or in a run with none) preempted in fewer than
  half of its steps;
* ``thin_evidence`` — a clean level sent fewer requests than the trace's odds need to trust it;
* ``odds_disagree_level`` — a level's observation was < 1 % likely by the trace's odds;
  ``odds_disagree`` — the observed onset is more than one measured level from the odds' onset;
* ``prediction_disagrees`` — the onset is more than one grid level from the arithmetic band;
* ``config_unreadable`` — ``config.json`` is not a readable JSON object; ``steps_missing`` — ``steps.jsonl``
  is missing or empty, so the steps were rebuilt from the requests (``runview.REBUILT_FROM_REQUESTS``);
* ``metrics_invalid`` — ``/metrics`` exposed a value no vLLM can (a KV usage of 7.5, waiting −3;
  ``metrics_invalid`` events): those samples were left out, and the server's other figures are suspect;
* ``worker_lost`` — a Locust worker of a distributed run was lost during a step (the others took
  over its users, or the run ended): that step's load changed under it;
* ``soak_inconclusive`` — a ``--soak`` memory trend is ``inconclusive`` (``oomload.verdict.trend``):
  the soak, whose question that is, did not answer it.

Information (no effect on the level): ``transport_errors`` (client-side, not casualties of an engine
death), ``preemption_counter_mismatch``, ``after_death`` (a step that measured a dead server),
``held_until_death`` (the step the engine died in, below the line only because the death ended it:
its level was in flight when it died, ``StepFacts.reached_at_death``),
``cancelled`` (requests oomload abandoned), ``no_cache_config``, ``no_trace``, ``unassigned_requests``.

Level: **high** without warnings; **low** with a critical warning (``no_steps``, ``non_monotone``,
``prediction_disagrees``, ``odds_disagree``, ``run_failed``, run-wide ``metrics_missing``) or any
warning on a step at the onset or last-safe level; **medium** otherwise — so repeats that disagree,
sporadic preemption, thin evidence at the boundary or one level against the odds each lower a
verdict to medium.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oomload.outcome import Outcome
from oomload.rundir.records import EventRow
from oomload.verdict.death import step_at
from oomload.verdict.loadgen import starved_line
from oomload.verdict.prediction import Prediction
from oomload.verdict.runview import REBUILT_FROM_REQUESTS, RunView
from oomload.verdict.stepfacts import ACHIEVED_CONCURRENCY_MIN_SHARE, StepFacts, ran_tally
from oomload.verdict.trend import MemoryTrend

CRITICAL = frozenset(
    {"no_steps", "non_monotone", "prediction_disagrees", "odds_disagree", "run_failed", "prefix_mismatch"}
)


@dataclass(frozen=True, slots=True)
class ConfidenceNote:
    kind: str
    message: str
    step: int | None = None
    severity: str = "warning"  # "warning" or "info"


def step_notes(steps: Sequence[StepFacts], min_requests: int) -> list[ConfidenceNote]:
    """Per-step caveats of every step (measured or not: a step after the death is named too)."""
    notes: list[ConfidenceNote] = []
    for s in steps:
        where = f"step {s.index} (concurrency {s.concurrency})"
        if s.counter_mismatch is not None:
            deltas, counter = s.counter_mismatch
            text = f"preemption deltas sum to {deltas} but the counter rose by {counter}"
            notes.append(_info("preemption_counter_mismatch", f"{where}: {text}; using {s.preemptions}", s))
        if s.after_death:
            text = "started after the engine died; its results are left out"
            notes.append(_info("after_death", f"{where} {text}", s))
        if s.warmup or s.after_death:
            continue
        if s.decided_requests < min_requests:
            text = f"finished only {s.decided_requests} request(s) (< {min_requests})"
            notes.append(_warn("few_requests", f"{where} {text}; its numbers are anecdotal", s))
        if s.mostly_failed:
            notes.append(_warn("requests_failed", f"{where}: {s.failed_text}; it is no evidence", s))
        if s.rate_limited:
            notes.append(_warn("rate_limited", f"{where}: {s.rate_limited_text}; it is no evidence", s))
        if s.concurrency_held is False and s.reached_at_death:  # the death cut the mean, not the client
            text = (
                f"{where}: the engine died with {s.in_flight_at_death} requests in flight, so the level was "
                f"reached; {s.not_held_text} because the death ended the step"
            )
            notes.append(_info("held_until_death", text, s))
        elif s.concurrency_held is False and not (s.mostly_failed or s.rate_limited):  # few are in flight
            # the text names the figure that decided, and whose it is
            share = f"{ACHIEVED_CONCURRENCY_MIN_SHARE:.0%}"
            below = f"below {share} of the target {s.concurrency}{s.queue_limit_text}"
            text = f"{where}: {s.not_held_text}, {below}: not trusted"
            notes.append(_warn("concurrency_not_held", text, s))
        if (found := s.starvation) is not None:  # the client's doing, not the server's
            notes.append(_warn("loadgen_starved", starved_line(s.index, found), s))
        transport = s.independent(Outcome.TRANSPORT_ERROR)
        if transport:
            text = f"{transport} client-side transport error(s) (connection reset before an answer)"
            notes.append(_info("transport_errors", f"{where}: {text} — not counted against the server", s))
        if s.cancelled_requests:
            text = f"{s.cancelled_requests} request(s) abandoned by oomload in flight (end of run, Ctrl-C)"
            notes.append(_info("cancelled", f"{where}: {text} — neither ok nor error", s))
    return notes


def evidence_notes(
    measured: Sequence[StepFacts],
    *,
    onset_concurrency: int | None,
    prediction: Prediction | None,
    cut_short_detail: str | None,
    died: bool = False,
) -> list[ConfidenceNote]:
    """Run-wide caveats about the onset and its evidence (``measured``: non-warmup, before death)."""
    notes: list[ConfidenceNote] = []
    if not measured:
        notes.append(ConfidenceNote("no_steps", "no measured (non-warmup) step: there is nothing to judge"))
    if (tally := ran_tally(measured)).nothing_to_judge:
        what = f"{tally.failed} of {tally.ran} requests failed" if tally.ran else "no request ran"
        notes.append(ConfidenceNote("run_failed", f"{what}: nothing to judge (Run)"))
    if cut_short_detail is not None:
        text = f"the run was cut short: {cut_short_detail}"
        notes.append(ConfidenceNote("cut_short", text, severity="info" if died else "warning"))
    with_metrics = [s for s in measured if s.preemptions is not None]
    if measured and not with_metrics:
        text = "no /metrics scrape reported preemptions: preemption and KV usage are unobserved"
        notes.append(ConfidenceNote("metrics_missing", text))
    else:
        for s in measured:
            if s.preemptions is None:
                text = f"step {s.index} (concurrency {s.concurrency}) has no successful /metrics scrape"
                notes.append(_warn("metrics_missing", text, s))
    conclusive = [s for s in with_metrics if s.conclusive]  # a clean step short of evidence, or
    # not trusted, contradicts nothing
    if onset_concurrency is not None:
        above = {s.concurrency for s in conclusive if s.concurrency > onset_concurrency}
        clean_above = sorted(above - {s.concurrency for s in with_metrics if s.preemptions})
        if clean_above:
            text = (
                f"preemption appeared at concurrency {onset_concurrency} but not at "
                f"{', '.join(map(str, clean_above))}: the knee is noisy (real vLLM moves it 1–2 levels "
                "between repeats)"
            )
            notes.append(ConfidenceNote("non_monotone", text))
    by_level: dict[int, list[bool]] = {}
    for s in conclusive:
        by_level.setdefault(s.concurrency, []).append((s.preemptions or 0) > 0)
    for level, seen in sorted(by_level.items()):
        if len(set(seen)) > 1:
            text = (
                f"repeats at concurrency {level} disagree on whether it preempts "
                f"({sum(seen)} of {len(seen)} steps preempted)"
            )
            notes.append(ConfidenceNote("noisy_repeat", text))
    if prediction is not None and prediction.disagrees:
        p = prediction
        observed = "no onset" if p.observed_onset is None else f"onset {p.observed_onset}"
        pool = f"{p.arithmetic.num_gpu_blocks} blocks × {p.arithmetic.block_size} tokens"
        text = (
            f"observed {observed} is {p.levels_apart} levels from the arithmetic band "
            f"{p.band_low}–{p.band_high} ({pool}): lengths replayed differently, or the server is not "
            "what cache_config_info says"
            if p.expects_onset
            else f"observed {observed} where the arithmetic ({pool}) expects none, since {p.no_onset_cause}: "
            "lengths replayed differently, a mix of lengths packing the pool tighter than its mean, prompts "
            "prefilled in chunks into a full pool, or the server is not what cache_config_info says"
        )
        other, observed_at = p.other, p.observed_onset
        if other is not None and observed_at is not None and other.band[0] <= observed_at <= other.band[1]:
            text += (
                "; it lies in the band for distinct prompts: is the server's prefix caching off?"
                if p.arithmetic.shape == "production"
                else "; it lies in the band for the trace's shared prefixes: did the prompts share them?"
            )
        notes.append(ConfidenceNote("prediction_disagrees", text))
    return notes


def data_notes(view: RunView, trends: Sequence[MemoryTrend] = ()) -> list[ConfidenceNote]:
    """Information about what the run directory lacks, and a soak's memory trends (``trends``) that could
    not tell a leak from none."""
    notes: list[ConfidenceNote] = []
    if inconclusive := [t for t in trends if t.verdict == "inconclusive"]:
        text = (
            f"{len(inconclusive)} of the soak's {len(trends)} memory trend(s) inconclusive (Memory trend): "
            "the soak shows neither a leak nor its absence there"
        )
        notes.append(ConfidenceNote("soak_inconclusive", text))
    if view.config_note:
        text = f"{view.config_note}: model, URL, limits and the replay's order are unknown"
        notes.append(ConfidenceNote("config_unreadable", text))
    if not view.cache_config:
        text = "vllm:cache_config_info was not read: no arithmetic prediction to check the onset against"
        notes.append(ConfidenceNote("no_cache_config", text, severity="info"))
    for event in view.events:
        if event.kind == "metrics_invalid":
            text = (
                f"/metrics exposed {event.fields.get('detail')}: those samples were left out; a server "
                "(or a proxy in front of it) that reports impossible values may report the rest wrongly too"
            )
            notes.append(ConfidenceNote("metrics_invalid", text))
    if rebuilt := [d for d in view.steps if d.boundary.end_reason == REBUILT_FROM_REQUESTS]:
        text = (
            f"steps.jsonl is missing or empty: its {len(rebuilt)} step(s) were rebuilt from the requests' "
            "step and concurrency, each read as a ramp step that spanned its requests and ended on its own "
            "— a warm-up or refinement step is not told apart, a step cut short is not seen, and the step "
            "end lines' counts, odds evidence and load-generator figures are gone"
        )
        notes.append(ConfidenceNote("steps_missing", text))
    started = sum(d.boundary.started or 0 for d in view.steps)
    written = sum(len(d.requests) for d in view.steps if d.boundary.started is not None)
    if written < started:  # every request started is written, cancelled if it never ended
        text = (
            f"steps.jsonl counts {started} requests started, requests*.jsonl holds {written} of them: the "
            "rest were lost (a file cut short or removed), and the verdict reads only those it holds"
        )
        notes.append(ConfidenceNote("requests_missing", text))
    if view.unassigned_requests:
        text = f"{view.unassigned_requests} request(s) could not be placed in any step"
        notes.append(ConfidenceNote("unassigned_requests", text, severity="info"))
    if view.trace_note and not view.trace_total_tokens:
        text = f"{view.trace_note}; lengths come from the requests"
        notes.append(ConfidenceNote("no_trace", text, severity="info"))
    return notes


def worker_notes(view: RunView, steps: Sequence[StepFacts]) -> list[ConfidenceNote]:
    """One warning per Locust worker lost during the run (``worker_lost`` events), on its step."""
    notes: list[ConfidenceNote] = []
    boundaries = [d.boundary for d in view.steps]
    by_index = {s.index: s for s in steps}
    for event in view.events:
        if event.kind != "worker_lost":
            continue
        e = event.fields
        left = e.get("workers_left")
        rule = f"{left} worker(s) left took over its users" if left else "no worker was left: the run ended"
        boundary = step_at(boundaries, event.t_unix_s)
        step = None if boundary is None else by_index.get(boundary.index)
        where = "" if step is None else f" during step {step.index} (concurrency {step.concurrency})"
        text = (
            f"Locust {lost_worker(event)} was lost{where}: {e.get('detail')}; "
            f"{e.get('rows_received')} of its results were received; {rule}"
        )
        notes.append(ConfidenceNote("worker_lost", text, step=None if step is None else step.index))
    return notes


def lost_worker(event: EventRow) -> str:
    """A ``worker_lost`` event's worker, by name: ``worker 1 (10.0.0.7, pid 4711)`` (or ``local``)."""
    e = event.fields
    host = "local" if e.get("local") else e.get("host", "?")
    return f"worker {e.get('worker')} ({host}, pid {e.get('pid')})"


def confidence_level(
    notes: Sequence[ConfidenceNote], key_levels: set[int], measured: Sequence[StepFacts]
) -> str:
    """``high`` / ``medium`` / ``low`` (module docstring); ``key_levels``: onset and last safe."""
    warnings = [n for n in notes if n.severity == "warning"]
    if not warnings:
        return "high"
    if any(n.kind in CRITICAL or (n.kind == "metrics_missing" and n.step is None) for n in warnings):
        return "low"
    key_steps = {s.index for s in measured if s.concurrency in key_levels}
    if any(n.step in key_steps for n in warnings):
        return "low"
    return "medium"


def _info(kind: str, message: str, step: StepFacts) -> ConfidenceNote:
    return ConfidenceNote(kind, message, step=step.index, severity="info")


def _warn(kind: str, message: str, step: StepFacts) -> ConfidenceNote:
    return ConfidenceNote(kind, message, step=step.index)
