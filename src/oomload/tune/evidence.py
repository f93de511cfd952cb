"""Did a candidate's replay hold the target — or, for a capped candidate, its cap? (pure)

A proof is evidence about the server's memory only when the server really held what the setting
admits. Read from the replay's ``summary.json`` steps at the target (``judge_target``):

* **Uncapped** (``max_num_seqs`` ≥ the target, or not set): the step held when the client delivered
  at least 80 % of the target (``stepfacts``: ``concurrency_held``), or vLLM queued what it did not
  run (saturation) while the load generator had its CPU. A step held only by vLLM's queue while the
  load generator was starved (``verdict.loadgen``: ``starved``) is no evidence: that queue may be the
  client's own burst of late sends.
* **Capped** (``max_num_seqs`` below the target): the server admits at most its cap, so what the pool
  must hold is the cap, not the target, and the client's concurrency is not the question. The step
  held when the engine ran at its cap: ``vllm:num_requests_running`` reached the cap, and the rest
  waited (requests waiting in two consecutive scrapes) — no preemption is the proof's own test. When
  the load generator was starved that queue may be its own burst, so the server's mean must say it
  instead: by Little's law on vLLM's inference-time sum (``serverside``: ``in_engine``) the engine ran
  at least 80 % of its cap on average. (That mean alone is not the rule: over a step of a few request
  lifetimes it reads low from edge effects — the simulator at cap 25, 4.6 waiting throughout, read
  19.4, 78 %.)

Either way the step must have completed and been mostly answered (``cut_short``, ``mostly_failed``).
A step that did not hold is *no evidence*: not "carries", not "does not carry". When its load
generator was starved (``verdict.loadgen``'s rule: not delivered and a CPU wait ≥ 50 % or a loop lag
≥ 100 ms) the load host is what limited the step, and ``starved`` names the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oomload.rundir.summary import Starved, StepSummary
from oomload.verdict.loadgen import Starvation
from oomload.verdict.stepfacts import ACHIEVED_CONCURRENCY_MIN_SHARE

CAP_HELD_SHARE = ACHIEVED_CONCURRENCY_MIN_SHARE  # the engine ran ≥ 80 % of its cap on average


@dataclass(frozen=True, slots=True)
class TargetEvidence:
    """What the steps at the target showed about whether they held (module docstring)."""

    held: bool
    how: str  # in words: what held, or what did not
    starved: str | None = None  # the load generator's figures when it was starved (no evidence)
    running_max: int | None = None  # vLLM's most requests running at once over the steps


def judge_target(
    steps: Sequence[StepSummary], target: int, cap: int | None, failed_run: str | None = None
) -> TargetEvidence:
    """Whether the target's steps held (module docstring); no steps: no evidence. ``failed_run`` is the
    replay's sentence when the whole run was nothing to judge (``Verdict.failed_run``): what a step
    whose requests mostly failed says of why."""
    if not steps:
        return TargetEvidence(False, f"no step at {target} ran")
    judged = [_judge(s, target, cap, failed_run) for s in steps]
    running = [s.running_max for s in steps if s.running_max is not None]
    running_max = max(running) if running else None
    failed = next((j for j in judged if not j.held), None)
    if failed is not None:
        return TargetEvidence(False, failed.how, failed.starved, running_max)
    return TargetEvidence(True, "; ".join(j.how for j in judged), None, running_max)


def _judge(step: StepSummary, target: int, cap: int | None, failed_run: str | None) -> TargetEvidence:
    starved = _starved_text(step.starved)
    if step.cut_short:
        return TargetEvidence(False, f"the step at {target} was cut short ({step.end_reason})")
    if step.mostly_failed:  # the run's sentence says why (an unloaded server, or answers not the trace's)
        why = failed_run or f"most requests at {target} failed, so the step is no evidence"
        return TargetEvidence(False, why)
    if cap is not None and cap < target:
        return _judge_capped(step, cap, starved)
    held = step.concurrency_held
    if held is None:
        held = step.trusted  # an older summary: its own word
    if held and starved is not None:  # held by vLLM's queue only, the client starved: maybe its own burst
        held = False
    delivered = step.delivered_concurrency
    shown = "?" if delivered is None else f"{delivered:.1f}"
    if held:
        return TargetEvidence(True, f"held {shown} of {target}")
    who = "the load generator was starved" if starved else "the level was not delivered"
    return TargetEvidence(False, f"{who}: {shown} of {target} in flight", starved)


def _judge_capped(step: StepSummary, cap: int, starved: str | None) -> TargetEvidence:
    running, in_engine, queued = step.running_max, step.server_in_engine, step.server_queued
    at_cap = running is not None and running >= cap
    waited = step.waiting_sustained
    by_mean = in_engine is not None and in_engine >= CAP_HELD_SHARE * cap
    ran = at_cap and ((waited > 0 and starved is None) or by_mean)
    mean = "" if in_engine is None else f", {in_engine:.1f} on average"
    mean += f", {waited} waiting in consecutive scrapes" if queued is None else f", {queued:.1f} waiting"
    shown = f"up to {'?' if running is None else running} running{mean}"
    if ran:
        return TargetEvidence(True, f"the server ran its cap {cap} ({shown})")
    who = "the load generator was starved" if starved else "the server did not run its cap"
    return TargetEvidence(False, f"{who}: cap {cap}, {shown}", starved)


def _starved_text(starved: Starved | None) -> str | None:
    if starved is None:
        return None
    return Starvation(starved.wait_share, starved.loop_lag_max_ms, starved.worker).text
