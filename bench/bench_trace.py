"""``trace build`` / ``trace stats``: speed, cores and memory on generated logs, against same-run floors.

Logs are generated in a temporary directory: OpenAI-style JSONL carrying prompt and completion
text (the gateway log of issue 15), Azure CSV and Mooncake JSONL. Every measurement runs in its own
subprocess, so its peak RSS (``VmHWM``, the main process; workers are separate processes) is its
own. Baselines, on the same file, in the same run, interleaved with what they are compared with
(the best of ``ROUNDS`` rounds of each: the least wall time, or for a CPU ratio the least CPU, which
on two threads is not the same run): ``orjson.loads`` per line (and ``json.loads``) for JSONL — for
an access log also a loop that parses each line's two JSON bodies too (``STRING_BODIES``) — and
pandas ``read_csv(engine="pyarrow")`` for CSV. A CPU ratio also gives the median of its rounds' own
ratios (``cpu_ratios``): this VM's CPU time moves by a third between identical runs, and the two runs
of a round, seconds apart, move together more often than the two minima do.

Lines printed: every OpenAI-style log shape of ``bench/logshapes.py`` (and a mix of the three of
issue 25), each ``build`` in one process against the orjson loop in CPU time per byte after start-
up, with prefix chains on and off, the worst shape named first; ``build`` with 1, 2 and all cores
(``--workers``) as a ratio to the floor and in MB/s; ``stats`` straight from the log; 2 workers'
time over one process's on OpenAI logs from 64 MB to 2 GB (the pool's start-up is fixed, its gain
grows with the input: where it pays is the in-process threshold); where the pool's CPU goes per GB
(main process, workers) and the bound that puts on more cores (``_spread_cost``); peak RSS of
``build`` and ``stats`` at 1M and 10M requests (Azure CSV), which must stay flat, and the 10M-row
CSV built on 1, 2 and all cores (byte ranges of rows). ``BENCH_TRACE_ONLY=shapes`` prints the log shapes
only, ``=vllm`` the vLLM log only, ``=tally`` ``stats`` of a chained gateway log at two sizes (its peak
RSS must not follow the log's size: ``bench_tally``) (``BENCH_TRACE_ROUNDS``: their rounds). Goals (issue 15):
OpenAI-style logs with text ≥ 300 MB/s a core, CSV within 2× of pandas, flat memory, every core used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CHILD = r"""
import json, sys, time
kind, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
if kind.startswith(("build", "stats", "pool", "read")):
    import oomload.ingest, oomload.ingest.parallel
    import pandas  # what pyarrow imports on its first conversion of a Python list (~0.2 s)
setup_cpu = time.process_time()  # the interpreter and its imports: paid once per run, whatever the input
if kind.startswith("pool"):  # start N workers, nothing else: what a pool costs before any work
    from oomload.ingest.parallel import ReadPool
    with ReadPool(int(kind.split(":")[1])) as pool:
        pool.pool.submit(int).result()
    rows = 0
elif kind == "read":
    from oomload.ingest import SkipLog, plan_inputs
    from oomload.ingest.build import iter_batches
    rows = sum(b.num_rows for b in iter_batches(plan_inputs([path]), SkipLog(), None))
elif kind.startswith("build"):
    from oomload.ingest import build_trace
    workers = int(kind.split(":")[1]) if ":" in kind else 1
    chains = {} if not kind.startswith("build-noprefix") else {"prefix_block_tokens": None}
    rows = build_trace([path], out, workers=workers, **chains).records_written
elif kind.startswith("stats"):
    from oomload.ingest import count_trace
    workers = int(kind.split(":")[1]) if ":" in kind else 1
    rows = count_trace([path], workers=workers).arrivals.count
elif kind == "orjson":
    import orjson
    rows = 0
    with open(path, "rb") as fh:
        for line in fh:
            orjson.loads(line)
            rows += 1
elif kind == "orjson-bodies":  # an access log read as any reader of its counts must: both bodies parsed too
    import orjson
    rows = 0
    with open(path, "rb") as fh:
        for line in fh:
            obj = orjson.loads(line)
            for side in ("request", "response"):
                body = obj.get(side, {}).get("body")
                if isinstance(body, str):
                    orjson.loads(body)
            rows += 1
elif kind == "pandas":
    import pandas as pd
    rows = len(pd.read_csv(path, engine="pyarrow"))
elif kind == "json":
    rows = 0
    with open(path, "rb") as fh:
        for line in fh:
            json.loads(line)
            rows += 1
wall = time.perf_counter() - start
import resource
children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool's workers, reaped by now
main_cpu = time.process_time()
cpu = main_cpu + children.ru_utime + children.ru_stime
# VmHWM: this process image's own peak RSS (ru_maxrss would include the parent's at fork time).
hwm_kib = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
result = {
    "rows": rows, "wall_s": wall, "cpu_s": cpu, "main_cpu_s": main_cpu, "setup_cpu_s": setup_cpu,
    "maxrss_mib": hwm_kib / 1024,
}
print(json.dumps(result))
"""


# Children may cache compiled modules, as an installed oomload does: where PYTHONDONTWRITEBYTECODE is
# set (this sandbox sets it), every pool worker would otherwise compile oomload's sources again.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def measure(kind: str, path: Path, out: Path) -> dict[str, float]:
    """One run of ``kind`` in a fresh interpreter. A build's output is removed first: every build
    writes a new file, and none pays for deleting the trace the run before it wrote (a trace with
    chains is 2-3 times the size of one without, so that cost had been charged to the other kind)."""
    out.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(path), str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
        env=CHILD_ENV,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _lognormal(rng: np.random.Generator, n: int, p50: float, p99: float, cap: int) -> np.ndarray:
    sigma = (np.log(p99) - np.log(p50)) / 2.3263478740408408
    return np.clip(np.rint(rng.lognormal(np.log(p50), sigma, n)), 1, cap).astype(np.int64)


def _write_lines(path: Path, pieces: list[pa.Array | str]) -> None:
    lines = pc.binary_join_element_wise(*pieces, "\n", "")
    with open(path, "wb") as fh:
        for start in range(0, len(lines), 200_000):
            fh.write("".join(lines.slice(start, 200_000).to_pylist()).encode())


def _text(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def generate_azure(path: Path, n: int, rng: np.random.Generator) -> None:
    # 100 ns ticks, ~0.04 s apart at 1M (closer for more), so every request falls in one day
    ticks = np.cumsum(rng.integers(1, 800_000 * min(1_000_000, n) // n, n))
    seconds, fraction = divmod(ticks, 10_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)

    def pad(values: np.ndarray, width: int) -> pa.Array:
        return pc.utf8_lpad(_text(values), width, "0")

    stamp = pc.binary_join_element_wise(
        "2023-11-16 ", pad(hours, 2), ":", pad(minutes, 2), ":", pad(secs, 2), ".", pad(fraction, 7), ""
    )
    body = pc.binary_join_element_wise(
        stamp, _text(_lognormal(rng, n, 1500, 7400, 7437)), _text(_lognormal(rng, n, 13, 250, 2000)), ","
    )
    lines = pc.binary_join_element_wise(body, "\r\n", "")
    with open(path, "wb") as fh:
        fh.write(b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
        for start in range(0, n, 200_000):
            fh.write("".join(lines.slice(start, 200_000).to_pylist()).encode())


def generate_mooncake(path: Path, n: int, rng: np.random.Generator) -> None:
    inputs = _lognormal(rng, n, 3000, 30000, 128_000)
    blocks = -(-inputs // 512)
    starts = np.concatenate([[0], np.cumsum(blocks)[:-1]])
    flat = (
        np.arange(int(blocks.sum()), dtype=np.int64)
        - np.repeat(starts, blocks)
        + np.repeat(starts // 3, blocks)
    )
    offsets = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int32)
    hash_ids = pa.ListArray.from_arrays(pa.array(offsets), pc.cast(pa.array(flat), pa.string()))
    _write_lines(
        path,
        [
            '{"timestamp": ',
            _text(np.sort(rng.integers(0, 3_600_000, n)) // 3000 * 3000),
            ', "input_length": ',
            _text(inputs),
            ', "output_length": ',
            _text(_lognormal(rng, n, 360, 1000, 2000)),
            ', "hash_ids": [',
            pc.binary_join(hash_ids, ", "),
            "]}",
        ],
    )


def generate_openai(path: Path, n: int, rng: np.random.Generator) -> None:
    words = np.array(["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"])
    corpus = " ".join(words[rng.integers(0, len(words), 400_000)])
    prompt_chars = _lognormal(rng, n, 600, 4000, 20_000)
    output_chars = _lognormal(rng, n, 150, 800, 4000)
    starts = rng.integers(0, len(corpus) - 25_000, n)
    t0 = 1_717_000_000.0
    times = t0 + np.cumsum(rng.exponential(0.01, n))
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            s = int(starts[i])
            prompt = corpus[s : s + int(prompt_chars[i])]
            answer = corpus[s + 7 : s + 7 + int(output_chars[i])]
            fh.write(
                f'{{"timestamp": {times[i]:.6f}, "request": {{"model": "m", "max_tokens": 1024, '
                f'"messages": [{{"role": "user", "content": "{prompt}"}}]}}, '
                f'"response": {{"id": "chatcmpl-{i}", '
                f'"choices": [{{"index": 0, "message": {{"role": "assistant", "content": "{answer}"}}}}], '
                f'"usage": {{"prompt_tokens": {int(prompt_chars[i]) // 4}, '
                f'"completion_tokens": {int(output_chars[i]) // 4}}}}}, "status_code": 200}}\n'
            )


ROUNDS = 2
CORES = os.cpu_count() or 1


def generate_vllm(path: Path, n: int, rng: np.random.Generator) -> None:
    """A vLLM DEBUG request log: prompts of one of 8 system prompts (500-2,000 ids) + their own ids."""
    systems = [rng.integers(16, 32000, int(rng.integers(500, 2000))) for _ in range(8)]
    own = _lognormal(rng, n, 200, 3000, 8000)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            ids = np.concatenate([systems[i % 8], rng.integers(16, 32000, int(own[i]))])
            stamp = f"12-01 06:{(i // 3600) % 60:02d}:{(i // 60) % 60:02d}"
            head = f"(APIServer pid=7) {{}} {stamp} [entrypoints/openai/utils/request_logger.py:55] "
            listed = ", ".join(map(str, ids.tolist()))
            fh.write(
                head.format("DEBUG") + f"Request c{i} details: prompt: None, prompt_token_ids: [{listed}], "
                "prompt_embeds shape: None.\n"
                + head.format("INFO")
                + f"Received request c{i}: params: SamplingParams(n=1, max_tokens=64), lora_request: None.\n"
            )


def _warm(path: Path) -> None:
    """Read ``path`` once, so that the measurement after it reads from the page cache.

    This VM's disk reads anywhere from ~90 MB/s (cold on the host) to ~2 GB/s, and DAMON evicts
    pages untouched for a while: without this, a measurement could time the disk, not the build.
    """
    with open(path, "rb") as fh:
        while fh.read(16 * 1024 * 1024):
            pass


def runs(
    kinds: list[str], path: Path, out: Path, rounds: int = ROUNDS, *, all_rows: bool = True
) -> dict[str, list[dict[str, float]]]:
    """Every run of each kind, ``rounds`` rounds with the kinds interleaved (A B C A B C …), each on a
    warm file (``all_rows``: every line makes a request, as many as the orjson loop's lines); the
    ``i``-th run of each kind is from round ``i``."""
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            _warm(path)
            r = measure(kind, path, out)
            assert (
                not all_rows
                or kind == "pandas"
                or kind.startswith("pool")
                or not results.get("orjson")
                or r["rows"] == results["orjson"][0]["rows"]
            )
            results[kind].append(r)
    return results


def best(
    kinds: list[str], path: Path, out: Path, rounds: int = ROUNDS, *, all_rows: bool = True
) -> dict[str, dict[str, float]]:
    """Each kind's fastest run in wall time of ``runs``."""
    measured = runs(kinds, path, out, rounds, all_rows=all_rows)
    return {kind: min(rs, key=lambda r: r["wall_s"]) for kind, rs in measured.items()}


def _row(label: str, n: int, mb: float, r: dict[str, float], base_s: float | None, base: str) -> str:
    ratio = "" if base_s is None else f"{r['wall_s'] / base_s:6.2f}× {base}"
    return (
        f"{label:<30}{n:>11,}{mb:>8.0f}{r['wall_s']:>8.2f}{n / r['wall_s']:>11,.0f}"
        f"{mb / r['wall_s']:>7.0f}{mb / r['cpu_s']:>9.0f}{r['maxrss_mib']:>8.0f}   {ratio}"
    )


def _spread_cost(
    mb: float, one: dict[str, float], spread: dict[str, float], started: dict[str, float], workers: int
) -> str:
    """Where the pool's CPU went, per GB, and what that allows on more cores than this machine has.

    Start-up is left out (the main process's interpreter and imports, pandas's among them,
    ``setup_cpu_s``; the workers' as measured by ``pool:N``, which starts them and does nothing
    else): it is paid once per build, ~0.5 CPU-s a process, and vanishes on the inputs the pool is
    for. What is left of the main
    process runs serially while the workers' CPU spreads over the cores, so on C cores a build takes
    at least max(main, (main + workers) / C): a bound from CPU measured here, not a measurement on C
    cores (none were lent to this bench).
    """
    main = spread["main_cpu_s"] - spread["setup_cpu_s"]
    work = spread["cpu_s"] - spread["main_cpu_s"] - (started["cpu_s"] - started["main_cpu_s"])
    alone = one["cpu_s"] - one["setup_cpu_s"]
    bounds = ", ".join(
        f"{c} cores ≤ {alone / max(main, (main + work) / c):.1f}×" for c in sorted({CORES, 8, 16})
    )
    return (
        f"{workers} workers after start-up: main process {main / mb * 1000:.2f} CPU-s/GB, workers "
        f"{work / mb * 1000:.2f} (one process {alone / mb * 1000:.2f}); against one process at most {bounds}"
    )


def _head(path: Path, size: int, out: Path) -> Path:
    """The first whole lines of ``path`` up to about ``size`` bytes, as ``out``."""
    with open(path, "rb") as src, open(out, "wb") as dst:
        dst.write(src.read(size))
        dst.write(src.readline())
    return out


SHAPE_BYTES = 48_000_000
# BENCH_TRACE_ONLY=shapes runs only the log shapes (1a; BENCH_SHAPES=a,b only those), =vllm only the
# vLLM log (1b); BENCH_TRACE_ROUNDS sets their rounds (default 5): the shapes' ratios need more rounds
# than the rest to settle — with 3, one shape read 1.43× and 1.92× in two runs of the same code on this
# 2-core VM; with 5, the worst shape read 1.88× and 1.92×.
SHAPE_ROUNDS = int(os.environ.get("BENCH_TRACE_ROUNDS", 5))
HELD_OUT = ("chat-iso", "completions", "batch")  # the shapes of issue 25's 409 MB log
# Shapes whose bodies are JSON inside a JSON string: the orjson loop makes each a string and never
# parses it, which no reader of their counts can skip, so they are also timed against a loop that does
STRING_BODIES = ("access-log",)


def _work_cpu_s(r: dict[str, float]) -> float:
    """CPU time after start-up (the interpreter and imports: the same whatever the input)."""
    return r["cpu_s"] - r["setup_cpu_s"]


def cpu_ratios(numerator: list[dict[str, float]], base: list[dict[str, float]]) -> tuple[float, float]:
    """(least CPU over least CPU, the median of the rounds' own ratios) of two kinds measured in the same
    rounds. Both are CPU after start-up, so a run is chosen by its CPU, not its wall time (the build
    renders on a second thread: its fastest wall time is not its least CPU). The median of the
    rounds' ratios pairs runs made seconds apart, so a slow spell of this VM, which moves both, moves
    it less than it moves the two minima."""
    least = min(map(_work_cpu_s, numerator)) / min(map(_work_cpu_s, base))
    paired = sorted(_work_cpu_s(a) / _work_cpu_s(b) for a, b in zip(numerator, base, strict=True))
    middle = len(paired) // 2
    median = paired[middle] if len(paired) % 2 else (paired[middle - 1] + paired[middle]) / 2
    return least, median


def bench_shapes(root: Path, out: Path) -> list[str]:
    """Each shape of ``bench.logshapes`` (and one log mixing the three held-out ones on one clock):
    ``build`` (1 process, prefix chains on and off) against the orjson loop in CPU time per byte,
    interleaved; returns the summary lines, the worst shape first."""
    from bench.logshapes import SHAPES, UNREAD, write_log

    ratios: dict[str, tuple[float, float, float]] = {}
    names = [*(s for s in SHAPES if s not in UNREAD), "+".join(HELD_OUT)]
    if only := os.environ.get("BENCH_SHAPES"):  # e.g. BENCH_SHAPES=access-log,flat: these shapes alone
        names = [n for n in names if n in only.split(",")]
    for shape in sorted(UNREAD):
        print(f"shape {shape:<34}not read by trace build (bench/logshapes.py UNREAD): no ratio", flush=True)
    paths = {name: root / f"shape-{index}.jsonl" for index, name in enumerate(names)}
    for name, path in paths.items():
        write_log(path, name, SHAPE_BYTES)
    for shape, path in paths.items():
        mb = path.stat().st_size / 1e6
        bodies = shape in STRING_BODIES
        kinds = ["orjson", "build:1", "build-noprefix:1", *(["orjson-bodies"] if bodies else [])]
        r = runs(kinds, path, out, SHAPE_ROUNDS, all_rows=False)
        base = min(map(_work_cpu_s, r["orjson"]))
        (on, on_median), (off, _) = (
            cpu_ratios(r["build:1"], r["orjson"]),
            cpu_ratios(r["build-noprefix:1"], r["orjson"]),
        )
        ratios[shape] = (on, off, on_median)
        print(
            f"shape {shape:<34}{mb:>6.0f} MB  orjson {mb / base:5.0f} MB/cpu-s   build {on:5.2f}× "
            f"(median of rounds {on_median:4.2f}×)  without chains {off:5.2f}×  "
            f"chains on/off {on / off:5.2f}×",
            flush=True,
        )
        if bodies:
            floor, _ = cpu_ratios(r["orjson-bodies"], r["orjson"])
            read, read_median = cpu_ratios(r["build:1"], r["orjson-bodies"])
            print(
                f"shape {shape:<34}orjson loop parsing both bodies too {floor:5.2f}× the orjson loop; "
                f"build {read:5.2f}× it (median of rounds {read_median:4.2f}×)",
                flush=True,
            )
        path.unlink()
    worst = max(ratios, key=lambda k: ratios[k][0])
    return [
        f"openai shapes, build CPU per byte / the orjson loop's (1 process, after start-up; least CPU of "
        f"{SHAPE_ROUNDS} rounds each): worst {worst} {ratios[worst][0]:.2f}× (goal ≤ 2×; median of its "
        f"rounds' ratios {ratios[worst][2]:.2f}×); "
        + ", ".join(f"{k} {on:.2f}×" for k, (on, _, _) in sorted(ratios.items(), key=lambda kv: -kv[1][0])),
        "openai shapes, prefix chains on / off (CPU): "
        + ", ".join(f"{k} {on / off:.2f}×" for k, (on, off, _) in ratios.items()),
    ]


TALLY_SIZES_MB = (100, 400)


def bench_tally(root: Path, out: Path, *, rounds: int = 1) -> list[str]:
    """``stats`` straight from a chained gateway log (``bench.logshapes``) of 100 and 400 MB: its CPU over
    the orjson loop's and its peak RSS, which must not grow with the log once past the prefix tally's
    exact bound (``oomload.trace.tally``: 2M distinct blocks, about 1.4M in 200 MB of this shape)."""
    from bench.logshapes import write_log

    cells = []
    for size_mb in TALLY_SIZES_MB:
        path = root / f"tally-{size_mb}.jsonl"
        write_log(path, "gateway", size_mb * 1_000_000, seed=5)
        r = runs(["orjson", "stats:1"], path, out, rounds, all_rows=False)
        cpu, _median = cpu_ratios(r["stats:1"], r["orjson"])
        rss = min(x["maxrss_mib"] for x in r["stats:1"])
        print(
            f"stats of a chained gateway log {size_mb:>5} MB: {cpu:.2f}× the orjson loop's CPU, "
            f"peak RSS {rss:.0f} MiB"
        )
        cells.append((size_mb, cpu, rss))
        path.unlink()
    return [
        "stats of a chained gateway log (prefix reuse, bounded tally): "
        + "; ".join(f"{mb} MB {cpu:.2f}× the orjson loop's CPU, peak {rss:.0f} MiB" for mb, cpu, rss in cells)
        + f"; peak RSS {cells[-1][2] / cells[0][2]:.2f}× for {cells[-1][0] / cells[0][0]:.0f}× the log"
    ]


def bench_vllm(root: Path, out: Path, rng: np.random.Generator, *, rounds: int = ROUNDS) -> list[str]:
    """A vLLM DEBUG request log (prompt_token_ids, eight shared system prompts), built with prefix chains
    and without them: both ratios, wall time and CPU (a vLLM log is not JSON: no orjson loop)."""
    n = 50_000
    path = root / "vllm.log"
    generate_vllm(path, n, rng)
    mb = path.stat().st_size / 1e6
    kinds = ["build:1", "build-noprefix:1"]
    measured = runs(kinds, path, out, rounds)
    r = {kind: min(rs, key=lambda run: run["wall_s"]) for kind, rs in measured.items()}
    base = r["build-noprefix:1"]["wall_s"]
    for kind in kinds:
        print(_row(f"vllm-log {kind}", n, mb, r[kind], base, "no chains"), flush=True)
    path.unlink()
    cpu, _median = cpu_ratios(measured["build:1"], measured["build-noprefix:1"])
    wall = r["build:1"]["wall_s"] / base
    return [
        f"vllm-log {n:,} requests ({mb:.0f} MB): build with prefix chains {wall:.2f}× the time without "
        f"them, {cpu:.2f}× the CPU after start-up (best of {rounds})"
    ]


def main() -> None:
    rng = np.random.default_rng(0)
    cores = sorted({1, 2, CORES})
    print(
        f"{'case':<30}{'n':>11}{'MB':>8}{'s':>8}{'lines/s':>11}{'MB/s':>7}{'MB/cpu-s':>9}{'RSS MiB':>8}"
        "   ratio (same run)"
    )
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="oomload-bench-") as tmp:
        root = Path(tmp)
        out = root / "trace.jsonl"
        if os.environ.get("BENCH_TRACE_ONLY") == "shapes":
            for line in bench_shapes(root, out):
                print(line)
            return
        if os.environ.get("BENCH_TRACE_ONLY") == "tally":
            for line in bench_tally(root, out):
                print(line)
            return
        if os.environ.get("BENCH_TRACE_ONLY") == "vllm":
            for line in bench_vllm(root, out, rng, rounds=SHAPE_ROUNDS):
                print(line)
            return

        # 1. OpenAI-style JSONL with text: build on 1, 2, all cores; stats from the log.
        n = 500_000
        path = root / "openai.jsonl"
        generate_openai(path, n, rng)
        mb = path.stat().st_size / 1e6
        kinds = [
            "orjson",
            *(f"build:{c}" for c in cores),
            "build-noprefix:1",
            f"stats:{CORES}",
            "json",
            "pool:2",
        ]
        r = best(kinds, path, out)
        kinds.remove("pool:2")
        base = r["orjson"]["wall_s"]
        for kind in kinds:
            print(_row(f"openai-jsonl {kind}", n, mb, r[kind], base, "orjson"), flush=True)
        one = r["build:1"]
        summary.append(
            f"openai-jsonl {n:,} requests ({mb:.0f} MB): build {one['wall_s'] / base:.2f}× the orjson loop's "
            f"time, {mb / one['cpu_s']:.0f} MB per CPU-second (orjson {mb / r['orjson']['cpu_s']:.0f}); "
            + ", ".join(f"{c} cores {mb / r[f'build:{c}']['wall_s']:.0f} MB/s" for c in cores[1:])
            + f"; stats from the log {r[f'stats:{CORES}']['wall_s'] / r[f'build:{CORES}']['wall_s']:.2f}× "
            f"the build's time ({CORES} cores)"
        )
        summary.append("openai-jsonl " + _spread_cost(mb, one, r["build:2"], r["pool:2"], 2))
        summary.append(
            "openai-jsonl prefix chains over messages: build "
            f"{one['wall_s'] / r['build-noprefix:1']['wall_s']:.2f}× "
            "the time without them (--prefix-block-tokens 0), 1 process"
        )
        # the in-process threshold: where do 2 workers start to pay? (start-up is fixed, the gain per GB)
        crossings = []
        for size_mb in (64, 256):
            part = _head(path, size_mb * 1_000_000, root / f"openai-{size_mb}.jsonl")
            t = best(["build:1", "build:2"], part, out)
            crossings.append(f"{size_mb} MB {t['build:2']['wall_s'] / t['build:1']['wall_s']:.2f}×")
            part.unlink()
        crossings.append(f"{mb:.0f} MB {r['build:2']['wall_s'] / one['wall_s']:.2f}×")
        path.unlink()
        big = root / "openai-big.jsonl"
        generate_openai(big, 3 * n, rng)
        t = best(["build:1", "build:2"], big, out)
        crossings.append(
            f"{big.stat().st_size / 1e6:.0f} MB {t['build:2']['wall_s'] / t['build:1']['wall_s']:.2f}×"
        )
        big.unlink()
        summary.append("openai-jsonl, 2 workers' time / one process's: " + "; ".join(crossings))

        # 1a. every OpenAI-style shape the docs list, generated apart from the fast path: CPU per byte.
        summary += bench_shapes(root, out)

        # 1b. vLLM request log (DEBUG prompt_token_ids) sharing system prompts: chains on and off.
        summary += bench_vllm(root, out, rng)

        # 1c. stats of a chained log: the prefix tally's memory stays bounded.
        summary += bench_tally(root, out)

        # 2. Mooncake JSONL.
        n = 1_000_000
        path = root / "mooncake.jsonl"
        generate_mooncake(path, n, rng)
        mb = path.stat().st_size / 1e6
        kinds = ["orjson", "build:1"]  # not spread over workers (see oomload.ingest.parallel)
        r = best(kinds, path, out)
        base = r["orjson"]["wall_s"]
        for kind in kinds:
            print(_row(f"mooncake-jsonl {kind}", n, mb, r[kind], base, "orjson"), flush=True)
        summary.append(f"mooncake-jsonl 1M: build {r['build:1']['wall_s'] / base:.2f}× the orjson loop")
        path.unlink()

        # 3. Azure CSV at 1M and 10M: pandas floor, build, stats from the log; memory must stay flat.
        rss: dict[str, list[float]] = {"build:1": [], "stats:1": [], "stats-trace": []}
        for n in (1_000_000, 10_000_000):
            path = root / f"azure-{n}.csv"
            generate_azure(path, n, rng)
            mb = path.stat().st_size / 1e6
            # the 10M file (about 360 MB) is also read in byte ranges by a pool: 2 and all cores
            spread = [f"build:{c}" for c in cores[1:]]
            kinds = (
                ["pandas", "build:1", "stats:1"]
                if n == 1_000_000
                else ["pandas", "build:1", *spread, "stats:1", "pool:2"]
            )
            r = best(kinds, path, out, rounds=ROUNDS if n == 1_000_000 else 1)
            started = r.pop("pool:2", None)
            r["stats-trace"] = measure("stats", out, out)
            base_s = r["pandas"]["wall_s"] if "pandas" in r else None
            for kind, result in r.items():
                print(_row(f"azure-csv {kind}", n, mb, result, base_s, "pandas"), flush=True)
            for kind in rss:
                rss[kind].append(r[kind]["maxrss_mib"])
            assert base_s is not None
            # at 1M rows the start-up (imports: ~0.45 s for oomload and pandas, ~0.2 s for pandas alone)
            # is most of both times; at 10M the reading and writing are
            summary.append(f"azure-csv {n:,}: build {r['build:1']['wall_s'] / base_s:.2f}× pandas' time")
            if n > 1_000_000:
                summary.append(
                    f"azure-csv {n:,} ({mb:.0f} MB) build: "
                    + ", ".join(f"{c} cores {mb / r[f'build:{c}']['wall_s']:.0f} MB/s" for c in cores)
                )
                assert started is not None
                summary.append(f"azure-csv {n:,} " + _spread_cost(mb, r["build:1"], r["build:2"], started, 2))
            path.unlink()
            out.unlink()
        summary.append(
            "peak RSS 1M → 10M requests: "
            + "; ".join(f"{kind} {a:.0f} → {b:.0f} MiB" for kind, (a, b) in rss.items())
        )
        print(
            "(baselines: orjson/json = for line in f: loads(line); pandas = read_csv(engine='pyarrow'); "
            f"build:N / stats:N = --workers N; {CORES} cores here)"
        )
        for line in summary:
            print(line)


if __name__ == "__main__":
    main()
