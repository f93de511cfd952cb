"""Issue 32's search rules: the boundary bisected on the server, capped candidates judged as capped, and
no evidence that is no verdict (oomload.tune.search rules 3-5, oomload.tune.evidence)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from oomload.capacity.odds import Pool
from oomload.rundir.summary import SUMMARY_SCHEMA, StepSummary, Summary, summary_from_doc
from oomload.tune.evidence import judge_target
from oomload.tune.guide import OddsGuide
from oomload.tune.ladder import seqs_ladder
from oomload.tune.prove import proof_from_summary
from oomload.tune.search import Candidate, Proof, SearchSpace, Settings, next_proposal, pick_winner
from oomload.tune.stops import evidence_stop

TARGET = 12
SPACE = SearchSpace(memory=(Settings(num_gpu_blocks=80),), max_num_seqs=seqs_ladder(TARGET), max_starts=12)
STARVED = "waited 93 % of the step for a CPU; loop lag up to 210 ms"


def _proof(*, preempted: bool = False, guess: int | None = None, no_evidence: bool = False) -> Proof:
    return Proof(
        num_gpu_blocks=80,
        block_size=32,
        predicted_onset=12,
        odds_safe_max_num_seqs=guess,
        requests_for_evidence=49,
        observed_onset=TARGET if preempted else None,
        preempted_at_target=preempted,
        died=False,
        overflow_at_target=False,
        slo_met=None,
        requests_at_target=0 if no_evidence else 60,
        throughput_tokens_per_s=900.0,
        ttft_p99_ms=400.0,
        run_dir=None,
        evidence="",
        no_evidence=no_evidence,
        starved=STARVED if no_evidence else None,
    )


def _tune(boundary: int, guess: int | None) -> list[Candidate]:
    """The search against a server on which ``max_num_seqs`` ≤ ``boundary`` carries and more preempts."""
    history: list[Candidate] = []
    while (proposal := next_proposal(SPACE, TARGET, history)) is not None:
        seqs = proposal.settings.max_num_seqs
        assert seqs is not None
        history.append(
            Candidate(len(history) + 1, proposal.settings, proposal.rule, True, proof=_proof(
                preempted=seqs > boundary, guess=guess))
        )  # fmt: skip
    return history


@pytest.mark.parametrize(
    ("boundary", "guess"),
    [(10, 11), (10, 10), (10, 6), (10, None), (3, 11), (7, 11), (11, 8), (1, 11)],
)
def test_the_winner_is_the_largest_cap_that_does_not_preempt_whatever_the_odds_guessed(
    boundary: int, guess: int | None
) -> None:
    """The reference case: 80 blocks of 32, preempting from 11 (boundary 10); the odds guess 11."""
    history = _tune(boundary, guess)
    winner = pick_winner(SPACE, history, TARGET)
    assert winner is not None and winner.settings.max_num_seqs == boundary, [
        (c.settings.max_num_seqs, c.rule) for c in history
    ]
    assert len(history) <= SPACE.max_starts


def test_a_guess_one_too_high_costs_one_more_start() -> None:
    seqs = [c.settings.max_num_seqs for c in _tune(10, 11)]
    assert seqs == [12, 11, 10]  # 12 preempts, the odds' 11 too, 10 carries: one apart, stop


def test_no_evidence_stops_the_search_and_names_the_load_host_never_a_smaller_setting() -> None:
    first = Candidate(
        1, Settings(num_gpu_blocks=80, max_num_seqs=12), "r", True, proof=_proof(preempted=True)
    )
    starved = Candidate(
        2, replace(first.settings, max_num_seqs=11), "r", True, proof=_proof(no_evidence=True)
    )
    assert next_proposal(SPACE, TARGET, [first, starved]) is None
    said = evidence_stop([first, starved])
    assert said is not None and "the load host limits" in said and STARVED in said and "--processes" in said
    # a smaller setting that carried earlier is no answer: the boundary above it was never measured
    small = Candidate(3, replace(first.settings, max_num_seqs=3), "r", True, proof=_proof())
    assert pick_winner(SPACE, [first, small, starved], TARGET) is None
    assert pick_winner(SPACE, [first, starved, small], TARGET) == small  # the last one had evidence
    # a capped candidate with evidence is not "no evidence": the search goes on from it
    assert next_proposal(SPACE, TARGET, [first, small]) is not None


def test_the_winner_prefers_more_concurrency_carried_over_a_lower_cap_that_passed() -> None:
    low = Candidate(1, Settings(num_gpu_blocks=80, max_num_seqs=3), "r", True, proof=_proof())
    high = Candidate(2, Settings(num_gpu_blocks=80, max_num_seqs=10), "r", True, proof=_proof())
    fast_low = replace(low, proof=replace(_proof(), throughput_tokens_per_s=9000.0))
    assert pick_winner(SPACE, [fast_low, high], TARGET) == high


def _step_doc(**kw: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "concurrency": TARGET,
        "warmup": False,
        "requests": 60,
        "preemptions": 0,
        "cut_short": False,
        "mostly_failed": False,
        "trusted": False,
        "concurrency_held": False,
        "delivered_concurrency": 9.1,
        "running_max": 8,
        "waiting_sustained": 1,
        "server": {"in_engine": 7.7, "queued": 1.4},
        "starved": None,
        "ttft": {"p99_ms": 300.0},
        "output_tokens_per_s": 800.0,
    }
    step.update(kw)
    return step


def _step(**kw: Any) -> StepSummary:
    return _typed({"verdict": {"steps": [_step_doc(**kw)]}}).steps[0]


def _typed(doc: dict[str, Any]) -> Summary:
    """A hand-made summary through the real reader (``summary_from_doc``), as the tuner reads it."""
    return summary_from_doc({"schema": SUMMARY_SCHEMA, **doc})


def test_a_capped_candidate_is_judged_by_the_cap_the_server_held() -> None:
    # the client delivered 9.1 of 12 (below 80 %), but the server ran its cap of 8 all along
    capped = judge_target([_step()], TARGET, 8)
    assert capped.held and "ran its cap 8" in capped.how
    assert not judge_target([_step()], TARGET, None).held  # uncapped, the same step held nothing
    # the engine reached its cap only now and then, nothing queued behind it: not held
    assert not judge_target(
        [_step(waiting_sustained=0, server={"in_engine": 5.0, "queued": 0.2})], TARGET, 8
    ).held
    assert not judge_target([_step(running_max=6)], TARGET, 8).held
    # the cap held with the rest waiting, though Little's law reads the mean low (edge effects)
    assert judge_target([_step(server={"in_engine": 6.1, "queued": 3.5})], TARGET, 8).held
    # a starved client's queue may be its own burst: then the server's mean must say the cap ran
    starved = {"wait_share": 0.93, "loop_lag_max_ms": 210.0, "worker": None}
    assert not judge_target(
        [_step(server={"in_engine": 6.1, "queued": 3.5}, starved=starved)], TARGET, 8
    ).held
    assert judge_target([_step(starved=starved)], TARGET, 8).held  # 7.7 of 8 on average
    assert not judge_target([_step(server=None, starved=starved)], TARGET, 8).held


def test_a_queue_that_held_a_starved_client_is_no_evidence() -> None:
    starved = {"wait_share": 0.93, "loop_lag_max_ms": 210.0, "worker": None}
    found = judge_target([_step(concurrency_held=True, starved=starved)], TARGET, None)
    assert not found.held and found.starved == STARVED


def _summary(step: dict[str, Any]) -> Summary:
    return _typed(
        {
            "verdict": {
                "steps": [step],
                "onsets": {"preemption": None, "engine_death": None},
                "context_overflow": {"refused": 0, "clamped": 0, "model_limit": 2048},
                "requests": {"total": step["requests"]},
            }
        }
    )


def _from_summary(step: dict[str, Any], seqs: int) -> Proof:
    guide = OddsGuide(
        onset=12, onset_worst_case=4, safe_max_num_seqs=11, requests_for_evidence=49, shape="production"
    )
    return proof_from_summary(
        _summary(step),
        target=TARGET,
        pool=Pool(80, 32, 2048),
        guide=guide,
        slo_ttft_p99_s=None,
        run_dir="r",
        replay_exit=0,
        max_num_seqs=seqs,
    )


def test_the_proof_carries_a_held_cap_and_marks_a_starved_step_as_no_evidence() -> None:
    assert _from_summary(_step_doc(), 8).carries
    starved = {"wait_share": 0.93, "loop_lag_max_ms": 210.0, "worker": None}
    proof = _from_summary(_step_doc(running_max=5, server={"in_engine": 4.0}, starved=starved), 8)
    assert proof.no_evidence and not proof.carries and proof.starved == STARVED
    assert proof.outcome == "no evidence" and "the load host limits" in proof.evidence
    preempted = _from_summary(_step_doc(running_max=5, preemptions=2, starved=starved), 8)
    assert not preempted.no_evidence and preempted.outcome == "preempted"  # a preemption is evidence


def test_a_failed_step_says_why_in_the_replays_words_not_that_the_server_was_idle() -> None:
    # a proxy rewrote every answer's usage: the server was loaded, but not with the trace
    said = (
        "60 of 60 requests failed (server_error 60): 60 answers' usage contradicted the lengths sent "
        "(…), so the load was not the trace's and nothing about the server's memory under it can be judged"
    )
    found = judge_target([_step(mostly_failed=True)], TARGET, None, said)
    assert not found.held and found.how == said
    bare = judge_target([_step(mostly_failed=True)], TARGET, None)
    assert not bare.held and bare.how == f"most requests at {TARGET} failed, so the step is no evidence"
    doc = _step_doc(mostly_failed=True)
    summary = _typed(
        {"verdict": {"steps": [doc], "requests": {"total": 60, "failed": 60, "failed_run": said}}}
    )
    proof = proof_from_summary(
        summary, target=TARGET, pool=None, guide=None, slo_ttft_p99_s=None, run_dir="r", replay_exit=3
    )
    assert not proof.carries and said in proof.evidence and "not loaded" not in proof.evidence
