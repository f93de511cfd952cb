"""The verdict's predictions for both prompt shapes: the run's own (config.json) judged, the other beside it.

Hand case (reference prefix-caching.md, measured on the real vLLM CPU build): 80 blocks of 32 tokens,
600-token prompts sharing their first 512 tokens, 100 output tokens — onset 11 with the shared prefix,
4 with distinct prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oomload.report.findings import describe
from oomload.trace.model import PrefixInfo, TraceHeader, TraceRecord, write_trace
from oomload.verdict import build_verdict
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run

POOL = {"num_gpu_blocks": 80, "block_size": 32, "kv_cache_size_tokens": 2560}
STEPS = [
    StepSpec(c, prompt_tokens=600, output_tokens=100, preemptions=p, requests=4 * c)
    for c, p in ((8, 0), (11, 3))
]


def _odds(concurrency: int, per_1000: int, shape: str) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "requests": 1000,
        "preemptions": per_1000,
        "episodes": per_1000,
        "prompts": shape,
    }


def _run(tmp_path: Path, config: dict[str, Any], *, hash_ids: bool = True) -> Path:
    odds = [
        _odds(8, 0, "production"),
        _odds(11, 0, "production"),
        _odds(12, 90, "production"),
        _odds(3, 0, "worst-case"),
        _odds(4, 400, "worst-case"),
        _odds(8, 400, "worst-case"),
    ]
    run = write_run(tmp_path / "run", STEPS, cache_config=POOL, config=config, odds=odds)
    records = [
        TraceRecord(f"r{i}", 0.0, 600, 100, hash_ids=(7, 100 + i) if hash_ids else ()) for i in range(50)
    ]
    write_trace(run / "trace.jsonl", records, TraceHeader(prefix=PrefixInfo(block_tokens=512)))
    return run


def _texts(v: Any) -> dict[str, str]:
    return {f.key: f.text for f in describe(v, recommend(v))}


def test_a_production_shaped_run_is_judged_by_the_shared_prefix_arithmetic(tmp_path: Path) -> None:
    v = build_verdict(load_run(_run(tmp_path, {"prefix_sharing": True})))
    p = v.prediction
    assert v.prompt_shape == "production"
    assert p is not None and p.arithmetic.shape == "production" and p.basis == "trace"
    # 11 with every request at its peak of 6 own blocks at once, 14 with their decode phases spread
    assert p.arithmetic.band == (11, 14) and p.observed_onset == 11 and not p.disagrees
    assert p.other is not None and p.other.shape == "worst-case" and p.other.band == (4, 4)
    # the odds judged are the run's shape's; the worst case's onset stands beside them
    assert v.level(8) is not None and v.level(8).odds is not None  # type: ignore[union-attr]
    assert v.level(8).odds.shape == "production"  # type: ignore[union-attr]
    assert (v.odds_onset, v.other_odds_onset, v.other_odds_onset_low) == (None, 4, 4)
    texts = _texts(v)
    assert (
        "→ onset 11–14 with shared prefixes (mean-length 11, decode phases spread 14; worst case, "
        "nothing shared: 4)" in texts["prediction"]
    )
    assert "with shared prefixes (worst case, nothing shared: 4)" in texts["trace_odds"]
    seqs = recommend(v).max_num_seqs
    assert seqs.value == 8
    assert "measured with the trace's shared prefixes cached" in seqs.reason
    assert "falls from 11–14 to 4" in seqs.reason
    out = v.to_json()
    assert out["prompt_shape"] == "production" and out["prediction"]["other"]["band"] == [4, 4]


def test_a_distinct_prompts_run_is_judged_by_the_worst_case(tmp_path: Path) -> None:
    v = build_verdict(load_run(_run(tmp_path, {"prefix_sharing": False})))
    p = v.prediction
    assert v.prompt_shape == "worst-case"
    assert p is not None and p.arithmetic.shape == "worst-case" and p.basis == "requests"
    assert p.arithmetic.band == (4, 4) and p.levels_apart == 1  # observed 11, one measured level above
    assert p.other is not None and p.other.band == (11, 14)
    assert v.level(8).odds.shape == "worst-case"  # type: ignore[union-attr]
    assert (v.odds_onset, v.other_odds_onset) == (8, 12)
    texts = _texts(v)
    assert (
        "→ onset 4 with distinct prompts (mean-length 4; with the trace's shared prefixes: 11–14)"
        in texts["prediction"]
    )
    assert "measured with distinct prompts, the worst case" in recommend(v).max_num_seqs.reason


def test_the_shape_key_of_config_json_wins_over_the_old_flag(tmp_path: Path) -> None:
    for config, shape in (
        ({"prompt_shape": "production", "prefix_sharing": False}, "production"),
        ({"distinct_prompts": True, "prefix_sharing": True}, "worst-case"),
        ({"distinct_prompts": False}, "production"),
        ({}, "worst-case"),
    ):
        view = load_run(write_run(tmp_path / f"run-{len(config)}-{shape}", STEPS, config=config))
        assert view.prompt_shape == shape, config


def test_without_hash_ids_there_is_no_other_shape(tmp_path: Path) -> None:
    v = build_verdict(load_run(_run(tmp_path, {"prefix_sharing": True}, hash_ids=False)))
    p = v.prediction
    assert p is not None and p.other is None and p.arithmetic.band == (4, 4)
    assert p.arithmetic.shape == "production"  # the run's shape, with nothing to share
    assert "nothing shared" not in _texts(v)["prediction"]


def test_an_onset_in_the_other_shapes_band_is_named(tmp_path: Path) -> None:
    """Shared prefixes sent, but preemption from 4 as if nothing were shared: a server without prefix
    caching looks exactly like this."""
    steps = [
        StepSpec(c, prompt_tokens=600, output_tokens=100, preemptions=p, requests=4 * c)
        for c, p in ((2, 0), (3, 0), (4, 5), (8, 9), (11, 9))
    ]
    run = write_run(tmp_path / "run", steps, cache_config=POOL, config={"prefix_sharing": True})
    records = [TraceRecord(f"r{i}", 0.0, 600, 100, hash_ids=(7, 100 + i)) for i in range(50)]
    write_trace(run / "trace.jsonl", records, TraceHeader(prefix=PrefixInfo(block_tokens=512)))
    v = build_verdict(load_run(run))
    assert v.prediction is not None and v.prediction.disagrees and v.prediction.observed_onset == 4
    note = next(n for n in v.notes if n.kind == "prediction_disagrees")
    assert note.message.endswith(
        "it lies in the band for distinct prompts: is the server's prefix caching off?"
    )
