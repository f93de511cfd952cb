"""The verdict in words: one labelled line per finding, shared by every renderer.

Each renderer (terminal, Markdown, HTML, JUnit) shows the same findings in the same order, so the
words a user reads in CI, a PR comment and the terminal never disagree. Each finding is one function
of the verdict (``None`` when it has nothing to say); ``describe`` lists them in their order.
"""

from __future__ import annotations

from collections.abc import Sequence

from oomload.capacity.blocks import OnsetPrediction
from oomload.capacity.schedule import NO_ANSWER, RATE_LIMITED
from oomload.report.finding import NOT_JUDGED as NOT_JUDGED  # re-exported: findings.NOT_JUDGED
from oomload.report.finding import Finding, not_judged
from oomload.report.requestfindings import (
    context_overflow,
    failed_requests,
    rate_limited,
    short_responses,
    usage_disagrees,
)
from oomload.report.steptable import fmt_num
from oomload.verdict import KV_SATURATED, PreemptionOnset, StepFacts, Verdict, kv_peak_text, kv_percent
from oomload.verdict.deathcause import DeathKind
from oomload.verdict.loadgen import starved_line
from oomload.verdict.recommend import Recommendation

NEAR_LIMIT_SHARE = 0.9  # a peak at 90 % of the server's memory limit is worth a warning


def describe(verdict: Verdict, recommendation: Recommendation) -> list[Finding]:
    """The findings of a verdict, most important first."""
    found = [
        run_status(verdict),
        prompt_shape(verdict),
        prefix_cache(verdict),
        preemption_onset(verdict),
        engine_death(verdict),
        server_memory(verdict),
        *memory_trends(verdict),
        kv_saturation(verdict),
        queueing(verdict),
        context_overflow(verdict),
        short_responses(verdict),
        usage_disagrees(verdict),
        rate_limited(verdict),
        failed_requests(verdict),
        load_delivered(verdict),
        load_generator(verdict),
        last_safe(verdict),
        trace_odds(verdict),
        prediction(verdict),
        Finding("recommendation", "Recommendation", recommendation.flag_line, "info"),
        confidence(verdict),
    ]
    return [f for f in found if f is not None]


def run_status(verdict: Verdict) -> Finding:
    run = verdict.run
    if verdict.failed_run is not None:
        stopped = f"; {_unloaded_words(verdict)}" if run.end_reason in (NO_ANSWER, RATE_LIMITED) else ""
        return Finding("run_status", "Run", f"NOTHING TO JUDGE: {verdict.failed_run}{stopped}", "bad")
    if run.cut_short:
        return Finding("run_status", "Run", f"CUT SHORT: {run.cut_short_detail}", "warn")
    if run.end_reason in (NO_ANSWER, RATE_LIMITED):
        return Finding("run_status", "Run", f"complete: {_unloaded_words(verdict)}", "warn")
    reason = "" if run.end_reason in (None, "completed") else f" ({run.end_reason})"
    return Finding("run_status", "Run", f"complete{reason}", "ok")


def _unloaded_words(verdict: Verdict) -> str:
    """Where the run stopped on a step that did not load the engine (``capacity.schedule``, "No answer",
    "Rate limit"): the step the driver ended at once, or the first one a limit turned requests away in."""
    if verdict.run.end_reason == NO_ANSWER:
        stop = next((s for s in verdict.steps if s.end_reason == NO_ANSWER), None)
        why = "no request that ended there was answered, so more load would only send more of the same"
    else:
        stop = next((s for s in verdict.steps if s.rate_limited), None)
        why = (
            "a limit in front of the engine turned requests away there, so the levels above would measure it"
        )
    where = "" if stop is None else f" at concurrency {stop.concurrency} (step {stop.index})"
    see = "Rate limit" if stop is not None and stop.rate_limited else "Failed requests"
    return f"the run stopped{where}: {why} ({see})"


def prompt_shape(verdict: Verdict) -> Finding | None:
    """Which traffic the run measured: production shape (shared prefixes) or the worst case."""
    check = verdict.prefix
    if check is None:
        return None
    if check.problem is not None:
        return Finding("prompt_shape", "Prompt shape", f"{check.words} — {check.problem}", "bad")
    why = check.why_distinct
    text = check.words if why is None or why == "--distinct-prompts" else f"{check.words} ({why})"
    return Finding("prompt_shape", "Prompt shape", text, "info")


def prefix_cache(verdict: Verdict) -> Finding | None:
    """The server's own prefix-cache hit rate beside the trace's expected one, per measured step."""
    check = verdict.prefix
    if check is None or (check.server_rate is None and not check.expected_rate):
        return None

    def pct(value: float | None) -> str:
        return "?" if value is None else f"{value:.0%}"

    head = f"server {pct(check.server_rate)}, trace expects {pct(check.expected_rate)}"
    measured = [s for s in check.steps if s.server_rate is not None or s.expected_rate is not None]
    pairs = {(pct(s.server_rate), pct(s.expected_rate)) for s in measured}
    if pairs == {(pct(check.server_rate), pct(check.expected_rate))}:  # a list would repeat the head
        text = head if len(measured) == 1 else f"{head} at every step"
    else:
        per_step = [f"c{s.concurrency} {pct(s.server_rate)}/{pct(s.expected_rate)}" for s in measured]
        text = head + (" (per step, server/expected: " + ", ".join(per_step) + ")" if per_step else "")
    return Finding("prefix_cache", "Prefix-cache hits", text, "warn" if check.problem else "info")


OPEN_LOOP_NOT_COMPARED = "not compared: an open loop's requests in flight followed the arrivals, not levels"


def preemption_onset(verdict: Verdict) -> Finding:
    onset = verdict.preemption_onset
    if onset is None and (unjudged := not_judged(verdict, "preemption_onset", "Preemption onset")):
        return unjudged
    if onset is not None:
        kv = "" if onset.kv_usage_max is None else f", {kv_peak_text(onset.kv_usage_max)}"
        where = f"concurrency {onset.concurrency}{_held(verdict, onset.step)}{_seen(onset)}"
        if verdict.run.open_loop:  # the level only capped the arrivals' requests in flight
            step = _step(verdict, onset.step)
            mean = "" if step is None else f", {fmt_num(step.achieved_concurrency)} in flight on average"
            where = f"in the open loop (cap {onset.concurrency}{mean})"
        return Finding(
            "preemption_onset",
            "Preemption onset",
            f"{where} — step "
            f"{onset.step}, {_count(onset.requests_in_step, 'request')}, "
            f"{_count(onset.preemptions_in_step, 'preemption')}{kv}",
            "bad",
        )
    if not verdict.preemptions_observed:
        return Finding("preemption_onset", "Preemption onset", "unobserved (no /metrics scrape)", "warn")
    judged = verdict.preemption_judged_up_to
    if judged is None:
        text = "none seen, but no level was judged (no trusted clean step decided the requests it needed)"
        return Finding("preemption_onset", "Preemption onset", text, "warn")
    if sporadic := verdict.preempted_levels:
        seen = "; ".join(lv.preempted_text for lv in sporadic)
        text = f"none in most repeats up to concurrency {judged}, but preempted {seen}: sporadic, not safe"
        return Finding("preemption_onset", "Preemption onset", text, "warn")
    return Finding("preemption_onset", "Preemption onset", f"none up to concurrency {judged}", "ok")


def engine_death(verdict: Verdict) -> Finding:
    death = verdict.engine_death
    if death is None:
        return not_judged(verdict, "engine_death", "OOM / engine death") or Finding(
            "engine_death", "OOM / engine death", f"none{_up_to(verdict)}", "ok"
        )
    where = "at an unknown step" if death.concurrency is None else f"at concurrency {death.concurrency}"
    cause = death.cause
    if cause is not None and cause.kind is not DeathKind.NO_CAUSE:
        label = "engine death (OOM)" if death.memory else "engine death (not of memory)"
        text = f"{label} {where} — {cause.sentence}; seen as: {death.evidence[0]}"
    else:
        kind = "CUDA OOM / engine death" if death.real_oom else "engine death"
        text = f"{kind} {where} — {death.evidence[0]}"
        if cause is not None:  # what was looked at, and what was missing
            text += f"; {cause.sentence}"
    rise = (
        None
        if death.step is None or verdict.server_memory is None
        else verdict.server_memory.rise_text(death.step)
    )
    if rise is not None:
        text += f"; {rise}"
    if death.casualty_text is not None:
        text += f"; {death.casualty_text}"
    return Finding("engine_death", "OOM / engine death", text, "bad")


def server_memory(verdict: Verdict) -> Finding | None:
    """The server's own host memory: its peak against its limit (``None`` when it was not sampled)."""
    memory = verdict.server_memory
    if memory is None:
        return None
    near = _near(memory.peak_bytes, memory.limit_bytes) or _near(
        memory.data_peak_bytes, memory.data_limit_bytes
    )
    severity = "bad" if memory.oom_kills else ("warn" if near or memory.peak_bytes is None else "info")
    return Finding("server_memory", "Server memory", memory.summary_text, severity)


def _near(peak_bytes: int | None, limit_bytes: int | None) -> bool:
    """A peak within ``NEAR_LIMIT_SHARE`` of its limit (``False`` when either is unknown)."""
    return peak_bytes is not None and limit_bytes is not None and peak_bytes >= NEAR_LIMIT_SHARE * limit_bytes


def memory_trends(verdict: Verdict) -> list[Finding]:
    """A soak's memory trends, one finding each: growth is bad, an inconclusive answer a warning (it is
    no pass), memory that rose and levelled off worth knowing (no leak), flat or shrinking fine."""
    severity = {"growing": "bad", "inconclusive": "warn", "levelled": "info"}
    return [
        Finding(f"memory_trend_{i}", "Memory trend (soak)", t.sentence, severity.get(t.verdict, "ok"))
        for i, t in enumerate(verdict.memory_trends)
    ]


SUSTAINED_WORDS = "≥ 99 % in two scrapes in a row"  # the rule of ``oomload.verdict.gauges``


def kv_saturation(verdict: Verdict) -> Finding:
    """The lowest level whose KV usage stayed saturated (``SUSTAINED_WORDS``); a peak of 99 % or more in
    single scrapes only is named as not sustained, so it never reads beside "peaked at 99%" as not seen."""
    level = verdict.kv_saturation
    label = "KV saturation (≥99 %)"
    if level is None:
        if unjudged := not_judged(verdict, "kv_saturation", label):
            return unjudged
        touched = [s for s in verdict.measured_steps if (s.kv_usage_max or 0.0) >= KV_SATURATED]
        if not touched:
            return Finding("kv_saturation", label, f"not seen (never {SUSTAINED_WORDS})", "ok")
        first = min(touched, key=lambda s: (s.concurrency, s.index))
        text = (
            f"not sustained: KV usage reached {kv_percent(first.kv_usage_max or 0.0)} at concurrency "
            f"{first.concurrency} (step {first.index}) in single scrapes, never {SUSTAINED_WORDS}"
        )
        return Finding("kv_saturation", label, text, "info")
    return Finding(
        "kv_saturation", label, f"concurrency {level.concurrency} ({kv_percent(level.value)})", "warn"
    )


def queueing(verdict: Verdict) -> Finding:
    level = verdict.queueing
    label = "Queueing (waiting > 0)"
    if level is None:
        return not_judged(verdict, "queueing", label) or Finding("queueing", label, "not seen", "ok")
    step = _step(verdict, level.step)
    depth = (
        f"{level.value:.1f} waiting on average, by vLLM's queue time"
        if step is not None and step.queued_by_mean
        else f"{level.value:.0f} waiting"
    )
    return Finding("queueing", label, f"concurrency {level.concurrency} ({depth})", "warn")


def last_safe(verdict: Verdict) -> Finding:
    label = "Last safe concurrency"
    if verdict.run.open_loop:
        text = (
            "not measured: an open loop replays the trace's arrival times, so its level only capped the "
            "requests in flight (Load delivered)"
        )
        return Finding("last_safe", label, text, "info")
    safe = verdict.last_safe_concurrency
    if safe is not None:
        return Finding("last_safe", label, f"{safe}{_why_not_higher(verdict)}", "ok")
    if verdict.engine_death is None and (unjudged := not_judged(verdict, "last_safe", label)):
        return unjudged  # failures of a run that never loaded the engine break no level of it
    first_unsafe = verdict.first_unsafe_concurrency
    below = [
        s
        for s in verdict.measured_steps
        if s.requests and (first_unsafe is None or s.concurrency < first_unsafe)
    ]
    if first_unsafe is not None and not below:  # a failure in an untrusted step is still a failure
        return Finding("last_safe", label, f"none (the lowest level already broke, at {first_unsafe})", "bad")
    untrusted = [d for s in below if (d := s.distrust) is not None]
    if untrusted:
        more = f" (+{len(untrusted) - 2} more)" if len(untrusted) > 2 else ""
        return Finding("last_safe", label, "unknown: " + "; ".join(untrusted[:2]) + more, "warn")
    trusted = [s.concurrency for s in verdict.measured_steps if s.requests and s.trusted]
    if not trusted:
        return Finding("last_safe", label, "unknown (no completed step with requests)", "warn")
    if not any(s.trusted and s.preemptions is not None for s in below) and verdict.unobserved_levels:
        levels = _levels(verdict.unobserved_levels)
        text = f"unknown: preemption was not observable at {levels} (no /metrics scrape)"
        return Finding("last_safe", label, text, "warn")
    lowest = min(trusted)
    queueing = verdict.queueing
    if queueing is not None and queueing.concurrency <= lowest:  # waiting is no breakage: say which
        text = (
            f"none: requests queued in vLLM from {queueing.concurrency}, the lowest level tested (nothing "
            "broke, but a level that queues does not run its concurrency in the engine); test lower levels"
        )
        return Finding("last_safe", label, text, "warn")
    if any(lv.evidence_thin for lv in verdict.level_summaries if lv.concurrency == lowest):
        return Finding("last_safe", label, f"none: not enough evidence at {lowest}, the lowest level", "warn")
    return Finding("last_safe", label, "none (no level qualified)", "warn")


def prediction(verdict: Verdict) -> Finding | None:
    p = verdict.prediction
    if p is None:
        return None
    a = p.arithmetic
    band = _band(p.band_low, p.band_high)  # "32", not "32–32"
    apart = "" if p.levels_apart is None else f", {p.levels_apart} level(s) apart"
    agree = "disagrees" if p.disagrees else "agrees"
    if verdict.run.open_loop:
        compared = OPEN_LOOP_NOT_COMPARED
    elif p.observed_onset is not None:
        compared = f"observed {p.observed_onset}: {agree}{apart}"
    elif not p.expects_onset and p.highest_clean is not None:
        compared = f"none observed up to {p.highest_clean}: agrees"
    elif p.highest_clean is None:
        compared = "no trusted level without preemption to compare"
    elif not p.reached:
        compared = (
            f"not reached: the run completed levels up to concurrency {p.highest_clean}, below the "
            f"predicted onset band {band} (no comparison possible)"
        )
    else:
        compared = f"no onset up to {p.highest_clean}: {agree}{apart}"
    basis = "the requests sent" if p.basis == "requests" else "the trace"
    other = "" if p.other is None else f"; {OTHER_SHAPE_WORDS[a.shape]} {_band(*p.other.band)}"
    onset = (
        f"onset {band} {SHAPE_WORDS[a.shape]} ({band_figures(a)}{other})"
        if p.expects_onset
        else f"no onset: {p.no_onset_reason(band)}"
    )
    return Finding(
        "prediction",
        "Arithmetic",
        f"{a.num_gpu_blocks} blocks × {a.block_size} tokens, lengths of {basis} → {onset}; {compared}",
        "warn" if p.disagrees else "info",
    )


def band_figures(a: OnsetPrediction) -> str:
    """The onsets an arithmetic band is made of, each named once where it differs from the mean request's:
    ``P90-length 6, mean-length 11, P50-length 15, decode phases spread 12`` (``OnsetPrediction.band``)."""
    figures: list[tuple[str, int | None]] = [
        ("P90-length", a.onset_p90),
        ("mean-length", a.onset_mean),
        ("P50-length", a.onset_p50),
        ("decode phases spread", a.onset_spread),
    ]
    return ", ".join(
        f"{name} {onset}"
        for name, onset in figures
        if onset is not None and (name == "mean-length" or onset != a.onset_mean)
    )


# How a prediction names the prompts it assumed, and the other shape beside it (capacity.PromptShape).
SHAPE_WORDS = {"production": "with shared prefixes", "worst-case": "with distinct prompts"}
OTHER_SHAPE_WORDS = {
    "production": "worst case, nothing shared:",
    "worst-case": "with the trace's shared prefixes:",
}


def _levels(levels: Sequence[int]) -> str:
    return ", ".join(map(str, levels))


def _band(low: int | None, high: int | None) -> str:
    if high is None:
        return "none"
    return str(high) if low in (None, high) else f"{low}–{high}"


def confidence(verdict: Verdict) -> Finding:
    warnings = [n for n in verdict.notes if n.severity == "warning"]
    conf = verdict.confidence + (f" — {len(warnings)} caveat(s)" if warnings else "")
    severity = {"high": "ok", "medium": "info"}.get(verdict.confidence, "warn")
    return Finding("confidence", "Confidence", conf, severity)


def _up_to(verdict: Verdict) -> str:
    top = verdict.max_tested_concurrency
    return f" up to concurrency {top}" if top is not None else ""


def load_delivered(verdict: Verdict) -> Finding:
    """Whether the server held the load each level asked for, by its own counters (``serverside``)."""
    label = "Load delivered"
    if verdict.run.open_loop:  # the arrivals set the load: there was no level to hold
        held = "; ".join(
            f"{fmt_num(s.achieved_concurrency)} in flight on average in step {s.index} (cap {s.concurrency})"
            for s in verdict.measured_steps
            if s.requests
        )
        text = "an open loop: the trace's arrival times set the load" + (f" — {held}" if held else "")
        return Finding("load_delivered", label, text, "info")
    if unjudged := not_judged(verdict, "load_delivered", label):
        return unjudged  # requests that fail at once leave few in flight: that is no finding of its own
    # a step whose requests mostly failed (Failed requests) or were turned away by a limit in front of the
    # engine (Rate limit) is no evidence already, its level held or not
    steps = [
        s
        for s in verdict.measured_steps
        if s.requests and not s.reached_at_death and not s.mostly_failed and not s.rate_limited
    ]
    short = [s for s in steps if s.concurrency_held is False]
    if short:
        worst = min(short, key=lambda s: (s.delivered_concurrency or 0.0) / s.concurrency)
        bottleneck = [s for s in short if s.server_bottleneck]
        text = f"{len(short)} of {len(steps)} level(s) not held: " + "; ".join(
            _delivery(s)
            for s in sorted({s.index: s for s in (worst, *short[:2])}.values(), key=lambda s: s.index)
        )
        if bottleneck:
            text += (
                " — the server saw less than the client sent: the API server or the client host is the "
                "bottleneck, so these levels say little about the engine's KV cache"
            )
        return Finding("load_delivered", label, text, "warn")
    measured = [s for s in steps if s.server_share is not None]
    if not measured:
        return Finding(
            "load_delivered",
            label,
            "held at the client; the server's side unknown (no latency sums in /metrics, or steps too "
            "short: fewer than 3 rounds of requests ended in each)",
            "info",
        )
    low = min(measured, key=lambda s: (s.delivered_concurrency or 0.0) / s.concurrency)
    return Finding(
        "load_delivered",
        label,
        f"every level held, by vLLM's own counters (lowest: {_delivery(low)})",
        "ok",
    )


def load_generator(verdict: Verdict) -> Finding | None:
    """The steps whose client could not send (``oomload.verdict.loadgen``), with what to do; ``None``
    when no step was starved."""
    starved = [(s, found) for s in verdict.measured_steps if (found := s.starvation) is not None]
    if not starved:
        return None
    text = "; ".join(starved_line(s.index, found) for s, found in starved)
    return Finding("load_generator", "Load generator", text, "warn")


def _delivery(s: StepFacts) -> str:
    """``concurrency 4: client 3.9, server 2.1`` (server: vLLM's counters, when known; a level held only
    because the server queued through it says so: the queue decided, not the figures)."""
    server = "" if s.server_share is None else f", server {fmt_num(s.delivered_concurrency)}"
    if s.held_by_saturation:  # the figures alone are below the line: the queue is what decided
        server += f", held: requests waited in vLLM in {s.waiting_share or 0.0:.0%} of its scrapes"
    return f"concurrency {s.concurrency} (step {s.index}): client {fmt_num(s.achieved_concurrency)}{server}"


def _step(verdict: Verdict, index: int) -> StepFacts | None:
    return next((s for s in verdict.steps if s.index == index), None)


def _held(verdict: Verdict, step_index: int) -> str:
    """``", the server held 1.6"`` when the step did not hold its level (the figure that decided, and
    whose), else nothing."""
    step = _step(verdict, step_index)
    text = None if step is None else step.held_text
    return "" if text is None else f", {text}"


def _seen(onset: PreemptionOnset) -> str:
    """``" (seen at 7 in 3 of 3)"`` when the level was measured more than once."""
    return "" if onset.measurements <= 1 else f" ({onset.seen_text})"


def _why_not_higher(verdict: Verdict) -> str:
    """Why the last safe level is not the one below the onset: queueing, thin evidence, sporadic."""
    safe = verdict.last_safe_concurrency
    if safe is None:
        return ""
    reasons = []
    if verdict.queueing is not None and verdict.queueing.concurrency == min(
        (lv.concurrency for lv in verdict.level_summaries if lv.concurrency > safe), default=None
    ):
        reasons.append(f"queueing began at {verdict.queueing.concurrency}")
    thin = [lv.concurrency for lv in verdict.level_summaries if lv.concurrency > safe and lv.evidence_thin]
    first_unsafe = verdict.first_unsafe_concurrency
    thin = [c for c in thin if first_unsafe is None or c < first_unsafe]
    if thin:
        reasons.append(f"not enough evidence at {_levels(thin)}")
    unobserved = [
        c for c in verdict.unobserved_levels if c > safe and (first_unsafe is None or c < first_unsafe)
    ]
    if unobserved:
        reasons.append(f"preemption not observable at {_levels(unobserved)} (no /metrics scrape)")
    onset = verdict.preemption_onset
    sporadic = [
        lv.concurrency
        for lv in verdict.preempted_levels
        if lv.concurrency > safe and (onset is None or lv.concurrency < onset.concurrency)
    ]
    if sporadic:
        reasons.append(f"sporadic preemption at {sporadic[0]}")
    return "" if not reasons else f" ({'; '.join(reasons)})"


def trace_odds(verdict: Verdict) -> Finding | None:
    """The trace's odds on the server's pool beside what the run saw (``oomload.capacity.odds``)."""
    with_odds = [lv for lv in verdict.level_summaries if lv.odds is not None]
    if not with_odds:
        return None
    parts = [  # the levels where either side saw preemption at all
        f"{lv.concurrency}: {lv.odds.per_100:.1f} vs {fmt_num(lv.preemptions_per_100, '.1f')}"
        for lv in with_odds
        if lv.odds is not None and (lv.odds.per_100 >= 0.05 or lv.steps_preempted)
    ]
    onset = verdict.preemption_onset
    if onset is None and (unjudged := not_judged(verdict, "trace_odds", "The trace's odds")):
        return unjudged
    low, high = verdict.odds_onset_low, verdict.odds_onset
    top = max(lv.concurrency for lv in with_odds)
    odds_onset = f"no onset up to {top}" if high is None else f"onset {_band(low, high)}"
    if verdict.run.open_loop:
        text = f"{odds_onset} {SHAPE_WORDS[verdict.prompt_shape]}; {OPEN_LOOP_NOT_COMPARED}"
        return Finding("trace_odds", "The trace's odds", text, "info")
    observed = "none observed" if onset is None else f"observed {onset.concurrency}"
    apart = verdict.odds_levels_apart
    disagree = [lv for lv in with_odds if lv.agreement not in (None, "agrees")]
    if apart is not None and apart > 1:
        verdict_word, status = "DISAGREES", "warn"
    elif disagree:  # the onsets agree (or none was seen): name the levels that do not
        by_word: dict[str, list[str]] = {}
        for lv in disagree:
            by_word.setdefault(str(lv.agreement), []).append(str(lv.concurrency))
        levels = "; ".join(f"{word} at {', '.join(at)}" for word, at in by_word.items())
        verdict_word = f"{'' if onset is None else 'the onset agrees, but '}DISAGREES ({levels})"
        status = "warn"
    else:
        verdict_word, status = "agrees", "ok"
    other = ""
    if verdict.other_odds_known:
        other_onset = _band(verdict.other_odds_onset_low, verdict.other_odds_onset)
        other = f" ({OTHER_SHAPE_WORDS[verdict.prompt_shape]} {other_onset})"
    text = (
        f"{odds_onset} {SHAPE_WORDS[verdict.prompt_shape]}{other} (≥ 1 preemption per 100 requests), "
        f"{observed}: {verdict_word}"
    ) + ("" if not parts else f"; preemptions per 100 requests, odds vs seen — {', '.join(parts)}")
    return Finding("trace_odds", "The trace's odds", text, status)


def _count(n: int, noun: str) -> str:
    """``1 preemption``, ``3 preemptions``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
