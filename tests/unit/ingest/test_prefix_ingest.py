"""Prefix structure derived while building a trace: chains from vLLM token ids, the salt, the header."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomload.ingest import build_trace
from oomload.ingest.prefixes import PREFIX_SALT_ENV
from oomload.trace.model import read_trace, read_trace_header
from oomload.trace.prefix import describe_prefix, expected_hit_tokens

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _vllm_line(second: int, request_id: str, ids: list[int], max_tokens: int = 4) -> str:
    prefix = f"(APIServer pid=7) {{level}} 12-01 06:33:{second:02d} [entrypoints/utils/request_logger.py:55] "
    return (
        prefix.format(level="DEBUG")
        + f"Request {request_id} details: prompt: None, prompt_token_ids: {ids}, prompt_embeds shape: None.\n"
        + prefix.format(level="INFO")
        + f"Received request {request_id}: params: SamplingParams(n=1, max_tokens={max_tokens}), "
        "lora_request: None.\n"
    )


def _shared_log(path: Path, system: list[int], tails: list[list[int]], start: int = 0) -> Path:
    path.write_text(
        "".join(_vllm_line(start + i, f"cmpl-{start + i}", system + tail) for i, tail in enumerate(tails))
    )
    return path


SYSTEM = list(range(100, 140))  # 40 tokens: 2 full blocks of 16, and 8 tokens into the third
TAILS = [[1] * 30, [2] * 30, [3] * 5]


def test_vllm_token_ids_become_chains_that_share_the_system_prompt(tmp_path: Path) -> None:
    log = _shared_log(tmp_path / "vllm.log", SYSTEM, TAILS)
    trace = build_trace([log], tmp_path / "t.jsonl", workers=1)
    assert trace.prefix is not None and trace.prefix.source == "token-ids"
    header = read_trace_header(tmp_path / "t.jsonl")
    assert header.prefix == trace.prefix
    assert (header.prefix.block_tokens, header.prefix.exact, header.prefix.truncated_requests) == (
        16,
        True,
        0,
    )
    recs = read_trace(tmp_path / "t.jsonl")
    assert [len(r.hash_ids) for r in recs] == [4, 4, 2]  # full blocks only (70, 70 and 45 tokens)
    assert recs[0].hash_ids[:2] == recs[1].hash_ids[:2] == recs[2].hash_ids
    assert recs[0].hash_ids[2] != recs[1].hash_ids[2]  # block 2 holds 8 system + 8 differing tokens
    reuse = expected_hit_tokens(recs, header.prefix)
    assert reuse.hit_tokens == (0, 32, 32)


def test_each_build_has_its_own_salt_unless_the_environment_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _shared_log(tmp_path / "vllm.log", SYSTEM, TAILS)

    def ids(name: str) -> set[int]:
        build_trace([log], tmp_path / name, workers=1)
        return {i for r in read_trace(tmp_path / name) for i in r.hash_ids}

    monkeypatch.delenv(PREFIX_SALT_ENV, raising=False)
    assert not ids("a.jsonl") & ids("b.jsonl")  # not matchable across builds
    monkeypatch.setenv(PREFIX_SALT_ENV, "fixed")
    assert ids("c.jsonl") == ids("d.jsonl")
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "d.jsonl").read_bytes()


def test_the_salt_is_shared_by_the_workers_of_one_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two vLLM logs read whole by two workers: one build's ids of one system prompt agree."""
    monkeypatch.delenv(PREFIX_SALT_ENV, raising=False)
    one = _shared_log(tmp_path / "one.log", SYSTEM, TAILS[:2])
    two = _shared_log(tmp_path / "two.log", SYSTEM, TAILS[2:], start=2)
    build_trace([one, two], tmp_path / "t.jsonl", workers=2, parallel_min_bytes=1)
    recs = read_trace(tmp_path / "t.jsonl")
    assert len(recs) == 3 and len({r.hash_ids[:2] for r in recs}) == 1


def test_prefix_chains_can_be_turned_off(tmp_path: Path) -> None:
    log = _shared_log(tmp_path / "vllm.log", SYSTEM, TAILS)
    result = build_trace([log], tmp_path / "t.jsonl", workers=1, prefix_block_tokens=None)
    assert result.prefix is not None and result.prefix.source == "none"
    assert all(not r.hash_ids for r in read_trace(tmp_path / "t.jsonl"))


def test_formats_without_prefix_structure_say_none(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    result = build_trace([azure], tmp_path / "t.jsonl", workers=1)
    assert read_trace_header(tmp_path / "t.jsonl").prefix == result.prefix
    assert result.prefix is not None and result.prefix.source == "none"


@pytest.mark.parametrize("workers", [1, 2])
def test_a_gateway_log_without_prompts_claims_no_chains(tmp_path: Path, workers: int) -> None:
    """Usage counts only, no messages or prompt: no request has ids, so the header claims no chains over
    message boundaries (the build says why), whichever process rendered the lines."""
    log = tmp_path / "usage.jsonl"
    log.write_text(
        "".join(
            f'{{"timestamp": {1760000000 + i}, "response": {{"usage": {{"prompt_tokens": {100 + i}, '
            f'"completion_tokens": 20}}}}}}\n'
            for i in range(60)
        )
    )
    result = build_trace([log], tmp_path / "t.jsonl", workers=workers, parallel_min_bytes=0, span_bytes=1024)
    header = read_trace_header(tmp_path / "t.jsonl")
    assert result.prefix is not None and result.prefix.source == "none"
    assert header.prefix == result.prefix
    assert "no request carried a prompt to chain (its messages or prompt)" in " ".join(header.extra["notes"])
    assert result.records_written == 60


@pytest.mark.parametrize("workers", [1, 2])
def test_a_gateway_log_with_one_prompt_keeps_its_chains(tmp_path: Path, workers: int) -> None:
    """One request of 60 with messages is enough for the header to say where its ids came from."""
    log = tmp_path / "usage.jsonl"
    lines = [
        f'{{"timestamp": {1760000000 + i}, "response": {{"usage": {{"prompt_tokens": 100, '
        f'"completion_tokens": 20}}}}}}\n'
        for i in range(59)
    ]
    log.write_text(
        "".join(lines) + _chat_line(59, [SYSTEM_MESSAGE, {"role": "user", "content": "q " * 40}], 300)
    )
    result = build_trace([log], tmp_path / "t.jsonl", workers=workers, parallel_min_bytes=0, span_bytes=1024)
    assert result.prefix is not None and result.prefix.source == "messages"
    assert sum(1 for r in read_trace(tmp_path / "t.jsonl") if r.hash_ids) == 1


def test_mooncake_and_bailian_ids_stay_as_given(tmp_path: Path) -> None:
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}\n')
    build_trace([mooncake], tmp_path / "m-trace.jsonl", workers=1)
    header = read_trace_header(tmp_path / "m-trace.jsonl")
    assert header.prefix is not None and (header.prefix.source, header.prefix.block_tokens) == (
        "source-trace",
        512,
    )
    assert read_trace(tmp_path / "m-trace.jsonl")[0].hash_ids == (7, 8)
    bailian = tmp_path / "b.jsonl"
    bailian.write_text(
        '{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 40, "output_length": 3, '
        '"hash_ids": [5, 6, 7], "turn": 1, "type": "text"}\n'
    )
    build_trace([bailian], tmp_path / "b-trace.jsonl", workers=1)
    header = read_trace_header(tmp_path / "b-trace.jsonl")
    assert header.prefix is not None and header.prefix.block_tokens == 16


def test_a_truncated_vllm_log_counts_the_requests_whose_chain_covers_the_logged_part(tmp_path: Path) -> None:
    """The real --max-log-len 64 log without its banner: 4 prompts logged at 64 ids, maybe cut."""
    lines = (FIXTURES / "vllm-request-log-max-log-len.txt").read_text().splitlines(keepends=True)
    log = tmp_path / "no-banner.log"
    log.write_text("".join(x for x in lines if "non-default args" not in x))
    build_trace([log], tmp_path / "t.jsonl", workers=1)
    header = read_trace_header(tmp_path / "t.jsonl")
    assert header.prefix is not None and header.prefix.truncated_requests == 4
    recs = read_trace(tmp_path / "t.jsonl")
    assert sorted(len(r.hash_ids) for r in recs) == [2, 4, 4, 4, 4]  # 40 ids: 2 blocks; 64 ids: 4


def test_a_real_vllm_request_log_with_shared_prefixes_shows_the_reuse_it_really_had(tmp_path: Path) -> None:
    """The real vLLM 0.32 log of requests sharing a system prompt and a three-turn conversation
    (tests/fixtures/regenerate.py): the trace's reuse is what was sent, to within a block per request,
    and in the server's 32-token blocks and 96-block pool it is the server's own hit counter."""
    import json

    shared = json.loads((FIXTURES / "manifest.json").read_text())["shared"]
    sent = shared["requests"]
    build_trace([FIXTURES / "vllm-request-log-shared.txt"], tmp_path / "t.jsonl", workers=1)
    recs = read_trace(tmp_path / "t.jsonl")
    header = read_trace_header(tmp_path / "t.jsonl")
    assert header.prefix is not None
    assert [r.prompt_tokens for r in recs] == [q["usage"]["prompt_tokens"] for q in sent]
    reuse = expected_hit_tokens(recs, header.prefix)
    for hit, q in zip(reuse.hit_tokens, sent, strict=True):
        assert 0 <= q["shared_tokens"] - hit < header.prefix.block_tokens, (hit, q)
    assert reuse.share == pytest.approx(
        sum(q["shared_tokens"] for q in sent) / sum(q["prompt_tokens"] for q in sent), abs=0.02
    )
    server = shared["server"]
    served = expected_hit_tokens(
        recs, header.prefix, server["num_gpu_blocks"], server_block_tokens=server["block_size"]
    )
    hits = (
        shared["counters_after"]["vllm:prefix_cache_hits_total"]
        - shared["counters_before"]["vllm:prefix_cache_hits_total"]
    )
    assert served.total_hit_tokens == hits > 0


# --- OpenAI-style logs: chains over message boundaries ------------------------------------------------

SYSTEM_MESSAGE = {"role": "system", "content": "You are terse. " * 12}


def _chat_line(i: int, messages: list[dict[str, str]], prompt_tokens: int, *, iso: bool = False) -> str:
    import json

    stamp: object = f"2024-06-01T00:00:{i:02d}Z" if iso else 1_717_200_000.0 + i
    return (
        json.dumps(
            {
                "timestamp": stamp,
                "request": {"model": "m", "max_tokens": 8, "messages": messages},
                "response": {
                    "id": f"c{i}",
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 8},
                },
            }
        )
        + "\n"
    )


def test_a_conversations_turn_k_starts_with_turn_k_minus_1s_blocks(tmp_path: Path) -> None:
    turn0 = [SYSTEM_MESSAGE, {"role": "user", "content": "first question " * 10}]
    turn1 = [*turn0, {"role": "assistant", "content": "an answer " * 10}, {"role": "user", "content": "next"}]
    other = [SYSTEM_MESSAGE, {"role": "user", "content": "something else " * 10}]
    log = tmp_path / "gateway.jsonl"
    log.write_text(_chat_line(0, turn0, 500) + _chat_line(1, turn1, 500) + _chat_line(2, other, 500))
    result = build_trace([log], tmp_path / "t.jsonl", workers=1)
    assert result.prefix is not None
    assert (result.prefix.source, result.prefix.exact) == ("messages", False)  # estimated counts
    a, b, c = (r.hash_ids for r in read_trace(tmp_path / "t.jsonl"))
    assert b[: len(a)] == a and len(b) > len(a)  # the whole of turn 0, then more
    system_blocks = len(json_bytes(SYSTEM_MESSAGE)) // 4 // 16  # blocks wholly in the system message
    assert system_blocks >= 2
    assert c[:system_blocks] == a[:system_blocks] and c[len(a) - 1] != a[-1]
    assert not any(str(t) in (tmp_path / "t.jsonl").read_text() for t in ("terse", "question"))


def json_bytes(obj: object) -> bytes:
    import json

    return json.dumps(obj).encode()


def test_the_chain_stops_at_the_logged_prompt_tokens(tmp_path: Path) -> None:
    log = tmp_path / "gateway.jsonl"
    log.write_text(_chat_line(0, [SYSTEM_MESSAGE, {"role": "user", "content": "q " * 200}], 40))
    build_trace([log], tmp_path / "t.jsonl", workers=1)
    assert len(read_trace(tmp_path / "t.jsonl")[0].hash_ids) == 2  # 40 tokens: 2 full blocks


def test_every_read_path_gives_one_message_the_same_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain line (columns), an ISO-time line (line by line) and a Batch-output line: one chain."""
    import json

    monkeypatch.setenv(PREFIX_SALT_ENV, "paths")
    messages = [SYSTEM_MESSAGE, {"role": "user", "content": "same " * 40}]
    batch = {
        "custom_id": "b1",
        "timestamp": 1_717_200_005.0,
        "request": {"body": {"model": "m", "messages": messages}},
        "response": {"status_code": 200, "body": {"usage": {"prompt_tokens": 300, "completion_tokens": 1}}},
    }
    plain, iso, out = tmp_path / "plain.jsonl", tmp_path / "iso.jsonl", tmp_path / "batch.jsonl"
    plain.write_text(_chat_line(0, messages, 300))
    iso.write_text(_chat_line(1, messages, 300, iso=True))
    out.write_text(json.dumps(batch) + "\n")
    chains = []
    for log in (plain, iso, out):
        build_trace([log], tmp_path / "t.jsonl", workers=1)
        chains.append(read_trace(tmp_path / "t.jsonl")[0].hash_ids)
    assert chains[0] and chains[0] == chains[1] == chains[2]


def _responses_line(i: int, request: dict[str, object], prompt_tokens: int) -> str:
    import json

    response = {"id": f"resp_{i}", "usage": {"input_tokens": prompt_tokens, "output_tokens": 8}}
    return json.dumps({"time": 1_717_200_000.0 + i, "request": request, "response": response}) + "\n"


def test_responses_api_instructions_and_input_items_chain_like_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Responses API's ``instructions`` is a system prompt and its ``input`` items are messages:
    turn 1 starts with turn 0's blocks, and a chat log with the same parts gives the same ids."""
    monkeypatch.setenv(PREFIX_SALT_ENV, "responses")
    item0 = {"role": "user", "content": [{"type": "input_text", "text": "first question " * 10}]}
    item1 = {"role": "assistant", "content": [{"type": "output_text", "text": "an answer " * 10}]}
    instructions = "You are terse. " * 12
    turn0 = {"model": "m", "instructions": instructions, "input": [item0]}
    turn1 = {
        "model": "m",
        "instructions": instructions,
        "input": [item0, item1, {"role": "user", "content": "next"}],
    }
    text = {"model": "m", "instructions": instructions, "input": "something else " * 10}
    log = tmp_path / "responses.jsonl"
    log.write_text(
        _responses_line(0, turn0, 300) + _responses_line(1, turn1, 500) + _responses_line(2, text, 300)
    )
    result = build_trace([log], tmp_path / "t.jsonl", workers=1)
    assert result.prefix is not None and result.prefix.source == "messages"
    a, b, c = (r.hash_ids for r in read_trace(tmp_path / "t.jsonl"))
    assert a and b[: len(a)] == a and len(b) > len(a)  # the whole of turn 0, then more
    head = len(json_bytes(instructions)) // 4 // 16  # blocks wholly in the instructions
    assert head >= 2 and c[:head] == a[:head] and c[head:] != a[head : len(c)]
    # the same parts as a chat request's system message and messages: the same ids
    import json

    chat = {"model": "m", "system": json.loads(json.dumps(instructions)), "messages": [item0]}
    same = tmp_path / "chat.jsonl"
    same.write_text(_responses_line(0, chat, 300))
    build_trace([same], tmp_path / "u.jsonl", workers=1)
    assert read_trace(tmp_path / "u.jsonl")[0].hash_ids == a


def test_spans_read_by_several_workers_share_one_salt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PREFIX_SALT_ENV, raising=False)
    log = tmp_path / "gateway.jsonl"
    log.write_text(
        "".join(
            _chat_line(i, [SYSTEM_MESSAGE, {"role": "user", "content": f"q{i} " * 30}], 300)
            for i in range(60)
        )
    )
    build_trace([log], tmp_path / "t.jsonl", workers=2, parallel_min_bytes=0, span_bytes=2048)
    recs = read_trace(tmp_path / "t.jsonl")
    assert len(recs) == 60 and len({r.hash_ids[:2] for r in recs}) == 1


def test_a_tokenizer_counts_each_message_and_its_tool_calls_but_the_chains_are_not_exact(
    tmp_path: Path,
) -> None:
    class WordCounter:
        """A fake tokenizer: one token per whitespace-separated word."""

        name = "fake:words"

        def count(self, text: str) -> int:
            return len(text.split())

    log = tmp_path / "gateway.jsonl"
    log.write_text(_chat_line(0, [SYSTEM_MESSAGE, {"role": "user", "content": "a b c"}], 100))
    result = build_trace([log], tmp_path / "t.jsonl", workers=1, counter=WordCounter())
    # a chat template's role and format tokens are not counted: the header does not say exact
    assert result.prefix is not None and not result.prefix.exact
    assert "not exact" in describe_prefix(result.prefix)
    # whitespace tokens: 36 in the system message, 3 in the user's: 39 tokens, 2 full blocks
    assert len(read_trace(tmp_path / "t.jsonl")[0].hash_ids) == 2
    call = {"function": {"name": "lookup", "arguments": '{"q": "w w w w w w w w w w w w"}'}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    log.write_text(_chat_line(0, [SYSTEM_MESSAGE, {"role": "user", "content": "a b c"}, assistant], 100))
    build_trace([log], tmp_path / "t.jsonl", workers=1, counter=WordCounter())
    # the tool call's name and arguments count too: 13 more words, 52 tokens, 3 full blocks
    assert len(read_trace(tmp_path / "t.jsonl")[0].hash_ids) == 3


# --- a mapped JSONL log with a conversation column ------------------------------------------------------


def test_a_conversation_column_gives_sessions_turns_and_chains(tmp_path: Path) -> None:
    from oomload.ingest.mapping import parse_mapping

    log = tmp_path / "mapped.jsonl"
    rows = [("a", 40, 10), ("b", 100, 5), ("a", 70, 10), ("a", 110, 3)]  # conversation, prompt, output
    log.write_text(
        "".join(f'{{"t": {i}, "conv": "{c}", "in": {p}, "out": {o}}}\n' for i, (c, p, o) in enumerate(rows))
    )
    mapping = parse_mapping("input=in,output=out,time=t,conversation=conv")
    result = build_trace([log], tmp_path / "t.jsonl", mapping=mapping, workers=1, keep_ids=True)
    assert result.prefix is not None and (result.prefix.source, result.prefix.exact) == ("column", False)
    recs = read_trace(tmp_path / "t.jsonl")
    assert [(r.session, r.turn) for r in recs] == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]
    build_trace([log], tmp_path / "p.jsonl", mapping=mapping, workers=1)  # sessions as pseudonyms
    named = read_trace(tmp_path / "p.jsonl")
    a, b = named[0].session, named[1].session
    assert [(r.session, r.turn) for r in named] == [(a, 0), (b, 0), (a, 1), (a, 2)]
    assert a != b and a is not None and b is not None and {a, b}.isdisjoint({"a", "b"}) and len(a) == 16
    assert [len(r.hash_ids) for r in recs] == [2, 6, 4, 6]
    a0, b0, a1, a2 = (r.hash_ids for r in recs)
    assert a1[:2] == a0 and a2[:4] == a1 and not set(b0) & set(a2)
    reuse = expected_hit_tokens(recs, result.prefix)
    assert reuse.hit_tokens == (0, 0, 32, 64)


def test_a_conversation_column_in_a_csv_is_refused_in_one_sentence(tmp_path: Path) -> None:
    from oomload.errors import ConfigError
    from oomload.ingest.mapping import parse_mapping

    log = tmp_path / "m.csv"
    log.write_text("in,out,conv\n10,2,a\n")
    with pytest.raises(ConfigError, match="conversation=COL is supported for JSONL logs only"):
        build_trace(
            [log], tmp_path / "t.jsonl", mapping=parse_mapping("input=in,output=out,conversation=conv")
        )


@pytest.mark.parametrize("strict", [False, True])
def test_vllm_prompts_are_counted_a_batch_at_a_time_and_their_bound_kept_in_line_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strict: bool
) -> None:
    """Ids are counted with their batch (many batches here), not line by line; a prompt over the token
    bound is still skipped with its line, in order, and under --strict the first one stops the build."""
    from oomload.errors import TraceFormatError
    from oomload.ingest import vllm_log
    from oomload.ingest.skips import SkipLog
    from oomload.ingest.source import LogSource

    monkeypatch.setattr(vllm_log, "BATCH_ROWS", 3)
    from oomload.trace import model as trace

    for module in (vllm_log, trace):  # the bound, scaled down to these prompts
        monkeypatch.setattr(module, "MAX_TOKENS", 20)
    sizes = [5, 21, 0, 7, 30, 20, 1, 25, 16, 2]
    log = tmp_path / "vllm.log"
    log.write_text("".join(_vllm_line(i, f"r{i}", list(range(100, 100 + n))) for i, n in enumerate(sizes)))
    skips = SkipLog(strict=strict)
    batches = vllm_log.read_vllm_batches(LogSource(log), skips, None)
    if strict:
        with pytest.raises(TraceFormatError, match="prompt_tokens over the limit") as error:
            list(batches)
        assert error.value.line == 4  # request 1's Received line: its Request line is 3
        return
    tables = list(batches)
    assert [t.num_rows for t in tables] == [2, 2, 2, 1]  # batches of 3, the over-bound ones dropped
    kept = [n for t in tables for n in t.column("prompt_tokens").to_pylist()]
    assert kept == [n for n in sizes if n <= 20]
    assert list(skips.counts.values()) == [3]
    assert next(iter(skips.examples.values())) == [f"{log}:{2 * i + 2}" for i in (1, 4, 7)]
