from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.errors import ConfigError, EndpointError
from oomload.telemetry.vllm_metrics import parse_label_value, parse_vllm_metrics

from .metrics_text import vllm_text


def _manifest(fixtures_dir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((fixtures_dir / "manifest.json").read_text())
    return doc["full"]


def test_real_cpu_capture(fixtures_dir: Path) -> None:
    """``/metrics`` of the real vLLM after the requests the regeneration script sent (idle again)."""
    manifest = _manifest(fixtures_dir)
    text = (fixtures_dir / "vllm-metrics.txt").read_text()
    snap = parse_vllm_metrics(text, t_unix_s=12.5)
    assert snap.t_unix_s == 12.5
    counters = manifest["idle_counters"]
    assert snap.num_preemptions_total == counters["vllm:num_preemptions_total"] >= 1
    sent = manifest["requests"]
    assert snap.prompt_tokens_total == sum(r["usage"]["prompt_tokens"] for r in sent)
    assert snap.generation_tokens_total == sum(r["usage"]["completion_tokens"] for r in sent)
    assert snap.kv_cache_usage == 0.0
    assert snap.num_requests_running == 0
    assert snap.num_requests_waiting == 0
    assert snap.admission_rejections_total == 0
    assert snap.prefix_cache_queries_total == snap.prompt_tokens_total
    assert snap.model_names == ("tiny-model",)
    assert snap.engine_count == 1
    assert snap.counters_created_unix_s is not None
    assert snap.counters_created_unix_s > manifest_time(fixtures_dir)  # the server started after
    config = snap.cache_config
    assert config is not None
    assert config["num_gpu_blocks"] == manifest["server"]["num_gpu_blocks"] == 12
    assert config["block_size"] == manifest["server"]["block_size"] == 256
    assert config["kv_cache_size_tokens"] == 12 * 256
    assert config["kv_cache_max_concurrency"] == 1.5
    assert config["kv_cache_memory_bytes"] == 16 * 1024 * 1024
    assert config["gpu_memory_utilization"] == 0.92
    assert config["enable_prefix_caching"] is True
    assert config["num_gpu_blocks_override"] == 12
    assert config["cache_dtype"] == "auto"
    assert config["kv_cache_dtype_skip_layers"] == "[]"
    assert config["engine_count"] == 1
    assert "engine" not in config


def manifest_time(fixtures_dir: Path) -> float:
    return float(json.loads((fixtures_dir / "manifest.json").read_text())["generated_unix_s"])


def test_real_cpu_capture_under_load(fixtures_dir: Path) -> None:
    """The scrape taken while a burst above the arithmetic onset ran: gauges as the script read them."""
    gauges = _manifest(fixtures_dir)["loaded_gauges"]
    text = (fixtures_dir / "vllm-metrics-loaded.txt").read_text()
    snap = parse_vllm_metrics(text, t_unix_s=0.0, model_name="tiny-model")
    assert snap.kv_cache_usage == pytest.approx(gauges["vllm:kv_cache_usage_perc"])
    assert snap.kv_cache_usage is not None and snap.kv_cache_usage > 0.5
    assert snap.num_requests_running == gauges["vllm:num_requests_running"] >= 1
    assert snap.num_requests_waiting == gauges["vllm:num_requests_waiting"]
    assert snap.cache_config is not None and snap.cache_config["num_gpu_blocks"] == 12


def test_legacy_gpu_cache_usage_name() -> None:
    snap = parse_vllm_metrics(vllm_text(kv=0.75, legacy=True), t_unix_s=0.0)
    assert snap.kv_cache_usage == 0.75
    assert snap.sources is not None
    assert snap.sources["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"


def test_current_name_wins_over_hidden_legacy_name() -> None:
    text = vllm_text(kv=0.25) + 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99\n'
    assert parse_vllm_metrics(text, t_unix_s=0.0).kv_cache_usage == 0.25


def test_v0_names_counters_without_total_and_swap_gauge() -> None:
    text = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{model_name="old"} 0.5\n'
        'vllm:cpu_cache_usage_perc{model_name="old"} 0.125\n'
        'vllm:num_requests_swapped{model_name="old"} 2.0\n'
        'vllm:num_preemptions{model_name="old"} 7.0\n'
        'vllm:gpu_prefix_cache_queries_total{model_name="old"} 40.0\n'
        'vllm:gpu_prefix_cache_hits_total{model_name="old"} 8.0\n'
    )
    snap = parse_vllm_metrics(text, t_unix_s=0.0, model_name="old")
    assert snap.kv_cache_usage == 0.5  # the swap gauge is never the KV usage
    assert snap.cpu_cache_usage == 0.125
    assert snap.num_requests_swapped == 2
    assert snap.num_preemptions_total == 7
    assert (snap.prefix_cache_queries_total, snap.prefix_cache_hits_total) == (40, 8)
    assert snap.num_requests_running is None
    assert snap.engine_count == 1


def test_data_parallel_engines_are_summed_and_kv_takes_the_fullest() -> None:
    text = vllm_text(engines=("0", "1"), kv=[0.25, 0.875], preemptions=[3, 4], running=5, waiting=2)
    snap = parse_vllm_metrics(text, t_unix_s=0.0)
    assert snap.engine_count == 2
    assert snap.num_preemptions_total == 7
    assert snap.num_requests_running == 10
    assert snap.num_requests_waiting == 4
    assert snap.prompt_tokens_total == 200
    assert snap.kv_cache_usage == 0.875
    assert snap.cache_config is not None
    assert snap.cache_config["engine_count"] == 2
    assert snap.cache_config["num_gpu_blocks"] == 96


def test_values_no_vllm_can_expose_are_left_out_and_named() -> None:
    """A KV usage of 7.5 read as "750 %", waiting −3 and an infinite counter: each sample is dropped
    as a NaN one is, and ``invalid`` says which and why."""
    snap = parse_vllm_metrics(vllm_text(kv=7.5, waiting=-3, preemptions=[2]), t_unix_s=0.0)
    assert (snap.kv_cache_usage, snap.num_requests_waiting) == (None, None)
    assert snap.num_preemptions_total == 2 and snap.num_requests_running == 3
    assert snap.invalid == {
        "kv_cache_usage": "vllm:kv_cache_usage_perc = 7.5, not a fraction in 0–1",
        "num_requests_waiting": "vllm:num_requests_waiting = -3, not a finite number ≥ 0",
    }
    fullest = parse_vllm_metrics(vllm_text(engines=("0", "1"), kv=[0.5, 1.5]), t_unix_s=0.0)
    assert fullest.kv_cache_usage == 0.5  # the other engine's impossible sample is not its maximum
    text = vllm_text().replace("vllm:num_preemptions_total{", "vllm:num_preemptions_total_x{") + (
        'vllm:num_preemptions_total{engine="0",model_name="m"} +Inf\n'
    )
    inf = parse_vllm_metrics(text, t_unix_s=0.0)
    assert inf.num_preemptions_total is None and inf.invalid is not None
    assert "num_preemptions_total" in inf.invalid
    assert parse_vllm_metrics(vllm_text(kv=1.0, waiting=0), t_unix_s=0.0).invalid is None  # the edges


def test_admission_rejections_summed_over_reasons() -> None:
    text = vllm_text() + (
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 4.0\n'
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"} 1.0\n'
    )
    assert parse_vllm_metrics(text, t_unix_s=0.0).admission_rejections_total == 5


def test_model_filter_selects_one_model() -> None:
    text = vllm_text(model="a", extra_models=("b",), preemptions=2)
    snap = parse_vllm_metrics(text, t_unix_s=0.0, model_name="b")
    assert snap.num_preemptions_total == 2
    assert snap.model_names == ("a", "b")
    assert snap.cache_config is not None  # cache_config_info has no model_name label


def test_model_filter_matching_nothing_names_the_models() -> None:
    text = vllm_text(model="a", extra_models=("b",))
    with pytest.raises(ConfigError, match=r"'c'.*models there: 'a', 'b'"):
        parse_vllm_metrics(text, t_unix_s=0.0, model_name="c")


def test_a_model_served_under_another_name_reads_the_servers_one_label() -> None:
    # vLLM labels its series with the first served name: a LoRA adapter or alias has no label of its own
    snap = parse_vllm_metrics(vllm_text(model="base", preemptions=3), t_unix_s=0.0, model_name="sql-lora")
    assert snap.num_preemptions_total == 3
    assert snap.model_names == ("base",)


def test_several_models_without_a_filter_is_refused() -> None:
    with pytest.raises(ConfigError, match="several models"):
        parse_vllm_metrics(vllm_text(model="a", extra_models=("b",)), t_unix_s=0.0)


def test_no_vllm_metrics_says_disable_log_stats() -> None:
    text = "# TYPE python_gc_objects_collected counter\npython_gc_objects_collected_total 3.0\n"
    with pytest.raises(EndpointError, match="--disable-log-stats"):
        parse_vllm_metrics(text, t_unix_s=0.0)


def test_not_prometheus_text() -> None:
    with pytest.raises(EndpointError, match="not Prometheus text"):
        parse_vllm_metrics("<html><body>Not Found</body></html>\n", t_unix_s=0.0)


def test_missing_fields_are_none() -> None:
    snap = parse_vllm_metrics('vllm:num_requests_running{model_name="m"} 1.0\n', t_unix_s=0.0)
    assert snap.num_requests_running == 1
    assert snap.kv_cache_usage is None
    assert snap.num_preemptions_total is None
    assert snap.cache_config is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("96", 96),
        ("0.92", 0.92),
        ("True", True),
        ("False", False),
        ("None", None),
        ("auto", "auto"),
        ("nan", "nan"),
        ("[]", "[]"),
        ("-3", -3),
    ],
)
def test_label_values(text: str, value: object) -> None:
    assert parse_label_value(text) == value


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=8))
def test_engine_sum_property(per_engine: list[int]) -> None:
    engines = tuple(str(i) for i in range(len(per_engine)))
    snap = parse_vllm_metrics(vllm_text(engines=engines, preemptions=per_engine), t_unix_s=0.0)
    assert snap.num_preemptions_total == sum(per_engine)
    assert snap.engine_count == len(per_engine)
