"""The verdict predicts from the trace's requests the run replayed (``verdict.replayed``): with
``--only-fitting`` or ``--tail-percentile`` in ``config.json``, the arithmetic's trace lengths and shared
prefix blocks leave out the requests the run never sent, when a saved run is judged (again). Only public
names here (``load_run``, ``build_verdict``), so the test runs, and fails, on the code before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oomload.capacity.blocks import predict_preemption_onset
from oomload.capacity.odds import trace_prefixes
from oomload.trace.model import PrefixInfo, TraceHeader, TraceRecord, write_trace
from oomload.verdict.runview import load_run
from oomload.verdict.verdict import build_verdict
from runbuilder import StepSpec, write_run

SHARED = {"mode": "shared", "block_tokens": 512, "why_distinct": None}
PREFIX = PrefixInfo(block_tokens=512)
BLOCKS, BLOCK_SIZE = 3000, 16


def _fitting(n: int = 30) -> list[TraceRecord]:
    """3000-token prompts sharing their first five 512-token blocks, 1000 tokens out."""
    return [TraceRecord(f"f{i}", float(i), 3000, 1000, hash_ids=(1, 2, 3, 4, 5, 100 + i)) for i in range(n)]


def _too_long(n: int = 10) -> list[TraceRecord]:
    """Longer than max_model_len 16384, nothing shared: --only-fitting never sends them."""
    chains = [tuple(range(1000 * (i + 1), 1000 * (i + 1) + 39)) for i in range(n)]
    return [TraceRecord(f"x{i}", float(i), 20000, 500, hash_ids=chain) for i, chain in enumerate(chains)]


def _short(n: int = 20) -> list[TraceRecord]:
    """600-token prompts sharing one block, 100 out: below the tail's cut."""
    return [TraceRecord(f"s{i}", float(i), 600, 100, hash_ids=(1, 500 + i)) for i in range(n)]


def _run(tmp_path: Path, records: list[TraceRecord], config: dict[str, Any]) -> Path:
    run = write_run(
        tmp_path / "run",
        [
            StepSpec(2, prompt_tokens=3000, output_tokens=1000),
            StepSpec(4, prompt_tokens=3000, output_tokens=1000),
        ],
        cache_config={"num_gpu_blocks": BLOCKS, "block_size": BLOCK_SIZE},
        config={"max_model_len": 16384, "prefix": SHARED, **config},
    )
    write_trace(run / "trace.jsonl", records, TraceHeader(source=("test",), prefix=PREFIX))
    return run


CASES = {
    "only-fitting": (lambda: [*_fitting(), *_too_long()], {"only_fitting": True}),
    "tail": (lambda: [*_short(), *_fitting()], {"tail_percentile": 50.0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_arithmetic_counts_only_the_requests_replayed(tmp_path: Path, case: str) -> None:
    """The production shape's band comes from the trace's lengths and shared blocks (only the trace has
    the chains): the 30 requests the run sent, 250 blocks each at their peak less the 160 they share,
    give 32–48. Counting the 10 left out (16384 tokens each, clamped, nothing shared) gave 3–31;
    counting the 20 short ones below the tail's cut, 31–73."""
    make, config = CASES[case]
    records = make()
    verdict = build_verdict(load_run(_run(tmp_path, records, config)))
    sent = _fitting()
    expected = predict_preemption_onset(
        BLOCKS,
        BLOCK_SIZE,
        [r.total_tokens for r in sent],
        trace_prefixes(sent, PREFIX, BLOCK_SIZE),
        prompt_tokens=[r.prompt_tokens for r in sent],
    )
    assert verdict.prediction is not None
    assert verdict.prediction.basis == "trace" and verdict.prediction.arithmetic.shape == "production"
    assert verdict.prediction.arithmetic.band == expected.band
    whole = predict_preemption_onset(
        BLOCKS,
        BLOCK_SIZE,
        [min(r.total_tokens, 16384) for r in records],
        trace_prefixes(records, PREFIX, BLOCK_SIZE),
        prompt_tokens=[min(r.prompt_tokens, 16384) for r in records],
    )
    assert whole.band != expected.band  # what the whole trace gives: the test can fail
