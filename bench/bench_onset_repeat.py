"""Does the demo give the same onset twice? The demo configuration, run N times per mode.

Two modes, interleaved run by run so the machine's drift hits both alike:

* ``first sighting`` — ``--repeats 1 --no-evidence``: the onset is the first level that preempted
  once, every level of the demo's 1, 2, 4, 8, 16 held for its 4 s, bisected (the behaviour before the
  odds and the repeats);
* ``odds + repeats`` — the defaults (``make demo``): the ramp placed where the trace's odds put the
  onset (that level and the one below it added, the levels under them short checks), clean steps
  extended until the odds say they sent enough requests, the two levels around the onset measured up
  to 3 times, the onset is what most saw.

Prints, per mode, the onset of every run, its distribution, the share of runs on the modal onset
(the goal: 9 of 10), the last safe levels and the mean and the slowest wall time.
``OOMLOAD_BENCH_RUNS`` (default 10) sets N; ``OOMLOAD_BENCH_MAX_S`` (default 180) is each run's
``--max-duration-s``; ``OOMLOAD_BENCH_MODES`` (default both, comma-separated) picks modes by name;
``OOMLOAD_BENCH_ARGS`` adds replay flags to every run (e.g. another ``--sim="--time-scale F"``).
Runs against the built-in simulated vLLM on loopback.
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRACE = Path(__file__).resolve().parent.parent / "traces" / "sample-chat.jsonl"
MODES = {
    "first sighting": ["--repeats", "1", "--no-evidence"],
    "odds + repeats": [],
}


def one_run(extra: list[str], run_dir: Path, max_s: float) -> tuple[int | None, int | None, float]:
    """(onset, last safe, wall seconds) of one demo replay."""
    oomload = Path(sys.executable).parent / "oomload"
    started = time.perf_counter()
    argv = [str(oomload), "replay", str(TRACE), "--max-duration-s", str(max_s), "--no-live"]
    argv += shlex.split(os.environ.get("OOMLOAD_BENCH_ARGS", ""))
    subprocess.run(
        [*argv, "--run-dir", str(run_dir), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=max_s + 120,
        check=False,
    )
    wall = time.perf_counter() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    verdict = summary["verdict"]
    onset = verdict["onsets"]["preemption"]
    return (None if onset is None else onset["concurrency"]), verdict["last_safe_concurrency"], wall


def main() -> None:
    runs = int(os.environ.get("OOMLOAD_BENCH_RUNS", "10"))
    max_s = float(os.environ.get("OOMLOAD_BENCH_MAX_S", "180"))
    names = [m.strip() for m in os.environ.get("OOMLOAD_BENCH_MODES", ",".join(MODES)).split(",")]
    modes = {m: MODES[m] for m in names if m in MODES}
    results: dict[str, list[tuple[int | None, int | None, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="oomload-bench-onset-") as tmp:
        for k in range(runs):
            for mode, extra in modes.items():
                run_dir = Path(tmp) / f"{mode.replace(' ', '-')}-{k}"
                results[mode].append(one_run(extra, run_dir, max_s))
                onset, safe, wall = results[mode][-1]
                print(
                    f"  run {k + 1}/{runs} {mode:15s} onset {onset} last safe {safe} ({wall:.0f} s)",
                    flush=True,
                )
    for mode, rows in results.items():
        onsets = collections.Counter(r[0] for r in rows)
        modal, count = onsets.most_common(1)[0]
        safes = _spread(collections.Counter(r[1] for r in rows))
        mean_wall = sum(r[2] for r in rows) / len(rows)
        print(
            f"{mode:15s} onset {{{_spread(onsets)}}}: modal {modal} in {count} of {len(rows)}; "
            f"last safe {{{safes}}}; wall mean {mean_wall:.0f} s, max {max(r[2] for r in rows):.0f} s"
        )


def _spread(counts: collections.Counter[int | None]) -> str:
    """``"6: 2, 7: 8"`` (None last)."""
    ordered = sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    return ", ".join(f"{k}: {v}" for k, v in ordered)


if __name__ == "__main__":
    main()
