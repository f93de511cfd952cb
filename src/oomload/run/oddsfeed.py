"""The trace's odds for a live run, computed without stalling the load (``oomload.capacity.odds``).

A level's odds cost a tenth to half a second of CPU (more where it preempts often, or with shared
prefixes; ``oomload.capacity.odds``). Computed inside the Locust process they would freeze every user for that
long — measured: a 1 s step at concurrency 8 then held 4.8 requests in flight instead of 8, because the
step's clock started before the freeze.
So:

1. before the load starts, the ramp's own levels are computed here, at once (nothing is running yet);
   with ``place``, only those that find where the odds put the onset (``odds.predicted_onset``: the
   ramp's levels up to the first one the odds do not call safe, then a bisection below it), and the
   ramp becomes the placed one (``schedule.place_levels``: the onset and the level below it, short
   checks under them); the ramp's higher levels go to the child first (a level whose odds are not
   known when its step is done is simply not extended);
2. every other level the refinement may visit — the integers between the lowest and the highest ramp
   level — is computed by a child process (``python -m oomload.run.oddsfeed``, at a low CPU priority)
   in the order a bisection visits them (each gap's midpoint first), and read back line by line by a
   greenlet;
3. each level's odds are appended to ``odds.jsonl`` when known, and ``requests_for`` answers at once:
   the requests a clean step at that level must send, or ``None`` while its odds are not known yet
   (the step driver asks again when the hold is done, before it decides to extend).

The odds are ``capacity.odds.TraceOdds``' (the one computation the tune and the plan use too), for
the prompts the run sends (``shape``: the trace's shared prefixes, cached by the server —
``production`` — or all distinct — ``worst-case``); only those answer ``requests_for``. When the trace
shares prefix blocks, the child then computes every level for the other shape too (one ``odds.jsonl``
line each, ``"prompts"`` naming the shape), so the verdict can say what prefix caching
buys at this traffic.

The child reads the run directory's ``trace.jsonl`` (lengths, ``hash_ids`` and the header's prefix block
size) and is given the pool on its command line; it writes one ``LevelOdds`` JSON line per level and
exits. Both draw from the requests the replay sends (``trace.model.replayed``, the one selection the
replay's order uses): with ``only_fitting`` (``--only-fitting``) those that fit the pool's
``max_model_len``, then with ``tail_percentile`` (``--tail-percentile``) the trace's longest — so the
ramp is placed, and a clean step's evidence asked, for the requests sent, not for the whole trace.
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

from oomload.capacity.blocks import PROMPT_SHAPES, PromptShape
from oomload.capacity.odds import LevelOdds, Pool, TraceOdds, predicted_onset
from oomload.capacity.schedule import place_levels
from oomload.trace.model import PrefixInfo, TraceRecord, read_trace, read_trace_header, replayed

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
        shape: PromptShape = "worst-case",
        place: bool = False,
        only_fitting: bool = False,
        tail_percentile: float | None = None,
    ) -> None:
        self.pool = pool
        self.only_fitting = only_fitting and pool.max_model_len is not None
        self.tail_percentile = tail_percentile or None
        records = replayed(
            records, pool.max_model_len, only_fitting=self.only_fitting, tail_percentile=self.tail_percentile
        )
        self.record = record
        self.shape = shape
        self._known: dict[tuple[str, int], LevelOdds] = {}
        odds = TraceOdds.of_records(records, _prefix_info(trace_path), pool, seed=seed)

        def odds_at(level: int) -> LevelOdds:  # before any load: computed here, at once
            known = self._known.get((shape, level))
            if known is None:
                known = odds.at(level, shape=shape)
                self._add(known)
            return known

        # where the odds put the onset, and the ramp placed around it (module docstring); placing asks
        # the ramp's levels only up to the first one the odds do not call safe: the child does the rest
        self.onset: int | None = predicted_onset(levels, odds_at) if place else None
        if not place:
            for level in levels:
                odds_at(level)
        self.levels, self.checks = place_levels(levels, self.onset)
        self._child: Any = None
        self._reader: Any = None  # the greenlet reading the child's lines
        rest = [c for c in [*self.levels, *bisection_order(self.levels)] if (shape, c) not in self._known]
        shares = odds.shared is not None
        other = sorted(set(self.levels) | set(bisection_order(self.levels))) if shares else []
        if rest or other:
            self._start_child(trace_path, rest, other, seed)

    def requests_for(self, concurrency: int) -> int | None:
        odds = self._known.get((self.shape, concurrency))
        return None if odds is None else odds.requests_for()

    def stop(self) -> None:
        """Kill the child if it still computes, and end its reader (which closes the pipe)."""
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
            self._child.wait()
        if self._reader is not None:
            self._reader.kill()  # waits for it: a no-op once it has read to the end
            self._child.stdout.close()  # (again): a reader killed before it started never opened it

    def _add(self, odds: LevelOdds) -> None:
        if (odds.shape, odds.concurrency) not in self._known:
            self._known[(odds.shape, odds.concurrency)] = odds
            self.record(odds)

    def _start_child(self, trace_path: Path, levels: Sequence[int], other: Sequence[int], seed: int) -> None:
        import gevent

        argv = [
            sys.executable,
            "-m",
            "oomload.run.oddsfeed",
            *("--trace", str(trace_path), "--seed", str(seed)),
            *("--num-gpu-blocks", str(self.pool.num_gpu_blocks), "--block-size", str(self.pool.block_size)),
            *("--levels", ",".join(map(str, levels)), "--prompts", self.shape),
            *("--other-levels", ",".join(map(str, other))),
        ]
        if self.pool.max_model_len is not None:
            argv += ["--max-model-len", str(self.pool.max_model_len)]
        if self.only_fitting:
            argv.append("--only-fitting")
        if self.tail_percentile is not None:
            argv += ["--tail-percentile", repr(self.tail_percentile)]
        argv += ["--max-num-seqs", str(self.pool.max_num_seqs)]
        argv += ["--max-num-batched-tokens", str(self.pool.max_num_batched_tokens)]
        self._child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = gevent.spawn(self._read, self._child)

    def _read(self, child: Any) -> None:
        with child.stdout:  # closed at its end (or when ``stop`` ends the reader): no pipe left to the GC
            for line in child.stdout:
                try:
                    odds = LevelOdds.from_json(json.loads(line))
                except ValueError:
                    continue
                if odds is not None:
                    self._add(odds)


def _prefix_info(trace_path: Path) -> PrefixInfo:
    """What the trace's ``hash_ids`` mean (its header), or the default for a trace not written yet."""
    return read_trace_header(trace_path).prefix_or_default() if trace_path.is_file() else PrefixInfo()


def main(argv: Sequence[str] | None = None) -> int:
    """The child: print one ``LevelOdds`` JSON line per ``--levels`` entry, in that order."""
    parser = argparse.ArgumentParser(prog="python -m oomload.run.oddsfeed")
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--num-gpu-blocks", type=int, required=True)
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int, help="the server's; default: vLLM's")
    parser.add_argument("--max-num-batched-tokens", type=int, help="the server's; default: vLLM's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--levels", required=True, help="levels of the run's own prompt shape")
    parser.add_argument("--prompts", choices=PROMPT_SHAPES, default="worst-case")
    parser.add_argument("--other-levels", default="", help="levels of the other shape, after those")
    parser.add_argument("--only-fitting", action="store_true", help="only requests within --max-model-len")
    parser.add_argument("--tail-percentile", type=float, help="then only those ≥ this percentile")
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.nice(CHILD_NICE)  # the load generator shares this host: it comes first
    pool = Pool(args.num_gpu_blocks, args.block_size, args.max_model_len)
    pool = pool.with_limits(args.max_num_seqs, args.max_num_batched_tokens)
    records = replayed(
        read_trace(args.trace),
        pool.max_model_len,
        only_fitting=args.only_fitting,
        tail_percentile=args.tail_percentile,
    )
    trace = TraceOdds.of_records(records, _prefix_info(args.trace), pool, seed=args.seed)
    other: PromptShape = "worst-case" if args.prompts == "production" else "production"
    for shape, spec in ((args.prompts, args.levels), (other, args.other_levels)):
        for c in (int(x) for x in spec.split(",") if x):
            print(json.dumps(trace.at(c, shape=shape).to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
