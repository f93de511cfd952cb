"""``oomload trace build | stats | synth`` from the command line: outputs, and every bad-input path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import oomload, run
from oomload.trace.model import read_trace, read_trace_header

REPO = Path(__file__).resolve().parents[2]
MOONCAKE = '{"timestamp": %d, "input_length": %d, "output_length": 3, "hash_ids": [1]}\n'


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "log.jsonl"
    path.write_text(MOONCAKE % (0, 10) + "garbage line\n" + MOONCAKE % (2000, 20) + MOONCAKE % (4000, 9000))
    return path


def test_build_writes_a_trace_and_reports_skips(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "trace.jsonl"
    code, stdout, _ = run(["trace", "build", str(log), "-o", str(out)], capsys)
    assert code == 0
    assert f"wrote 3 requests to {out} (format mooncake)" in stdout
    assert "skipped 1 line:" in stdout and f"not a JSON object  (first: {log}:2)" in stdout
    assert [r.prompt_tokens for r in read_trace(out)] == [10, 20, 9000]
    assert read_trace_header(out).extra["skipped"] == {"not a JSON object": 1}


def test_stats_json_and_plot(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "hist.png"
    code, stdout, _ = run(
        [
            "trace",
            "stats",
            str(log),
            "--json",
            "--plot",
            str(png),
            "--block-size",
            "96",
            "--kv-cache-tokens",
            "100000",
            "--current-max-model-len",
            "32768",
        ],
        capsys,
    )
    assert code == 0
    doc = json.loads(stdout)
    assert doc["count"] == 3 and doc["skipped"] == {"not a JSON object": 1}
    assert doc["percentile_method"].startswith("nearest-rank")
    assert doc["total_tokens"]["p50"] == 23 and doc["total_tokens"]["max"] == 9003
    assert doc["arrivals"]["span_s"] == 4.0 and doc["arrivals"]["mean_rps"] == 0.5
    assert doc["schema"] == "oomload.trace-stats/1"
    assert doc["share_above_fraction"]["8192"] == pytest.approx(1 / 3)
    advice = doc["max_model_len"]
    assert advice["implied_by_trace"] == advice["recommended"] and advice["margin_fraction"] == 0.1
    assert not (advice["capped_by_model_limit"] or advice["capped_by_kv_cache"] or advice["kept_current"])
    assert (
        advice["recommended"] == 9984 and advice["round_to"] == 768
    )  # 9003 × 1.1 = 9903 → 13 × lcm(256, 96)
    # concurrency in the usable pool: 100,000 // 96 = 1041 blocks, less the null block = 99,840 tokens
    assert advice["usable_kv_cache_tokens"] == 99_840
    assert advice["freed_concurrency"] == pytest.approx(99_840 / 9984 - 99_840 / 32_768)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stats_table_states_the_method(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run(["trace", "stats", str(REPO / "traces" / "sample-fixed.jsonl")], capsys)
    assert code == 0
    assert "nearest-rank" in stdout and "max_model_len the trace implies" in stdout
    assert "64" in stdout and "512" in stdout


def test_synth_reproduces_the_committed_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands = {
        "sample-chat.jsonl": [
            "--count",
            "400",
            "--input",
            "lognormal:600:6000:16384",
            "--output",
            "lognormal:200:1000:2048",
            "--rate",
            "2",
            "--seed",
            "3",
        ],
        "sample-fixed.jsonl": [
            "--count",
            "64",
            "--input",
            "fixed:256",
            "--output",
            "fixed:256",
            "--rate",
            "4",
            "--seed",
            "1",
        ],
    }
    for name, flags in commands.items():
        out = tmp_path / name
        code, stdout, _ = run(["trace", "synth", "-o", str(out), *flags], capsys)
        assert code == 0 and "wrote" in stdout
        assert out.read_bytes() == (REPO / "traces" / name).read_bytes()


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("", [], "empty file"),
        ("just some prose\n", [], "cannot tell the log format"),
        ("a,b\n1,2\n", ["--map", "input=a,output=tokens_out"], "names column 'tokens_out'"),
        ('{"a": 1, "b": 2}\n', ["--map", "input=a,output=c"], "names column 'c'"),
        ("a,b\n1,2\n", ["--map", "input=a"], "--map needs output=COLUMN"),
        ("a,b\n1,2\n", ["--map", "inp=a,output=b"], "unknown --map key 'inp'"),
        ("a,b\n1,2\n", ["--format", "parquet"], "unknown --format 'parquet'"),
        ("a,b\n1,2\n", ["--format", "azure"], "names column 'TIMESTAMP'"),
        ("a,b\n1,2\n", ["--tokenizer", "bogus"], "unknown --tokenizer"),
        (MOONCAKE % (0, 1) + "bad\n", ["--strict"], "log.txt:2: not a JSON object (stopped by --strict)"),
        ('{"timestamp": 0, "input_length": -1, "output_length": 1}\n', [], "no usable requests"),
    ],
)
def test_build_bad_inputs_exit_2_with_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, extra: list[str], message: str
) -> None:
    path = tmp_path / "log.txt"
    path.write_text(content)
    out = tmp_path / "trace.jsonl"
    code, _, err = run(["trace", "build", str(path), "-o", str(out), *extra], capsys)
    assert code == 2
    assert err.startswith("oomload: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_unreadable_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for target, message in ((tmp_path / "nope.csv", "no such file"), (tmp_path, "is a directory")):
        code, _, err = run(["trace", "build", str(target), "-o", str(tmp_path / "t.jsonl")], capsys)
        assert code == 2 and message in err
        code, _, err = run(["trace", "stats", str(target)], capsys)
        assert code == 2 and message in err


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "stats", "IN", "--block-size", "0"],
        ["trace", "stats", "IN", "--margin", "-0.5"],
        ["trace", "synth", "-o", "OUT", "--count", "5", "--input", "gamma:1"],
        ["trace", "synth", "-o", "OUT", "--count", "0"],
        ["trace", "synth", "-o", "OUT", "--count", "5", "--rate", "-2"],
    ],
)
def test_bad_flags_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    trace = REPO / "traces" / "sample-fixed.jsonl"
    argv = [str(trace) if a == "IN" else str(tmp_path / "o.jsonl") if a == "OUT" else a for a in argv]
    code, _, err = run(argv, capsys)
    assert code == 2 and err.startswith("oomload: error: ")


def test_subprocess_bad_log_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "prose.log"
    path.write_text("nothing here looks like a log\n")
    done = oomload("trace", "build", str(path), "-o", str(tmp_path / "t.jsonl"))
    assert done.returncode == 2
    assert done.stderr.startswith("oomload: error: ") and "Traceback" not in done.stderr
    assert "cannot tell the log format" in done.stderr


def test_build_says_in_one_line_that_mixed_clocks_were_rebased(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,5,1\n2023-11-16 18:00:09.0,6,1\n"
    )
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(MOONCAKE % (0, 7) + MOONCAKE % (4000, 8))
    out = tmp_path / "both.jsonl"
    code, stdout, _ = run(["trace", "build", str(azure), str(mooncake), "-o", str(out)], capsys)
    assert code == 0
    notes = [line for line in stdout.splitlines() if "rebased" in line]
    assert notes == [
        "note: inputs mix wall-clock and relative (since-start) timestamps: "
        "each input rebased to its own start"
    ]
    code, stdout, _ = run(["trace", "stats", str(out), "--json"], capsys)
    assert json.loads(stdout)["arrivals"]["span_s"] == 9.0
    code, stdout, _ = run(["trace", "stats", str(azure), str(mooncake), "--json"], capsys)
    document = json.loads(stdout)
    assert (
        document["arrivals"]["span_s"] == 9.0 and document["aligned"] == "each input rebased to its own start"
    )


@pytest.mark.parametrize("packing", ["p.trace.zst", "gzip-content.jsonl"])
def test_a_compressed_trace_reads_back(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], packing: str
) -> None:
    """A trace compressed with zstd, or gzip content without a .gz name: opened by its content."""
    import gzip

    import zstandard

    plain = tmp_path / "plain.jsonl"
    assert run(["trace", "build", str(log), "-o", str(plain)], capsys)[0] == 0
    packed = tmp_path / packing
    data = plain.read_bytes()
    packed.write_bytes(
        zstandard.ZstdCompressor().compress(data) if packing.endswith(".zst") else gzip.compress(data)
    )
    assert [r.prompt_tokens for r in read_trace(packed)] == [10, 20, 9000]
    code, stdout, _ = run(["trace", "stats", str(packed), "--json"], capsys)
    assert code == 0 and json.loads(stdout)["count"] == 3
    again = tmp_path / "again.jsonl"
    code, stdout, _ = run(["trace", "build", str(packed), "-o", str(again)], capsys)
    assert code == 0 and "(format oomload)" in stdout
    assert [r.prompt_tokens for r in read_trace(again)] == [10, 20, 9000]


@pytest.mark.parametrize(
    ("name", "magic"), [("hist.svg", b"<?xml"), ("hist.PDF", b"%PDF"), ("hist", b"\x89PNG")]
)
def test_the_plot_is_written_in_the_format_its_name_says(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, magic: bytes
) -> None:
    """``--plot lengths.svg`` wrote a PNG under that name (found by a new user)."""
    out = tmp_path / name
    code, _, _ = run(["trace", "stats", str(log), "--plot", str(out)], capsys)
    assert code == 0 and out.read_bytes().startswith(magic)
