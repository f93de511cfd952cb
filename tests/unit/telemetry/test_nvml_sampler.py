from __future__ import annotations

from typing import Any

import pynvml
import pytest

from oomload.errors import ConfigError, SamplerUnavailableError
from oomload.telemetry.fake_nvml import GIB, FakeNvml, load_fake_spec, nvml_error
from oomload.telemetry.nvml import NvmlSampler, describe_nvml_error


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 0.1
        return self.t


def two_gpus(**first: Any) -> dict[str, Any]:
    return {
        "devices": [
            {
                "name": "Fake H100",
                "total_bytes": 80 * GIB,
                "used_bytes": 70 * GIB,
                "util_pct": 97,
                "processes": [{"pid": 4242, "used_bytes": 69 * GIB}, {"pid": 7, "used_bytes": None}],
                **first,
            },
            {"name": "Fake H100", "total_bytes": 80 * GIB, "used_bytes": GIB, "processes": []},
        ]
    }


def test_samples_every_device_with_values_and_processes() -> None:
    fake = FakeNvml(two_gpus())
    with NvmlSampler(fake, clock=Clock()) as sampler:
        samples = sampler.sample()
        assert sampler.names == {0: "Fake H100", 1: "Fake H100"}
    assert [s.device for s in samples] == [0, 1]
    first = samples[0]
    assert (first.total_bytes, first.used_bytes, first.free_bytes) == (80 * GIB, 70 * GIB, 10 * GIB)
    assert first.util_pct == 97.0
    assert first.source == "nvml"
    assert first.t_unix_s == pytest.approx(100.1)
    assert first.processes is not None
    assert [(p.pid, p.used_bytes) for p in first.processes] == [(4242, 69 * GIB), (7, None)]
    assert samples[1].processes == ()
    assert samples[1].t_unix_s > first.t_unix_s
    assert fake.shutdowns == 1


def test_device_subset_and_memory_that_moves() -> None:
    spec = two_gpus()
    spec["devices"][1]["used_step_bytes"] = GIB
    with NvmlSampler(FakeNvml(spec), [1]) as sampler:
        used = [sampler.sample()[0].used_bytes for _ in range(3)]
        assert sampler.devices == [1]
    assert used == [GIB, 2 * GIB, 3 * GIB]


def test_unsupported_utilization_and_process_list_become_null() -> None:
    spec = two_gpus(util_error="NOT_SUPPORTED", processes_error="NOT_SUPPORTED")
    with NvmlSampler(FakeNvml(spec), [0]) as sampler:
        sample = sampler.sample()[0]
    assert sample.util_pct is None
    assert sample.processes is None
    assert sample.to_json()["processes"] is None


@pytest.mark.parametrize(
    ("error", "sentence"),
    [
        ("LIBRARY_NOT_FOUND", "libnvidia-ml.so) was not found"),
        ("DRIVER_NOT_LOADED", "the NVIDIA driver is not loaded"),
        ("LIB_RM_VERSION_MISMATCH", "driver/library mismatch"),
        ("NO_PERMISSION", "no permission"),
        ("UNKNOWN", "NVML failed: Unknown Error (NVML error code 999)"),
    ],
)
def test_init_errors_are_one_sentence(error: str, sentence: str) -> None:
    with pytest.raises(SamplerUnavailableError) as info:
        NvmlSampler(FakeNvml({"error": error})).open()
    message = str(info.value)
    assert sentence in message
    assert "\n" not in message
    assert isinstance(info.value.__cause__, pynvml.NVMLError)


def test_fake_raises_the_real_pynvml_subclasses() -> None:
    fake = FakeNvml({"error": "LIBRARY_NOT_FOUND"})
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        FakeNvml({"error": "DRIVER_NOT_LOADED"}).nvmlInit()
    ok = FakeNvml()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        ok.nvmlDeviceGetCount()
    ok.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        ok.nvmlDeviceGetHandleByIndex(1)


def test_device_index_out_of_range() -> None:
    with pytest.raises(
        SamplerUnavailableError, match=r"GPU index 2 is out of range: .* 2 GPU\(s\) \(allowed: 0–1\)"
    ):
        NvmlSampler(FakeNvml(two_gpus()), [0, 2]).open()


def test_invalid_argument_from_nvml_names_the_index() -> None:
    assert describe_nvml_error(nvml_error("INVALID_ARGUMENT"), device=5, device_count=1) == (
        "GPU index 5 is out of range: this machine has 1 GPU(s) (allowed: 0)"
    )


def test_no_device_at_all() -> None:
    fake = FakeNvml()
    fake.devices = []
    with pytest.raises(SamplerUnavailableError, match="found no NVIDIA GPU"):
        NvmlSampler(fake).open()
    assert fake.shutdowns == 1  # a failed open releases NVML


def test_gpu_lost_while_sampling() -> None:
    with NvmlSampler(FakeNvml(two_gpus(lost_after_reads=1)), [0]) as sampler:
        sampler.sample()
        with pytest.raises(SamplerUnavailableError, match="GPU 0 stopped answering"):
            sampler.sample()


def test_sample_before_open() -> None:
    with pytest.raises(SamplerUnavailableError, match="not open"):
        NvmlSampler(FakeNvml()).sample()


def test_fake_spec_parsing(tmp_path: Any) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{"devices": [{"used_bytes": 5}]}')
    assert load_fake_spec(str(path)) == {"devices": [{"used_bytes": 5}]}
    assert load_fake_spec('{"error": "DRIVER_NOT_LOADED"}') == {"error": "DRIVER_NOT_LOADED"}
    with pytest.raises(ConfigError, match="not JSON"):
        load_fake_spec("{nope")
    with pytest.raises(ConfigError, match="cannot read"):
        load_fake_spec(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="unknown NVML error name"):
        nvml_error("NOPE")
