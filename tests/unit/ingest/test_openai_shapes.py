"""Every OpenAI-style log shape the docs list reads, on the fast paths, exactly as line by line.

The lines come from ``bench/logshapes.py`` (the bench's generator, written without the fast path in
mind: shuffled keys, escapes, raw UTF-8, extra fields, lines without usage and failed requests):
gateway chat, chat nested under ``request``/``response`` with an ISO ``created_at``, completions
with a float ``timestamp``, OpenAI Batch output, the Responses API, flat request bodies and a
LiteLLM spend log (``messages`` at the top, the response nested, float ``startTime``). For each
shape the column reader must give the rows and skips of ``parse_openai_line``, its prompt parts
(hence ``hash_ids``) must be those the exact path reads, and a build on 2 workers in byte ranges
must write the trace of one process. ISO stamps parsed once per second must give the same float as
the full parse. An API gateway's access log (bodies as escaped JSON strings) is read on both paths, its
request body decoded once with chains.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from spreadrun import run_both

from oomload.ingest import LogSource, SkipLog, openai_fast, openai_parts
from oomload.ingest.columns import batches_from_records
from oomload.ingest.openai_fast import read_openai_batches
from oomload.ingest.openai_log import read_openai_records
from oomload.ingest.tabular import _parse_datetime_s, parse_datetime_s
from oomload.trace.prefix import BlockHasher

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: bench/
logshapes: Any = importlib.import_module("bench.logshapes")
SHAPES = sorted(set(logshapes.SHAPES) - logshapes.UNREAD)


def _log(path: Path, shape: str, count: int) -> Path:
    path.write_text("\n".join(logshapes.lines(shape, count, seed=1)) + "\n", encoding="utf-8")
    return path


def _table(batches: list[pa.Table]) -> list[dict[str, Any]]:
    return pa.concat_tables([b.replace_schema_metadata(None) for b in batches]).to_pylist()


@pytest.mark.parametrize("piece_bytes", [300, 256 * 1024])
@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_reads_as_the_line_parser_reads_it(
    shape: str, piece_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_fast, "PIECE_BYTES", piece_bytes)
    source = LogSource(_log(tmp_path / "log.jsonl", shape, 400))
    fast_skips, exact_skips = SkipLog(), SkipLog()
    fast = _table(list(read_openai_batches(source, fast_skips, None)))
    exact = _table(list(batches_from_records(read_openai_records(source, exact_skips, None))))
    assert fast == exact
    assert len(fast) > 380  # a few lines lack usage or failed without counts: skipped by both
    assert (fast_skips.counts, fast_skips.examples, fast_skips.notes) == (
        exact_skips.counts,
        exact_skips.examples,
        exact_skips.notes,
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_no_shape_goes_line_by_line(shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every piece is decoded at once (``Plain`` or ``Line``), its odd lines (no usage, a failure)
    included: the slow per-line loop is for pieces holding a line no schema takes (bad JSON, …)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a piece of {shape} lines went line by line")

    monkeypatch.setattr(openai_fast, "_line_rows", refuse)
    source = LogSource(_log(tmp_path / "log.jsonl", shape, 300))
    assert (
        sum(b.num_rows for b in read_openai_batches(source, SkipLog(), None, hasher=BlockHasher(b"s" * 32)))
        > 280
    )


def _all_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every line through ``parse_openai_line``, its parts through ``_prompt_parts``: the reference."""
    monkeypatch.setattr(openai_fast, "_plain_piece", lambda *args: None)
    monkeypatch.setattr(openai_fast, "_fast_row", lambda line: None)


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_chains_the_prompt_parts_the_exact_path_reads(
    shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = LogSource(_log(tmp_path / "log.jsonl", shape, 300))
    hasher = BlockHasher(b"s" * 32, 4)
    fast = _table(list(read_openai_batches(source, SkipLog(), None, hasher=hasher)))
    _all_exact(monkeypatch)
    exact = _table(list(read_openai_batches(source, SkipLog(), None, hasher=hasher)))
    assert fast == exact
    chained = sum(1 for row in fast if row["hash_ids"])
    # Batch output holds no request; a Responses API request's ``input`` is its prompt parts
    assert chained == (0 if shape == "batch" else len(fast))


request_parts = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(st.fixed_dictionaries({"content": st.text('ab"é', max_size=40)}), max_size=3)
        | st.just("text"),
        "system": st.text("xy", max_size=30),
        "prompt": st.just([1, 2, 3]) | st.text("q", max_size=30),
        "instructions": st.text("in", max_size=30),
        "input": st.lists(st.fixed_dictionaries({"content": st.text("ié", max_size=30)}), max_size=3)
        | st.text("t", max_size=30),
        "model": st.just("m"),
    },
)
parts_line = st.fixed_dictionaries(
    {"usage": st.fixed_dictionaries({"prompt_tokens": st.integers(0, 40), "completion_tokens": st.just(2)})},
    optional={
        "request": request_parts | st.none() | st.fixed_dictionaries({"body": request_parts}),
        "messages": st.just([{"content": "top level " * 3}]),
        "system": st.just("sys " * 5),
        "timestamp": st.just(1.7e9),
        "error": st.none() | st.just({"message": "x"}),
    },
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(parts_line.map(json.dumps), min_size=1, max_size=12))
def test_prompt_parts_of_any_request_shape_match_the_exact_path(lines: list[str]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openai_fast, "PIECE_BYTES", 64)
        path = Path(_scratch_dir()) / "log.jsonl"
        path.write_text("\n".join(lines) + "\n")
        hasher = BlockHasher(b"s" * 32, 2)
        fast = _table(list(read_openai_batches(LogSource(path), SkipLog(), None, hasher=hasher)))
        _all_exact(patch)
        exact = _table(list(read_openai_batches(LogSource(path), SkipLog(), None, hasher=hasher)))
    assert fast == exact


@given(body=request_parts)
def test_the_usual_requests_parts_are_every_part_in_order(body: dict[str, Any]) -> None:
    """``parts_of``'s short cuts (a chat, a completions, a Responses API request) give what the
    general walk gives: every part present, in a chat template's order."""
    assume(not isinstance(body.get("messages"), str))  # not a request object: no parts (the readers' skip)
    decoded = openai_parts.PARTS_BODY_DECODER.decode(json.dumps(body))
    assert list(map(bytes, openai_parts.parts_of(decoded))) == list(
        map(bytes, openai_parts._every_part(decoded))
    )


def _scratch_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="oomload-shapes-")


stamp = st.from_regex(
    r"\A20[0-9]{2}-(0[1-9]|1[0-2])-([0-2][0-9]|3[01])[T ]([01][0-9]|2[0-4]):[0-5][0-9]:[0-6][0-9]"
    r"(\.[0-9]{0,11})?(Z|[+-](0[0-9]|1[0-4]):[0-5][0-9]|[+-][0-9]{4})?\Z"
)


@given(text=stamp | st.text(" 0123456789-:.TZ+", max_size=35))
def test_stamps_parsed_once_per_second_are_the_full_parse_to_the_bit(text: str) -> None:
    assert parse_datetime_s(text) == _parse_datetime_s(text)


RUNNER = r"""
import json, sys
from oomload.ingest import build_trace
inputs, out = json.loads(sys.argv[1]), sys.argv[2]
results = []
for workers in (1, 2):
    r = build_trace(inputs, f"{out}.{workers}", workers=workers, parallel_min_bytes=0, span_bytes=16000)
    results.append({"bytes": open(f"{out}.{workers}", encoding="utf-8").read(), "count": r.records_written,
                    "counts": r.skips.counts, "examples": r.skips.examples, "notes": r.skips.notes})
print(json.dumps(results))
"""


def test_every_shape_builds_the_same_bytes_in_byte_ranges_on_2_workers(tmp_path: Path) -> None:
    """One log of every shape, line by line in turn, cut into ~15 byte ranges."""
    shapes = [list(logshapes.lines(shape, 25, seed=2)) for shape in SHAPES]
    log = tmp_path / "mixed.jsonl"
    log.write_text("\n".join(line for turn in zip(*shapes, strict=True) for line in turn) + "\n")
    single, spread = run_both(RUNNER, json.dumps([str(log)]), str(tmp_path / "trace.jsonl"))
    assert spread == single
    assert single["count"] > 6 * 22 and '"hash_ids":[' in single["bytes"]


def test_an_access_log_reads_its_bodies_from_their_strings(tmp_path: Path) -> None:
    """``access-log``: the token counts, id, model and status are inside JSON strings; both paths read
    them, and a failed request's status comes from ``response.status``."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3}
    ok = {"id": "chatcmpl-1", "model": "m", "usage": usage}
    request = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    lines = [
        {"started_at": 1_700_000_000_500, "request": {"body": json.dumps(request)},
         "response": {"status": 200, "body": json.dumps(ok)}},
        {"@timestamp": "2023-11-14T22:13:21.000Z", "request": {"body": json.dumps(request)},
         "response": {"status": 500, "body": json.dumps({"error": {"message": "x"}, "usage": usage})}},
    ]  # fmt: skip
    log = tmp_path / "access.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    source = LogSource(log)
    fast = _table(list(read_openai_batches(source, SkipLog(), None)))
    exact = _table(list(batches_from_records(read_openai_records(source, SkipLog(), None))))
    assert fast == exact
    assert [
        (r["id"], r["time_s"], r["prompt_tokens"], r["output_tokens"], r["max_tokens"], r["ok"]) for r in fast
    ] == [
        ("chatcmpl-1", 1_700_000_000.5, 7, 3, 64, True),
        (None, 1_700_000_001.0, 7, 3, 64, False),  # failed, its usage kept as the exact path keeps it
    ]


def test_an_access_logs_request_body_is_decoded_once_with_its_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With chains, the fast path decodes a string request body once, with its prompt parts, for the row
    and the parts alike: the parts decoder of the exact path is never called, and the chains are those
    it would give."""
    source = LogSource(_log(tmp_path / "log.jsonl", "access-log", 200))
    hasher = BlockHasher(b"s" * 32, 4)
    expected = _table(list(read_openai_batches(source, SkipLog(), None, hasher=hasher)))

    class Refuse:
        def decode(self, *args: Any) -> Any:
            raise AssertionError("the request body was decoded a second time for its parts")

    monkeypatch.setattr(openai_parts, "PARTS_BODY_DECODER", Refuse())
    fast = _table(list(read_openai_batches(source, SkipLog(), None, hasher=hasher)))
    assert fast == expected
    assert len(fast) == 200 and all(row["hash_ids"] for row in fast)


def test_a_litellm_spend_log_is_timed_by_its_start_time_on_both_paths(tmp_path: Path) -> None:
    """LiteLLM's ``startTime`` is when the request arrived; the response's ``created`` (here 100 s
    later) is only the fallback. The fast path and ``parse_openai_line`` agree."""
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    line = {"startTime": 1_700_000_000.25, "response": {"created": 1_700_000_100, "usage": usage}}
    log = tmp_path / "litellm.jsonl"
    log.write_text(json.dumps(line) + "\n")
    source = LogSource(log)
    fast = _table(list(read_openai_batches(source, SkipLog(), None)))
    exact = _table(list(batches_from_records(read_openai_records(source, SkipLog(), None))))
    assert [r["time_s"] for r in fast] == [r["time_s"] for r in exact] == [1_700_000_000.25]
