"""KV-cache capacity arithmetic: how many requests of given lengths a block pool holds (pure).

vLLM's V1 scheduler gives a request ``ceil(tokens / block_size)`` blocks, where ``tokens`` is the
number of tokens whose KV is written: it grows from the prompt length as the request decodes, but the
KV of the last sampled token is never written (the request finishes first). So a request of ``P``
prompt + ``O`` output tokens holds at most

    blocks_held = ceil((P + O − 1) / block_size)

blocks (``blocks_held``, the one function every prediction uses: ``predict_preemption_onset`` for the
verdict's prediction and ``oomload plan``, ``concurrent_fit``; the simulator's scheduler reaches the
same number by allocating as it computes). Measured on the real vLLM 0.32: 129 + 128 tokens with 12
blocks of 256 ran 10 concurrent requests in one block each and never preempted. One block of the pool
is the reserved null block, so ``num_gpu_blocks - 1`` are usable (vLLM's own ``kv_cache_usage_perc``
divides by that number). When every running request holds its full length at once, ``n`` requests
fit while ``n × blocks_held ≤ usable``; the first preemption is expected at one more than that:

    onset = floor(usable_blocks / blocks_held) + 1

This is exact for fixed lengths (seen on the real CPU vLLM, reference ``vllm-cpu.md`` §6). For a mixed
trace we report the onset for a mean request (a rough centre; it lands about one level early because
requests start staggered and do not all hold their full length at once) and for the P50 / P90
requests, so the verdict can show the observed onset beside a band instead of one number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """Blocks a request of ``tokens`` KV tokens holds (``ceil``; 0 tokens → 0 blocks)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return -(-max(tokens, 0) // block_size)


def kv_tokens_held(total_tokens: int) -> int:
    """KV slots a finished request of ``total_tokens`` = prompt + output tokens held: one less, since the
    last sampled token's KV is never written (at least 1 for a non-empty request)."""
    return max(total_tokens - 1, 1) if total_tokens > 0 else 0


def blocks_held(total_tokens: int, block_size: int) -> int:
    """Blocks a request of ``total_tokens`` (prompt + output) holds at its peak: ``ceil((P+O−1)/bs)``."""
    return blocks_for_tokens(kv_tokens_held(total_tokens), block_size)


def blocks_held_array(total_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """``blocks_held`` for an array of totals (vectorised; same rule)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    held = np.where(total_tokens > 0, np.maximum(total_tokens - 1, 1), 0)
    return -(-held // block_size)


def usable_blocks(num_gpu_blocks: int) -> int:
    """Blocks a V1 scheduler can hand out (one is the reserved null block)."""
    return max(num_gpu_blocks - 1, 0)


def single_request_limit_tokens(num_gpu_blocks: int, block_size: int) -> int:
    """The longest request (in KV tokens) the pool can hold: vLLM 0.33's start-up check compares
    ``max_model_len`` with the usable blocks (the null block excluded); older versions with all blocks,
    so this is the conservative bound for every version. ``oomload plan`` and ``recommend`` both use it."""
    return usable_blocks(num_gpu_blocks) * block_size


def concurrent_fit(num_gpu_blocks: int, block_size: int, tokens_per_request: float) -> int:
    """How many requests of ``tokens_per_request`` (prompt + output) tokens fit at once in the pool."""
    per_request = max(blocks_held(math.ceil(tokens_per_request), block_size), 1)
    return usable_blocks(num_gpu_blocks) // per_request


@dataclass(frozen=True, slots=True)
class OnsetPrediction:
    """Predicted first concurrency with preemption, for a mean, median and P90 request."""

    num_gpu_blocks: int
    block_size: int
    kv_cache_tokens: int
    onset_mean: int
    onset_p50: int
    onset_p90: int

    @property
    def band(self) -> tuple[int, int]:
        """(earliest, latest) plausible onset: a P90-length mix preempts first, a P50 mix last."""
        return (min(self.onset_p90, self.onset_mean), max(self.onset_p50, self.onset_mean))


def predict_preemption_onset(
    num_gpu_blocks: int, block_size: int, total_tokens: Sequence[int] | np.ndarray
) -> OnsetPrediction:
    """Predict the preemption onset concurrency for requests of the given total (prompt + output)
    lengths, each holding ``blocks_held`` blocks."""
    arr = np.asarray(total_tokens, dtype=np.int64)
    if arr.size == 0:
        raise ValueError("cannot predict an onset without request lengths")
    blocks = blocks_held_array(arr, block_size)
    mean_blocks = max(float(blocks.mean()), 1.0)
    p50_blocks = max(float(np.percentile(blocks, 50, method="inverted_cdf")), 1.0)
    p90_blocks = max(float(np.percentile(blocks, 90, method="inverted_cdf")), 1.0)
    usable = usable_blocks(num_gpu_blocks)
    return OnsetPrediction(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        kv_cache_tokens=num_gpu_blocks * block_size,
        onset_mean=int(usable // mean_blocks) + 1,
        onset_p50=int(usable // p50_blocks) + 1,
        onset_p90=int(usable // p90_blocks) + 1,
    )
