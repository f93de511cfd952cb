from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.telemetry.gpu_sample import GpuSample, ProcessMemory

processes = st.none() | st.lists(
    st.builds(ProcessMemory, st.integers(1, 2**22), st.none() | st.integers(0, 2**45)), max_size=3
).map(tuple)


@given(
    st.floats(0, 2e9, allow_nan=False),
    st.sampled_from(["nvml", "dcgm", "remote"]),
    st.integers(0, 7),
    st.integers(0, 2**45),
    st.integers(0, 2**45),
    st.none() | st.floats(0, 100, allow_nan=False),
    processes,
)
def test_json_round_trip(
    t: float,
    source: str,
    device: int,
    used: int,
    free: int,
    util: float | None,
    procs: tuple[ProcessMemory, ...] | None,
) -> None:
    sample = GpuSample(t, source, device, used + free, used, free, util, procs)
    line = json.loads(json.dumps(sample.to_json()))
    assert GpuSample.from_json(line) == sample


def test_json_keys_match_the_run_directory_contract() -> None:
    line = GpuSample(1.0, "nvml", 0, 10, 4, 6, None, (ProcessMemory(9, 4),)).to_json()
    assert list(line) == [
        "t_unix_s",
        "source",
        "device",
        "total_bytes",
        "used_bytes",
        "free_bytes",
        "util_pct",
        "processes",
    ]
    assert line["processes"] == [{"pid": 9, "used_bytes": 4}]


def test_bad_line() -> None:
    with pytest.raises(KeyError):
        GpuSample.from_json({"t_unix_s": 1.0})
