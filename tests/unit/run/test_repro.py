"""The repro traces keep the shared prefixes the run sent, so replaying one reproduces the same KV."""

from __future__ import annotations

import json
from pathlib import Path

from oomload.outcome import Outcome, RequestResult
from oomload.run.repro import write_repro
from oomload.trace.model import (
    PrefixInfo,
    TraceHeader,
    TraceRecord,
    read_trace,
    read_trace_header,
    write_trace,
)


def test_a_repro_keeps_the_runs_prefix_ids_and_block_size(tmp_path: Path) -> None:
    """Regression: the repro traces dropped hash_ids, so a production-shape run's repro replayed the
    worst case (distinct prompts) instead of what was in flight."""
    records = [TraceRecord(f"r{i}", 0.0, 600, 100, hash_ids=(1, 2, 10 + i)) for i in range(3)]
    write_trace(tmp_path / "trace.jsonl", records, TraceHeader(prefix=PrefixInfo(block_tokens=256)))
    rows = [
        RequestResult(f"r{i}#{7 + i}", 0, 3, 100.0 + i, 110.0, Outcome.OK, 600, 100).to_json()
        for i in range(3)
    ]
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "events.jsonl").write_text(json.dumps({"kind": "first_preemption", "t_unix_s": 105.0}) + "\n")
    [path] = write_repro(tmp_path)
    repro = read_trace(path)
    assert [r.hash_ids for r in repro] == [(1, 2, 10), (1, 2, 11), (1, 2, 12)]
    prefix = read_trace_header(path).prefix
    assert prefix is not None and prefix.block_tokens == 256
