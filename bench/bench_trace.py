"""``trace build`` + ``trace stats`` throughput and peak memory on generated 1,000,000-request logs.

For each main format (Azure CSV, Mooncake JSONL, OpenAI-style JSONL carrying text) a log is generated
in a temporary directory at 250k and 1M requests. Every measurement runs in its own subprocess so
its peak RSS (``VmHWM``) is its own:

- ``read``  — stream the log through the reader only (batches, nothing written);
- ``build`` — ``oomload.ingest.build_trace`` (read + write the trace);
- ``stats`` — ``load_columns`` + ``summarize_trace`` on the built trace;
- baseline — pandas ``read_csv(engine="pyarrow")`` for CSV; ``for line in f: json.loads(line)``
  for JSONL, on the same file, in the same run.

Goals (issue 2): CSV within 2× of the pandas baseline, Mooncake ≥ 300,000 lines/s, OpenAI-style logs
with text ≥ 100 MB/s, and peak memory flat from 250k to 1M requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SIZES = (250_000, 1_000_000)

CHILD = r"""
import json, sys, time
kind, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
if kind == "read":
    from oomload.ingest import SkipLog, plan_inputs
    from oomload.ingest.build import iter_batches
    rows = sum(b.num_rows for b in iter_batches(plan_inputs([path]), SkipLog(), None))
elif kind == "build":
    from oomload.ingest import build_trace
    rows = build_trace([path], out).records_written
elif kind == "stats":
    from oomload.ingest import load_columns
    from oomload.stats import summarize_trace
    c = load_columns([path])
    rows = summarize_trace(c.arrival_s, c.prompt_tokens, c.output_tokens, c.ok).arrivals.count
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
# VmHWM: this process image's own peak RSS (ru_maxrss would include the parent's at fork time).
hwm_kib = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"rows": rows, "wall_s": wall, "maxrss_mib": hwm_kib / 1024}))
"""


def measure(kind: str, path: Path, out: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(path), str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
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
    ticks = np.cumsum(rng.integers(1, 800_000, n))  # 100 ns ticks, ~0.04 s apart: 1M fit in one day
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


CASES = [
    ("azure-csv", "azure.csv", generate_azure, "pandas"),
    ("mooncake-jsonl", "mooncake.jsonl", generate_mooncake, "json"),
    ("openai-jsonl", "openai.jsonl", generate_openai, "json"),
]


def main() -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="oomload-bench-") as tmp:
        root = Path(tmp)
        print(f"{'case':<16}{'n':>10}{'MB':>8}  {'step':<9}{'s':>7}{'lines/s':>12}{'MB/s':>8}{'RSS MiB':>9}")
        summary: list[str] = []
        for name, filename, generate, baseline in CASES:
            peaks: dict[str, list[float]] = {"build": [], "stats": []}
            for n in SIZES:
                path = root / f"{n}-{filename}"
                started = time.perf_counter()
                generate(path, n, rng)
                gen_s = time.perf_counter() - started
                size_mb = path.stat().st_size / 1e6
                out = root / f"{n}-{name}.trace.jsonl"
                results = {"read": measure("read", path, out), "build": measure("build", path, out)}
                results["stats"] = measure("stats", out, out)
                if n == SIZES[-1]:
                    results[f"{baseline}*"] = measure(baseline, path, out)
                for step, r in results.items():
                    assert r["rows"] == n, (name, step, r)
                    mb = size_mb if step != "stats" else out.stat().st_size / 1e6
                    print(
                        f"{name:<16}{n:>10,}{mb:>8.0f}  {step:<9}{r['wall_s']:>7.2f}"
                        f"{n / r['wall_s']:>12,.0f}{mb / r['wall_s']:>8.0f}{r['maxrss_mib']:>9.0f}",
                        flush=True,
                    )
                for step in peaks:
                    peaks[step].append(results[step]["maxrss_mib"])
                if n == SIZES[-1]:
                    base = results[f"{baseline}*"]["wall_s"]
                    summary.append(
                        f"{name}: build {results['build']['wall_s'] / base:.2f}× and read "
                        f"{results['read']['wall_s'] / base:.2f}× the {baseline} baseline's time; "
                        f"build {n / results['build']['wall_s']:,.0f} lines/s, "
                        f"{size_mb / results['build']['wall_s']:.0f} MB/s; peak RSS 250k→1M: build "
                        f"{peaks['build'][0]:.0f}→{peaks['build'][1]:.0f} MiB, stats "
                        f"{peaks['stats'][0]:.0f}→{peaks['stats'][1]:.0f} MiB (generate {gen_s:.1f} s)"
                    )
                path.unlink()
                out.unlink()
        print("(* baseline: pandas = read_csv(engine='pyarrow'); json = for line in f: json.loads(line))")
        for line in summary:
            print(line)


if __name__ == "__main__":
    main()
