"""A release that lowers ``--gpu-memory-utilization`` is caught by ``oomload compare`` and its gate, on
the simulated vLLM (default suite).

The same trace — 400 requests of 1024 + 256 tokens, 80 blocks of 16 tokens each — is replayed against
the simulator of Llama-3.1-8B on an L4 twice: at 0.82 (1029 KV blocks: 12 requests always fit) and at
0.76 (338 blocks: 4 fit). The levels 2–16 with the default refinement (3 repeats around each onset) put
the base onset near 13 and the new one at 5. The onsets are told apart by the steps between them
(Fisher's exact test on the conclusive steps of both runs): at every level 5–12 the base cannot preempt
(12 × 80 = 960 blocks ≤ 1029) and the new run must (5 × 64 prompt blocks alone are 320 of 338), so the
test holds on a busy host. At 0.8 (799 blocks) the base's level 10 needed 800 blocks at its peak: it
preempted in some steps and not others, and in 1 of many CI runs those sporadic preemptions left the
onsets 11 and 5 "not separated" (p > 0.05). Each replay is a subprocess (Locust monkey-patches the
process).
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clirun import oomload
from oomload.errors import ExitCode
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

SIM = "--model llama-3.1-8b --gpu l4 --max-model-len 4096 --max-num-seqs 64 --time-scale 0.025"
LEVELS = "2,4,5,6,7,8,10,12,16"
HTML_LIMIT = 60_000  # compare.json (≈ 15 KB) fits; compare.html (two PNGs, ≈ 150 KB) does not


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("compare-sim")
    trace = tmp / "fixed-1024-256.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 1024, 256) for i in range(400)], TraceHeader(source=("t",)))
    out = []
    for utilization in ("0.82", "0.76"):
        run = tmp / f"run-{utilization}"
        proc = oomload(
            "replay", str(trace),
            "--sim", f"{SIM} --gpu-memory-utilization {utilization}",
            "--concurrency", LEVELS, "--hold-s", "2", "--gpu", "none", "--no-live", "--no-html",
            "--run-dir", str(run),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        out.append(run)
    return out[0], out[1]


def test_provenance_records_what_a_comparison_needs(runs: tuple[Path, Path]) -> None:
    doc = json.loads((runs[1] / "provenance.json").read_text())
    assert doc["schema"] == "oomload.provenance/1"
    assert doc["levels"] == [2, 4, 5, 6, 7, 8, 10, 12, 16] and doc["repeats"] == 3
    assert len(doc["trace"]["sha256"]) == 64 and doc["trace"]["requests"] == 400
    assert doc["server_version"] and "--gpu-memory-utilization" in " ".join(doc["sim_args"])


def test_a_lower_gpu_memory_utilization_is_caught(runs: tuple[Path, Path], tmp_path: Path) -> None:
    base, new = runs
    out = tmp_path / "cmp"
    proc = oomload(
        "compare", str(base), str(new), "--out", str(out), "--format", "terminal,json,junit",
        "--gate", "onset>=baseline", "--gate", "kv-blocks>=baseline*0.95", "--gate", "no-new-death",
    )  # fmt: skip
    assert proc.returncode == ExitCode.GATE_FAILED, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = json.loads((out / "compare.json").read_text())
    rows = {r["key"]: r for r in doc["results"]}
    assert (rows["kv_blocks"]["base"], rows["kv_blocks"]["new"]) == ("1029", "338")
    assert rows["kv_blocks"]["status"] == "regression"
    assert rows["preemption_onset"]["status"] == "regression", rows["preemption_onset"]
    assert int(rows["preemption_onset"]["new"]) < int(rows["preemption_onset"]["base"])
    gates = {g["rule"]: g for g in doc["gates"]}
    assert gates["onset>=baseline"]["status"] == "fail"
    assert "separated by the repeats" in gates["onset>=baseline"]["reason"]
    assert gates["kv-blocks>=baseline*0.95"]["status"] == "fail"
    assert gates["no-new-death"]["status"] == "pass"
    setup = {r["label"]: r for r in doc["setup"]}
    assert setup["gpu_memory_utilization"]["changed"] and not setup["trace"]["changed"]
    print(f"sim: {doc['headline']}; onset p = {doc['onset']['p_value']:.3g}")

    # the same relative rule on `oomload report --baseline`
    report = oomload("report", str(new), "--baseline", str(base), "--gate", "kv-blocks>=baseline*0.95",
                     "--format", "json")  # fmt: skip
    assert report.returncode == ExitCode.GATE_FAILED, report.stderr


def test_a_run_against_its_own_configuration_finds_no_regression(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """A copy of the run (one run directory as both is exit 2): no regression, and a caveat that the two
    are one replay."""
    copy = tmp_path / "copy"
    shutil.copytree(runs[0], copy)
    out = tmp_path / "self"
    proc = oomload("compare", str(runs[0]), str(copy), "--out", str(out), "--format", "json",
                   "--gate", "onset>=baseline", "--gate", "p99-ttft-s@4<=baseline*1.10")  # fmt: skip
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    doc = json.loads((out / "compare.json").read_text())
    assert doc["regressions"] == 0
    assert any(
        c.startswith(f"{runs[0].name} and copy are one replay (both started at ") for c in doc["caveats"]
    )
    same = oomload("compare", str(runs[0]), str(runs[0]), "--out", str(tmp_path / "x"), "--format", "json")
    assert same.returncode == ExitCode.USAGE and "are one run directory" in same.stderr, same.stderr


def test_a_full_disk_at_compares_writes_is_one_sentence_and_exit_2(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """``RLIMIT_FSIZE`` in the child, as ``test_disk_full_outputs`` does: compare.json fits, compare.html
    does not (``EFBIG``, as a full disk's ``ENOSPC``)."""

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (HTML_LIMIT, HTML_LIMIT))

    out = tmp_path / "full"
    proc = subprocess.run(
        [sys.executable, "-m", "oomload", "compare", *map(str, runs),
         "--out", str(out), "--format", "json,html"],
        capture_output=True, text=True, timeout=300, preexec_fn=limited, check=False,
    )  # fmt: skip
    assert proc.returncode == ExitCode.USAGE, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert f"cannot write compare.html in {out} (File too large)" in err
    assert "written before it: compare.json" in err
    json.loads((out / "compare.json").read_text())  # whole
    assert not (out / "compare.html").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no scratch file left
