"""What "carries the target" means, read from a candidate replay's summary.json (proof_from_summary)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from oomload.capacity.odds import Pool
from oomload.rundir.summary import SUMMARY_SCHEMA, Summary, summary_from_doc
from oomload.tune.guide import OddsGuide
from oomload.tune.prove import proof_from_summary
from oomload.tune.search import Candidate, SearchSpace, Settings, next_proposal, pick_winner
from oomload.tune.stops import death_stop

POOL = Pool(num_gpu_blocks=12, block_size=256, max_model_len=768)


def _summary(
    *,
    preemptions: int = 0,
    trusted: bool = True,
    refused: int = 0,
    limit: int = 768,
    onset: int | None = None,
    ttft_ms: float = 1500.0,
) -> Summary:
    step = {
        "concurrency": 8,
        "warmup": False,
        "requests": 40,
        "preemptions": preemptions,
        "trusted": trusted,
        "ttft": {"p99_ms": ttft_ms},
        "output_tokens_per_s": 300.0,
    }
    return _typed(
        {
            "verdict": {
                "steps": [step, {**step, "concurrency": 10, "preemptions": 3}],
                "onsets": {
                    "preemption": None if onset is None else {"concurrency": onset},
                    "engine_death": None,
                },
                "context_overflow": {"refused": refused, "clamped": 0, "model_limit": limit},
                "requests": {"total": 80},
            }
        }
    )


def _typed(doc: dict[str, Any]) -> Summary:
    """A hand-made summary through the real reader (``summary_from_doc``), as the tuner reads it."""
    return summary_from_doc({"schema": SUMMARY_SCHEMA, **doc})


def _proof(summary: Summary | None, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "target": 8,
        "pool": POOL,
        "guide": OddsGuide(
            onset=6, onset_worst_case=5, safe_max_num_seqs=5, requests_for_evidence=30, shape="production"
        ),
        "slo_ttft_p99_s": None,
        "run_dir": "r",
        "replay_exit": 0,
        "recommended_max_model_len": 768,
    }
    args.update(kw)
    return proof_from_summary(summary, **args)


def test_clean_at_the_target_carries_even_if_the_level_above_preempts() -> None:
    proof = _proof(_summary(onset=10))
    assert proof.carries and proof.requests_at_target == 40 and proof.observed_onset == 10


def test_a_preemption_at_the_target_does_not_carry() -> None:
    assert not _proof(_summary(preemptions=1, onset=8)).carries


def test_a_step_that_did_not_hold_the_concurrency_is_no_evidence() -> None:
    proof = _proof(_summary(trusted=False))
    assert not proof.carries and "did not hold concurrency 8" in proof.evidence


def test_overflow_blocks_only_below_the_traces_recommended_limit() -> None:
    assert _proof(_summary(refused=2, limit=768)).carries  # the trace's own tail beyond its P99
    assert not _proof(_summary(refused=2, limit=512)).carries  # a limit cut below the traffic


def test_the_slo_and_a_missing_verdict() -> None:
    assert not _proof(_summary(), slo_ttft_p99_s=1.0).carries
    assert _proof(_summary(), slo_ttft_p99_s=2.0).carries
    missing = _proof(None, replay_exit=3)
    assert not missing.carries and "no verdict (exit 3)" in missing.evidence


def test_a_missed_slo_is_named_in_the_evidence_with_the_measured_ttft() -> None:
    """A candidate rejected for the TTFT SLO read "19 requests at 4: 0 preemptions (the odds call it
    safe); held 3.9 of 4" — no word of the SLO in the line, the table or tune.md."""
    missed = _proof(_summary(), slo_ttft_p99_s=1.0)
    assert missed.slo_met is False and missed.outcome == "rejected"
    assert "TTFT p99 1500 ms misses the SLO (--slo-ttft-p99-s 1: ≤ 1000 ms)" in missed.evidence
    met = _proof(_summary(), slo_ttft_p99_s=2.0)
    assert "TTFT p99 1500 ms meets the SLO (--slo-ttft-p99-s 2: ≤ 2000 ms)" in met.evidence
    close = _proof(_summary(ttft_ms=1500.3), slo_ttft_p99_s=1.5)  # never "1500 ms misses … ≤ 1500 ms"
    assert "TTFT p99 1500.3 ms misses the SLO (--slo-ttft-p99-s 1.5: ≤ 1500 ms)" in close.evidence
    assert "SLO" not in _proof(_summary()).evidence  # none asked, none named


def test_an_overflow_says_whether_it_is_held_against_the_candidate() -> None:
    tail = _proof(_summary(refused=2, limit=768))
    assert "2 of 80 overflowed max_model_len 768 (the trace's own tail: shown, not held against it)" in (
        tail.evidence
    )
    cut = _proof(_summary(refused=2, limit=512))
    assert "overflowed max_model_len 512, below the trace's recommended 768: it refuses the traffic" in (
        cut.evidence
    )


def test_the_proof_reads_a_real_summary_json(tmp_path: Any) -> None:
    """``build_summary``'s own document, written and read back as the tuner reads a candidate's replay:
    a schema change that drops what the proof needs fails here, not only in a hand-made dict."""
    from oomload.report.summary import build_summary, dump_summary
    from oomload.tune.prove import read_replay_summary
    from oomload.verdict import build_verdict
    from oomload.verdict.recommend import recommend
    from oomload.verdict.runview import load_run
    from runbuilder import StepSpec, write_run

    run = write_run(
        tmp_path / "run",
        [StepSpec(4), StepSpec(8), StepSpec(10, preemptions=3)],
        cache_config={"block_size": 256, "num_gpu_blocks": 12},
    )
    verdict = build_verdict(load_run(run))
    doc = build_summary(verdict, recommend(verdict), (), exit_code=0, generated_unix_s=1.0)
    (run / "summary.json").write_text(dump_summary(doc))
    proof = _proof(read_replay_summary(run))
    # the made-up step at 8 delivered 6.0 of 8 (its requests' own timings): no evidence, said in
    # figures the reader took from the document (delivered_concurrency, concurrency_held, onsets)
    assert proof.observed_onset == 10 and not proof.preempted_at_target and proof.running_max == 8
    assert proof.no_evidence and "the level was not delivered: 6.0 of 8 in flight" in proof.evidence
    assert proof.ttft_p99_ms is not None and proof.throughput_tokens_per_s is not None
    assert read_replay_summary(tmp_path / "nothing") is None  # the replay wrote no verdict


# --- the engine's death, where and of what (a review found both read wrong) ----------------------------
def _died(at: int | None, kind: str, seqs: int) -> Any:
    """A proof at target 8 (and the headroom level 10) whose engine died at ``at`` of ``kind``."""
    step = {
        "concurrency": 8,
        "warmup": False,
        "requests": 40,
        "preemptions": 0,
        "trusted": True,
        "ttft": {"p99_ms": 900.0},
        "output_tokens_per_s": 300.0,
    }
    death = {"concurrency": at, "step": 1, "kind": kind, "memory": kind != "crash", "real_oom": False}
    if at is None:
        death = None  # type: ignore[assignment]
    summary = _typed(
        {
            "verdict": {
                "steps": [step, {**step, "concurrency": 10, "requests": 12}],
                "onsets": {"preemption": None, "engine_death": death},
                "context_overflow": {"refused": 0, "clamped": 0, "model_limit": 768},
                "requests": {"total": 52},
            }
        }
    )
    return _proof(summary, max_num_seqs=seqs)


SPACE = SearchSpace(memory=(Settings(gpu_memory_utilization=0.9),), max_num_seqs=(2, 4, 6, 8))


def test_a_death_at_the_headroom_level_is_no_headroom() -> None:
    """Target 8: max_num_seqs 8 carried; 10 carried 8 too but its engine died (CUDA OOM) at 10. The
    capped 8 wins: the 10 that killed the engine one level up lost it its headroom."""
    capped = replace(_died(None, "", 8), odds_safe_above=True)
    above = _died(10, "cuda_oom", 10)
    assert above.carries and above.died_above == 10 and above.broke_above == 10
    assert "the server died at 10 (cuda_oom)" in above.evidence
    history = [
        Candidate(1, Settings(gpu_memory_utilization=0.9, max_num_seqs=8), "first", True, proof=capped),
        Candidate(2, Settings(gpu_memory_utilization=0.9, max_num_seqs=10), "headroom", True, proof=above),
    ]
    assert next_proposal(SPACE, 8, history) is None
    winner = pick_winner(SPACE, history, 8)
    assert winner is not None and winner.index == 1


def test_a_crash_at_the_target_stops_the_search_and_says_so() -> None:
    proof = replace(_died(8, "crash", 8), odds_safe_max_num_seqs=6)
    assert proof.died and not proof.died_of_memory
    history = [Candidate(1, Settings(gpu_memory_utilization=0.9, max_num_seqs=8), "first", True, proof=proof)]
    assert next_proposal(SPACE, 8, history) is None  # no max_num_seqs cut for a crash
    stop = death_stop(history)
    assert stop is not None and stop.startswith("candidate 1's engine died of crash, not of memory")


def test_an_activation_peak_at_the_target_halves_the_prefill_batch_first() -> None:
    proof = replace(_died(8, "cpu_oom", 8), odds_safe_max_num_seqs=6)
    history = [Candidate(1, Settings(gpu_memory_utilization=0.9, max_num_seqs=8), "first", True, proof=proof)]
    proposal = next_proposal(SPACE, 8, history)
    assert proposal is not None and proposal.settings.max_num_batched_tokens == 1024
    assert proposal.settings.max_num_seqs == 8 and "activation peak (cpu_oom)" in proposal.rule
    assert death_stop(history) is None
