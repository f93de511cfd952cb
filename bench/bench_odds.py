"""CPU time of the trace's odds (``oomload.capacity.odds.level_odds``) with and without shared prefixes.

The odds run live during a replay (``run.oddsfeed``), so the prefix cache must not make them slow.
Trace: 2,000 chat-like requests — one of four system prompts (1–4 Mooncake-style 512-token ids) in
front of a distinct user part, prompts 600–6,000 tokens, outputs 20–600 — on a 16-token-block pool
of 4,000 blocks, at three levels around its onset. Baseline, measured in the same run: the same levels
with every prompt distinct (the worst case: the code path the odds had before prefixes counted).
Ratio: production / worst case, per level and over all (lower is cheaper; above 1 is the prefix
cache's cost).
"""

from __future__ import annotations

import time

import numpy as np

from oomload.capacity.blocks import SharedPrefixes
from oomload.capacity.odds import Pool, level_odds

REQUESTS = 2000
LEVELS = (8, 16, 32)
POOL = Pool(num_gpu_blocks=4000, block_size=16, max_model_len=16_384)


def _trace() -> tuple[list[int], list[int], SharedPrefixes]:
    rng = np.random.default_rng(7)
    prompts = rng.integers(600, 6000, REQUESTS).tolist()
    outputs = rng.integers(20, 600, REQUESTS).tolist()
    chains = []
    for i, p in enumerate(prompts):
        system = int(rng.integers(1, 5))
        own = range(1_000_000 + 100 * i, 1_000_000 + 100 * i + p // 512)
        chains.append((*(system * 10 + k for k in range(system)), *own)[: p // 512 + 1])
    shared = SharedPrefixes.from_chains(chains, prompts, block_tokens=512, block_size=POOL.block_size)
    return prompts, outputs, shared


def main() -> None:
    prompts, outputs, shared = _trace()
    total = {"worst-case": 0.0, "production": 0.0}
    print(f"{'level':>5} {'worst case s':>13} {'production s':>13} {'ratio':>6}  per 100 (worst / prod)")
    for c in LEVELS:
        times = {}
        odds = {}
        for shape, prefixes in (("worst-case", None), ("production", shared)):
            start = time.process_time()
            odds[shape] = level_odds(prompts, outputs, POOL, c, shared=prefixes)
            times[shape] = time.process_time() - start
            total[shape] += times[shape]
        print(
            f"{c:>5} {times['worst-case']:>13.2f} {times['production']:>13.2f} "
            f"{times['production'] / times['worst-case']:>6.2f}  "
            f"{odds['worst-case'].per_100:.1f} / {odds['production'].per_100:.1f}"
        )
    print(f"all levels: production / worst case = {total['production'] / total['worst-case']:.2f}")


if __name__ == "__main__":
    main()
