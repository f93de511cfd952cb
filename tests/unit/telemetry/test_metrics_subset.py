"""Only the series oomload reads are parsed: the same snapshot as parsing every line."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from oomload.telemetry import vllm_metrics
from oomload.telemetry.vllm_metrics import WANTED_NAMES, _wanted_lines, parse_vllm_metrics


def exposition() -> str:
    """vLLM-shaped text through prometheus_client itself: HELP/TYPE lines, histogram buckets, info."""
    reg = CollectorRegistry()
    labels = ["engine", "model_name"]
    Gauge("vllm:kv_cache_usage_perc", "KV", labels, registry=reg).labels("0", "m").set(0.42)
    Gauge("vllm:num_requests_running", "r", labels, registry=reg).labels("0", "m").set(3)
    Gauge("vllm:num_requests_waiting", "w", labels, registry=reg).labels("0", "m").set(1)
    Counter("vllm:num_preemptions", "p", labels, registry=reg).labels("0", "m").inc(7)
    Counter("vllm:prompt_tokens", "p", labels, registry=reg).labels("0", "m").inc(1000)
    Counter("vllm:generation_tokens", "g", labels, registry=reg).labels("0", "m").inc(500)
    for name in (
        "e2e_request_latency",
        "request_queue_time",
        "request_inference_time",
        "time_to_first_token",
    ):
        h = Histogram(
            f"vllm:{name}_seconds", name, labels, registry=reg, buckets=[0.1 * k for k in range(1, 40)]
        )
        for v in (0.2, 1.5, 3.0):
            h.labels("0", "m").observe(v)
    Info("vllm:cache_config", "c", registry=reg).info({"block_size": "16", "num_gpu_blocks": "799"})
    return generate_latest(reg).decode()


def test_the_subset_gives_the_same_snapshot_as_every_line(monkeypatch: pytest.MonkeyPatch) -> None:
    text = exposition()
    kept = _wanted_lines(text)
    assert 0 < len(kept.splitlines()) < len(text.splitlines()) / 5  # buckets and comments dropped
    assert all(line.split("{")[0].split(" ")[0] in WANTED_NAMES for line in kept.splitlines())
    subset = parse_vllm_metrics(text, t_unix_s=1.0)
    monkeypatch.setattr(vllm_metrics, "_wanted_lines", lambda _text: "")  # parse every line instead
    assert asdict(parse_vllm_metrics(text, t_unix_s=1.0)) == asdict(subset)
    assert subset.e2e_latency_seconds_sum == 4.7 and subset.queue_seconds_sum == 4.7
    assert subset.num_preemptions_total == 7 and subset.kv_cache_usage == 0.42
    assert subset.cache_config is not None and subset.cache_config["num_gpu_blocks"] == 799
