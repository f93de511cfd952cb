"""The real public traces in ../shared/traces: counts, and statistics equal to numpy's nearest rank."""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from oomload.ingest import build_trace, load_columns
from oomload.trace.model import read_trace, read_trace_header
from oomload.trace.stats import summarize_trace


def _azure_reference(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    times = np.array([datetime.fromisoformat(r["TIMESTAMP"]).timestamp() for r in rows])
    return (
        times - times[0],
        np.array([int(r["ContextTokens"]) for r in rows]),
        np.array([int(r["GeneratedTokens"]) for r in rows]),
    )


def _mooncake_reference(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    times = np.array([r["timestamp"] / 1000 for r in rows])
    return (
        times - times[0],
        np.array([r["input_length"] for r in rows]),
        np.array([r["output_length"] for r in rows]),
    )


CASES = [
    ("azure_code_2023.csv", 8819, _azure_reference, "azure"),
    ("mooncake_conversation_first10min.jsonl", 1750, _mooncake_reference, "mooncake"),
]


@pytest.mark.parametrize(("name", "rows", "reference", "fmt"), CASES)
def test_real_trace_builds_and_matches_numpy(
    shared_dir: Path, tmp_path: Path, name: str, rows: int, reference: object, fmt: str
) -> None:
    path = shared_dir / "traces" / name
    out = tmp_path / "trace.jsonl"
    result = build_trace([path], out)
    assert result.records_written == rows and result.skips.total == 0 and result.formats == (fmt,)
    arrival, prompt, output = reference(path)  # type: ignore[operator]
    records = read_trace(out)
    assert [r.prompt_tokens for r in records] == prompt.tolist()
    assert [r.output_tokens for r in records] == output.tolist()
    assert np.allclose([r.arrival_s for r in records], arrival, atol=1e-6)

    columns = load_columns([out])
    stats = summarize_trace(columns.arrival_s, columns.prompt_tokens, columns.output_tokens, columns.ok)
    for summary, values in ((stats.prompt, prompt), (stats.output, output), (stats.total, prompt + output)):
        expected = np.percentile(values, [50, 90, 95, 99, 99.9], method="inverted_cdf")
        assert [summary.p50, summary.p90, summary.p95, summary.p99, summary.p999] == expected.tolist()
        assert summary.max == values.max() and summary.mean == pytest.approx(values.mean())
    assert stats.arrivals.count == rows
    assert stats.arrivals.span_s == pytest.approx(arrival[-1], abs=1e-6)


def test_published_reference_figures(shared_dir: Path) -> None:
    """The nearest-rank values the traces' README lists (in brackets where they differ from linear)."""
    azure = load_columns([shared_dir / "traces" / "azure_code_2023.csv"])
    stats = summarize_trace(azure.arrival_s, azure.prompt_tokens, azure.output_tokens)
    assert (stats.prompt.p50, stats.prompt.p90, stats.prompt.p99, stats.prompt.max) == (
        1469,
        5194,
        7436,
        7437,
    )
    assert (stats.output.p99, stats.total.p90, stats.total.p99, stats.total.max) == (252, 5223, 7462, 7841)
    mooncake = load_columns([shared_dir / "traces" / "mooncake_conversation_first10min.jsonl"])
    stats = summarize_trace(mooncake.arrival_s, mooncake.prompt_tokens, mooncake.output_tokens)
    assert (stats.prompt.p50, stats.prompt.p90, stats.prompt.p99) == (8036, 30183, 99934)
    assert (stats.total.p50, stats.total.p99, stats.total.max) == (8417, 100333, 123783)
    assert stats.arrivals.span_s == 597.0


def test_merging_the_two_real_traces_keeps_every_request(shared_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "both.jsonl"
    traces = shared_dir / "traces"
    result = build_trace(
        [traces / "mooncake_conversation_first10min.jsonl", traces / "azure_code_2023.csv"], out
    )
    assert result.records_written == 8819 + 1750
    arrivals = [r.arrival_s for r in read_trace(out)]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert arrivals[-1] == pytest.approx(3435.95, abs=0.01)  # Azure's own span, not 2023 − 1970
    assert read_trace_header(out).extra["aligned"] == "each input rebased to its own start"


@pytest.mark.parametrize(("name", "rows", "reference", "fmt"), CASES)
def test_built_trace_equals_the_record_path(
    shared_dir: Path, tmp_path: Path, name: str, rows: int, reference: object, fmt: str
) -> None:
    """The vectorized writer's lines read back as the records ``TraceRecord.to_json`` would write."""
    from dataclasses import replace

    from oomload.ingest import iter_records

    out = tmp_path / "out.jsonl"
    build_trace([shared_dir / "traces" / name], out)
    expected = [
        replace(r, id=f"r{i}", arrival_s=round(r.arrival_s, 6))
        for i, r in enumerate(iter_records([shared_dir / "traces" / name]))
    ]
    assert read_trace(out) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no scratch file left
