"""``oomload trace``: output-path problems, flag parsing and the stated limits of the max_model_len advice."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from clirun import run
from oomload.cli import main

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "traces" / "sample-fixed.jsonl"  # 64 requests of 256 + 256 tokens
MOONCAKE = '{"timestamp": %d, "input_length": %d, "output_length": 3}\n'


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "log.jsonl"
    path.write_text("".join(MOONCAKE % (i * 1000, 7000 + i) for i in range(100)))
    return path


def one_error_line(err: str) -> str:
    assert err.startswith("oomload: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("verb", ["build", "stats"])
def test_one_log_given_twice_is_refused_not_read_twice(
    verb: str, log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trace build LOG LOG`` wrote every request twice (200 of a 100-line log), without a word; so
    did a log and a link to it (a shell glob and a path given by hand)."""
    link = tmp_path / "link.jsonl"
    link.symlink_to(log)
    out = ["-o", str(tmp_path / "t.jsonl")] if verb == "build" else []
    for second, said in ((log, f"{log} is given twice"), (link, f"{log} and {link} are one file")):
        code, stdout, err = run(["trace", verb, str(log), str(second), *out], capsys)
        assert code == 2 and stdout == "", err
        assert f"{said}: its requests would be read twice" in one_error_line(err)
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("command", ["build", "synth"])
def test_output_paths_that_cannot_be_files_exit_2_with_one_sentence(
    command: str, log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    cases = {
        str(tmp_path): "is a directory; name a file",
        str(blocker / "y.jsonl"): "exists and is not a directory",
        "/dev/null": "is not a regular file",
        "": "output path is empty",
    }
    for out, message in cases.items():
        argv = ["trace", "build", str(log)] if command == "build" else ["trace", "synth", "--count", "3"]
        code, _, err = run([*argv, "-o", out], capsys)
        assert code == 2 and message in one_error_line(err), (out, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "log.jsonl"]  # no scratch file left


def test_a_failed_build_keeps_the_old_trace_and_leaves_no_scratch(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "trace.jsonl"
    assert run(["trace", "build", str(log), "-o", str(out)], capsys)[0] == 0
    good = out.read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("garbage\n")
    code, _, err = run(["trace", "build", str(bad), "-o", str(out)], capsys)
    assert code == 2 and "cannot tell the log format" in one_error_line(err)
    assert out.read_bytes() == good and [p.name for p in out.parent.iterdir()] == ["trace.jsonl"]
    code, _, err = run(["trace", "synth", "-o", str(out), "--count", "3", "--input", "fixed:0"], capsys)
    assert code == 2 and out.read_bytes() == good


def test_a_read_only_directory_is_named_as_the_output_the_user_gave(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a read-only file system both making the scratch file and removing it (never made) fail with
    EROFS: the sentence names the user's ``-o``, not a hidden scratch file. (Tests may run as root,
    whom a read-only mode does not stop: the file system's answers are played here.)"""
    from oomload.ingest import writer

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(writer, "_create", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    out = tmp_path / "tiny" / "out.trace"
    code, _, err = run(["trace", "build", str(log), "-o", str(out)], capsys)
    assert code == 2 and f"cannot write to {out}: Read-only file system" in one_error_line(err)
    assert ".tmp" not in err


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n"


@pytest.mark.parametrize("link", ["same path", "symlink", "hard link"])
@pytest.mark.parametrize("what", ["log", "trace", "plot"])
def test_an_output_that_is_one_of_the_inputs_is_refused_before_reading(
    what: str, link: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trace build LOG -o LOG`` wrote the trace over the log (exit 0, the log gone); so did a trace
    rebuilt onto itself, and ``trace stats … --plot`` onto its input. Now exit 2 before anything is
    read or written, whichever link leads to the input."""
    source = tmp_path / ("log.csv" if what == "log" else "t.jsonl")
    source.write_bytes(AZURE.encode() if what == "log" else SAMPLE.read_bytes())
    before = source.read_bytes()
    out = source
    if link == "symlink":
        out = tmp_path / "link"
        out.symlink_to(source)
    elif link == "hard link":
        out = tmp_path / "hard"
        out.hardlink_to(source)
    other = tmp_path / "other.csv"  # another input before it: every input is checked
    other.write_text(AZURE)
    inputs = [str(other), str(source)]
    if what == "plot":
        argv = ["trace", "stats", *inputs, "--plot", str(out)]
    else:
        argv = ["trace", "build", *inputs, "-o", str(out)]
    code, stdout, err = run(argv, capsys)
    assert code == 2 and stdout == "", err
    assert f"the output {out} is one of the inputs ({source})" in one_error_line(err)
    assert source.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({source.name, out.name, other.name})


def test_plot_to_a_directory_is_refused_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, err = run(["trace", "stats", str(SAMPLE), "--plot", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in one_error_line(err) and stdout == ""


@pytest.mark.parametrize(
    ("margin", "recommended"), [("0.5", 768), ("50%", 768), (" 0 ", 512), ("100%", 1024)]
)
def test_margin_is_a_fraction_or_a_percentage(
    margin: str, recommended: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, _ = run(["trace", "stats", str(SAMPLE), "--json", "--margin", margin], capsys)
    assert code == 0 and json.loads(stdout)["max_model_len"]["recommended"] == recommended


@pytest.mark.parametrize(
    ("margin", "message"), [("10", "write 0.1 or 10%"), ("ten", "a fraction such as 0.1")]
)
def test_bad_margins_are_one_sentence(margin: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["trace", "stats", str(SAMPLE), "--margin", margin], capsys)
    assert code == 2 and message in one_error_line(err)


def test_unknown_time_unit_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "any.csv"
    path.write_text("c,a,b\n1,2,3\n")
    code, _, err = run(["trace", "stats", str(path), "--map", "input=a,output=b,time=c:fortnights"], capsys)
    assert code == 2 and "unknown time unit 'fortnights'" in one_error_line(err)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_utf16_log_is_named_utf16(
    encoding: str, log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log saved by a Windows tool read "cannot tell the log format (a CSV with 8 columns)"."""
    log.write_bytes(log.read_text().encode(encoding))  # with a byte-order mark, and without
    for argv in (["trace", "build", str(log), "-o", str(tmp_path / "t.jsonl")], ["trace", "stats", str(log)]):
        code, _, err = run(argv, capsys)
        assert code == 2 and "the log is UTF-16 text, not UTF-8: convert it first" in one_error_line(err)


def test_a_damaged_gz_is_called_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.jsonl.gz"
    path.write_bytes(bytes(range(156, 256)))  # 100 bytes, no gzip signature, not text
    code, _, err = run(["trace", "build", str(path), "-o", str(tmp_path / "t.jsonl")], capsys)
    assert code == 2 and "is a damaged gzip file" in one_error_line(err)


def advice(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str]:
    code, stdout, _ = run(["trace", "stats", *argv, "--json"], capsys)
    assert code == 0
    doc = json.loads(stdout)
    code, table, _ = run(["trace", "stats", *argv], capsys)
    assert code == 0
    return doc["max_model_len"], " ".join(table.split())


def test_capped_and_kept_advice_says_so(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # totals 7003..7102: P99 = 7101, × 1.1 = 7811.1 → 7936 (31 × 256)
    plain, text = advice([str(log)], capsys)
    assert plain["recommended"] == plain["implied_by_trace"] == 7936
    assert (
        "max_model_len the trace implies: 7,936" in text and "capped at" not in text and "kept at" not in text
    )

    capped, text = advice([str(log), "--model-limit", "4096"], capsys)
    assert capped["recommended"] == 4096 and capped["implied_by_trace"] == 7936
    assert capped["capped_by_model_limit"] and capped["model_limit"] == 4096
    assert capped["refused_count"] == 100 and capped["refused_fraction"] == 1.0
    assert "max_model_len to use: 4,096; the trace alone implies 7,936" in text
    assert "capped at the model's context limit 4,096 tokens" in text

    kv, text = advice([str(log), "--kv-cache-tokens", "7500", "--block-size", "16"], capsys)
    # 7500 tokens = 468 whole blocks of 16; one is vLLM's null block: 467 × 16 = 7472 usable
    assert kv["recommended"] == 7472 and kv["capped_by_kv_cache"] and kv["kv_cache_tokens"] == 7500
    assert kv["usable_kv_cache_tokens"] == 7472
    assert "capped at 7,472: the KV cache holds 7,500 tokens (7,472 usable: one block is vLLM's null" in text

    kept, text = advice([str(log), "--current-max-model-len", "7200"], capsys)
    assert kept["recommended"] == 7200 and kept["kept_current"] and kept["implied_by_trace"] == 7936
    assert "kept at the current 7,200: it already covers the P99" in text


def test_every_numeric_trace_flag_states_its_unit(capsys: pytest.CaptureFixture[str]) -> None:
    for action in ("stats", "synth"):
        with pytest.raises(SystemExit):
            main(["trace", action, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        if action == "stats":
            assert "a fraction: 0.1 = 10%" in text
            for flag in (
                "--round-to",
                "--block-size",
                "--current-max-model-len",
                "--kv-cache-tokens",
                "--model-limit",
            ):
                assert f"{flag} TOKENS" in text
        else:
            assert "--rate RPS Poisson arrival rate in requests/s (default: none" in text
            assert "--count REQUESTS" in text and "length spec in tokens" in text
