"""``oomload compare`` on the real vLLM: no regression between two runs of one configuration, and a
smaller KV pool caught with its onset.

Trace: 400 requests of 1792 + 256 tokens; on blocks of 256 tokens (the harness's) each holds
``ceil(2047 / 256)`` = 8 blocks from its first decode step on. 80 blocks (79 usable) fit 9 requests —
the arithmetic onset is 10; 64 blocks (63 usable) fit 7 — onset 8. The sweep 6,7,8,9,10,11 with the
default refinement (3 repeats of the two levels around each onset) measures both onsets with repeats.
Runs: 80 blocks twice (a fresh server each time: a release gate compares fresh servers, and the second
run must not meet the first run's prefix cache), then 64 blocks. The capacity rows (blocks, onset, death,
last safe level) must not move between the two runs of 80 blocks; their latency may, with the host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import FIGURES, ServerPool, replay, write_trace_file

from clirun import oomload
from oomload.errors import ExitCode

pytestmark = pytest.mark.e2e

PROMPT_TOKENS, OUTPUT_TOKENS = 1792, 256
SWEEP = ("--concurrency", "6,7,8,9,10,11", "--hold-s", "8", "--warmup-s", "0", "--max-duration-s", "400")
CAPACITY_ROWS = ("kv_blocks", "preemption_onset", "engine_death", "last_safe")


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compare") / "fixed-1792-256.jsonl"
    return write_trace_file(path, [(PROMPT_TOKENS, OUTPUT_TOKENS)] * 400)


def _run(pool: ServerPool, trace: Path, run_dir: Path, blocks: int) -> Path:
    pool.stop()  # a fresh server for every run
    server = pool.get(num_gpu_blocks=blocks)
    proc = replay(server.url, trace, run_dir, *SWEEP)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def runs(vllm_servers: ServerPool, trace: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("compare-runs")
    out = {
        "base": _run(vllm_servers, trace, tmp / "base-80", 80),
        "again": _run(vllm_servers, trace, tmp / "again-80", 80),
        "small": _run(vllm_servers, trace, tmp / "small-64", 64),
    }
    vllm_servers.stop()
    return out


def _compare(base: Path, new: Path, out: Path, *gates: str) -> tuple[int, dict[str, object]]:
    args = ["compare", str(base), str(new), "--out", str(out), "--format", "terminal,json,md,html,junit"]
    for gate in gates:
        args += ["--gate", gate]
    proc = oomload(*args)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads((out / "compare.json").read_text())
    FIGURES.append(f"compare {new.name} against {base.name}: exit {proc.returncode}; {doc['headline']}")
    for row in doc["results"]:  # type: ignore[union-attr]
        if row["key"] in CAPACITY_ROWS or row["status"] in ("regression", "improvement"):
            FIGURES.append(
                f"  {row['label']}: {row['base']} → {row['new']} [{row['status']}] {row['evidence']}"
            )
    return proc.returncode, doc


def test_the_same_configuration_twice_is_no_regression(runs: dict[str, Path], tmp_path: Path) -> None:
    code, doc = _compare(
        runs["base"], runs["again"], tmp_path / "same",
        "onset>=baseline", "kv-blocks>=baseline*0.95", "no-new-death", "last-safe>=baseline-1",
    )  # fmt: skip
    rows = {r["key"]: r for r in doc["results"]}  # type: ignore[union-attr]
    assert [k for k in CAPACITY_ROWS if rows[k]["status"] == "regression"] == [], rows
    # Latency is not asserted: on this shared host a rerun moved every level one way, by −20…−31 % in
    # one CI run and +31…+48 % in another — host speed, which no per-request test tells from a slower
    # release (docs/compare.md, "Latency needs a quiet host"). The figures above show what it said.
    assert rows["kv_blocks"]["status"] == "unchanged"
    assert code in (ExitCode.OK, ExitCode.GATE_NOT_EVALUATED), doc["gates"]  # never a failed gate


def test_a_smaller_pool_is_caught_with_its_onset(runs: dict[str, Path], tmp_path: Path) -> None:
    code, doc = _compare(runs["base"], runs["small"], tmp_path / "small", "onset>=baseline")
    rows = {r["key"]: r for r in doc["results"]}  # type: ignore[union-attr]
    assert (rows["kv_blocks"]["base"], rows["kv_blocks"]["new"]) == ("80", "64")
    assert rows["kv_blocks"]["status"] == "regression"
    onset = rows["preemption_onset"]
    assert onset["status"] == "regression", onset
    assert int(onset["new"]) < int(onset["base"])
    assert code == ExitCode.GATE_FAILED
    [gate] = doc["gates"]  # type: ignore[misc]
    assert gate["status"] == "fail"
    assert f"fell from concurrency {onset['base']} to concurrency {onset['new']}" in gate["reason"]
