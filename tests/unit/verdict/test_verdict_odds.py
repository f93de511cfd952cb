"""The verdict with repeats and the trace's odds: the onset by majority, rates per level, thin evidence,
queueing over last safe, and disagreements with the odds called what they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oomload.outcome import Outcome
from oomload.report.findings import describe, trace_odds
from oomload.verdict import build_verdict
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, StepSpec, write_run


def _odds(concurrency: int, per_1000: int) -> dict[str, Any]:
    return {"concurrency": concurrency, "requests": 1000, "preemptions": per_1000, "episodes": per_1000}


def _verdict(tmp_path: Path, steps: list[StepSpec], odds: list[dict[str, Any]] | None = None) -> Any:
    view = load_run(write_run(tmp_path / "run", steps, cache_config=CPU_CACHE, odds=odds or []))
    return build_verdict(view)


def _texts(v: Any) -> dict[str, str]:
    return {f.key: f.text for f in describe(v, recommend(v))}


def test_the_onset_is_what_most_repeats_saw(tmp_path: Path) -> None:
    steps = [
        StepSpec(4),
        StepSpec(8, preemptions=2),
        StepSpec(6, phase="refine"),
        StepSpec(7, preemptions=1, phase="refine"),
        StepSpec(6, preemptions=1, phase="refine"),  # 6 sporadic: 1 of 3
        StepSpec(7, phase="refine"),
        StepSpec(6, phase="refine"),
        StepSpec(7, preemptions=3, phase="refine"),
    ]
    v = _verdict(tmp_path, steps)
    assert v.preemption_onset is not None
    assert (v.preemption_onset.concurrency, v.preemption_onset.seen_in, v.preemption_onset.measurements) == (
        7,
        2,
        3,
    )
    assert v.preemption_onset.seen_text == "seen at 7 in 2 of 3"
    assert v.first_unsafe_concurrency == 6  # sporadic at 6: never safe
    assert v.last_safe_concurrency == 4
    kinds = {n.kind for n in v.notes}
    assert {"noisy_repeat", "sporadic_preemption"} <= kinds
    noisy = sorted(n.message for n in v.notes if n.kind == "noisy_repeat")
    assert noisy == [  # each names the counts that decided
        "repeats at concurrency 6 disagree on whether it preempts (1 of 3 steps preempted)",
        "repeats at concurrency 7 disagree on whether it preempts (2 of 3 steps preempted)",
    ]
    assert v.confidence == "medium"
    texts = _texts(v)
    assert "concurrency 7 (seen at 7 in 2 of 3)" in texts["preemption_onset"]
    assert "sporadic preemption at 6" in texts["last_safe"]
    level7 = v.level(7)
    assert level7 is not None and (level7.steps, level7.steps_preempted, level7.requests) == (3, 2, 36)
    assert level7.preemptions_per_100 == 100 * 4 / 36


def test_rates_per_step_and_level(tmp_path: Path) -> None:
    steps = [StepSpec(2, scrapes=4, peak_scrapes=2, waiting_max=1, kv_max=0.995, requests=20)]
    v = _verdict(tmp_path, steps)
    s = v.steps[0]
    assert s.preemptions_per_100 == 0.0
    assert s.waiting_share == 0.5 and s.kv_saturated_share == 0.5
    out = v.to_json()
    assert out["steps"][0]["waiting_share"] == 0.5
    assert out["level_summaries"][0]["kv_saturated_share"] == 0.5


def test_queueing_caps_last_safe(tmp_path: Path) -> None:
    """Queueing at 4 and no preemption until 8: 4 did not run its concurrency in the engine."""
    v = _verdict(tmp_path, [StepSpec(2), StepSpec(4, waiting_max=2), StepSpec(8, preemptions=1)])
    assert v.queueing is not None and v.queueing.concurrency == 4
    assert v.last_safe_concurrency == 2
    assert "queueing began at 4" in _texts(v)["last_safe"]


def test_queueing_from_the_lowest_level_is_no_breakage(tmp_path: Path) -> None:
    """Seen on the real vLLM (a prefill budget of 7,936 tokens, 16 and 32 tested): 7 requests waited at
    16 and nothing broke. No level is safe, but the finding says why, as a warning: not "already broke"."""
    v = _verdict(
        tmp_path, [StepSpec(16, waiting_max=7, requests=48), StepSpec(32, waiting_max=11, requests=96)]
    )
    assert v.last_safe_concurrency is None and v.first_unsafe_concurrency is None
    finding = next(f for f in describe(v, recommend(v)) if f.key == "last_safe")
    assert finding.severity == "warn" and "already broke" not in finding.text
    assert finding.text.startswith(
        "none: requests queued in vLLM from 16, the lowest level tested (nothing broke"
    )
    broke = _verdict(tmp_path / "2", [StepSpec(4, preemptions=2), StepSpec(8, preemptions=5)])
    finding = next(f for f in describe(broke, recommend(broke)) if f.key == "last_safe")
    assert (finding.text, finding.severity) == ("none (the lowest level already broke, at 4)", "bad")


def test_queueing_below_the_onset_names_no_cap_and_says_why(tmp_path: Path) -> None:
    """Long prompts spending the prefill budget: requests waited from the lowest level and preemption
    began above it (the simulator: a heavy-tailed mix queued from 8 and preempted at 15). The advice said
    "the lowest level tested already broke: test lower concurrency first", though nothing broke there. A
    cap at the clean level 12 is not proven either: its engine ran fewer than 12 at times, and on the
    simulator a server capped at 14 still preempted 3.2 times per 100 requests at 32."""
    steps = [StepSpec(8, waiting_max=3, requests=48), StepSpec(12, waiting_max=3, requests=48)]
    v = _verdict(tmp_path, [*steps, StepSpec(16, preemptions=5)])
    assert v.last_safe_concurrency is None and v.queueing is not None and v.queueing.concurrency == 8
    rec = recommend(v)
    seqs = rec.max_num_seqs
    assert (seqs.value, seqs.action) == (None, "below 16: oomload tune")
    assert "already broke" not in seqs.reason
    assert seqs.reason.startswith(
        "preemption began at 16, but requests already queued in vLLM from 8, so no level proved a cap: "
        "level 12 ran without preemption"
    )
    assert "Preemption began at 16, but requests already queued in vLLM from 8" in rec.reasoning
    assert "--max-num-seqs" not in rec.flag_line


def test_a_clean_level_short_of_the_odds_evidence_is_not_safe(tmp_path: Path) -> None:
    """The odds expect 4 per 100 at 6 (116 requests for 99 %); 12 requests without one prove little."""
    odds = [_odds(4, 0), _odds(6, 40), _odds(8, 200)]
    v = _verdict(tmp_path, [StepSpec(4), StepSpec(6), StepSpec(8, preemptions=5)], odds)
    level6 = v.level(6)
    assert level6 is not None and level6.evidence_needed == 116 and level6.evidence_thin
    assert v.last_safe_concurrency == 4
    assert any(n.kind == "thin_evidence" for n in v.notes)
    assert "not enough evidence at 6" in _texts(v)["last_safe"]
    # the same level with enough requests counts
    v2 = _verdict(tmp_path / "2", [StepSpec(4), StepSpec(6, requests=120), StepSpec(8, preemptions=5)], odds)
    assert v2.last_safe_concurrency == 6


def test_observation_against_the_odds(tmp_path: Path) -> None:
    """The odds give 8 ≥ 99 % to preempt in 120 requests but none was seen; 4's odds are nil and it did."""
    odds = [_odds(4, 0), _odds(8, 200), _odds(16, 400)]
    steps = [StepSpec(4, preemptions=1), StepSpec(8, requests=120), StepSpec(16, preemptions=9)]
    v = _verdict(tmp_path, steps, odds)
    assert v.level(8) is not None and v.level(8).agreement == "fewer than the odds"
    assert v.level(4) is not None and v.level(4).agreement == "more than the odds"
    assert sum(1 for n in v.notes if n.kind == "odds_disagree_level") == 2
    finding = trace_odds(v)
    assert finding is not None and finding.severity == "warn" and "DISAGREES" in finding.text


def test_the_odds_onset_agrees_within_one_level(tmp_path: Path) -> None:
    odds = [_odds(2, 0), _odds(4, 0), _odds(8, 100), _odds(16, 300)]
    steps = [StepSpec(2), StepSpec(4), StepSpec(8, preemptions=2), StepSpec(16, preemptions=8)]
    v = _verdict(tmp_path, steps, odds)
    assert (v.odds_onset_low, v.odds_onset, v.odds_levels_apart) == (5, 8, 0)
    finding = trace_odds(v)
    assert finding is not None and finding.severity == "ok"
    assert finding.text.startswith(
        "onset 5–8 with distinct prompts (≥ 1 preemption per 100 requests), observed 8: agrees"
    )
    assert v.to_json()["odds_onset"] == 8


def test_no_onset_on_either_side_reads_as_such(tmp_path: Path) -> None:
    # seen on the real vLLM: "onset none with distinct prompts (...), observed none: agrees"
    odds = [_odds(1, 0), _odds(2, 0), _odds(4, 0)]
    v = _verdict(tmp_path, [StepSpec(1), StepSpec(2), StepSpec(4)], odds)
    finding = trace_odds(v)
    assert finding is not None and finding.text == (
        "no onset up to 4 with distinct prompts (≥ 1 preemption per 100 requests), none observed: agrees"
    )


def test_odds_distance_counts_measured_levels_around_the_range() -> None:
    from oomload.verdict.levels import odds_distance

    levels = (1, 2, 4, 8, 16)
    assert odds_distance(6, 5, 8, levels) == 0  # inside 5–8
    assert odds_distance(4, 5, 8, levels) == 1  # just below the range
    assert odds_distance(2, 5, 8, levels) == 2
    assert odds_distance(16, 5, 8, levels) == 1  # the next measured level above
    assert odds_distance(7, None, 8, (6, 7, 8)) == 1
    assert odds_distance(None, 5, 8, levels) is None


def test_an_onset_far_from_the_odds_lowers_confidence(tmp_path: Path) -> None:
    odds = [_odds(1, 300), _odds(2, 400), _odds(4, 500), _odds(8, 600)]
    steps = [StepSpec(1), StepSpec(2), StepSpec(4), StepSpec(8, preemptions=3)]
    v = _verdict(tmp_path, steps, odds)
    assert v.odds_onset == 1 and v.odds_levels_apart == 3
    assert any(n.kind == "odds_disagree" for n in v.notes)
    assert v.confidence == "low"


def test_a_clean_repeat_short_of_evidence_does_not_outvote_a_sighting(tmp_path: Path) -> None:
    """8 preempted once; its two clean repeats sent 12 requests each where the odds ask for 171."""
    odds = [_odds(4, 0), _odds(8, 27), _odds(16, 250)]
    steps = [
        StepSpec(4),
        StepSpec(8, preemptions=1),
        StepSpec(16, preemptions=6),
        StepSpec(8, phase="refine"),
        StepSpec(8, phase="refine"),
    ]
    v = _verdict(tmp_path, steps, odds)
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 8
    assert v.preemption_onset.seen_text == "seen at 8 in 1 of 1, 2 more clean step(s) short of evidence"
    assert not any(n.kind == "noisy_repeat" for n in v.notes)


def test_a_level_whose_requests_mostly_failed_contradicts_nothing(tmp_path: Path) -> None:
    """Seen on the simulator with a Mooncake trace at max_model_len 8192: most requests of 4 and 8
    were refused as too long, so those levels sent no load. They did not preempt, and that is no
    evidence: neither a clean level above the onset (non_monotone), nor fewer than the odds, nor a
    repeat that disagrees. A preemption in such a step is still one."""
    odds = [_odds(2, 10), _odds(4, 71), _odds(8, 115)]
    refused = {Outcome.CONTEXT_OVERFLOW: 60}
    steps = [
        StepSpec(2, preemptions=1, requests=100),
        StepSpec(4, requests=100, failures=refused),
        StepSpec(8, requests=100, failures=refused),
        StepSpec(2, preemptions=1, requests=100, failures=refused, phase="refine"),
    ]
    v = _verdict(tmp_path, steps, odds)
    assert [s.conclusive for s in v.steps] == [True, False, False, True]
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 2
    assert v.preemption_onset.seen_text == "seen at 2 in 2 of 2"
    kinds = {n.kind for n in v.notes}
    assert not kinds & {"non_monotone", "odds_disagree_level", "noisy_repeat"}, kinds
    level4 = v.level(4)
    assert level4 is not None and level4.judged_requests == 0 and level4.agreement is None
    finding = trace_odds(v)
    assert finding is not None and finding.severity == "ok" and "observed 2: agrees" in finding.text
    # the same levels answered: now their silence is evidence against the odds
    answered = [StepSpec(2, preemptions=1, requests=100), *(StepSpec(c, requests=100) for c in (4, 8))]
    v2 = _verdict(tmp_path / "2", answered, odds)
    assert {"non_monotone", "odds_disagree_level"} <= {n.kind for n in v2.notes}
    level4 = v2.level(4)
    assert level4 is not None and level4.judged_requests == 100
    assert level4.agreement == "fewer than the odds"
    finding = trace_odds(v2)
    assert finding is not None and finding.severity == "warn"
    assert "observed 2: the onset agrees, but DISAGREES (fewer than the odds at 4, 8)" in finding.text
