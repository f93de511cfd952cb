"""Every input format, from small fixtures written here: what each reader keeps, skips and marks."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from oomload.errors import ConfigError, TraceFormatError
from oomload.ingest import (
    SkipLog,
    build_trace,
    detect_format,
    iter_records,
    load_columns,
    parse_mapping,
    writer,
)
from oomload.ingest.source import LogSource
from oomload.trace.model import TraceRecord, read_trace, read_trace_header

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"  # real vLLM logs (tests/fixtures/regenerate.py)
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


class WordCounter:
    """A fake tokenizer: one token per whitespace-separated word."""

    name = "fake:words"

    def count(self, text: str) -> int:
        return len(text.split())


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return path


def records(path: Path, **kwargs: object) -> tuple[list[TraceRecord], SkipLog]:
    skips = SkipLog()
    out = list(iter_records([path], skips=skips, **kwargs))  # type: ignore[arg-type]
    return out, skips


# --- Azure -------------------------------------------------------------------------------------------


def test_azure_2023_crlf_seven_digit_fractions_no_final_newline(tmp_path: Path) -> None:
    path = write(
        tmp_path / "azure.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        "2023-11-16 18:17:03.9799600,4808,10\r\n"
        "2023-11-16 18:17:04.0319600,3180,8\r\n"
        "2023-11-16 18:17:05.0000001,110,27",
    )
    assert detect_format(LogSource(path)) == "azure"
    recs, skips = records(path)
    assert [(r.prompt_tokens, r.output_tokens) for r in recs] == [(4808, 10), (3180, 8), (110, 27)]
    assert [round(r.arrival_s, 6) for r in recs] == [0.0, 0.052, 1.02004]
    assert [r.id for r in recs] == ["", "", ""] and skips.total == 0


def test_azure_2025_with_num_images_and_time_zone(tmp_path: Path) -> None:
    path = write(
        tmp_path / "azure25.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,NumImages\n"
        "2025-05-10 00:00:00.0039050+00:00,100,5,1\n"
        "2025-05-10 00:00:02.5039050+00:00,200,6,0\n",
    )
    recs, _ = records(path)
    assert [(r.arrival_s, r.prompt_tokens) for r in recs] == [(0.0, 100), (2.5, 200)]


def test_azure_bad_rows_are_skipped_with_their_line_numbers(tmp_path: Path) -> None:
    path = write(
        tmp_path / "bad.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,many,8\n"
        "2023-11-16 18:17:04.5,-3,8\n"
        "yesterday,10,8\n"
        "2023-11-16 18:17:05.0,7,9\n",
    )
    recs, skips = records(path)
    assert [r.prompt_tokens for r in recs] == [4808, 7]
    assert skips.counts == {
        "not a non-negative integer in column 'ContextTokens'": 2,
        "not a timestamp in column 'TIMESTAMP'": 1,
    }
    assert skips.examples["not a non-negative integer in column 'ContextTokens'"] == [
        f"{path}:3",
        f"{path}:4",
    ]
    assert skips.examples["not a timestamp in column 'TIMESTAMP'"] == [f"{path}:5"]


def test_csv_row_with_wrong_column_count_is_skipped(tmp_path: Path) -> None:
    path = write(
        tmp_path / "short.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,48,10\n2023-11-16 18:17:04.0,31\n",
    )
    recs, skips = records(path)
    assert len(recs) == 1 and skips.counts == {"wrong number of columns (expected 3)": 1}


# --- BurstGPT -----------------------------------------------------------------------------------------


def test_burstgpt_keeps_failed_requests_marked(tmp_path: Path) -> None:
    path = write(
        tmp_path / "burst.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,GPT-4,1087,0,1087,API log\n"
        "46.5,ChatGPT,300,12,312,Conversation log\n",
    )
    assert detect_format(LogSource(path)) == "burstgpt"
    recs, _ = records(path)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.ok, r.model) for r in recs] == [
        (0.0, 472, 18, True, "ChatGPT"),
        (40.0, 1087, 0, False, "GPT-4"),
        (41.5, 300, 12, True, "ChatGPT"),
    ]


# --- Mooncake / Bailian ------------------------------------------------------------------------------


def test_mooncake_and_bailian_fields(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]},
        {
            "timestamp": 1500,
            "input_length": 1030,
            "output_length": 5,
            "hash_ids": [0, 1, 2, 3, 4],
            "chat_id": 7,
            "parent_chat_id": -1,
            "turn": 1,
            "type": "text",
        },
        {
            "timestamp": 3000,
            "input_length": 40,
            "output_length": 9,
            "hash_ids": [],
            "chat_id": 8,
            "parent_chat_id": 7,
            "turn": 2,
            "type": "text",
        },
    ]
    path = write(tmp_path / "bailian.jsonl", "".join(json.dumps(o) + "\n" for o in lines))
    assert detect_format(LogSource(path)) == "mooncake"
    recs, _ = records(path)
    assert [(r.arrival_s, r.prompt_tokens, r.hash_ids, r.session, r.parent, r.turn) for r in recs] == [
        (0.0, 600, (0, 1), None, None, None),
        (1.5, 1030, (0, 1, 2, 3, 4), "7", None, 1),
        (3.0, 40, (), "8", "7", 2),
    ]


def test_mooncake_bad_lines_counted_by_reason(tmp_path: Path) -> None:
    path = write(
        tmp_path / "m.jsonl",
        '{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [0]}\n'
        "{not json\n"
        '{"timestamp": 3000, "input_length": -6, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 3000, "output_length": 1}\n'
        "\n"
        '{"timestamp": 6000, "input_length": 9, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 1e400, "input_length": 9, "output_length": 2}\n',
    )
    recs, skips = records(path)
    assert [r.prompt_tokens for r in recs] == [6, 9]
    assert skips.counts == {
        "not a JSON object": 1,
        "input_length is not a non-negative integer": 1,
        "missing input_length": 1,
        "a number out of range or not JSON (1e400, NaN)": 1,  # was "not a JSON object"
    }
    assert skips.examples["not a JSON object"] == [f"{path}:2"]
    assert skips.examples["missing input_length"] == [f"{path}:4"]


def test_bailian_turns_that_are_not_integers_or_beyond_the_bound_are_counted_skips(tmp_path: Path) -> None:
    """``"turn": true`` crashed the build (a bool is an int to Python, not to Arrow); 2e6 is a turn."""
    turns = ["1", "true", '"3"', "2.5", "3.0", "2000000", "2e6", "1e22", "null"]
    path = write(
        tmp_path / "bailian.jsonl",
        "".join(
            f'{{"timestamp": {i}, "input_length": 10, "output_length": 2, "turn": {t}}}\n'
            for i, t in enumerate(turns)
        ),
    )
    result = build_trace([path], tmp_path / "out.jsonl")
    assert [r.turn for r in read_trace(tmp_path / "out.jsonl")] == [1, 3, None]
    assert result.skips.counts == {"turn is not an integer": 3, "turn beyond ±1,000,000": 3}


# --- OpenAI-style logs --------------------------------------------------------------------------------


def test_openai_request_response_log(tmp_path: Path) -> None:
    lines = [
        {
            "timestamp": "2024-03-01T10:00:00Z",
            "request": {"model": "m1", "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]},
            "response": {"id": "chatcmpl-1", "usage": {"prompt_tokens": 12, "completion_tokens": 30}},
            "status_code": 200,
        },
        {
            "timestamp": 1709287201.5,
            "request": {"body": {"model": "m1", "max_completion_tokens": 64, "prompt": [1, 2, 3]}},
            "response": {"id": "cmpl-2", "error": {"message": "boom"}},
            "status_code": 500,
        },
    ]
    path = write(tmp_path / "gw.jsonl", "".join(json.dumps(o) + "\n" for o in lines))
    assert detect_format(LogSource(path)) == "openai"
    recs, skips = records(path)
    assert skips.total == 0
    assert [
        (r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.max_tokens, r.ok, r.model) for r in recs
    ] == [
        ("chatcmpl-1", 0.0, 12, 30, 256, True, "m1"),
        ("cmpl-2", 1.5, 3, 0, 64, False, "m1"),  # token-id prompt counted exactly; failed: output 0
    ]


def test_openai_batch_output_shape(tmp_path: Path) -> None:
    line = {
        "id": "batch_req_1",
        "custom_id": "request-7",
        "response": {
            "status_code": 200,
            "request_id": "req_1",
            "body": {
                "id": "chatcmpl-9",
                "created": 1711652795,
                "model": "gpt-4o",
                "usage": {"prompt_tokens": 22, "completion_tokens": 2, "total_tokens": 24},
            },
        },
        "error": None,
    }
    failed = {**line, "custom_id": "request-8", "response": {"status_code": 400, "body": {"error": {}}}}
    path = write(tmp_path / "batch.jsonl", json.dumps(line) + "\n" + json.dumps(failed) + "\n")
    recs, skips = records(path, counter=WordCounter())
    assert (recs[0].id, recs[0].prompt_tokens, recs[0].output_tokens, recs[0].model) == (
        "request-7",
        22,
        2,
        "gpt-4o",
    )
    # The failed Batch line has no usage and no request text: nothing to count, so it is skipped.
    assert len(recs) == 1 and skips.counts == {"no token counts (give --tokenizer)": 1}


def test_openai_streaming_log_without_usage_needs_a_tokenizer(tmp_path: Path) -> None:
    line = {
        "created_at": 100,
        "request": {"stream": True, "messages": [{"role": "user", "content": "one two three"}]},
        "response": [
            {"choices": [{"delta": {"content": "four "}}]},
            {"choices": [{"delta": {"content": "five six"}}]},
        ],
    }
    path = write(tmp_path / "stream.jsonl", json.dumps(line) + "\n")
    recs, skips = records(path)
    assert recs == [] and skips.counts == {"no token counts (give --tokenizer)": 1}
    recs, skips = records(path, counter=WordCounter())
    assert [(r.prompt_tokens, r.output_tokens) for r in recs] == [(3, 3)] and skips.total == 0


# --- vLLM server logs ---------------------------------------------------------------------------------


def _logged_ids(text: str, request_id: str) -> int:
    details = next(line for line in text.splitlines() if f"Request {request_id} details" in line)
    return len(details.split("prompt_token_ids: [")[1].split("]")[0].split(","))


def test_vllm_request_log_excerpt() -> None:
    """The real vLLM 0.32 log (DEBUG, --enable-log-requests): every request, its exact lengths."""
    path = FIXTURES / "vllm-request-log.txt"
    sent = MANIFEST["full"]["requests"]
    assert detect_format(LogSource(path)) == "vllm-log"
    recs, skips = records(path)
    assert len(recs) == len(sent)
    # the first four were sent one after the other (3 completions, 1 chat): in order, exact
    assert [(r.prompt_tokens, r.max_tokens) for r in recs[:4]] == [
        (q["usage"]["prompt_tokens"], q["max_tokens"]) for q in sent[:4]
    ]
    assert recs[3].id.startswith("chatcmpl-")
    assert sorted((r.prompt_tokens, r.output_tokens) for r in recs) == sorted(
        (q["usage"]["prompt_tokens"], q["max_tokens"]) for q in sent
    )
    text = path.read_text()
    assert all(r.prompt_tokens == _logged_ids(text, r.id) for r in recs)
    assert skips.total == 0 and any("max_tokens" in note for note in skips.notes)
    assert not any("max-log-len" in note for note in skips.notes)


def test_vllm_log_written_with_max_log_len_never_records_a_cut_length() -> None:
    """Real log of a vLLM started with --max-log-len 64: prompts of 900, 40, 64, 200 and a chat of 72
    tokens. The 900, 64, 200 and 72 ones are logged with 64 ids: skipped with the reason; 40 is kept."""
    path = FIXTURES / "vllm-request-log-max-log-len.txt"
    cut = MANIFEST["max_log_len"]["max_log_len"]
    sent = MANIFEST["max_log_len"]["requests"]
    recs, skips = records(path)
    assert [r.prompt_tokens for r in recs] == [q["prompt_tokens"] for q in sent if q["prompt_tokens"] < cut]
    assert all(r.prompt_tokens < cut for r in recs)
    assert skips.counts == {
        f"prompt ids cut at --max-log-len {cut}": sum(q["prompt_tokens"] >= cut for q in sent)
    }
    assert any("without --max-log-len" in note for note in skips.notes)


def test_vllm_log_without_the_banner_warns_when_many_prompts_sit_at_one_maximum(tmp_path: Path) -> None:
    """The same real log with its start-up line cut off: nothing says --max-log-len, so a note warns."""
    lines = (FIXTURES / "vllm-request-log-max-log-len.txt").read_text().splitlines(keepends=True)
    path = write(tmp_path / "no-banner.log", "".join(x for x in lines if "non-default args" not in x))
    recs, skips = records(path)
    assert sorted(r.prompt_tokens for r in recs) == [40, 64, 64, 64, 64]
    assert any("4 of 5 prompts have exactly 64 token ids" in note for note in skips.notes), skips.notes
    # the full log (banner present, no cut) has varied lengths: no such warning
    _, clean = records(FIXTURES / "vllm-request-log.txt")
    assert not any("--max-log-len" in note for note in clean.notes)


def test_vllm_old_single_line_format_and_aborted_requests(tmp_path: Path) -> None:
    path = write(
        tmp_path / "v0.log",
        "INFO 12-20 20:25:46 api_server.py:1] vLLM API server version 0.6.6\n"
        "INFO 12-20 20:25:50 engine.py:267] Received request cmpl-a: prompt: 'hello there', "
        "params: SamplingParams(n=1, max_tokens=16, min_tokens=0), prompt_token_ids: [1, 2, 3, 4], "
        "lora_request: None, prompt_adapter_request: None.\n"
        "INFO 12-20 20:25:52 engine.py:267] Received request cmpl-b: prompt: 'a b c', "
        "params: SamplingParams(n=1, max_tokens=8), prompt_token_ids: None, lora_request: None.\n"
        "INFO 12-20 20:25:53 async_llm_engine.py:1] Aborted request cmpl-a.\n"
        'INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\n',
    )
    recs, skips = records(path, counter=WordCounter())
    assert [(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.ok) for r in recs] == [
        ("cmpl-a", 0.0, 4, 16, False),
        ("cmpl-b", 2.0, 3, 8, True),  # prompt text counted with the named tokenizer
    ]
    assert any("1 non-2xx" in note for note in skips.notes)


def test_vllm_info_only_log_is_skipped_with_the_fix(tmp_path: Path) -> None:
    path = write(
        tmp_path / "info.log",
        "(APIServer pid=1) INFO 11-30 03:04:04 [request_logger.py:65] Received request cmpl-x: "
        "params: SamplingParams(n=1, max_tokens=300), lora_request: None.\n",
    )
    recs, skips = records(path)
    assert recs == [] and "VLLM_LOGGING_LEVEL=DEBUG" in next(iter(skips.counts))


# --- generic mapping ----------------------------------------------------------------------------------


def test_mapped_csv_with_datetime_time_and_ids(tmp_path: Path) -> None:
    path = write(
        tmp_path / "any.csv",
        "when,rid,in,out,cap\n2024-01-01T00:00:00,a,10,2,64\n2024-01-01T00:00:03,b,20,4,\n",
    )
    mapping = parse_mapping("input=in,output=out,time=when,id=rid,max_tokens=cap")
    recs, _ = records(path, mapping=mapping)
    assert [(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.max_tokens) for r in recs] == [
        ("a", 0.0, 10, 2, 64),
        ("b", 3.0, 20, 4, None),
    ]


def test_mapped_jsonl_with_dotted_paths_and_ms(tmp_path: Path) -> None:
    lines = [{"t": 1000, "u": {"p": 5, "c": 1}, "ok": 200}, {"t": 3500, "u": {"p": 6, "c": 0}, "ok": 503}]
    path = write(tmp_path / "any.jsonl", "".join(json.dumps(o) + "\n" for o in lines))
    mapping = parse_mapping("input=u.p,output=u.c,time=t:ms,ok=ok")
    recs, _ = records(path, mapping=mapping)
    assert [(r.arrival_s, r.prompt_tokens, r.ok) for r in recs] == [(0.0, 5, True), (2.5, 6, False)]


def test_mapped_jsonl_whose_first_line_is_longer_than_the_sniffed_head(tmp_path: Path) -> None:
    """A first line of 300 KiB (a long prompt logged with its counts): its columns are still found."""
    lines = [{"t": i, "in": 5 + i, "out": 2, "text": "x" * 300 * 1024} for i in range(2)]
    path = write(tmp_path / "long.jsonl", "".join(json.dumps(o) + "\n" for o in lines))
    recs, _ = records(path, mapping=parse_mapping("input=in,output=out,time=t"))
    assert [(r.arrival_s, r.prompt_tokens) for r in recs] == [(0.0, 5), (1.0, 6)]


@pytest.mark.parametrize(
    ("header", "timed"),
    [("100", "101"), ("2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z")],
    ids=["seconds", "datetime"],
)
def test_mapped_csv_counts_an_unreadable_time_apart_from_a_missing_one(
    tmp_path: Path, header: str, timed: str
) -> None:
    """An empty time cell is "no time"; ``yesterday`` or ``12:xx`` is a time that cannot be read."""
    path = write(
        tmp_path / "m.csv", f"ts,in,out\n{header},5,3\n,5,3\n  ,5,3\nyesterday,5,3\n12:xx,5,3\n{timed},5,3\n"
    )
    recs, skips = records(path, mapping=parse_mapping("input=in,output=out,time=ts"))
    assert len(recs) == 2
    bad = "not a number in time column 'ts'" if header == "100" else "not a timestamp in column 'ts'"
    assert skips.counts == {"no time in column 'ts'": 2, bad: 2}
    assert skips.examples["no time in column 'ts'"] == [f"{path}:3", f"{path}:4"]
    assert skips.examples[bad] == [f"{path}:5", f"{path}:6"]


def test_mapped_jsonl_counts_an_unreadable_time_apart_from_a_missing_one(tmp_path: Path) -> None:
    times: list[object] = [100, None, "", "yesterday", "12:xx", True, 101]
    lines = [{"ts": t, "in": 5, "out": 3} for t in times]
    lines.insert(1, {"in": 5, "out": 3})  # no ts at all (the first line names the file's columns)
    path = write(tmp_path / "m.jsonl", "".join(json.dumps(o) + "\n" for o in lines))
    recs, skips = records(path, mapping=parse_mapping("input=in,output=out,time=ts"))
    assert len(recs) == 2
    assert skips.counts == {"no time in 'ts'": 3, "not a time in 'ts'": 3}  # absent, null, "" / bad
    assert skips.examples["no time in 'ts'"] == [f"{path}:2", f"{path}:3", f"{path}:4"]


def test_mapping_naming_a_missing_column_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "any.csv", "a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="'tokens_in', but the file has columns a, b"):
        list(iter_records([path], mapping=parse_mapping("input=tokens_in,output=b")))
    with pytest.raises(ConfigError, match="needs output"):
        parse_mapping("input=a")


def test_mapping_time_units() -> None:
    assert parse_mapping("input=a,output=b,time=t:ms").time_unit == "ms"
    assert parse_mapping("input=a,output=b,time=t:iso").time_unit == "datetime"
    both = parse_mapping("input=a,output=b,time=when:utc:s")
    assert (both.time, both.time_unit) == ("when:utc", "s")
    with pytest.raises(
        ConfigError, match=r"unknown time unit 'fortnights' .*allowed: s, ms, us, ns, datetime"
    ):
        parse_mapping("input=a,output=b,time=c:fortnights")
    with pytest.raises(ConfigError, match="names no column"):
        parse_mapping("input=a,output=b,time=:ms")


# --- compression, merging, ordering, detection --------------------------------------------------------

MOONCAKE = '{"timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": []}\n'


def test_gzip_and_zstd_inputs(tmp_path: Path) -> None:
    import zstandard

    text = (MOONCAKE % (0, 5) + MOONCAKE % (1000, 6)).encode()
    gz = write(tmp_path / "t.jsonl.gz", gzip.compress(text))
    zst = write(tmp_path / "t.jsonl.zst", zstandard.ZstdCompressor().compress(text))
    for path in (gz, zst):
        recs, _ = records(path)
        assert [(r.arrival_s, r.prompt_tokens) for r in recs] == [(0.0, 5), (1.0, 6)]


def test_zstd_without_the_library_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zstandard

    zst = write(tmp_path / "t.zst", zstandard.ZstdCompressor().compress((MOONCAKE % (0, 5)).encode()))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(TraceFormatError, match="pip install zstandard"):
        list(iter_records([zst]))


def test_several_inputs_merge_in_time_order(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", MOONCAKE % (0, 1) + MOONCAKE % (2000, 3))
    b = write(tmp_path / "b.jsonl", MOONCAKE % (1000, 2) + MOONCAKE % (3000, 4))
    out = tmp_path / "out.jsonl"
    result = build_trace([a, b], out)
    assert result.records_written == 4 and not result.reordered
    assert [(r.id, r.arrival_s, r.prompt_tokens) for r in read_trace(out)] == [
        ("r0", 0.0, 1),
        ("r1", 1.0, 2),
        ("r2", 2.0, 3),
        ("r3", 3.0, 4),
    ]
    assert read_trace_header(out).source == (str(a), str(b))


def test_unsorted_input_is_reordered_and_rebased(tmp_path: Path) -> None:
    path = write(tmp_path / "u.jsonl", MOONCAKE % (5000, 1) + MOONCAKE % (2000, 2) + MOONCAKE % (9000, 3))
    out = tmp_path / "out.jsonl"
    result = build_trace([path], out)
    assert result.reordered
    assert [(r.arrival_s, r.prompt_tokens) for r in read_trace(out)] == [(0.0, 2), (3.0, 1), (7.0, 3)]
    assert read_trace_header(out).extra["reordered"] is True


TRICKY_IDS = [
    'a,"arrival_s":9,"prompt_tokens":1',  # the keys the sort cuts lines at, inside an id
    'quote " and back\\slash',
    "line\nbreak and tab\t",
    "日本語 ωmega 🙂",
    "plain",
]


@pytest.mark.parametrize(
    ("times", "rendered_again"),
    [
        ([30.5, 10.25, 20.0, 10.25, 0.125], True),  # the earliest comes last: every number is rebased
        ([0.125, 30.5, 10.25, 20.0, 10.25], False),  # the first is the earliest: whole lines move
        ([5.0, 5.0, 30.0, 10.25, 20.0], False),  # the first ties with the second for the earliest
    ],
)
@pytest.mark.parametrize(("sort_rows", "scan_bytes"), [(8192, 1 << 20), (2, 7), (1, 64)])
def test_out_of_order_lines_are_sorted_byte_for_byte_like_an_in_order_build(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sort_rows: int,
    scan_bytes: int,
    times: list[float],
    rendered_again: bool,
) -> None:
    """The sort cuts each trace line at its keys (``writer._write_sorted``): ids holding those keys,
    quotes, escapes and non-ASCII text must come out as a build of the same lines in time order gives
    them; ties keep their log order — also when its newlines are found in blocks of a few bytes and
    its output is rendered a line or two at a time, and whether its numbers are rendered again (the
    earliest line is not the first) or its lines are moved whole."""
    monkeypatch.setenv("OOMLOAD_PREFIX_SALT", "sort test")
    monkeypatch.setattr(writer, "SORT_ROWS", sort_rows)
    monkeypatch.setattr(writer, "NEWLINE_SCAN_BYTES", scan_bytes)
    stays = writer._numbers_stay
    decided: list[bool] = []
    monkeypatch.setattr(writer, "_numbers_stay", lambda *a: decided.append(stays(*a)) or decided[-1])
    lines = [
        json.dumps(
            {
                "request_id": request_id,
                "timestamp": 1_760_000_000 + time_s,
                "model": request_id,
                "messages": [
                    {"role": "system", "content": "shared " * 40},
                    {"role": "user", "content": request_id * 9},
                ],
                "usage": {"prompt_tokens": 90 + i, "completion_tokens": 5 + i},
            }
        )
        for i, (request_id, time_s) in enumerate(zip(TRICKY_IDS, times, strict=True))
    ]
    by_time = sorted(range(len(lines)), key=lambda i: times[i])
    shuffled = build_trace(
        [write(tmp_path / "shuffled.jsonl", "\n".join(lines) + "\n")], tmp_path / "a.jsonl", keep_ids=True
    )
    ordered = build_trace(
        [write(tmp_path / "ordered.jsonl", "\n".join(lines[i] for i in by_time) + "\n")],
        tmp_path / "b.jsonl",
        keep_ids=True,
    )
    assert shuffled.reordered and not ordered.reordered
    body_a = (tmp_path / "a.jsonl").read_bytes().split(b"\n", 1)[1]
    body_b = (tmp_path / "b.jsonl").read_bytes().split(b"\n", 1)[1]
    assert body_a == body_b
    records = read_trace(tmp_path / "a.jsonl")
    assert [r.id for r in records] == [TRICKY_IDS[i] for i in by_time]
    assert [r.arrival_s for r in records] == [round(t - min(times), 6) for t in sorted(times)]
    assert all(r.hash_ids for r in records)
    assert decided == [not rendered_again]


def test_oomload_trace_as_input_round_trips(tmp_path: Path) -> None:
    first = tmp_path / "first.jsonl"
    build_trace([write(tmp_path / "m.jsonl", MOONCAKE % (0, 7) + MOONCAKE % (500, 8))], first)
    assert detect_format(LogSource(first)) == "oomload"
    second = tmp_path / "second.jsonl"
    build_trace([first], second)
    assert read_trace(second) == read_trace(first)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"\n\n  \n", "empty file"),
        (b"hello world\nthis is prose\n", "cannot tell the log format"),
        (b"a,b,c\n1,2,3\n", "a CSV with columns a, b, c"),
        (b'{"foo": 1}\n', "keys foo match no known format"),
        (b"[1, 2]\n", "not an object"),
        (b'{"cut\n[1, 2]\n', "the first line that parses is JSON but not an object"),
        (b'{"cut\n{"cut, too\n', "none of the first 2 lines parses"),
    ],
)
def test_undetectable_inputs_fail_with_a_sentence(tmp_path: Path, content: bytes, message: str) -> None:
    path = write(tmp_path / "x.log", content)
    with pytest.raises(TraceFormatError, match=message):
        build_trace([path], tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_unreadable_inputs(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        build_trace([tmp_path / "missing.csv"], tmp_path / "out.jsonl")
    with pytest.raises(TraceFormatError, match="is a directory"):
        build_trace([tmp_path], tmp_path / "out.jsonl")
    broken = write(tmp_path / "broken.jsonl.gz", gzip.compress(((MOONCAKE % (0, 5)) * 2000).encode())[:300])
    with pytest.raises(TraceFormatError, match=r"is a damaged gzip file \(truncated"):
        build_trace([broken], tmp_path / "out.jsonl")


def test_damaged_compressed_inputs_are_named_as_such(tmp_path: Path) -> None:
    import random

    import zstandard

    noise = random.Random(7).randbytes(100)
    text = ((MOONCAKE % (0, 5)) * 50_000).encode()
    cases = {
        "noise.gz": (noise, "is a damaged gzip file: its name ends in .gz but it does not start"),
        "noise.zst": (noise, "is a damaged zstd file: its name ends in .zst"),
        "badframe.gz": (b"\x1f\x8b" + noise, "is a damaged gzip file"),
        "badframe.zst": (b"\x28\xb5\x2f\xfd" + noise, "is a damaged zstd file"),
        "cut.zst": (zstandard.ZstdCompressor().compress(text)[:400], r"is a damaged zstd file \(truncated"),
    }
    for name, (content, message) in cases.items():
        with pytest.raises(TraceFormatError, match=message):
            build_trace([write(tmp_path / name, content)], tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_zstd_frames_one_after_another_are_all_read(tmp_path: Path) -> None:
    import zstandard

    one, two = zstandard.ZstdCompressor(), zstandard.ZstdCompressor()
    frames = one.compress((MOONCAKE % (0, 5)).encode() * 30_000) + two.compress(
        (MOONCAKE % (1000, 6)).encode()
    )
    recs, _ = records(write(tmp_path / "two.zst", frames))
    assert len(recs) == 30_001 and recs[-1].prompt_tokens == 6


def test_a_text_log_named_gz_still_reads(tmp_path: Path) -> None:
    recs, _ = records(write(tmp_path / "plain.jsonl.gz", MOONCAKE % (0, 5)))
    assert [r.prompt_tokens for r in recs] == [5]


def test_strict_stops_at_the_first_bad_line(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", MOONCAKE % (0, 5) + "oops\n" + MOONCAKE % (1, 6))
    with pytest.raises(TraceFormatError) as info:
        build_trace([path], tmp_path / "out.jsonl", strict=True)
    assert info.value.path == str(path) and info.value.line == 2


def test_nothing_usable_is_an_error_naming_the_reasons(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", '{"timestamp": 0, "input_length": -1, "output_length": 1}\n')
    with pytest.raises(TraceFormatError, match=r"no usable requests.*input_length"):
        build_trace([path], tmp_path / "out.jsonl")


def test_load_columns_from_logs_equals_from_the_built_trace(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", MOONCAKE % (4000, 5) + MOONCAKE % (5000, 6) + MOONCAKE % (7500, 9))
    out = tmp_path / "out.jsonl"
    build_trace([path], out)
    from_log, from_trace = load_columns([path]), load_columns([out])
    assert from_log.arrival_s.tolist() == from_trace.arrival_s.tolist() == [0.0, 1.0, 3.5]
    assert from_log.prompt_tokens.tolist() == from_trace.prompt_tokens.tolist() == [5, 6, 9]


def test_a_skipped_row_rewrites_the_guessed_header(tmp_path: Path) -> None:
    path = write(
        tmp_path / "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.0000000,x,1\n"
        "2023-11-16 18:15:48.6805900,10,2\n",
    )
    out = tmp_path / "out.jsonl"
    build_trace([path], out)
    assert read_trace_header(out).extra["skipped"] == {
        "not a non-negative integer in column 'ContextTokens'": 1
    }
    assert [(r.id, r.arrival_s, r.prompt_tokens) for r in read_trace(out)] == [
        ("r0", 0.0, 374),
        ("r1", 2.0, 10),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "out.jsonl"]  # no scratch file left
