"""A fake NVML with the same interface as ``pynvml`` — a test double, not a user feature.

It drives the NVML sampler's tests, ``oomload sample`` in tests (passed to
``oomload.cli.sample.run`` as ``nvml``, see ``tests/fakesampler.py``) and the telemetry benchmark on
machines without a GPU. Errors are the real ``pynvml.NVMLError`` subclasses (``pynvml.NVMLError(code)``
builds them), so the sampler's error mapping is exercised for real.

Spec (a JSON object, or the path of a JSON file; ``load_fake_spec``)::

    {"error": "LIBRARY_NOT_FOUND",          # nvmlInit raises NVML_ERROR_<error>
     "devices": [{"name": "Fake H100", "total_bytes": 85899345920, "used_bytes": 1073741824,
                  "used_step_bytes": 0,      # used memory grows by this much per memory read
                  "util_pct": 12,            # or "util_error": "NOT_SUPPORTED"
                  "processes": [{"pid": 4242, "used_bytes": 1073741824}],
                  "processes_error": null,   # e.g. "NOT_SUPPORTED"
                  "lost_after_reads": null}]}  # memory reads before NVML_ERROR_GPU_IS_LOST

With no ``devices``, one 80 GiB device with 1 GiB used and no processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from oomload.errors import ConfigError

GIB = 1024**3


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None


def nvml_error(name: str) -> pynvml.NVMLError:
    """The real ``pynvml`` exception for ``NVML_ERROR_<name>`` (e.g. ``"DRIVER_NOT_LOADED"``)."""
    code = getattr(pynvml, f"NVML_ERROR_{name.upper()}", None)
    if not isinstance(code, int):
        raise ConfigError(f"unknown NVML error name {name!r} (e.g. LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED)")
    error: pynvml.NVMLError = pynvml.NVMLError(code)
    return error


def load_fake_spec(spec: str) -> dict[str, Any]:
    """A spec given as JSON text or as the path of a JSON file."""
    text = spec if spec.lstrip().startswith("{") else _read(spec)
    try:
        obj = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"the fake NVML spec is not JSON: {err}") from err
    if not isinstance(obj, dict):
        raise ConfigError("the fake NVML spec must be a JSON object")
    return obj


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read the fake NVML spec {path}: {err.strerror}") from err


class FakeNvml:
    """Implements ``oomload.telemetry.nvml.NvmlLibrary`` from a spec (see the module docstring)."""

    def __init__(self, spec: dict[str, Any] | None = None) -> None:
        spec = spec or {}
        self._error = spec.get("error")
        devices = spec.get("devices")
        self.devices: list[dict[str, Any]] = (
            [dict(d) for d in devices]
            if devices
            else [{"name": "Fake GPU", "total_bytes": 80 * GIB, "used_bytes": GIB, "processes": []}]
        )
        self._reads = [0] * len(self.devices)
        self.initialized = False
        self.shutdowns = 0

    # -- NvmlLibrary ----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self._error:
            raise nvml_error(str(self._error))
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._require_init()
        self.initialized = False
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._require_init()
        if not 0 <= index < len(self.devices):
            raise nvml_error("INVALID_ARGUMENT")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._device(handle).get("name", "Fake GPU"))

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-fake-{handle:04d}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        device = self._device(handle)
        lost_after = device.get("lost_after_reads")
        if lost_after is not None and self._reads[handle] >= int(lost_after):
            raise nvml_error("GPU_IS_LOST")
        used = int(device.get("used_bytes", 0)) + self._reads[handle] * int(device.get("used_step_bytes", 0))
        self._reads[handle] += 1
        total = int(device.get("total_bytes", 80 * GIB))
        used = min(used, total)
        return _Memory(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Utilization:
        device = self._device(handle)
        if device.get("util_error"):
            raise nvml_error(str(device["util_error"]))
        return _Utilization(gpu=int(device.get("util_pct", 0)), memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Process]:
        device = self._device(handle)
        if device.get("processes_error"):
            raise nvml_error(str(device["processes_error"]))
        return [_Process(int(p["pid"]), p.get("used_bytes")) for p in device.get("processes", [])]

    # -- helpers --------------------------------------------------------------------------------
    def _require_init(self) -> None:
        if not self.initialized:
            raise nvml_error("UNINITIALIZED")

    def _device(self, handle: int) -> dict[str, Any]:
        self._require_init()
        if not 0 <= handle < len(self.devices):
            raise nvml_error("INVALID_ARGUMENT")
        return self.devices[handle]
