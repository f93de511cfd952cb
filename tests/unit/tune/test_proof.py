"""What "carries the target" means, read from a candidate replay's summary.json (proof_from_summary)."""

from __future__ import annotations

from typing import Any

from oomload.capacity.odds import Pool
from oomload.tune.guide import OddsGuide
from oomload.tune.prove import proof_from_summary

POOL = Pool(num_gpu_blocks=12, block_size=256, max_model_len=768)


def _summary(
    *,
    preemptions: int = 0,
    trusted: bool = True,
    refused: int = 0,
    limit: int = 768,
    onset: int | None = None,
) -> dict[str, Any]:
    step = {
        "concurrency": 8,
        "warmup": False,
        "requests": 40,
        "preemptions": preemptions,
        "trusted": trusted,
        "ttft": {"p99_ms": 1500.0},
        "output_tokens_per_s": 300.0,
    }
    return {
        "verdict": {
            "steps": [step, {**step, "concurrency": 10, "preemptions": 3}],
            "onsets": {"preemption": None if onset is None else {"concurrency": onset}, "engine_death": None},
            "context_overflow": {"refused": refused, "clamped": 0, "model_limit": limit},
            "requests": {"total": 80},
        }
    }


def _proof(summary: dict[str, Any] | None, **kw: Any) -> Any:
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
