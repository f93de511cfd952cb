"""Preemption onset on the real vLLM, seen three ways: by oomload, by the test itself, by the arithmetic;
and the simulated server's onset on the same trace (simulator fidelity).

Trace: fixed 256 + 256 tokens. Pool: 12 blocks of 256 tokens (11 usable), 2 blocks per request, so the
arithmetic onset is floor(11 / 2) + 1 = 6 concurrent requests. The sweep 2, 4, 5, 6, 7, 8, 10 puts the
prediction on the grid with a neighbour on each side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import FIGURES, Run, ServerPool, replay, write_trace_file
from probe import CounterWatch, cache_config

from oomload.capacity.blocks import predict_preemption_onset
from oomload.sim.process import SimServer

pytestmark = pytest.mark.e2e

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 256
LEVELS = (2, 4, 5, 6, 7, 8, 10)
SWEEP = ("--concurrency", ",".join(map(str, LEVELS)), "--hold-s", "5", "--warmup-s", "0", "--no-refine")
SWEEP_STOP = ("--stop-on", "first-preemption")


@dataclass(frozen=True)
class RealSweep:
    run: Run
    watch: CounterWatch
    labels: dict[str, str]
    max_num_seqs: int


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("onset") / "fixed-256-256.jsonl"
    return write_trace_file(path, [(PROMPT_TOKENS, OUTPUT_TOKENS)] * 400)


@pytest.fixture(scope="module")
def real_sweep(vllm_servers: ServerPool, trace: Path, tmp_path_factory: pytest.TempPathFactory) -> RealSweep:
    server = vllm_servers.get()
    run_dir = tmp_path_factory.mktemp("onset-real") / "run"
    watch = CounterWatch(server.url).start()
    try:
        proc = replay(
            server.url,
            trace,
            run_dir,
            *SWEEP,
            *SWEEP_STOP,
        )
    finally:
        watch.stop()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return RealSweep(Run.read(run_dir), watch, cache_config(server.url), server.config.max_num_seqs)


def _grid_index(level: int) -> int:
    """Index of the lowest sweep level ≥ ``level``."""
    return next(i for i, c in enumerate(LEVELS) if c >= level)


def test_replay_onset_matches_the_counter_and_the_arithmetic(real_sweep: RealSweep) -> None:
    run, summary = real_sweep.run, real_sweep.run.summary
    assert summary is not None
    onset = summary["verdict"]["onsets"]["preemption"]
    assert onset is not None, "oomload saw no preemption"

    # The test's own reading of vllm:num_preemptions_total: the first rise happened after the last
    # scrape that still showed the baseline was sent and before the first higher one was received.
    window = real_sweep.watch.first_rise_window()
    assert window is not None, "the counter never rose during the sweep"
    candidates = {
        step
        for step, (_c, start, end) in run.step_windows().items()
        if start <= window[1] and end >= window[0]
    }
    assert onset["step"] in candidates, (onset, window, run.step_windows())

    # Within one sweep step of the block arithmetic from vllm:cache_config_info and the trace.
    labels = real_sweep.labels
    predicted = predict_preemption_onset(
        int(labels["num_gpu_blocks"]), int(labels["block_size"]), [PROMPT_TOKENS + OUTPUT_TOKENS]
    )
    assert predicted.onset_mean == 6
    assert abs(_grid_index(onset["concurrency"]) - _grid_index(predicted.onset_mean)) <= 1
    prediction = summary["verdict"]["prediction"]
    assert (prediction["num_gpu_blocks"], prediction["block_size"], prediction["onset_mean"]) == (12, 256, 6)
    assert prediction["levels_apart"] is not None and prediction["levels_apart"] <= 1

    # What the onset step held, at the client and in vLLM by its own counters (printed, not asserted:
    # how much load a 2-core machine delivers drifts; test_load_delivered checks the figures).
    at_onset = next(s for s in summary["verdict"]["steps"] if s["index"] == onset["step"])
    server = at_onset["server"] or {}
    FIGURES.append(
        f"onset step {onset['step']} (concurrency {onset['concurrency']}): client held "
        f"{at_onset['achieved_concurrency']:.2f}, server {at_onset['delivered_concurrency']:.2f} "
        f"(Little's law in vLLM {server.get('in_server')}), concurrency held: {at_onset['concurrency_held']}"
    )

    # Exact lengths, from usage, on every request that completed.
    ok = [r for r in run.requests if r["outcome"] == "ok"]
    assert len(ok) >= sum(c for c in LEVELS if c < onset["concurrency"])
    assert {(r["usage_prompt_tokens"], r["usage_completion_tokens"]) for r in ok} == {
        (PROMPT_TOKENS, OUTPUT_TOKENS)
    }
    assert {(r["prompt_tokens_asked"], r["output_tokens_asked"]) for r in run.requests} == {
        (PROMPT_TOKENS, OUTPUT_TOKENS)
    }
    # Nothing but ok before the stop: the only others are requests cut by the stop itself.
    stopped_at = max(s["t_unix_s"] for s in run.steps)
    assert [r for r in run.requests if r["outcome"] != "ok" and r["end_unix_s"] < stopped_at - 1.0] == []


def test_simulator_gives_the_same_onset_on_the_same_trace(
    real_sweep: RealSweep, trace: Path, tmp_path: Path
) -> None:
    real_onset = (real_sweep.run.summary or {})["verdict"]["onsets"]["preemption"]
    assert real_onset is not None
    cache = json.loads((real_sweep.run.path / "cache_config.json").read_text())
    sim_args = [
        *("--model", "tiny", "--served-model-name", "tiny-model", "--max-model-len", "2048"),
        *("--num-gpu-blocks", str(cache["num_gpu_blocks"]), "--block-size", str(cache["block_size"])),
        *("--max-num-seqs", str(real_sweep.max_num_seqs)),
    ]
    run_dir = tmp_path / "run"
    with SimServer(sim_args) as sim:
        proc = replay(
            sim.url,
            trace,
            run_dir,
            *SWEEP,
            *SWEEP_STOP,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = Run.read(run_dir).summary
    assert summary is not None
    sim_onset = summary["verdict"]["onsets"]["preemption"]
    assert sim_onset is not None, "the simulator never preempted"
    FIGURES.append(
        f"preemption onset: real vLLM {real_onset['concurrency']}, simulated {sim_onset['concurrency']}, "
        "arithmetic 6 (sweep " + ",".join(map(str, LEVELS)) + ")"
    )
    assert abs(_grid_index(sim_onset["concurrency"]) - _grid_index(real_onset["concurrency"])) <= 1
