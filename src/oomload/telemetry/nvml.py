"""The NVML sampler: device memory, utilization and per-process memory through ``pynvml``.

``NvmlSampler`` talks to NVML only through the ``NvmlLibrary`` protocol — the handful of
``pynvml`` functions it calls — so the real module (``import pynvml``) and the fake in
``oomload.telemetry.fake_nvml`` plug in the same way. NVML calls block, so this module is meant to
run in its own process (``oomload sample``; ``oomload.telemetry.gpu.GpuSamplerProcess`` spawns it),
never inside Locust's gevent loop.

Every way NVML can be unusable becomes ONE sentence in a ``SamplerUnavailableError``
(``describe_nvml_error``): no driver library (no GPU here), driver not loaded, driver/library version
mismatch, no permission, no GPU found, a device index out of range. During sampling, utilization or
the process list that a device will not report (MIG, some containers) become ``null`` instead of
failing the sample; a device that stops answering (fell off the bus) raises the same kind of error.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from oomload.errors import SamplerUnavailableError
from oomload.telemetry.gpu_sample import GpuSample, ProcessMemory


class NvmlLibrary(Protocol):
    """The subset of ``pynvml`` the sampler uses (the real module satisfies it as is)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Any: ...


def load_pynvml() -> NvmlLibrary:
    """The real bindings, or one sentence saying they are not installed."""
    try:
        import pynvml
    except ImportError as err:
        raise SamplerUnavailableError(
            "the NVML bindings are not installed (pip install nvidia-ml-py)"
        ) from err
    library: NvmlLibrary = pynvml
    return library


def describe_nvml_error(err: Exception, *, device: int | None = None, device_count: int | None = None) -> str:
    """One sentence for an ``pynvml.NVMLError`` (by its ``value`` code), naming what to check."""
    import pynvml

    code = getattr(err, "value", None)
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return (
            "no NVIDIA GPU can be sampled here: the NVML library (libnvidia-ml.so) was not found, "
            "so there is no NVIDIA driver on this machine"
        )
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return (
            "no NVIDIA GPU can be sampled here: the NVIDIA driver is not loaded "
            "(NVML_ERROR_DRIVER_NOT_LOADED)"
        )
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return (
            "the NVIDIA driver and its NVML library have different versions (driver/library mismatch, "
            "usually a driver upgrade without a reboot)"
        )
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return "NVML refused access to the GPU (no permission): run as a user allowed to query the GPU"
    if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
        return "the NVIDIA driver is too old for these NVML bindings (NVML_ERROR_FUNCTION_NOT_FOUND)"
    if code == pynvml.NVML_ERROR_INVALID_ARGUMENT and device is not None:
        return _out_of_range(device, device_count)
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        which = "a GPU" if device is None else f"GPU {device}"
        return f"{which} stopped answering NVML (NVML_ERROR_GPU_IS_LOST: it fell off the bus)"
    where = "" if device is None else f" on GPU {device}"
    return f"NVML failed{where}: {err} (NVML error code {code})"


def _out_of_range(device: int, device_count: int | None) -> str:
    if device_count is None:
        return f"GPU index {device} is out of range on this machine"
    allowed = "none" if device_count == 0 else f"0–{device_count - 1}" if device_count > 1 else "0"
    return f"GPU index {device} is out of range: this machine has {device_count} GPU(s) (allowed: {allowed})"


class NvmlSampler:
    """Samples the given devices (default: all) through an ``NvmlLibrary``; a ``GpuSource``."""

    def __init__(
        self,
        nvml: NvmlLibrary | None = None,
        devices: Sequence[int] | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml
        self._requested = None if devices is None else list(devices)
        self._clock = clock
        self._handles: list[tuple[int, Any]] = []
        self.names: dict[int, str] = {}
        self.uuids: dict[int, str] = {}
        self._opened = False

    @property
    def devices(self) -> list[int]:
        return [index for index, _ in self._handles]

    def open(self) -> None:
        """Initialize NVML and resolve the devices; any failure is one ``SamplerUnavailableError``."""
        if self._opened:
            return
        nvml = self._nvml if self._nvml is not None else load_pynvml()
        self._nvml = nvml
        import pynvml

        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise SamplerUnavailableError(describe_nvml_error(err)) from err
        self._opened = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            if count == 0:
                raise SamplerUnavailableError("NVML found no NVIDIA GPU on this machine")
            wanted = list(range(count)) if self._requested is None else self._requested
            for index in wanted:
                if index < 0 or index >= count:
                    raise SamplerUnavailableError(_out_of_range(index, count))
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                except pynvml.NVMLError as err:
                    raise SamplerUnavailableError(
                        describe_nvml_error(err, device=index, device_count=count)
                    ) from err
                self._handles.append((index, handle))
                self.names[index] = _text(_optional(nvml.nvmlDeviceGetName, handle)) or "NVIDIA GPU"
                self.uuids[index] = _text(_optional(nvml.nvmlDeviceGetUUID, handle)) or ""
        except pynvml.NVMLError as err:
            self.close()
            raise SamplerUnavailableError(describe_nvml_error(err)) from err
        except SamplerUnavailableError:
            self.close()
            raise

    def sample(self) -> list[GpuSample]:
        """One ``GpuSample`` per device, stamped with ``clock()`` as the memory is read."""
        if not self._opened or self._nvml is None:
            raise SamplerUnavailableError("the NVML sampler is not open")
        import pynvml

        nvml = self._nvml
        samples: list[GpuSample] = []
        for index, handle in self._handles:
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                t_unix_s = self._clock()
            except pynvml.NVMLError as err:
                raise SamplerUnavailableError(describe_nvml_error(err, device=index)) from err
            utilization = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            processes = _optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
            samples.append(
                GpuSample(
                    t_unix_s=t_unix_s,
                    source="nvml",
                    device=index,
                    total_bytes=int(memory.total),
                    used_bytes=int(memory.used),
                    free_bytes=int(memory.free),
                    util_pct=None if utilization is None else float(utilization.gpu),
                    processes=None if processes is None else tuple(_process(p) for p in processes),
                    name=self.names.get(index),
                    uuid=self.uuids.get(index),
                )
            )
        return samples

    def close(self) -> None:
        if self._opened and self._nvml is not None:
            import pynvml

            with contextlib.suppress(pynvml.NVMLError):
                self._nvml.nvmlShutdown()
        self._opened = False
        self._handles = []

    def __enter__(self) -> NvmlSampler:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _optional(call: Callable[[Any], Any], handle: Any) -> Any:
    """``call(handle)``, or ``None`` when the device does not support it (MIG, containers)."""
    import pynvml

    try:
        return call(handle)
    except pynvml.NVMLError:
        return None


def _process(info: Any) -> ProcessMemory:
    used = getattr(info, "usedGpuMemory", None)
    # NVML reports "not available" as None (pynvml) or as the NVML_VALUE_NOT_AVAILABLE sentinel.
    if used is not None and (used < 0 or used >= 2**64 - 1):
        used = None
    return ProcessMemory(pid=int(info.pid), used_bytes=None if used is None else int(used))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
