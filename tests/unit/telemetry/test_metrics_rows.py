"""The run directory's lines as types: what a writer writes is what a reader parses, field by field."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from oomload.errors import EndpointError
from oomload.rundir import RunReader, RunWriter
from oomload.rundir.records import (
    CacheConfig,
    EventRow,
    GpuSampleRow,
    MetricsLine,
    MetricsRow,
    ProcessRow,
    RunConfig,
)
from oomload.telemetry.gpu_sample import GpuSample, GpuSampleJson, ProcessMemory
from oomload.telemetry.poller import MetricsPoller

from .metrics_text import vllm_text


def _fields(record: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(record)}


def test_a_metrics_row_has_every_field_a_metrics_line_can_hold() -> None:
    assert set(MetricsLine.__annotations__) == _fields(MetricsRow)


def test_a_gpu_row_has_every_field_a_gpu_line_holds() -> None:
    assert set(GpuSampleJson.__annotations__) <= _fields(GpuSampleRow)


def test_the_poller_s_lines_parse_back_value_for_value(tmp_path: Path) -> None:
    answers = iter([vllm_text(preemptions=5, kv=0.25), vllm_text(preemptions=9, kv=0.75, waiting=4), None])

    def fetch(url: str, timeout_s: float) -> str:
        answer = next(answers)
        if answer is None:
            raise EndpointError(f"GET {url} failed: connection refused")
        return answer

    clock = iter([1000.0, 1001.0, 1002.0])
    with RunWriter(tmp_path) as writer:
        writer.write_json("config.json", {"schema": 1})
        poller = MetricsPoller("http://127.0.0.1:9", writer, fetch=fetch, clock=lambda: next(clock))
        for _ in range(3):
            poller.poll_once()
    lines = list(RunReader(tmp_path).stream("metrics"))
    rows = [MetricsRow.from_json(line) for line in lines]
    assert len(rows) == 3
    for line, row in zip(lines, rows, strict=True):
        assert row is not None
        assert {k: getattr(row, k) for k in line} == line  # every written value, read back unchanged
    ok, later, failed = rows
    assert ok is not None and later is not None and failed is not None
    assert (later.preemptions_delta, later.num_preemptions_total, later.num_requests_waiting) == (4, 9, 4)
    assert later.kv_cache_usage == 0.75 and later.ok and not later.restarted
    assert not failed.ok and failed.error is not None and "connection refused" in failed.error
    assert failed.kv_cache_usage is None and failed.preemptions_delta is None


def test_loose_metrics_values_read_as_none() -> None:
    assert MetricsRow.from_json({"ok": True}) is None  # no time: the reader cannot place it
    assert MetricsRow.from_json({"t_unix_s": math.nan, "ok": True}) is None
    row = MetricsRow.from_json(
        {
            "t_unix_s": 5,
            "ok": True,
            "kv_cache_usage": True,
            "preemptions_delta": "3",
            "num_requests_running": 2.0,
        }
    )
    assert row is not None
    assert (row.t_unix_s, row.kv_cache_usage, row.preemptions_delta, row.num_requests_running) == (
        5.0,
        None,
        None,
        2,
    )


def test_values_no_server_reports_read_as_none() -> None:
    """A run directory written before the poller left such samples out (or edited by hand): a KV
    usage of 7.5 was shown as a 750 % peak."""
    row = MetricsRow.from_json(
        {
            "t_unix_s": 5,
            "ok": True,
            "kv_cache_usage": 7.5,
            "num_requests_waiting": -3,
            "preemptions_delta": -1,
            "queue_seconds_sum": -0.5,
            "num_requests_running": 4,
        }
    )
    assert row is not None
    assert (row.kv_cache_usage, row.num_requests_waiting, row.preemptions_delta, row.queue_seconds_sum) == (
        None,
        None,
        None,
        None,
    )
    assert row.num_requests_running == 4
    edges = MetricsRow.from_json({"t_unix_s": 5, "ok": True, "kv_cache_usage": 1, "num_requests_waiting": 0})
    assert edges is not None and (edges.kv_cache_usage, edges.num_requests_waiting) == (1.0, 0)


def test_a_gpu_sample_reads_back_with_its_processes() -> None:
    sample = GpuSample(1.5, "nvml", 0, 80, 30, 50, 12.0, (ProcessMemory(42, 20), ProcessMemory(7, None)))
    row = GpuSampleRow.from_json(json.loads(json.dumps(sample.to_json())))
    assert row == GpuSampleRow(1.5, "nvml", 0, 80, 30, 50, 12.0, (ProcessRow(42, 20), ProcessRow(7, None)))
    null = GpuSampleRow.from_json({"t_unix_s": 2.0, "processes": None})
    absent = GpuSampleRow.from_json({"t_unix_s": 2.0})
    junk = GpuSampleRow.from_json({"t_unix_s": 2.0, "processes": [3, {"pid": 9}]})
    assert null is not None and null.processes is None
    assert absent is not None and absent.processes is None
    assert junk is not None and junk.processes == (ProcessRow(9, None),)


def test_an_event_keeps_its_explanations_in_order_and_its_extras() -> None:
    row = EventRow.from_json(
        {
            "t_unix_s": 3.0,
            "kind": "worker_lost",
            "error": "EOF",
            "detail": "heartbeat",
            "reason": "",
            "host": "h",
        }
    )
    assert row is not None
    assert (row.kind, row.step, row.text) == ("worker_lost", None, ("heartbeat", "EOF"))
    assert row.fields["host"] == "h"
    assert EventRow.from_json({"kind": "server_dead"}) is None


def test_the_config_fields_the_verdict_reads() -> None:
    config = RunConfig.from_json(
        {
            "model": "m",
            "simulated": True,
            "open_loop": 1,
            "schedule": {"min_requests": 30},
            "tail_percentile": 99,
        }
    )
    assert config == RunConfig(
        model="m", simulated=True, open_loop=False, min_requests=30, tail_percentile=99.0
    )
    assert RunConfig.from_json({"schedule": [30], "simulated": "yes"}) == RunConfig()
    pool = CacheConfig.from_json({"num_gpu_blocks": 97, "block_size": "16", "gpu_memory_utilization": 0.9})
    assert pool == CacheConfig(num_gpu_blocks=97, block_size=None, gpu_memory_utilization=0.9)
