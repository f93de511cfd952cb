"""The step schedule: level parsing, holds, stop conditions and the bisection refinement."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.capacity.schedule import (
    Hold,
    SchedulePlan,
    StepOutcome,
    StepPlan,
    StopCondition,
    max_duration_exceeded,
    next_refine_level,
    next_step,
    no_answer,
    parse_levels,
    parse_stop_condition,
    place_levels,
    refine_bracket,
)
from oomload.errors import ConfigError

FIRST_PREEMPTION = (StopCondition("first-preemption"),)


def test_parse_levels_list_linear_geometric() -> None:
    assert parse_levels("1,2,4,8") == (1, 2, 4, 8)
    assert parse_levels("linear:2:10:4") == (2, 6, 10)
    assert parse_levels("geometric:1:100:2") == (1, 2, 4, 8, 16, 32, 64)
    assert parse_levels("geometric:1:10:1.5") == (1, 2, 3, 5, 8)


@pytest.mark.parametrize(
    "spec",
    ["", "4,2", "1,1", "0,1", "a,b", "linear:1:10", "linear:5:1:1", "geometric:1:8:1", "geometric:1:8:x"],
)
def test_parse_levels_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_levels(spec)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("foo:1:2:3", "ramp 'foo:1:2:3': unknown kind 'foo'; give linear:START:STOP:STEP"),
        ("linear:1:10:0", "concurrency 'linear:1:10:0': STEP 0 is outside 1..100,000"),
        ("0", "concurrency '0': level 0 is outside 1..100,000"),
        ("1,x", "concurrency '1,x': level 'x' is not a positive integer"),
    ],
)
def test_a_bad_spec_names_the_number_that_is_wrong(spec: str, says: str) -> None:
    """It read "'foo:1:2:3' is not a positive integer" for an unknown kind, and "0 is outside 1..100000"
    for a linear ramp's STEP, without saying which number or what kind of flag."""
    with pytest.raises(ConfigError) as err:
        parse_levels(spec)
    assert str(err.value).startswith(says)


def test_parse_stop_conditions() -> None:
    assert parse_stop_condition("first-preemption") == StopCondition("first-preemption")
    assert parse_stop_condition("error-rate:0.05") == StopCondition("error-rate", 0.05)
    assert str(parse_stop_condition("error-rate:0.05")) == "error-rate:0.05"
    for bad in ("error-rate:2", "error-rate:x", "preempt", "never:1"):
        with pytest.raises(ConfigError):
            parse_stop_condition(bad)


def test_hold_needs_time_and_count() -> None:
    hold = Hold(hold_s=5.0, min_requests=10)
    assert not hold.done(elapsed_s=6.0, completed=9)
    assert not hold.done(elapsed_s=4.0, completed=20)
    assert hold.done(elapsed_s=5.0, completed=10)
    with pytest.raises(ConfigError):
        Hold(hold_s=0.0, min_requests=0)


def _run(plan: SchedulePlan, onset: int, dead_at: int | None = None) -> tuple[list[StepOutcome], str]:
    """Drive the schedule against a server that preempts from ``onset`` on (and dies at ``dead_at``)."""
    history: list[StepOutcome] = []
    for _ in range(200):
        decision = next_step(plan, history)
        if decision.step is None:
            assert decision.end_reason is not None
            return history, decision.end_reason
        c = decision.step.concurrency
        dead = dead_at is not None and c >= dead_at
        history.append(
            StepOutcome(decision.step, completed=10, preemptions=int(c >= onset), server_dead=dead)
        )
    raise AssertionError("the schedule did not terminate")


def test_ramp_then_bisection_finds_the_onset() -> None:
    plan = SchedulePlan(levels=(1, 2, 4, 8, 16), warmup=True, stop_on=FIRST_PREEMPTION)
    history, reason = _run(plan, onset=6)
    assert [(f.step.phase, f.step.concurrency) for f in history] == [
        ("warmup", 1),
        ("ramp", 1),
        ("ramp", 2),
        ("ramp", 4),
        ("ramp", 8),
        ("refine", 6),
        ("refine", 5),
    ]
    assert [f.step.index for f in history] == list(range(7))
    assert reason == "stop_condition:first-preemption"


def test_default_oom_ramps_past_the_first_preemption_then_bisects_it() -> None:
    plan = SchedulePlan(levels=(1, 2, 4, 8, 16))
    assert plan.stop_on == (StopCondition("oom"),)
    history, reason = _run(plan, onset=6)
    assert [(f.step.phase, f.step.concurrency) for f in history] == [
        ("ramp", 1),
        ("ramp", 2),
        ("ramp", 4),
        ("ramp", 8),
        ("ramp", 16),
        ("refine", 6),
        ("refine", 5),
    ]
    assert reason == "completed"


def test_default_oom_stops_at_the_death_after_passing_the_preemption_onset() -> None:
    history, reason = _run(SchedulePlan(levels=(1, 2, 4, 8, 16, 32)), onset=3, dead_at=16)
    assert [(f.step.concurrency, f.preemptions > 0, f.server_dead) for f in history] == [
        (1, False, False),
        (2, False, False),
        (4, True, False),
        (8, True, False),
        (16, True, True),
    ]
    assert reason == "server_dead"


def test_never_ramps_through_every_level_and_no_refine_skips_bisection() -> None:
    plan = SchedulePlan(levels=(1, 2, 4, 8), refine=False, stop_on=(StopCondition("never"),))
    history, reason = _run(plan, onset=3)
    assert [f.step.concurrency for f in history] == [1, 2, 4, 8]
    assert reason == "completed"


def test_dead_server_ends_the_run_at_once() -> None:
    plan = SchedulePlan(levels=(1, 2, 4, 8), stop_on=(StopCondition("never"),))
    history, reason = _run(plan, onset=100, dead_at=4)
    assert [f.step.concurrency for f in history] == [1, 2, 4]
    assert reason == "server_dead"


def test_error_rate_condition_marks_steps_bad() -> None:
    plan = SchedulePlan(levels=(1, 2, 4), stop_on=(parse_stop_condition("error-rate:0.1"),))
    history = [StepOutcome(next_step(plan, []).step, completed=10, errors=5)]  # type: ignore[arg-type]
    decision = next_step(plan, history)
    assert decision.step is None
    assert decision.end_reason == "stop_condition:error-rate:0.1"


def test_max_duration() -> None:
    assert max_duration_exceeded(90.0, 90.0)
    assert not max_duration_exceeded(89.9, 90.0)
    assert not max_duration_exceeded(1e9, None)


@given(
    levels=st.lists(st.integers(1, 500), min_size=1, max_size=12, unique=True).map(sorted),
    onset=st.integers(1, 600),
    warmup=st.booleans(),
)
def test_bisection_lands_on_the_exact_onset(levels: list[int], onset: int, warmup: bool) -> None:
    plan = SchedulePlan(levels=tuple(levels), warmup=warmup, stop_on=FIRST_PREEMPTION)
    history, _ = _run(plan, onset=onset)
    measured = [f for f in history if f.step.phase != "warmup"]
    bad = [f.step.concurrency for f in measured if f.preemptions]
    good = [f.step.concurrency for f in measured if not f.preemptions]
    # every level tried agrees with the truth, and the bracket is as tight as the levels allow
    assert all(c >= onset for c in bad) and all(c < onset for c in good)
    if bad and good and min(bad) > levels[0]:
        assert min(bad) == max(onset, levels[0]) and max(good) == min(bad) - 1
    if not bad:
        assert levels[-1] < onset and len(measured) == len(levels)
    assert next_refine_level(FIRST_PREEMPTION, history) is None
    indices = [f.step.index for f in history]
    assert indices == list(range(len(history)))


def test_repeats_measure_both_bracketing_levels_bad_one_first() -> None:
    plan = SchedulePlan(levels=(1, 2, 4, 8, 16), stop_on=FIRST_PREEMPTION, repeats=3)
    history, _ = _run(plan, onset=6)
    refine = [f.step.concurrency for f in history if f.step.phase == "refine"]
    # bisect 8 → 6 (bad), 5 (good); then each once more: two of three agree, the third cannot flip them
    assert refine == [6, 5, 6, 5]
    plan5 = SchedulePlan(levels=(1, 2, 4, 8, 16), stop_on=FIRST_PREEMPTION, repeats=5)
    history5, _ = _run(plan5, onset=6)
    assert [f.step.concurrency for f in history5 if f.step.phase == "refine"] == [6, 5, 6, 5, 6, 5]


def test_a_repeat_that_flips_a_level_moves_the_bracket() -> None:
    """7 bad once, then good twice: 7 is good by majority, and the onset moves up to 8."""
    plan = SchedulePlan(levels=(4, 8), stop_on=FIRST_PREEMPTION, repeats=3)
    seen = {7: iter([1, 0, 0])}
    history: list[StepOutcome] = []
    for _ in range(50):
        decision = next_step(plan, history)
        if decision.step is None:
            break
        c = decision.step.concurrency
        preempted = next(seen[c]) if c in seen else int(c >= 8)
        history.append(StepOutcome(decision.step, completed=10, preemptions=preempted))
    order = [f.step.concurrency for f in history]
    assert order[:2] == [4, 8]
    assert order.count(7) == 3  # 1 bad, then 1 clean: open; the third decides
    assert order.count(8) == 2  # 2 bad of 2: decided
    assert refine_bracket(plan.stop_on, history) == (7, 8)


def test_repeats_are_bounded() -> None:
    with pytest.raises(ConfigError):
        SchedulePlan(levels=(1, 2), repeats=0)
    with pytest.raises(ConfigError):
        SchedulePlan(levels=(1, 2), repeats=100)


def test_a_clean_step_short_of_evidence_is_no_vote_for_its_level() -> None:
    from oomload.capacity.schedule import level_is_bad

    plan = SchedulePlan(levels=(8,))
    step = StepPlan(0, 8, "ramp")
    bad = StepOutcome(step, completed=10, preemptions=1)
    clean = StepOutcome(step, completed=10)
    short = StepOutcome(step, completed=10, evidence_short=True)
    assert level_is_bad(plan.stop_on, [bad, short, short])  # 1 of 1 conclusive
    assert not level_is_bad(plan.stop_on, [bad, clean, clean])  # 1 of 3
    assert level_is_bad(plan.stop_on, [bad, clean, short])  # 1 of 2: ties are bad
    assert not level_is_bad(plan.stop_on, [short, short])  # nothing seen


def test_the_odds_place_the_onset_and_the_level_below_it_in_the_ramp_and_check_the_rest_briefly() -> None:
    assert place_levels((1, 2, 4, 8, 16), 8) == ((1, 2, 4, 7, 8, 16), frozenset({1, 2, 4}))
    assert place_levels((1, 2, 4, 8, 16), 10) == ((1, 2, 4, 8, 9, 10, 16), frozenset({1, 2, 4, 8}))
    assert place_levels((1, 2, 4, 8, 16), 5) == ((1, 2, 4, 5, 8, 16), frozenset({1, 2}))
    assert place_levels((4, 8, 16), 4) == ((4, 8, 16), frozenset())  # nothing below the lowest level
    assert place_levels((1, 2, 4), None) == ((1, 2, 4), frozenset())  # no odds: the levels as given


def test_placed_levels_make_the_bracket_adjacent_so_the_repeats_start_at_once() -> None:
    """With the onset where the odds put it, the ramp itself brackets it: no bisection step follows."""
    levels, checks = place_levels((1, 2, 4, 8, 16), 8)
    plan = SchedulePlan(levels=levels, stop_on=FIRST_PREEMPTION, repeats=3, checks=checks)
    history = [
        StepOutcome(StepPlan(i, c, "ramp"), completed=20, preemptions=int(c >= 8))
        for i, c in enumerate(levels[:5])
    ]
    decision = next_step(plan, history)
    assert decision.step is not None and decision.step.phase == "refine" and decision.step.concurrency == 8


def test_a_short_check_holds_a_share_of_the_hold_and_only_at_ramp_levels() -> None:
    plan = SchedulePlan(levels=(1, 2, 7, 8), checks=frozenset({1, 2}))
    assert plan.check_hold(Hold(4.0, 3)) == Hold(1.0, 3)
    with pytest.raises(ConfigError):
        SchedulePlan(levels=(1, 2, 7, 8), checks=frozenset({3}))


def test_a_geometric_factor_a_hair_above_1_is_refused_not_looped_on() -> None:
    """A review found 'geometric:1:100:1.0000001' hang (46 M multiplications); now one sentence."""
    with pytest.raises(ConfigError, match=r"FACTOR 1\.0000001 is too close to 1"):
        parse_levels("geometric:1:100:1.0000001")
    assert parse_levels("geometric:1:100:1.05")[-1] <= 100  # 95 steps: fine


def _drive(plan: SchedulePlan, outcome_of: Callable[[StepPlan], StepOutcome]) -> tuple[list[int], str]:
    """Drive the schedule, each step ending as ``outcome_of`` says; the levels measured and the end reason."""
    history: list[StepOutcome] = []
    for _ in range(100):
        decision = next_step(plan, history)
        if decision.step is None:
            assert decision.end_reason is not None
            return [f.step.concurrency for f in history], decision.end_reason
        history.append(outcome_of(decision.step))
    raise AssertionError("the schedule did not terminate")


def _no_answer_run(
    plan: SchedulePlan, failing_from: int, onset: int = 10**6, failing_only: int | None = None
) -> tuple[list[int], str]:
    """Drive the schedule against a server that answers nothing from ``failing_from`` on (or only at
    ``failing_only``; 10 failures a step, the least that counts) and preempts from ``onset``; the levels
    measured and the end reason."""

    def outcome(step: StepPlan) -> StepOutcome:
        c = step.concurrency
        failing = c >= failing_from if failing_only is None else c == failing_only
        preempted = int(c >= onset and not failing)
        return StepOutcome(step, completed=10, errors=10 * failing, preemptions=preempted, no_answer=failing)

    return _drive(plan, outcome)


def test_a_step_with_no_answer_stops_the_ramp() -> None:
    """A server that fails every request (a 500 or 404 for everything): higher levels learn nothing."""
    plan = SchedulePlan(levels=(1, 2, 4, 8, 16))
    assert _no_answer_run(plan, failing_from=1) == ([1], "no_answer")
    assert _no_answer_run(plan, failing_from=8) == ([1, 2, 4, 8], "no_answer")
    # `never` ramps through every level, as it says
    never = SchedulePlan(levels=(1, 2, 4), stop_on=(StopCondition("never"),))
    assert _no_answer_run(never, failing_from=1) == ([1, 2, 4], "completed")


def test_the_refinement_still_bisects_below_a_step_with_no_answer() -> None:
    plan = SchedulePlan(levels=(1, 2, 8, 16))
    levels, reason = _no_answer_run(plan, failing_from=16, onset=5)
    assert levels[:4] == [1, 2, 8, 16] and sorted(set(levels[4:])) == [3, 4, 5]
    assert reason == "no_answer"
    # a refinement step with no answer ends the run at once: the server stopped answering
    levels, reason = _no_answer_run(plan, failing_from=0, onset=8, failing_only=5)
    assert levels == [1, 2, 8, 16, 5] and reason == "no_answer"


def _limited_run(plan: SchedulePlan, limited_from: int, onset: int = 10**6) -> tuple[list[int], str]:
    """Drive the schedule against a gateway that turns requests away from ``limited_from`` on (some still
    answered) in front of an engine that preempts from ``onset``; the levels measured and the end reason."""

    def outcome(step: StepPlan) -> StepOutcome:
        c, limited = step.concurrency, step.concurrency >= limited_from
        return StepOutcome(
            step, completed=30, errors=20 * limited, preemptions=int(c >= onset), rate_limited=limited
        )

    return _drive(plan, outcome)


def test_a_step_a_limit_in_front_of_the_engine_turned_away_stops_the_ramp() -> None:
    """A gateway that admits 4 at a time lets vLLM see 4 at level 8 and at 64: the levels above it
    measure the gateway. The ramp ends after the first such step (its hold kept), end reason
    ``rate_limited``; ``never`` still climbs every level."""
    plan = SchedulePlan(levels=(1, 2, 4, 8, 16, 32))
    assert _limited_run(plan, limited_from=8) == ([1, 2, 4, 8], "rate_limited")
    never = SchedulePlan(levels=(1, 2, 4, 8), stop_on=(StopCondition("never"),))
    assert _limited_run(never, limited_from=2) == ([1, 2, 4, 8], "completed")
    # a stop condition met first names the end; a refinement step turned away ends the run
    first = SchedulePlan(levels=(1, 2, 4, 8, 16), stop_on=(StopCondition("first-preemption"),))
    assert _limited_run(first, limited_from=8, onset=4) == (
        [1, 2, 4, 3],
        "stop_condition:first-preemption",
    )
    levels, reason = _limited_run(SchedulePlan(levels=(1, 2, 8, 16)), limited_from=5, onset=5)
    assert levels == [1, 2, 8, 5] and reason == "rate_limited"


def test_too_few_failures_an_answer_or_a_request_still_pending_is_not_no_answer() -> None:
    assert no_answer(10, 10, 0.05, 2.0)  # ten fast failures, nothing else, after 2 s
    assert not no_answer(9, 9, 0.05, 2.0)  # one long request that broke, say: too few to say
    assert not no_answer(29, 30, 0.05, 2.0)  # one answer (a short one counts)
    # a request in flight for 1 s may still be answered: a gateway that turns away the requests beyond
    # its limit and serves the rest slowly; unknown (a worker that did not say) is no verdict either
    assert not no_answer(30, 30, 1.0, 5.0)
    assert not no_answer(30, 30, None, 5.0)
    # before the step ran 2 s, a long request sent with the first failures has not had time to show
    assert not no_answer(30, 30, 0.5, 1.9)
    # seen on the real vLLM: two long answers sent 0.1 s into the step, 1.9 s old when it had run 2 s
    assert not no_answer(38, 38, 1.9, 2.015)
