"""The trace's odds for a live run, computed without stalling the load (``oomload.odds``).

A level's odds cost about a quarter of a second of CPU (more for long outputs). Computed inside the
Locust process they would freeze every user for that long — measured: a 1 s step at concurrency 8
then held 4.8 requests in flight instead of 8, because the step's clock started before the freeze.
So:

1. before the load starts, the ramp's own levels are computed here, at once (nothing is running yet);
2. every other level the refinement may visit — the integers between the lowest and the highest ramp
   level — is computed by a child process (``python -m oomload.run.oddsfeed``, at a low CPU priority)
   in the order a bisection visits them (each gap's midpoint first), and read back line by line by a
   greenlet;
3. each level's odds are appended to ``odds.jsonl`` when known, and ``requests_for`` answers at once:
   the requests a clean step at that level must send, or ``None`` while its odds are not known yet
   (the step driver asks again when the hold is done, before it decides to extend).

The child reads the run directory's ``trace.jsonl`` (lengths only) and is given the pool on its
command line; it writes one ``LevelOdds`` JSON line per level and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from oomload.odds import LevelOdds, Pool, level_odds, trace_odds
from oomload.trace import TraceRecord, read_trace

CHILD_NICE = 10


def bisection_order(levels: Sequence[int]) -> list[int]:
    """The integers strictly between consecutive ``levels``, each gap's midpoint first, breadth first
    over all gaps (the order a bisection from any bracket would need them)."""
    ordered: list[int] = []
    gaps = [(a, b) for a, b in zip(sorted(levels), sorted(levels)[1:], strict=False) if b - a > 1]
    while gaps:
        next_gaps = []
        for a, b in gaps:
            mid = (a + b) // 2
            ordered.append(mid)
            next_gaps += [(lo, hi) for lo, hi in ((a, mid), (mid, b)) if hi - lo > 1]
        gaps = next_gaps
    return ordered


class OddsFeed:
    """The odds of every level a run may measure (module docstring); ``requests_for`` never blocks."""

    def __init__(
        self,
        records: Sequence[TraceRecord],
        pool: Pool,
        levels: Sequence[int],
        *,
        trace_path: Path,
        seed: int,
        record: Callable[[LevelOdds], None],
    ) -> None:
        self.pool = pool
        self.record = record
        self._known: dict[int, LevelOdds] = {}
        prompts, outputs = [r.prompt_tokens for r in records], [r.output_tokens for r in records]
        for odds in trace_odds(prompts, outputs, pool, levels, seed=seed):  # the ramp's, before any load
            self._add(odds)
        self._child: Any = None
        rest = bisection_order(levels)
        if rest:
            self._start_child(trace_path, rest, seed)

    def requests_for(self, concurrency: int) -> int | None:
        odds = self._known.get(concurrency)
        return None if odds is None else odds.requests_for()

    def stop(self) -> None:
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
            self._child.wait()

    def _add(self, odds: LevelOdds) -> None:
        if odds.concurrency not in self._known:
            self._known[odds.concurrency] = odds
            self.record(odds)

    def _start_child(self, trace_path: Path, levels: Sequence[int], seed: int) -> None:
        import gevent

        argv = [
            sys.executable,
            "-m",
            "oomload.run.oddsfeed",
            *("--trace", str(trace_path), "--seed", str(seed)),
            *("--num-gpu-blocks", str(self.pool.num_gpu_blocks), "--block-size", str(self.pool.block_size)),
            *("--levels", ",".join(map(str, levels))),
        ]
        if self.pool.max_model_len is not None:
            argv += ["--max-model-len", str(self.pool.max_model_len)]
        self._child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        gevent.spawn(self._read, self._child)

    def _read(self, child: Any) -> None:
        for line in child.stdout:
            try:
                odds = LevelOdds.from_json(json.loads(line))
            except ValueError:
                continue
            if odds is not None:
                self._add(odds)


def main(argv: Sequence[str] | None = None) -> int:
    """The child: print one ``LevelOdds`` JSON line per ``--levels`` entry, in that order."""
    parser = argparse.ArgumentParser(prog="python -m oomload.run.oddsfeed")
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--num-gpu-blocks", type=int, required=True)
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--levels", required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.nice(CHILD_NICE)  # the load generator shares this host: it comes first
    records = read_trace(args.trace)
    prompts = [r.prompt_tokens for r in records]
    outputs = [r.output_tokens for r in records]
    pool = Pool(args.num_gpu_blocks, args.block_size, args.max_model_len)
    for c in (int(x) for x in args.levels.split(",") if x):
        odds = level_odds(prompts, outputs, pool, c, seed=args.seed)
        print(json.dumps(odds.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
