"""One set of odds: ``tune``, ``replay`` and ``plan`` give the same odds for the same trace and pool.

The reference case of issue 32: 600-token prompts sharing a 512-token system prompt (16 ids of 32
tokens), 100 output tokens, a pool of 80 blocks of 32 tokens. Each command's own entry point is fed the
trace file: the tune's candidate guide (``tune.prove.candidate_guide``, as a candidate's proof builds
it), the replay's ``OddsFeed`` (as a run's session builds it, placing its ramp on the onset) and
``oomload plan --json``. Their per-level odds and their onsets must be equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.capacity.odds import LevelOdds, Pool
from oomload.cli import main
from oomload.run.oddsfeed import OddsFeed
from oomload.trace.model import (
    PrefixInfo,
    TraceHeader,
    TraceRecord,
    read_trace,
    read_trace_header,
    write_trace,
)
from oomload.tune.prove import candidate_guide

SHARED_IDS = tuple(range(1, 17))
LEVELS = (2, 4, 8, 16)
TARGET = 12


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("agree") / "system-prompt.jsonl"
    records = [TraceRecord(f"r{i}", 0.0, 600, 100, hash_ids=SHARED_IDS) for i in range(200)]
    write_trace(path, records, TraceHeader(format="synthetic", prefix=PrefixInfo(block_tokens=32)))
    return path


def test_tune_replay_and_plan_agree_on_the_odds(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = Pool(num_gpu_blocks=80, block_size=32, max_model_len=2048)  # as vllm:cache_config_info gives it
    records = read_trace(trace)

    # the tune: a candidate at the target on this pool
    guide = candidate_guide(records, read_trace_header(trace).prefix_or_default(), pool, TARGET, TARGET)

    # the replay: the session's feed, production-shaped, placing its ramp on the onset
    seen: list[LevelOdds] = []
    feed = OddsFeed(
        records, pool, LEVELS, trace_path=trace, seed=0, record=seen.append, shape="production", place=True
    )
    feed.stop()
    replay = {o.concurrency: o for o in seen if o.shape == "production"}

    # the plan: the simulated engine's pool set to the same blocks and limits as the server's
    argv = [
        "plan", str(trace), "--model", "tiny", "--num-gpu-blocks", "80", "--block-size", "32",
        "--max-model-len", "2048", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
        "--concurrency", ",".join(map(str, LEVELS)), "--requests-per-level", "8", "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    planned = {o["concurrency"]: LevelOdds.from_json(o) for o in plan["odds"]}

    assert guide.shape == "production" and all(o.shape == "production" for o in planned.values())
    assert guide.onset == feed.onset == plan["odds_onset"] == 12
    assert guide.onset_worst_case == plan["odds_onset_worst_case"] == 4
    for level in LEVELS:
        assert planned[level] == replay[level], level
    # the onset and the level below, as each computed them
    for level in (11, 12):
        assert replay[level].negligible is (level < 12)
    assert guide.requests_for_evidence == replay[TARGET].requests_for()
