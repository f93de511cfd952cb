"""CSV logs read in byte ranges by a pool give the same trace and stats, byte for byte, as one process.

Small CSVs are cut into spans of a few hundred bytes (``parallel_min_bytes=0``) so that every
boundary case is met: bad cells and rows with the wrong number of columns in many spans (their line
numbers), blank lines, CRLF, no final newline, ``--strict``. A CSV whose quoted value may hold a
newline (a line with an odd number of ``"``) is read in one process from the span where that is
seen, with a note that is not part of the trace. Both builds run in a fresh interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spreadrun import SPY, run_both

RUNNER = (
    SPY
    + r"""
import json, sys
from oomload.ingest import build_trace, count_trace, parse_mapping
spec = json.loads(sys.argv[1])
mapping = None if spec["map"] is None else parse_mapping(spec["map"])
results = []
for workers in (1, 2):
    del spans[:]
    kinds.clear()
    out = f"{spec['out']}.{workers}"
    sizes = {"parallel_min_bytes": 0, "span_bytes": 300}
    try:
        r = build_trace(
            spec["inputs"], out, workers=workers, strict=spec["strict"], mapping=mapping,
            keep_ids=spec["keep_ids"], **sizes,
        )
        c = count_trace(spec["inputs"], workers=workers, mapping=mapping, **sizes)
    except Exception as err:
        results.append({"error": f"{type(err).__name__}: {err}"})
        continue
    results.append({
        "bytes": open(out, encoding="utf-8").read(), "count": r.records_written,
        "counts": r.skips.counts, "examples": r.skips.examples, "notes": r.skips.notes,
        "stats": [repr(c.arrivals), c.prompt_tokens.distinct()[1].tolist(), c.failed, c.skips.counts],
        "read_notes": [list(r.read_notes), list(c.read_notes)], "spread": len(spans), "kinds": dict(kinds),
    })
print(json.dumps(results))
"""
)


def _build_both(
    inputs: list[Path],
    tmp_path: Path,
    *,
    strict: bool = False,
    mapping: str | None = None,
    keep_ids: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = {
        "keep_ids": keep_ids,
        "inputs": [str(p) for p in inputs],
        "out": str(tmp_path / "t.jsonl"),
        "strict": strict,
        "map": mapping,
    }
    return run_both(RUNNER, json.dumps(spec))


def _same(single: dict[str, Any], spread: dict[str, Any]) -> bool:
    keys = ("bytes", "count", "counts", "examples", "notes", "stats")
    return "error" not in single and all(single[k] == spread[k] for k in keys)


def _azure(path: Path, count: int) -> Path:
    rows = []
    for i in range(count):
        stamp = f"2023-11-16 18:{i // 60 % 60:02d}:{i % 60:02d}.{i * 7919 % 10**7:07d}"
        if i % 17 == 5:
            rows.append(f"{stamp},{i}")  # too few columns
        elif i % 23 == 7:
            rows.append(f"{stamp},x{i},3")
        elif i % 29 == 11:
            rows.append(f"not a time,{i},3")
        elif i % 31 == 13:
            rows.append("")  # a blank line
        else:
            rows.append(f"{stamp},{100 + i},{1 + i % 40}")
    path.write_bytes(("TIMESTAMP,ContextTokens,GeneratedTokens\r\n" + "\r\n".join(rows)).encode())
    return path


def test_spans_of_an_azure_csv_build_the_same_bytes(tmp_path: Path) -> None:
    single, spread = _build_both([_azure(tmp_path / "az.csv", 500)], tmp_path)
    assert _same(single, spread), (single, spread)
    assert spread["spread"] == 2 and single["spread"] == 0  # build and stats, in byte ranges
    assert spread["kinds"]["LinesToRender"] > 5  # workers rendered the lines, numbered in order
    assert spread["read_notes"] == [[], []]
    assert set(single["counts"]) == {
        "wrong number of columns (expected 3)",
        "not a non-negative integer in column 'ContextTokens'",
        "not a timestamp in column 'TIMESTAMP'",
    }


def test_spans_of_a_burstgpt_csv_keep_failed_requests(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    rows = [f"{i * 3},ChatGPT,{10 + i},{i % 4},{10 + i + i % 4},Conversation log" for i in range(300)]
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "\n".join(rows) + "\n"
    )
    single, spread = _build_both([path], tmp_path)
    assert _same(single, spread) and spread["spread"] == 2
    assert single["stats"][2] == 75  # 0 response tokens: failed


def test_quoted_values_without_newlines_are_read_in_spans(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    rows = [f'{i},{5 + i},{i % 9},"id {i}, ""q"""' for i in range(300)]
    path.write_text("t,inp,out,rid\n" + "\n".join(rows) + "\n")
    mapping = "input=inp,output=out,time=t,id=rid"
    single, spread = _build_both([path], tmp_path, mapping=mapping, keep_ids=True)
    assert _same(single, spread) and spread["spread"] == 2
    assert spread["read_notes"] == [[], []]
    assert '"id":"id 7, \\"q\\""' in single["bytes"]


def test_a_quoted_newline_falls_back_to_one_process_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    rows = [f"{i},{5 + i},{i % 9},r{i}" for i in range(300)]
    rows[200] = '200,1,1,"two\nlines, 201,1,1,r201"'  # a span may start inside this value
    path.write_text("t,inp,out,rid\n" + "\n".join(rows) + "\n")
    mapping = "input=inp,output=out,time=t,id=rid"
    single, spread = _build_both([path], tmp_path, mapping=mapping, keep_ids=True)
    assert _same(single, spread), (single, spread)
    assert '"id":"two\\nlines, 201,1,1,r201"' in single["bytes"]
    named, named_spread = _build_both([path], tmp_path, mapping=mapping)  # pseudonyms: the same on 2 workers
    assert _same(named, named_spread) and "two" not in named["bytes"] and '"id":"r1' not in named["bytes"]
    assert single["read_notes"] == [[], []]
    build_note, stats_note = spread["read_notes"]
    assert (
        len(build_note) == 1 and "a quoted value may span lines" in build_note[0] and build_note == stats_note
    )


def test_strict_stops_at_the_first_bad_line_of_the_csv(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    rows = [f"2023-11-16 18:15:{i % 60:02d}.0,{i},1" for i in range(300)]
    rows[150] = "2023-11-16 18:15:00.0,7"  # line 152: too few columns
    rows[151] = "2023-11-16 18:15:00.0,x,1"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    single, spread = _build_both([path], tmp_path, strict=True)
    assert spread == single
    assert single["error"] == (
        f"TraceFormatError: {path}:152: wrong number of columns (expected 3) (stopped by --strict)"
    )
