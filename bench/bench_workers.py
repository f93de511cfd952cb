"""Distributed load: tokens/s and client CPU per token with 1, 2 and 4 Locust workers, same run.

A whole ``oomload replay --workers N --processes N`` (the master plus N local ``oomload worker``
processes, every result streamed back to the master's ``requests.jsonl``) drives the fast streaming
stub of ``bench_client`` (its own process; 256-token prompts, 128-token outputs, no pacing) at a
fixed concurrency for one step. Client CPU is the master's and its workers' user + system time
(``/proc``) over that step only — start-up is not counted; tokens are the step's completion tokens
(``steps.jsonl``). The in-process run (no master, no worker) is shown for reference; ratios are
against one worker measured in the same run. On a shared 2-core host the stub competes with the
clients for CPU, so more workers cannot add throughput beyond what the cores give: the line says what
distribution costs per token and whether streaming results to the master keeps up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_client import _start_server
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

CONCURRENCY = int(os.environ.get("OOMLOAD_BENCH_WORKERS_C", "64"))
HOLD_S = float(os.environ.get("OOMLOAD_BENCH_WINDOW_S", "8"))
TICK_S = os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its descendants (Linux ``/proc``)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK_S
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def _steps(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(url: str, workers: int, workdir: Path) -> dict[str, float]:
    trace = workdir / "trace.jsonl"
    if not trace.exists():
        records = [TraceRecord(f"r{i}", 0.0, 256, 128) for i in range(256)]
        write_trace(trace, records, TraceHeader(source=("bench",)))
    run_dir = workdir / f"run-{workers}-{time.monotonic_ns()}"
    cmd = [
        sys.executable, "-m", "oomload", "replay", str(trace), "--url", url,
        "--concurrency", str(CONCURRENCY),
        "--hold-s", str(HOLD_S), "--stop-on", "never", "--no-refine", "--gpu", "none", "--no-live",
        "--metrics-interval-s", "5", "--run-dir", str(run_dir), "--max-duration-s", "120",
    ]  # fmt: skip
    if workers:
        cmd += ["--workers", str(workers), "--processes", str(workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu_start = cpu_end = None
    while proc.poll() is None:
        steps = _steps(run_dir)
        if cpu_start is None and any(s.get("event") == "start" for s in steps):
            cpu_start = _tree_cpu_s(proc.pid)
        if cpu_start is not None and any(s.get("event") == "end" for s in steps):
            cpu_end = _tree_cpu_s(proc.pid)
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    if proc.returncode != 0 or cpu_start is None or cpu_end is None:
        raise RuntimeError(f"replay with {workers} workers failed ({proc.returncode}): {err[-500:]}")
    end = next(s for s in _steps(run_dir) if s.get("event") == "end")
    tokens = float(end["completion_tokens"])  # type: ignore[arg-type]
    duration_s = float(end["duration_s"])  # type: ignore[arg-type]
    achieved = end.get("achieved_concurrency_mean")
    return {
        "tokens_per_s": tokens / duration_s,
        "cpu_us_per_token": (cpu_end - cpu_start) / max(1.0, tokens) * 1e6,
        "achieved": float(achieved) if isinstance(achieved, int | float) else float("nan"),
    }


def main() -> None:
    print(
        f"stub full speed, prompt 256 / output 128 tokens, concurrency {CONCURRENCY}, one {HOLD_S:g} s step"
    )
    with tempfile.TemporaryDirectory(prefix="oomload-bench-workers-") as tmp:
        workdir = Path(tmp)
        server, url = _start_server(0.0, 0.0, workdir)
        try:
            results = {n: _run(url, n, workdir) for n in (0, 1, 2, 4)}
        finally:
            server.terminate()
            server.wait(timeout=10)
    base = results[1]
    for n, r in results.items():
        name = "in-process" if n == 0 else f"{n} worker{'s' if n > 1 else ''}"
        print(
            f"{name:>12}: {r['tokens_per_s']:8.0f} tokens/s"
            f" ({r['tokens_per_s'] / base['tokens_per_s']:4.2f}× 1 worker)"
            f" · client CPU {r['cpu_us_per_token']:6.1f} µs/token"
            f" ({r['cpu_us_per_token'] / base['cpu_us_per_token']:4.2f}× 1 worker)"
            f" · achieved concurrency {r['achieved']:.1f} of {CONCURRENCY}",
            flush=True,
        )


if __name__ == "__main__":
    main()
