"""The parallel build writes the same trace, byte for byte, as the single-process build.

Small logs are cut into many byte spans (``parallel_min_bytes=0``, spans of a few hundred bytes)
so every boundary case is met: bad lines and requests without a time at span starts, skips in
several spans (their line numbers), several inputs read whole by workers and merged by time.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from oomload.errors import TraceFormatError
from oomload.ingest import build_trace, count_trace
from oomload.ingest.build import merge_batches
from oomload.ingest.columns import make_batch
from oomload.ingest.parallel import plan_spans


def _openai_log(
    path: Path, count: int, *, start_s: float = 1_717_000_000.0, bad_every: int = 7, ids_every: int = 5
) -> Path:
    lines = []
    for i in range(count):
        if i % bad_every == 3:
            lines.append("{not json")
            continue
        line: dict[str, object] = {
            "request": {"model": "m", "max_tokens": 64, "messages": [{"content": "x" * (i % 50)}]},
            "response": {
                "id": f"c-{i}" if i % ids_every else None,
                "usage": {"prompt_tokens": i, "completion_tokens": 2},
            },
        }
        if i % 11 != 0:  # some requests have no time: they take the one before them
            line["timestamp"] = start_s + i * 0.5
        if i % 13 == 0:
            line["error"] = {"message": "overloaded"}
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


def _mooncake_log(path: Path, count: int) -> Path:
    lines = [
        json.dumps({"timestamp": i * 10, "input_length": 100 + i, "output_length": 5, "hash_ids": [i, i + 1]})
        if i % 9 != 4
        else '{"timestamp": 5, "input_length": -1, "output_length": 1}'
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _build_both(inputs: list[Path], tmp_path: Path, **options: object) -> tuple[bytes, bytes, object, object]:
    single = build_trace(inputs, tmp_path / "single.jsonl", workers=1, **options)  # type: ignore[arg-type]
    parallel = build_trace(
        inputs,
        tmp_path / "parallel.jsonl",
        workers=2,
        parallel_min_bytes=0,
        span_bytes=700,
        **options,  # type: ignore[arg-type]
    )
    return (
        (tmp_path / "single.jsonl").read_bytes(),
        (tmp_path / "parallel.jsonl").read_bytes(),
        single,
        parallel,
    )


def _same_result(single: object, parallel: object) -> None:
    for name in ("records_written", "formats", "reordered"):
        assert getattr(single, name) == getattr(parallel, name)
    s, p = single.skips, parallel.skips  # type: ignore[attr-defined]
    assert (s.counts, s.examples, s.notes) == (p.counts, p.examples, p.notes)


def test_spans_of_an_openai_log_build_the_same_bytes(tmp_path: Path) -> None:
    log = _openai_log(tmp_path / "gw.jsonl", 300)
    assert len(plan_spans(log, log.stat().st_size, 700)) > 20
    single_bytes, parallel_bytes, single, parallel = _build_both([log], tmp_path)
    assert parallel_bytes == single_bytes
    _same_result(single, parallel)
    assert single.skips.counts == {"not a JSON object": 43}  # type: ignore[attr-defined]
    assert any("no timestamp" in note for note in single.skips.notes)  # type: ignore[attr-defined]


def test_lines_rendered_by_workers_are_the_same_bytes(tmp_path: Path) -> None:
    """Every id present: workers render most batches themselves, with the origin of the first span."""
    log = _openai_log(tmp_path / "gw.jsonl", 400, ids_every=10**9, start_s=1_717_000_000.123456)
    single_bytes, parallel_bytes, single, parallel = _build_both([log], tmp_path)
    assert parallel_bytes == single_bytes
    _same_result(single, parallel)


def test_spans_of_a_mooncake_log_build_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mooncake logs are not spread by default (slower on few cores), but the spans read them right."""
    from oomload.ingest import parallel

    monkeypatch.setattr(parallel, "SPAN_FORMATS", ("openai", "mooncake"))
    log = _mooncake_log(tmp_path / "mc.jsonl", 400)
    single_bytes, parallel_bytes, single, parallel = _build_both([log], tmp_path)
    assert parallel_bytes == single_bytes
    _same_result(single, parallel)


def test_several_inputs_read_by_workers_build_the_same_bytes(tmp_path: Path) -> None:
    first = _openai_log(tmp_path / "a.jsonl", 120)
    second = tmp_path / "b.jsonl.gz"  # overlapping in time: merged, not appended
    second.write_bytes(
        gzip.compress(_openai_log(tmp_path / "b.jsonl", 90, start_s=1_717_000_020.0).read_bytes())
    )
    third = _openai_log(tmp_path / "c.jsonl", 60, start_s=1_717_000_500.0, bad_every=5)
    single_bytes, parallel_bytes, single, parallel = _build_both([first, second, third], tmp_path)
    assert parallel_bytes == single_bytes
    _same_result(single, parallel)


def test_strict_stops_at_the_first_bad_line_of_the_file(tmp_path: Path) -> None:
    log = _openai_log(tmp_path / "gw.jsonl", 200, bad_every=150)
    messages = []
    for workers in (1, 2):
        with pytest.raises(TraceFormatError) as caught:
            build_trace(
                [log],
                tmp_path / "out.jsonl",
                strict=True,
                workers=workers,
                parallel_min_bytes=0,
                span_bytes=700,
            )
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"{log}:4: not a JSON object")


def test_stats_straight_from_spans_match_the_single_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oomload.ingest import parallel

    log = _openai_log(tmp_path / "gw.jsonl", 300)
    single = count_trace([log], workers=1)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(parallel, "SPAN_BYTES", 700)
    spread = count_trace([log], workers=2)
    assert spread.arrivals == single.arrivals
    assert spread.prompt_tokens.distinct()[0].tolist() == single.prompt_tokens.distinct()[0].tolist()
    assert (spread.failed, spread.skips.counts, spread.skips.notes) == (
        single.failed,
        single.skips.counts,
        single.skips.notes,
    )


def test_merge_keeps_heapq_order_for_ties() -> None:
    import heapq

    streams_times = [[0.0, 1.0, 1.0, 3.0], [1.0, 1.0, 2.0], [1.0, 5.0]]
    batches = [
        [
            make_batch(
                len(t),
                time_s=t,
                prompt_tokens=[s * 10 + i for i in range(len(t))],
                output_tokens=[0] * len(t),
            )
        ]
        for s, t in enumerate(streams_times)
    ]
    merged = [
        row
        for batch in merge_batches([iter(b) for b in batches])
        for row in batch.column("prompt_tokens").to_pylist()
    ]
    expected = [
        row
        for _, row in heapq.merge(
            *[[(t, s * 10 + i) for i, t in enumerate(times)] for s, times in enumerate(streams_times)],
            key=lambda item: item[0],
        )
    ]
    assert merged == expected
