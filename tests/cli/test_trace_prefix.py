"""``oomload trace build`` / ``trace stats``: the prefix structure a trace carries and the reuse it shows."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from clirun import run


def _vllm_log(path: Path, prompts: list[list[int]]) -> Path:
    lines = []
    for i, ids in enumerate(prompts):
        head = f"(APIServer pid=7) {{}} 12-01 06:33:{i:02d} [request_logger.py:55] "
        lines.append(
            head.format("DEBUG") + f"Request c{i} details: prompt: None, prompt_token_ids: {ids}, "
            "prompt_embeds shape: None.\n"
        )
        lines.append(
            head.format("INFO") + f"Received request c{i}: params: SamplingParams(n=1, max_tokens=10), "
            "lora_request: None.\n"
        )
    path.write_text("".join(lines))
    return path


@pytest.fixture
def shared_log(tmp_path: Path) -> Path:
    """10 prompts: one 200-token system prompt (12 full blocks of 16 = 192 tokens) + 100 own tokens."""
    rng = random.Random(3)
    system = [rng.randrange(16, 2000) for _ in range(200)]
    return _vllm_log(
        tmp_path / "vllm.log", [system + [rng.randrange(16, 2000) for _ in range(100)] for _ in range(10)]
    )


def stats(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str]:
    code, stdout, _ = run(["trace", "stats", *argv, "--json"], capsys)
    assert code == 0
    doc = json.loads(stdout)["prefix"]
    code, table, _ = run(["trace", "stats", *argv], capsys)
    assert code == 0
    return doc, " ".join(table.split())


def test_stats_of_a_trace_show_the_share_of_prompt_tokens_seen_earlier(
    shared_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["trace", "build", str(shared_log), "-o", str(tmp_path / "t.jsonl")], capsys)
    assert code == 0 and "prefix: chained ids of 16-token blocks from the prompt token ids (exact)" in out
    doc, text = stats([str(tmp_path / "t.jsonl")], capsys)
    # 9 requests after the first find the 12 shared blocks: 9 × 192 of 10 × 300 prompt tokens
    assert (doc["seen_hit_tokens"], doc["prompt_tokens"], doc["source"]) == (9 * 192, 3000, "token-ids")
    assert doc["largest_shared_prefixes"] == [
        {
            "block_id": doc["largest_shared_prefixes"][0]["block_id"],
            "tokens": 192,
            "uses": 10,
            "tokens_error": 0,
        }
    ]
    assert "prompt tokens in blocks seen earlier (infinite cache, upper bound): 57.6%" in text
    assert "192 tokens × 10 uses" in text and "give --kv-cache-tokens or --kv-blocks" in text
    # a pool of 40 blocks holds the 12 shared blocks between two requests (each holds 20 blocks)
    pool, text = stats([str(tmp_path / "t.jsonl"), "--kv-blocks", "40"], capsys)
    assert pool["pool_hit_tokens"] == 9 * 192 and "still held by a pool of 40 blocks" in text
    # 8 blocks: a finished request's blocks are freed prefix-last, so the first 8 shared ones stay
    small, _ = stats([str(tmp_path / "t.jsonl"), "--kv-blocks", "8"], capsys)
    assert small["pool_hit_tokens"] == 9 * 128
    # the server's blocks of 64 tokens: 3 full shared blocks (192 tokens) per request
    big, _ = stats([str(tmp_path / "t.jsonl"), "--block-size", "64"], capsys)
    assert big["block_tokens"] == 64 and big["seen_hit_tokens"] == 9 * 192
    # the logs read directly give the same numbers
    direct, _ = stats([str(shared_log)], capsys)
    assert direct["seen_hit_tokens"] == 9 * 192


def test_stats_of_a_log_without_prefix_structure_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.6805900,374,44\n"
    )
    doc, text = stats([str(azure)], capsys)
    assert doc["source"] == "none" and "Prefix structure: no prefix structure in this log" in text
    assert "seen earlier" not in text  # no silent zero
    code, _, _ = run(["trace", "build", str(azure), "-o", str(tmp_path / "t.jsonl")], capsys)
    assert code == 0
    doc, text = stats([str(tmp_path / "t.jsonl")], capsys)
    assert doc["source"] == "none" and "no prefix structure in this log" in text


def test_stats_count_the_turns_of_conversations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bailian = tmp_path / "b.jsonl"
    rows = [(1, -1, 1, [1, 2]), (1, 1, 2, [1, 2, 3]), (2, -1, 1, [9]), (1, 1, 3, [1, 2, 3, 4])]
    bailian.write_text(
        "".join(
            json.dumps(
                {
                    "chat_id": c,
                    "parent_chat_id": p,
                    "timestamp": i * 1000,
                    "input_length": 16 * len(ids) + 5,
                    "output_length": 3,
                    "hash_ids": ids,
                    "turn": t,
                    "type": "text",
                }
            )
            + "\n"
            for i, (c, p, t, ids) in enumerate(rows)
        )
    )
    doc, text = stats([str(bailian)], capsys)
    assert doc["conversations"] == {
        "count": 2,
        "requests": 4,
        "mean_turns": 2.0,
        "max_turns": 3,
        "turns_histogram": {"1": 1, "3": 1},
        "inferred_from_chains": False,
        "count_error": 0,
    }
    assert doc["trace_block_tokens"] == 16 and doc["seen_hit_tokens"] == 32 + 48
    assert "conversations: 2, turns mean 2.0, max 3" in text


def test_the_plot_has_a_prefix_panel(
    shared_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(["trace", "stats", str(shared_log), "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 0
    png = (tmp_path / "p.png").read_bytes()
    height_px = int.from_bytes(png[20:24], "big")  # the IHDR chunk: 4 panels of 3 in at 110 dpi
    assert png[12:16] == b"IHDR" and height_px == 4 * 3 * 110


def test_bad_prefix_flags_are_one_sentence(
    shared_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["trace", "stats", str(shared_log), "--kv-blocks", "0"], capsys)
    assert code == 2 and "--kv-blocks must be a positive number of blocks" in err and err.count("\n") == 1
    for value in ("-3", str(2**64)):  # 2**64 overflowed an int64 while the ids were made: exit 70
        argv = ["trace", "build", str(shared_log), "-o", str(tmp_path / "t.jsonl")]
        code, _, err = run([*argv, "--prefix-block-tokens", value], capsys)
        assert code == 2 and "--prefix-block-tokens must be in 0..10,000,000" in err and err.count("\n") == 1


def test_a_server_block_size_is_noted_only_where_the_trace_has_blocks(
    shared_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace without ``hash_ids`` read "prefix reuse counted in the trace's 512-token blocks" for a
    ``--block-size`` of 17: a block size the user sees nowhere (the trace format's default), beside "no
    prefix structure in this log"."""
    sample = Path(__file__).parents[2] / "traces" / "sample-chat.jsonl"
    code, table, err = run(["trace", "stats", str(sample), "--block-size", "17"], capsys)
    assert code == 0 and "no prefix structure" in " ".join(table.split())
    assert "blocks" not in err, err
    code, _, err = run(["trace", "stats", str(shared_log), "--block-size", "17"], capsys)
    assert code == 0
    assert "counted in the trace's 16-token blocks: the server block of 17 tokens is not a multiple" in err
