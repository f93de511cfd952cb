"""Bounded inputs at the trace boundary (issue #24): absurd lengths, ids and non-finite numbers.

Reading a trace (``trace stats``'s columnar reader, ``read_trace`` as ``replay`` uses it) refuses a
value over a bound with exit 2 and the file and line; ``NaN``, ``Infinity`` and ``1e400`` exited 70
("internal error") before. Building a trace from logs skips such a line and counts it, like any
unusable line, or stops ``--strict`` at it; it passed them through before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import run
from oomload.errors import TraceFormatError
from oomload.trace.model import MAX_ID_CHARS, MAX_LINE_BYTES, MAX_TOKENS, read_trace

HEADER = '{"oomload_trace":1,"source":[],"format":null,"tokenizer":null}\n'
GOOD = '{"id":"a","arrival_s":0,"prompt_tokens":5,"output_tokens":3}\n'
BAD_VALUES = {
    "1e400": ('"prompt_tokens":1e400,"output_tokens":3', "1e400 is too large"),
    "NaN": ('"prompt_tokens":NaN,"output_tokens":3', "NaN is not a number"),
    "Infinity arrival": ('"arrival_s":Infinity,"prompt_tokens":5,"output_tokens":3', "Infinity"),
    "huge integer": ('"prompt_tokens":5,"output_tokens":' + "9" * 5000, "has 5000 digits"),
    "10**9 tokens": ('"prompt_tokens":1000000000,"output_tokens":3', "prompt_tokens over the limit"),
    "max_tokens": ('"prompt_tokens":5,"output_tokens":3,"max_tokens":10000001', "max_tokens over the limit"),
    "long model": (f'"prompt_tokens":5,"output_tokens":3,"model":"{"m" * 300}"', "model longer than 256"),
    "fractional hash id": ('"prompt_tokens":5,"output_tokens":3,"hash_ids":[1.5]', "hash_ids must be"),
    "a string for a count": ('"prompt_tokens":"5","output_tokens":3', "prompt_tokens must be an integer"),
}


def _trace(tmp_path: Path, fields: str, *, record_id: str = "b") -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(HEADER + GOOD + f'{{"id":"{record_id}","arrival_s":1,{fields}}}\n')
    return path


@pytest.mark.parametrize("case", BAD_VALUES, ids=list(BAD_VALUES))
def test_a_value_over_its_bound_in_a_trace_is_exit_2_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    fields, message = BAD_VALUES[case]
    path = _trace(tmp_path, fields)
    code, _, err = run(["trace", "stats", str(path)], capsys)
    assert code == 2, err
    assert err.startswith(f"oomload: error: {path}:3: ") and message in err and err.count("\n") == 1
    with pytest.raises(TraceFormatError, match=message) as caught:
        read_trace(path)  # the reader replay uses
    assert caught.value.line == 3


@pytest.mark.parametrize(
    ("line", "kind"), [("[1,2,3]", "an array"), ('"r1"', "a string"), ("7", "a number"), ("null", "null")]
)
def test_a_trace_line_that_is_not_an_object_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, kind: str
) -> None:
    """A line ``[1,2,3]`` gave "malformed trace record (list indices must be integers or slices, not
    str)": Python's words. It names what the line is, in shape only, like every reader of logs."""
    path = tmp_path / "t.jsonl"
    path.write_text(HEADER + GOOD + line + "\n")
    message = f"{path}:3: malformed trace record (not a JSON object but {kind})"
    for argv in (["trace", "stats", str(path)], ["trace", "build", str(path), "-o", str(tmp_path / "o")]):
        code, _, err = run(argv, capsys)
        assert code == 2 and err == f"oomload: error: {message}\n", err
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    assert str(caught.value) == message


def test_an_id_over_256_characters_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace(tmp_path, '"prompt_tokens":5,"output_tokens":3', record_id="r" * (MAX_ID_CHARS + 1))
    code, _, err = run(["trace", "stats", str(path)], capsys)
    assert code == 2 and f"{path}:3: " in err and "id longer than 256 characters" in err
    ok = _trace(tmp_path, '"prompt_tokens":5,"output_tokens":3', record_id="r" * MAX_ID_CHARS)
    assert len(read_trace(ok)) == 2  # the bound itself is allowed


def test_a_line_longer_than_the_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with path.open("w") as fh:
        fh.write(HEADER + GOOD)
        fh.write(
            '{"id":"' + "x" * (MAX_LINE_BYTES + 10) + '","arrival_s":1,"prompt_tokens":5,"output_tokens":3}\n'
        )
    with pytest.raises(TraceFormatError, match="line longer than 32 MiB") as caught:
        read_trace(path)
    assert caught.value.line == 3


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    fields = f'"prompt_tokens":{MAX_TOKENS},"output_tokens":{MAX_TOKENS},"max_tokens":{MAX_TOKENS}'
    records = read_trace(_trace(tmp_path, fields))
    assert records[1].prompt_tokens == MAX_TOKENS and records[1].max_tokens == MAX_TOKENS


# One log per reader: a good line, then one whose prompt is 10**9 tokens.
LOGS = {
    "openai": (
        "log.jsonl",
        "".join(
            json.dumps(
                {"timestamp": 1_700_000_000 + i, "request": {"model": "m"},
                 "response": {"usage": {"prompt_tokens": n, "completion_tokens": 3}}}
            ) + "\n"
            for i, n in enumerate((5, 10**9))
        ),
        [],
        2,
    ),
    "azure": (
        "log.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.6805900,1000000000,44\n",
        [],
        3,
    ),
    "mooncake": (
        "log.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [1]}\n'
        '{"timestamp": 1000, "input_length": 1000000000, "output_length": 3}\n',
        [],
        2,
    ),
    "mapped jsonl": (
        "log.jsonl",
        '{"t": 0, "in": 5, "out": 3}\n{"t": 1, "in": 1000000000, "out": 3}\n',
        ["--map", "input=in,output=out,time=t"],
        2,
    ),
}  # fmt: skip


@pytest.mark.parametrize("fmt", LOGS, ids=list(LOGS))
def test_trace_build_skips_an_absurd_length_or_stops_strict_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    name, text, extra, bad_line = LOGS[fmt]
    log = tmp_path / name
    log.write_text(text)
    out = tmp_path / "trace.jsonl"
    code, stdout, err = run(["trace", "build", str(log), "-o", str(out), *extra], capsys)
    assert code == 0, err
    assert [r.prompt_tokens for r in read_trace(out)] in ([5], [374])
    assert f"prompt_tokens over the limit of 10,000,000 tokens  (first: {log}:{bad_line})" in stdout
    code, _, err = run(
        ["trace", "build", str(log), "-o", str(tmp_path / "s.jsonl"), "--strict", *extra], capsys
    )
    assert code == 2
    reason = "prompt_tokens over the limit of 10,000,000 tokens"
    assert err == f"oomload: error: {log}:{bad_line}: {reason} (stopped by --strict)\n"


def test_trace_build_skips_a_vllm_log_request_asking_for_an_absurd_max_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "INFO 12-20 20:25:46 api_server.py:1] vLLM API server version 0.6.6\n"
        "INFO 12-20 20:25:50 engine.py:267] Received request cmpl-a: prompt: 'hi', "
        "params: SamplingParams(n=1, max_tokens=16), prompt_token_ids: [1, 2, 3], lora_request: None.\n"
        "INFO 12-20 20:25:51 engine.py:267] Received request cmpl-b: prompt: 'hi', "
        "params: SamplingParams(n=1, max_tokens=100000000), prompt_token_ids: [1, 2], lora_request: None.\n"
    )
    out = tmp_path / "trace.jsonl"
    code, stdout, err = run(["trace", "build", str(log), "-o", str(out), "--keep-ids"], capsys)
    assert code == 0, err
    assert [r.id for r in read_trace(out)] == ["cmpl-a"]
    assert f"output_tokens over the limit of 10,000,000 tokens  (first: {log}:3)" in stdout


SYNTH_OVER = {
    "fixed": (["--input", "fixed:20000000"], "allows requests of 20,000,000 tokens, over the limit"),
    "uniform": (["--output", "uniform:1:10000001"], "over the limit of 10,000,000 tokens"),
    "lognormal P99": (["--input", "lognormal:600:20000000"], "over the limit of 10,000,000 tokens"),
    "lognormal MAX": (["--input", "lognormal:600:6000:10000001"], "over the limit of 10,000,000 tokens"),
    "a mix": (["--input", "fixed:5@1+fixed:10000001@1"], "over the limit of 10,000,000 tokens"),
    "count": (["--count", "100000000000"], "--count must be at most 1,000,000 requests"),
    "rate": (["--count", "1000", "--rate", "1e-9"], "past the limit of 1e+11 s"),
}  # fmt: skip


@pytest.mark.parametrize("case", SYNTH_OVER, ids=list(SYNTH_OVER))
def test_trace_synth_refuses_what_a_trace_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """``synth --input fixed:20000000`` wrote a trace that ``stats`` then refused (exit 0, then 2);
    ``--count 100000000000`` ran out of memory (exit 70). Both are exit 2 at synth time now, naming
    the bound, and nothing is written."""
    argv, message = SYNTH_OVER[case]
    out = tmp_path / "s.jsonl"
    argv = ["--count", "3", *argv] if "--count" not in argv else argv
    code, _, err = run(["trace", "synth", "-o", str(out), *argv], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_synthetic_trace_at_the_bounds_is_read_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.jsonl"
    argv = ["--input", f"fixed:{MAX_TOKENS}", "--output", f"lognormal:9000000:{MAX_TOKENS}", "--rate", "1e-7"]
    code, _, err = run(["trace", "synth", "-o", str(out), "--count", "1000", *argv], capsys)
    assert code == 0, err
    records = read_trace(out)
    assert {r.prompt_tokens for r in records} == {MAX_TOKENS}
    assert max(r.output_tokens for r in records) == MAX_TOKENS  # its 1 % over the P99, capped
    assert run(["trace", "stats", str(out)], capsys)[0] == 0
