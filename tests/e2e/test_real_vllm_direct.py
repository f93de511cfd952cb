"""The harness itself, checked with plain HTTP: exact lengths, cache config, preemption at the arithmetic.

256 prompt + 256 output tokens hold 2 blocks of 256 tokens; 11 of the 12 blocks are usable (one is
vLLM's null block), so 5 requests fit (10 blocks) and 6 do not (12 > 11). A burst of 5 can never
preempt. A burst of 6 preempts only when all six hold their second block at once; on the 2 busy cores
the server sometimes admits them far enough apart that the first finishes before the last needs its
block (CI once saw 0 preemptions in 4 bursts of 6). So the test asks what the product promises and
the oomload-driven tests check too: no preemption below the arithmetic onset, and the counter rises at
the onset or one level above it (a burst of 7 needs 14 blocks). Which level it was is printed.
"""

from __future__ import annotations

import random

import pytest
from harness import FIGURES, ServerPool
from probe import PREEMPTIONS, burst, cache_config, complete, get_json, scrape, token_prompt

from oomload.capacity.blocks import predict_preemption_onset

pytestmark = pytest.mark.e2e

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 256


def test_server_reports_its_model_and_cache_config(vllm_servers: ServerPool) -> None:
    server = vllm_servers.get()
    models = get_json(server.url + "/v1/models")
    assert [m["id"] for m in models["data"]] == ["tiny-model"]
    assert models["data"][0]["max_model_len"] == 2048
    labels = cache_config(server.url)
    assert labels["num_gpu_blocks"] == "12"
    assert labels["block_size"] == "256"
    assert labels["kv_cache_size_tokens"] == "3072"


def test_exact_lengths_come_back_in_usage(vllm_servers: ServerPool) -> None:
    server = vllm_servers.get()
    rng = random.Random(7)
    for prompt_tokens, output_tokens in [(1, 1), (37, 5), (PROMPT_TOKENS, OUTPUT_TOKENS), (1500, 3)]:
        answer = complete(server.url, token_prompt(rng, prompt_tokens), output_tokens)
        assert (answer.status, answer.prompt_tokens, answer.completion_tokens) == (
            200,
            prompt_tokens,
            output_tokens,
        )


def test_preemption_counter_never_rises_below_the_predicted_onset_and_rises_within_one_level(
    vllm_servers: ServerPool,
) -> None:
    server = vllm_servers.get()
    labels = cache_config(server.url)
    predicted = predict_preemption_onset(
        int(labels["num_gpu_blocks"]), int(labels["block_size"]), [PROMPT_TOKENS + OUTPUT_TOKENS]
    )
    assert predicted.onset_mean == 6
    rng = random.Random(11)
    below = [_burst_preemptions(server.url, predicted.onset_mean - 1, rng) for _ in range(2)]
    assert below == [0, 0]
    tried: list[tuple[int, float]] = []
    for level in (predicted.onset_mean, predicted.onset_mean + 1):
        for _ in range(3):
            tried.append((level, _burst_preemptions(server.url, level, rng)))
            if tried[-1][1] > 0:
                break
        if tried[-1][1] > 0:
            break
    assert tried[-1][1] > 0, f"no preemption in bursts (concurrency, preemptions) {tried}"
    FIGURES.append(f"direct bursts: first preemption at concurrency {tried[-1][0]} after {tried}")


def _burst_preemptions(url: str, concurrency: int, rng: random.Random) -> float:
    """Preemptions during one burst; also checks every answer's lengths and the prompt counter."""
    before = scrape(url)
    answers = burst(url, concurrency, PROMPT_TOKENS, OUTPUT_TOKENS, rng)
    after = scrape(url)
    assert [(a.status, a.prompt_tokens, a.completion_tokens) for a in answers] == [
        (200, PROMPT_TOKENS, OUTPUT_TOKENS)
    ] * concurrency
    # Recomputed prefill is not counted again: the prompt counter rises by exactly what was sent.
    prompt_delta = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert prompt_delta == concurrency * PROMPT_TOKENS
    return after[PREEMPTIONS] - before[PREEMPTIONS]
