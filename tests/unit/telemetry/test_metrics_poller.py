from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oomload.errors import EndpointError
from oomload.rundir import RunWriter
from oomload.telemetry.poller import MetricsPoller, metrics_url

from .metrics_text import vllm_text


class ScriptedFetch:
    """A transport that answers each scrape with the next scripted text, or raises EndpointError."""

    def __init__(self, answers: list[str | None]) -> None:
        self._answers: Iterator[str | None] = iter(answers)
        self.urls: list[str] = []

    def __call__(self, url: str, timeout_s: float) -> str:
        self.urls.append(url)
        answer = next(self._answers)
        if answer is None:
            raise EndpointError(f"GET {url} failed: connection refused (is the server running?)")
        return answer


class StepClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def poller(tmp_path: Path, answers: list[str | None], **kwargs: Any) -> tuple[MetricsPoller, RunWriter]:
    writer = RunWriter(tmp_path)
    return MetricsPoller(
        "http://srv:8000", writer, fetch=ScriptedFetch(answers), clock=StepClock(), **kwargs
    ), writer


def test_counter_deltas_and_record_shape(tmp_path: Path) -> None:
    p, writer = poller(
        tmp_path,
        [vllm_text(preemptions=5, prompt_tokens=100), vllm_text(preemptions=9, prompt_tokens=350, kv=0.9)],
    )
    first = p.poll_once()
    second = p.poll_once()
    writer.close()
    assert first["preemptions_delta"] == 0  # before oomload watched is not this run's
    assert second["preemptions_delta"] == 4
    assert second["prompt_tokens_delta"] == 250
    assert second["kv_cache_usage"] == 0.9
    assert second["restarted"] is False
    assert set(second) >= {
        "t_unix_s",
        "ok",
        "kv_cache_usage",
        "num_requests_running",
        "num_requests_waiting",
        "num_preemptions_total",
        "preemptions_delta",
        "prompt_tokens_total",
        "generation_tokens_total",
        "admission_rejections_total",
        "restarted",
    }
    written = lines(tmp_path / "metrics.jsonl")
    assert [r["num_preemptions_total"] for r in written] == [5, 9]
    assert [r["t_unix_s"] for r in written] == [1001.0, 1002.0]
    assert p.latest == second
    assert not (tmp_path / "events.jsonl").exists()


def test_counter_drop_is_a_restart_never_a_negative_delta(tmp_path: Path) -> None:
    p, writer = poller(
        tmp_path, [vllm_text(preemptions=514), vllm_text(preemptions=3), vllm_text(preemptions=4)]
    )
    records = [p.poll_once() for _ in range(3)]
    writer.close()
    assert [r["restarted"] for r in records] == [False, True, False]
    assert [r["preemptions_delta"] for r in records] == [0, 3, 1]
    assert p.restarts == 1
    events = lines(tmp_path / "events.jsonl")
    assert [e["kind"] for e in events] == ["server_restarted"]
    assert events[0]["evidence"] == "vllm:num_preemptions_total dropped from 514 to 3"
    assert events[0]["t_unix_s"] == records[1]["t_unix_s"]


def test_an_impossible_gauge_is_left_out_and_told_once(tmp_path: Path) -> None:
    p, writer = poller(tmp_path, [vllm_text(kv=7.5), vllm_text(kv=6.0), vllm_text(kv=0.5)])
    records = [p.poll_once() for _ in range(3)]
    writer.close()
    assert [r["kv_cache_usage"] for r in records] == [None, None, 0.5]
    assert all(r["ok"] for r in records)
    events = lines(tmp_path / "events.jsonl")
    assert [(e["kind"], e["field"], e["detail"]) for e in events] == [
        ("metrics_invalid", "kv_cache_usage", "vllm:kv_cache_usage_perc = 7.5, not a fraction in 0–1")
    ]


def test_recreated_counters_are_a_restart_even_without_a_drop(tmp_path: Path) -> None:
    p, writer = poller(
        tmp_path, [vllm_text(preemptions=0, created=1.0e9), vllm_text(preemptions=0, created=2.0e9)]
    )
    p.poll_once()
    second = p.poll_once()
    writer.close()
    assert second["restarted"] is True
    assert "re-created" in lines(tmp_path / "events.jsonl")[0]["evidence"]


def test_scrape_failures_are_recorded_and_counted(tmp_path: Path) -> None:
    p, writer = poller(tmp_path, [vllm_text(preemptions=1), None, None, vllm_text(preemptions=2), None])
    records = [p.poll_once() for _ in range(3)]
    assert p.consecutive_failures == 2
    records.append(p.poll_once())
    assert p.consecutive_failures == 0
    records.append(p.poll_once())
    writer.close()
    assert [r["ok"] for r in records] == [True, False, False, True, False]
    assert "connection refused" in records[1]["error"]
    assert records[1]["t_unix_s"] == 1002.0
    assert records[3]["preemptions_delta"] == 1  # against the last ok scrape
    assert p.latest == records[3]
    assert (p.failures, p.scrapes) == (3, 5)
    events = lines(tmp_path / "events.jsonl")
    assert [e["kind"] for e in events] == ["scrape_failed", "scrape_failed"]  # first of each streak
    assert [e["t_unix_s"] for e in events] == [1002.0, 1005.0]


def test_parse_errors_are_scrape_failures(tmp_path: Path) -> None:
    p, writer = poller(tmp_path, ["python_gc_objects_collected_total 3.0\n"])
    record = p.poll_once()
    writer.close()
    assert record["ok"] is False
    assert "--disable-log-stats" in record["error"]


def test_model_mismatch_is_a_scrape_failure_naming_the_models(tmp_path: Path) -> None:
    p, writer = poller(tmp_path, [vllm_text(model="served", extra_models=("second",))], model_name="other")
    record = p.poll_once()
    writer.close()
    assert record["ok"] is False
    assert "'second', 'served'" in record["error"]


def test_cache_config_written_once_with_max_model_len(tmp_path: Path) -> None:
    p, writer = poller(tmp_path, [vllm_text(), vllm_text()], max_model_len=4096)
    p.poll_once()
    (tmp_path / "cache_config.json").unlink()
    p.poll_once()
    writer.close()
    assert not (tmp_path / "cache_config.json").exists()  # read once
    assert p.cache_config == {
        "block_size": 16,
        "gpu_memory_utilization": 0.9,
        "num_gpu_blocks": 96,
        "enable_prefix_caching": False,
        "cache_dtype": "auto",
        "engine_count": 1,
        "max_model_len": 4096,
    }


def test_without_writer(tmp_path: Path) -> None:
    p = MetricsPoller("http://x", None, fetch=ScriptedFetch([vllm_text(preemptions=1), None]))
    assert p.poll_once()["ok"] is True
    assert p.poll_once()["ok"] is False
    assert p.consecutive_failures == 1


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://h:8000", "http://h:8000/metrics"),
        ("http://h:8000/", "http://h:8000/metrics"),
        ("http://h:8000/v1", "http://h:8000/metrics"),
        ("http://h:8000/metrics", "http://h:8000/metrics"),
    ],
)
def test_metrics_url(base: str, url: str) -> None:
    assert metrics_url(base) == url


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        MetricsPoller("http://x", None, interval_s=0)
