"""A worker's own copy of its rows (``--results FILE``): a failing disk ends the copy, never a row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oomload.load import wire
from oomload.load.resultstream import ResultStream
from oomload.outcome import Outcome, RequestResult
from oomload.run.worker_node import _RowFile


def _result(i: int) -> RequestResult:
    return RequestResult(
        request_id=f"w0-{i}",
        step=1,
        concurrency=2,
        start_unix_s=10.0 + i,
        end_unix_s=11.0 + i,
        outcome=Outcome.OK,
        prompt_tokens_asked=5,
        output_tokens_asked=3,
    )


def _stream(copy: _RowFile) -> tuple[ResultStream, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    stream = ResultStream(
        lambda kind, data: sent.append(data) if kind == wire.RESULTS else None, 0, copy=copy
    )
    return stream, sent


def test_the_copy_holds_every_row_as_a_json_line(tmp_path: Path) -> None:
    said: list[str] = []
    copy = _RowFile(tmp_path / "deep" / "rows.jsonl", said.append)
    stream, sent = _stream(copy)
    for i in range(5):
        stream.request(_result(i))
    stream.flush()
    copy.close()
    lines = (tmp_path / "deep" / "rows.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [row for batch in sent for row in batch["rows"]]
    assert copy.rows == 5 and copy.stopped() is None and said == []


@pytest.mark.skipif(
    not Path("/dev/full").exists(), reason="needs /dev/full (a device whose writes fail: disk full)"
)
def test_a_full_disk_ends_the_copy_with_one_sentence_and_the_master_gets_every_row() -> None:
    said: list[str] = []
    copy = _RowFile(Path("/dev/full"), said.append)
    stream, sent = _stream(copy)
    for i in range(300):  # more than a batch: some go at once, the rest on flush
        stream.request(_result(i))
    stream.flush()
    assert [row["request_id"] for batch in sent for row in batch["rows"]] == [f"w0-{i}" for i in range(300)]
    assert len(said) == 1, said  # said once, not once a row
    assert "--results /dev/full could not be written (No space left on device)" in said[0]
    assert "after 0 rows" in said[0] and "every result still went to the master" in said[0]
    assert copy.stopped() == said[0]
    copy.close()
