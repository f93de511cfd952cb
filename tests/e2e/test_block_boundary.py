"""A request one token past a block boundary holds one block, not two: ``ceil((P + O − 1) / bs)``.

vLLM V1 never writes the KV of the last sampled token. Requests of 129 + 128 = 257 tokens hold 256
KV tokens, one block of 256, so 11 fit the 11 usable blocks of the harness's pool; counting 257
tokens (two blocks) would predict preemption from 6 concurrent requests on. Checked two ways:

- plain HTTP bursts of 6 and 10 such requests: vLLM's preemption counter never rises, and every
  answer has the exact lengths;
- ``oomload replay`` at 6 and 10: no preemption onset, and the verdict's prediction (from
  ``vllm:cache_config_info`` and the lengths sent) puts the pool's fill at 12, above the levels run — it
  agrees with what was seen (no ``disagrees``).

Such a request also never grows: its prompt of 129 tokens already takes the one block it ends in, and
vLLM admits a request only when its prompt's blocks are free. So past the pool (12 and 16 at once) the
requests queue and none is preempted — the burst of 16 and the replay at 12 and 16 check it, and the
arithmetic says "no onset" (``grows`` false) rather than 12.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from harness import FIGURES, Run, ServerPool, replay, write_trace_file
from probe import PREEMPTIONS, burst, cache_config, scrape

from oomload.capacity.blocks import blocks_held, predict_preemption_onset

pytestmark = pytest.mark.e2e

PROMPT_TOKENS = 129
OUTPUT_TOKENS = 128


def test_bursts_one_token_past_a_block_boundary_never_preempt(vllm_servers: ServerPool) -> None:
    server = vllm_servers.get()
    labels = cache_config(server.url)
    block_size = int(labels["block_size"])
    assert (int(labels["num_gpu_blocks"]), block_size) == (12, 256)
    assert blocks_held(PROMPT_TOKENS + OUTPUT_TOKENS, block_size) == 1
    predicted = predict_preemption_onset(12, block_size, [PROMPT_TOKENS + OUTPUT_TOKENS])
    assert predicted.onset_mean == 12
    rng = random.Random(129)
    seen = []
    for concurrency in (6, 10, 16):  # 16: past the pool, 5 wait for a block and none is preempted
        before = scrape(server.url)
        answers = burst(server.url, concurrency, PROMPT_TOKENS, OUTPUT_TOKENS, rng)
        after = scrape(server.url)
        assert [(a.status, a.prompt_tokens, a.completion_tokens) for a in answers] == [
            (200, PROMPT_TOKENS, OUTPUT_TOKENS)
        ] * concurrency
        seen.append((concurrency, after[PREEMPTIONS] - before[PREEMPTIONS]))
    FIGURES.append(f"block boundary 129 + 128: preemptions per burst (concurrency, count) {seen}")
    assert [count for _, count in seen] == [0, 0, 0]


def test_replay_at_the_boundary_predicts_and_sees_no_preemption(
    vllm_servers: ServerPool, tmp_path: Path
) -> None:
    server = vllm_servers.get()
    trace = write_trace_file(tmp_path / "boundary.jsonl", [(PROMPT_TOKENS, OUTPUT_TOKENS)] * 200)
    run_dir = tmp_path / "run"
    proc = replay(
        server.url,
        trace,
        run_dir,
        *("--concurrency", "6,10,12,16", "--hold-s", "4", "--warmup-s", "0", "--no-refine", "--no-live"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = Run.read(run_dir).summary
    assert summary is not None
    assert summary["verdict"]["onsets"]["preemption"] is None
    prediction = summary["verdict"]["prediction"]
    assert (prediction["num_gpu_blocks"], prediction["block_size"]) == (12, 256)
    assert (prediction["band_low"], prediction["band_high"]) == (12, 12)  # where the pool fills
    assert prediction["grows"] is False  # no onset: past the pool the requests queue
    assert prediction["disagrees"] is False and prediction["levels_apart"] == 0
    waiting = max(s.get("waiting_max") or 0 for s in summary["verdict"]["steps"])
    FIGURES.append(f"block boundary replay at 6,10,12,16: no onset, the most waiting at once {waiting}")
