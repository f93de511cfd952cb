from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.errors import EndpointError, SamplerUnavailableError
from oomload.telemetry.dcgm import MIB, DcgmReader, dcgm_url, parse_dcgm_metrics, render_dcgm_text
from oomload.telemetry.gpu_sample import GpuSample, ProcessMemory

LABELS = 'gpu="{i}",UUID="GPU-{i}",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"'
EXPORTER_TEXT = "".join(
    [
        "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n# TYPE DCGM_FI_DEV_FB_FREE gauge\n",
        *(f"DCGM_FI_DEV_FB_FREE{{{LABELS.format(i=i)}}} {free}\n" for i, free in ((0, 1000), (1, 80000))),
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n",
        *(f"DCGM_FI_DEV_FB_USED{{{LABELS.format(i=i)}}} {used}\n" for i, used in ((0, 79000), (1, 1))),
        "# TYPE DCGM_FI_DEV_FB_RESERVED gauge\n",
        *(f"DCGM_FI_DEV_FB_RESERVED{{{LABELS.format(i=i)}}} 559\n" for i in (0, 1)),
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n",
        f"DCGM_FI_DEV_GPU_UTIL{{{LABELS.format(i=0)}}} 88\n",
    ]
)


def test_exporter_text_in_mib() -> None:
    samples = parse_dcgm_metrics(EXPORTER_TEXT, t_unix_s=5.0)
    assert [s.device for s in samples] == [0, 1]
    gpu0 = samples[0]
    assert gpu0.source == "dcgm"
    assert gpu0.used_bytes == 79000 * MIB
    assert gpu0.free_bytes == 1000 * MIB
    assert gpu0.total_bytes == (79000 + 1000 + 559) * MIB
    assert gpu0.util_pct == 88.0
    assert gpu0.processes is None  # DCGM cannot tell, which is not "no process"
    assert (gpu0.name, gpu0.uuid) == ("NVIDIA H100 80GB HBM3", "GPU-0")
    assert samples[1].util_pct is None
    assert gpu0.t_unix_s == 5.0


def test_total_from_fb_total_when_exported() -> None:
    text = EXPORTER_TEXT + 'DCGM_FI_DEV_FB_TOTAL{gpu="0"} 81559\n'
    assert parse_dcgm_metrics(text, t_unix_s=0.0, devices=[0])[0].total_bytes == 81559 * MIB


def test_device_filter_and_missing_device() -> None:
    assert [s.device for s in parse_dcgm_metrics(EXPORTER_TEXT, t_unix_s=0.0, devices=[1])] == [1]
    with pytest.raises(SamplerUnavailableError, match=r"GPU index 3 is not .* \(GPUs there: 0, 1\)"):
        parse_dcgm_metrics(EXPORTER_TEXT, t_unix_s=0.0, devices=[3])


def test_not_a_dcgm_endpoint() -> None:
    with pytest.raises(SamplerUnavailableError, match="no DCGM_FI_DEV_FB_USED"):
        parse_dcgm_metrics('vllm:num_requests_running{engine="0"} 1\n', t_unix_s=0.0)
    with pytest.raises(SamplerUnavailableError, match="Prometheus text"):
        parse_dcgm_metrics("<html>hi</html>\n", t_unix_s=0.0)


def test_own_serve_text_round_trips_exact_bytes_and_processes() -> None:
    original = [
        GpuSample(
            1.0,
            "nvml",
            0,
            80 * 2**30,
            12_345_678_901,
            80 * 2**30 - 12_345_678_901,
            55.0,
            (ProcessMemory(4242, 12_000_000_000), ProcessMemory(7, None)),
            'H100 "SXM"',
            "GPU-a",
        ),
        GpuSample(1.0, "nvml", 1, 80 * 2**30, 3, 80 * 2**30 - 3, None, None, "H100", "GPU-b"),
    ]
    parsed = parse_dcgm_metrics(render_dcgm_text(original, hostname="gpu-host"), t_unix_s=9.0)
    for before, after in zip(original, parsed, strict=True):
        assert after.source == "remote"
        assert after.t_unix_s == 9.0  # stamped by the reader's clock, not the GPU host's
        assert (after.device, after.total_bytes, after.used_bytes, after.free_bytes) == (
            before.device,
            before.total_bytes,
            before.used_bytes,
            before.free_bytes,
        )
        assert after.util_pct == before.util_pct
        assert after.processes == before.processes
        assert (after.name, after.uuid) == (before.name, before.uuid)


@given(
    st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), min_size=1, max_size=4),
)
def test_render_parse_property(memory: list[tuple[int, int]]) -> None:
    samples = [GpuSample(0.0, "nvml", i, u + f, u, f, None, ()) for i, (u, f) in enumerate(memory)]
    parsed = parse_dcgm_metrics(render_dcgm_text(samples), t_unix_s=0.0)
    assert [(s.used_bytes, s.free_bytes, s.total_bytes) for s in parsed] == [(u, f, u + f) for u, f in memory]
    assert all(s.processes == () for s in parsed)


def test_reader_with_a_fake_transport() -> None:
    calls: list[str] = []

    def fetch(url: str, timeout_s: float) -> str:
        calls.append(url)
        return EXPORTER_TEXT

    reader = DcgmReader("http://gpu-host:9400", devices=[0], fetch=fetch, clock=lambda: 42.0)
    reader.open()
    samples = reader.sample()
    assert calls == ["http://gpu-host:9400/metrics"] * 2
    assert [(s.device, s.t_unix_s) for s in samples] == [(0, 42.0)]


def test_reader_turns_endpoint_errors_into_sampler_unavailable() -> None:
    def fetch(url: str, timeout_s: float) -> str:
        raise EndpointError(f"GET {url} failed: connection refused (is the server running?)")

    with pytest.raises(
        SamplerUnavailableError, match="cannot read GPU memory: GET http://h:1/metrics failed"
    ):
        DcgmReader("http://h:1", fetch=fetch).open()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://h:9400", "http://h:9400/metrics"),
        ("http://h:9400/", "http://h:9400/metrics"),
        ("http://h:8000/dcgm/metrics", "http://h:8000/dcgm/metrics"),
        ("http://h:9400/metrics", "http://h:9400/metrics"),
    ],
)
def test_dcgm_url(url: str, expected: str) -> None:
    assert dcgm_url(url) == expected
