"""``oomload plan`` end to end through the CLI entry point (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.cli import main
from oomload.trace import TraceHeader, TraceRecord, write_trace


@pytest.fixture
def fixed_trace(tmp_path: Path) -> Path:
    path = tmp_path / "fixed.jsonl"
    records = [
        TraceRecord(id=f"r{i}", arrival_s=i * 0.1, prompt_tokens=512, output_tokens=512) for i in range(40)
    ]
    write_trace(path, records, TraceHeader(format="synthetic"))
    return path


def test_plan_json_reports_the_onset_of_the_cpu_table(
    fixed_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "plan", str(fixed_trace), "--model", "tiny", "--num-gpu-blocks", "32", "--block-size", "128",
        "--max-model-len", "2048", "--max-num-seqs", "64", "--concurrency", "1,2,3,4,8", "--json",
        "--requests-per-level", "16",
    ])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_gpu_blocks"] == 32 and out["kv_cache_tokens"] == 4096
    assert out["onset_concurrency"] == 4
    assert out["last_safe_concurrency"] == 3
    assert [lv["concurrency"] for lv in out["levels"]] == [1, 2, 3, 4, 8]
    assert out["serve_command"].startswith("vllm serve tiny-model --max-model-len")


def test_plan_table_on_a_gpu_preset(fixed_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", str(fixed_trace), "--gpu", "a10g", "--concurrency", "linear:1:3:1"])
    assert code == 0
    out = capsys.readouterr().out
    assert "GPU KV cache size" in out and "vllm serve meta-llama/Llama-3.1-8B-Instruct" in out


def test_plan_refuses_bad_levels_and_missing_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(tmp_path / "none.jsonl"), "--gpu", "h100"]) == 2
    assert "does not exist" in capsys.readouterr().err
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord(id="a", arrival_s=0.0, prompt_tokens=5, output_tokens=5)], TraceHeader())
    assert main(["plan", str(trace), "--gpu", "h100", "--concurrency", "0,x"]) == 2
    assert "--concurrency" in capsys.readouterr().err
