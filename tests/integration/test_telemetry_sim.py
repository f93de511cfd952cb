"""The telemetry readers against the simulated vLLM (both metric-name profiles, and its DCGM endpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.rundir import RunWriter
from oomload.sim.process import SimServer
from oomload.telemetry.dcgm import DcgmReader
from oomload.telemetry.gpu import GpuSamplerProcess
from oomload.telemetry.poller import MetricsPoller
from oomload.telemetry.scrape import fetch_text
from oomload.telemetry.vllm_metrics import parse_vllm_metrics

ARGS = [
    "--gpu",
    "l4",
    "--num-gpu-blocks",
    "96",
    "--block-size",
    "32",
    "--max-model-len",
    "2048",
    "--served-model-name",
    "sim-model",
]


@pytest.mark.parametrize("profile", ["current", "legacy"])
def test_poller_reads_both_profiles(profile: str, tmp_path: Path) -> None:
    with SimServer([*ARGS, "--metrics-profile", profile]) as sim, RunWriter(tmp_path) as writer:
        poller = MetricsPoller(sim.url, writer, model_name="sim-model", max_model_len=2048)
        first = poller.poll_once()
        second = poller.poll_once()
        dcgm = DcgmReader(f"{sim.url}/dcgm/metrics").sample()
        snapshot = parse_vllm_metrics(fetch_text(f"{sim.url}/metrics", 5.0), t_unix_s=0.0)
    expected_kv_name = {"current": "vllm:kv_cache_usage_perc", "legacy": "vllm:gpu_cache_usage_perc"}[profile]
    assert snapshot.sources is not None
    assert snapshot.sources["kv_cache_usage"] == expected_kv_name
    assert snapshot.model_names == ("sim-model",)
    assert first["ok"] is True, first
    assert first["kv_cache_usage"] == 0.0
    assert first["num_requests_running"] == 0
    assert first["num_preemptions_total"] == 0
    assert second["preemptions_delta"] == 0 and second["restarted"] is False
    config = json.loads((tmp_path / "cache_config.json").read_text())
    assert config["num_gpu_blocks"] == 96
    assert config["block_size"] == 32
    assert config["max_model_len"] == 2048
    assert [s.source for s in dcgm] == ["dcgm"]
    assert dcgm[0].used_bytes > 0
    assert dcgm[0].total_bytes >= dcgm[0].used_bytes


def test_gpu_sampler_process_on_the_sim_dcgm_endpoint(tmp_path: Path) -> None:
    with SimServer(ARGS) as sim:
        out = tmp_path / "gpu.jsonl"
        with GpuSamplerProcess(out, interval_s=0.05, source="dcgm", url=f"{sim.url}/dcgm/metrics") as sampler:
            assert sampler.unavailable_reason is None
            latest = sampler.latest()
    assert latest is not None
    assert latest["source"] == "dcgm"
    assert latest["device"] == 0
    assert latest["used_bytes"] > 0
