"""``oomload plan`` end to end through the CLI entry point (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.cli import main
from oomload.trace.model import PrefixInfo, TraceHeader, TraceRecord, write_trace


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
    assert main(["plan", str(trace), "--gpu", "h100", "--concurrency", "4,2"]) == 2  # as replay refuses it
    assert "must be strictly increasing" in capsys.readouterr().err
    assert main(["plan", str(tmp_path), "--gpu", "h100"]) == 2
    assert "is not a file" in capsys.readouterr().err
    for count in ("0", "10000001"):  # past the bound, a plan would run for days
        assert main(["plan", str(trace), "--gpu", "h100", "--requests-per-level", count]) == 2
        assert f"--requests-per-level must be in 1..10,000,000, got {int(count):,}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--block-size", "0"], "--block-size must be a positive integer, got 0"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be a positive integer, got 0"),
        (["--max-model-len", "0"], "--max-model-len must be a positive integer, got 0"),
        (["--block-size", "7"], "--block-size must be one of 1, 8, 16, 32, 64, 128"),
        (["--tp", "3"], "attention heads (32) must be divisible by tensor parallel size (3)"),
        (
            ["--model", "qwen2.5-7b", "--tp", "7"],
            "4 KV heads of 'Qwen/Qwen2.5-7B-Instruct' cannot be sharded",
        ),
    ],
)
def test_invalid_engine_flags_are_refused_in_one_sentence(
    fixed_trace: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(fixed_trace), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_plan_text_keeps_a_covering_max_model_len_and_shows_refusals_per_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.jsonl"
    lengths = [(1500, 100)] * 30 + [(3000, 10)] * 10  # a quarter of the prompts exceed 2,048
    records = [
        TraceRecord(id=f"r{i}", arrival_s=0.0, prompt_tokens=p, output_tokens=o)
        for i, (p, o) in enumerate(lengths)
    ]
    write_trace(path, records, TraceHeader(format="synthetic"))
    base = ["plan", str(path), "--model", "tiny", "--num-gpu-blocks", "200", "--block-size", "32"]
    assert main([*base, "--max-model-len", "3072", "--concurrency", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "keep 3,072 (already covers the P99" in out
    assert main([*base, "--max-model-len", "2048", "--concurrency", "1,2", "--requests-per-level", "40"]) == 0
    out = capsys.readouterr().out
    assert "refuses 10 of the 40 trace requests (25.0%" in out
    assert "10 25%" in out  # the refused column of each level: count and share
    assert "Arithmetic band" in out and "Checked with --max-model-len" in out


def test_a_trace_whose_every_prompt_is_refused_shows_no_level_safe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every prompt longer than max_model_len: each level refused all its requests and put nothing in the
    KV pool. Before, the plan said "last safe concurrency: 256" and "the KV pool holds the highest
    concurrency tried"; a level that finished no request is no evidence that it is safe."""
    path = tmp_path / "huge.jsonl"
    records = [
        TraceRecord(id=f"r{i}", arrival_s=i, prompt_tokens=200_000 + i, output_tokens=80) for i in range(3)
    ]
    write_trace(path, records, TraceHeader(format="synthetic"))
    base = ["plan", str(path), "--model", "llama-3.1-8b", "--gpu", "l4", "--concurrency", "1,4,16"]
    assert main([*base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [lv["requests_finished"] for lv in doc["levels"]] == [0, 0, 0]
    assert doc["last_safe_concurrency"] is None and doc["check"]["last_safe_concurrency"] is None
    assert main(base) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at 80 columns
    assert "last safe concurrency: unknown (no level finished a request)" in out
    assert "the KV pool holds the highest concurrency tried" not in out
    assert "Note: no level finished a request: every prompt is at least max_model_len 8,192 tokens" in out


def test_plan_gives_both_prompt_shapes_for_a_shared_prefix_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """600-token prompts whose first 512 tokens are one trace id, 100 output tokens, 80 blocks of 32:
    the real vLLM CPU build preempted at 11 with the shared prefix and at 4 with distinct prompts."""
    trace = tmp_path / "shared.jsonl"
    records = [TraceRecord(f"r{i}", i * 0.1, 600, 100, hash_ids=(7, 100 + i)) for i in range(50)]
    write_trace(trace, records, TraceHeader(format="synthetic", prefix=PrefixInfo(block_tokens=512)))
    argv = [
        "plan", str(trace), "--model", "tiny", "--num-gpu-blocks", "80", "--block-size", "32",
        "--max-model-len", "2048", "--max-num-seqs", "48", "--concurrency", "4,11,12",
        "--requests-per-level", "16",
    ]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arithmetic"]["band"] == [11, 14] and out["arithmetic"]["shape"] == "production"
    assert out["arithmetic_worst_case"]["band"] == [4, 4]
    shared = {o["concurrency"]: o for o in out["odds"]}
    worst = {o["concurrency"]: o for o in out["odds_worst_case"]}
    assert shared[4]["requests_for_evidence"] is None and shared[11]["requests_for_evidence"] is None
    assert shared[12]["requests_for_evidence"] is not None  # the simulator's cache: one level late
    assert worst[4]["requests_for_evidence"] is not None
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Arithmetic band 11–14 with shared prefixes (worst case, nothing shared: 4)" in " ".join(
        text.split()
    )
    assert "12 with shared prefixes, 4 in the worst case" in " ".join(text.split())
    # a level under the 1-per-100 line needs no evidence: the table says why, whatever "seen in 50" shows
    assert "– (< 1 per 100)" in text and "negligible" not in text


def test_plan_without_hash_ids_shows_one_shape(fixed_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(fixed_trace), "--model", "tiny", "--num-gpu-blocks", "32", "--block-size", "128"]
    argv += ["--max-model-len", "2048", "--concurrency", "2,4", "--requests-per-level", "8", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arithmetic_worst_case"] is None and out["odds_worst_case"] is None


@pytest.mark.parametrize(
    ("max_num_seqs", "said", "capped"),
    [
        (4, "Arithmetic: no onset: the server runs at most 4 requests at once (max_num_seqs) and 4 fit "
            "the pool at their peak, so more queue (onset 11–14 without the cap)", 4),
        (12, "Arithmetic band 11–14 with shared prefixes (worst case, nothing shared: 4): the onset from "
             "block counts alone", None),
        (48, "Arithmetic band 11–14 with shared prefixes (worst case, nothing shared: 4)", None),
    ],
)  # fmt: skip
def test_plan_reads_the_band_through_the_servers_max_num_seqs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], max_num_seqs: int, said: str, capped: int | None
) -> None:
    """A server that runs fewer requests at once than the band's low end never preempts (the verdict's
    ``Prediction.capped``): the plan said "Arithmetic band 11–14" whatever ``--max-num-seqs`` was."""
    trace = tmp_path / "shared.jsonl"
    records = [TraceRecord(f"r{i}", i * 0.1, 600, 100, hash_ids=(7, 100 + i)) for i in range(50)]
    write_trace(trace, records, TraceHeader(format="synthetic", prefix=PrefixInfo(block_tokens=512)))
    argv = [
        "plan", str(trace), "--model", "tiny", "--num-gpu-blocks", "80", "--block-size", "32",
        "--max-model-len", "2048", "--max-num-seqs", str(max_num_seqs), "--concurrency", "4",
        "--requests-per-level", "16",
    ]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["arithmetic"]["capped"] == capped
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert said in text
    reach = "only 11–12 of the band is reached, above it more queue"
    assert (reach in text) == (max_num_seqs == 12)


def test_a_cap_below_the_band_that_the_largest_requests_overflow_stays_a_band(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """95 % short requests and 5 % of 3,000 + 500 tokens on 300 blocks of 16: a cap of 4 is below the
    band, but two long requests do not fit together, so the plan keeps the band and says why (it read
    "only 17–14 of the band is reached" on such a mix)."""
    trace = tmp_path / "tail.jsonl"
    lengths = [(3000, 500) if i % 20 == 0 else (100, 50) for i in range(200)]
    write_trace(
        trace,
        [TraceRecord(f"r{i}", 0.0, p, o) for i, (p, o) in enumerate(lengths)],
        TraceHeader(format="synthetic"),
    )
    argv = [
        "plan", str(trace), "--model", "tiny", "--num-gpu-blocks", "300", "--block-size", "16",
        "--max-model-len", "4096", "--max-num-seqs", "4", "--concurrency", "4", "--requests-per-level", "16",
    ]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    arithmetic = json.loads(capsys.readouterr().out)["arithmetic"]
    assert arithmetic["capped"] is None and arithmetic["band"][0] > 4
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "The server runs at most 4 requests at once (max_num_seqs), below the band, but 4 of the trace's"
        in text
    )
    assert "of the band is reached" not in text


class _FakeStatus:
    def __init__(self, log: list[str], text: str) -> None:
        self.log = log
        log.append(f"start {text}")

    def start(self) -> None:
        pass

    def update(self, text: str) -> None:
        self.log.append(f"update {text}")

    def stop(self) -> None:
        self.log.append("stop")


class _FakeConsole:
    def __init__(self) -> None:
        self.log: list[str] = []

    def status(self, text: str) -> _FakeStatus:
        return _FakeStatus(self.log, text)


def test_a_long_plan_names_each_level_it_simulates(
    fixed_trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--concurrency 100000`` ran for minutes in silence: on a terminal each level (of both sweeps:
    the check with the advised max_model_len runs them again) is named with its requests, and the
    line is gone before the plan prints."""
    from oomload.cli import plan as plan_cli

    console = _FakeConsole()
    monkeypatch.setattr(plan_cli.LevelStatus, "on_stderr", classmethod(lambda cls: cls(console)))
    code = main([
        "plan", str(fixed_trace), "--model", "tiny", "--num-gpu-blocks", "32", "--block-size", "128",
        "--max-model-len", "2048", "--max-num-seqs", "64", "--concurrency", "1,80", "--json",
    ])  # fmt: skip
    assert code == 0
    json.loads(capsys.readouterr().out)  # stdout stays the JSON alone
    assert console.log[:2] == [
        "start simulating concurrency 1: 40 requests",  # the trace's 40 requests
        "update simulating concurrency 80: 80 requests",  # one a user at least
    ]
    assert len(console.log) == 5  # the check sweep with the advised max_model_len: both levels again
    assert console.log[-1] == "stop" and console.log.count("stop") == 1


def test_the_level_status_is_silent_off_a_terminal() -> None:
    from oomload.cli.plan import LevelStatus

    with LevelStatus(None) as status:
        status(8, 1000)  # no console: nothing to draw, nothing raised
