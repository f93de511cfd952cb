"""CSV logs streamed in bounded memory: line numbers of skipped rows, ``--strict``, and memory.

pyarrow's streaming CSV reader keeps up to 32 blocks read ahead, so the reader's blocks are small
(``tabular.BLOCK_BYTES``): memory in flight no longer grows with the file (it did, up to 32 × 4 MiB).
Arrival statistics are the same to the last bit however the rows are batched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.errors import TraceFormatError
from oomload.ingest import SkipLog, build_trace, iter_records
from oomload.trace.stats import GAP_BLOCK, ArrivalCounter

HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_rows_with_wrong_column_counts_have_line_numbers_and_shift_later_ones(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(
        HEADER
        + b"2023-11-16 18:15:46.68,374,44\n"  # 2
        + b"2023-11-16 18:15:47.00,12\n"  # 3: too few columns
        + b"2023-11-16 18:15:48.00,x,10\n"  # 4: not an integer
        + b"2023-11-16 18:15:49.00,1,2,3\n"  # 5: too many
        + b"2023-11-16 18:15:50.00,7,8\n"  # 6
        + b"2023-11-16 18:15:51.00,-1,8\n"  # 7: not an integer
    )
    skips = SkipLog()
    recs = list(iter_records([path], skips=skips))
    assert [r.prompt_tokens for r in recs] == [374, 7]
    assert skips.examples == {
        "wrong number of columns (expected 3)": [f"{path}:3", f"{path}:5"],
        "not a non-negative integer in column 'ContextTokens'": [f"{path}:4", f"{path}:7"],
    }


@pytest.mark.parametrize(
    ("rows", "first"),
    [
        (b"2023-11-16 18:15:47.00,12\n2023-11-16 18:15:48.00,x,10\n", "3: wrong number of columns"),
        (b"2023-11-16 18:15:48.00,x,10\n2023-11-16 18:15:47.00,12\n", "3: not a non-negative integer"),
        (b"2023-11-16 18:15:48.00,1,x\nnot a time,1,1\n", "3: not a non-negative integer in column 'Gen"),
        (b"not a time,1,1\n2023-11-16 18:15:48.00,x,10\n", "3: not a timestamp"),
    ],
)
def test_strict_stops_at_the_first_bad_line_whatever_its_reason(
    tmp_path: Path, rows: bytes, first: str
) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(HEADER + b"2023-11-16 18:15:46.68,374,44\n" + rows)
    with pytest.raises(TraceFormatError) as caught:
        build_trace([path], tmp_path / "out.jsonl", strict=True)
    assert f"{path}:{first}" in str(caught.value)


def test_strict_on_a_short_row_is_one_sentence_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(HEADER + b"2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.00,12\n")
    done = subprocess.run(
        [sys.executable, "-m", "oomload", "trace", "build", str(path), "-o", str(tmp_path / "o"), "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    reason = "wrong number of columns (expected 3) (stopped by --strict)"
    assert done.stderr == f"oomload: error: {path}:3: {reason}\n"


READ_PEAK = r"""
import json, sys
from oomload.ingest import SkipLog, plan_inputs
from oomload.ingest.build import iter_batches
rows = sum(batch.num_rows for batch in iter_batches(plan_inputs([sys.argv[1]]), SkipLog(), None))
hwm_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"rows": rows, "peak_rss_bytes": hwm_kib * 1024}))
"""


def _read_peak(path: Path, rows: int) -> int:
    block = b"2023-11-16 18:15:46.6805900,1374,144\r\n" * 100_000
    with open(path, "wb") as fh:
        fh.write(HEADER)
        for _ in range(rows // 100_000):
            fh.write(block)
    done = subprocess.run(
        [sys.executable, "-c", READ_PEAK, str(path)], capture_output=True, text=True, timeout=300, check=True
    )
    path.unlink()
    result = json.loads(done.stdout)
    assert result["rows"] == rows
    return int(result["peak_rss_bytes"])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_peak_memory_of_reading_a_csv_does_not_grow_with_its_rows(tmp_path: Path) -> None:
    """0.5M rows (19 MB) and 5M rows (190 MB): the reader used to hold up to 32 blocks of 4 MiB read
    ahead (about 100 MiB more for the bigger file); now its blocks are small, the peak the same."""
    small = _read_peak(tmp_path / "small.csv", 500_000)
    big = _read_peak(tmp_path / "big.csv", 5_000_000)
    assert big - small < 32 * 2**20, (small, big)


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 3 * GAP_BLOCK), st.lists(st.integers(1, 3 * GAP_BLOCK), max_size=6), st.integers(0, 9))
def test_arrival_statistics_do_not_depend_on_the_batching(count: int, cuts: list[int], seed: int) -> None:
    times = np.cumsum(np.random.default_rng(seed).exponential(0.37, count))
    whole = ArrivalCounter()
    whole.add(times)
    split = ArrivalCounter()
    for part in np.split(times, sorted(c for c in cuts if c < count)):
        split.add(part)
    assert split.result() == whole.result()
