"""GPU memory in DCGM's Prometheus form: read it (a DCGM exporter, ``oomload sample --serve``) and write it.

Clusters already expose GPU memory through NVIDIA's DCGM exporter (default port 9400)::

    DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-…",modelName="NVIDIA H100 80GB HBM3",Hostname="n1",…} 61234
    DCGM_FI_DEV_FB_FREE{gpu="0",…} 19844

in MiB, one series per GPU (``gpu`` = device index). ``parse_dcgm_metrics`` (pure) turns such text into
``GpuSample`` values: total = ``DCGM_FI_DEV_FB_TOTAL`` when exported, else used + free (+
``DCGM_FI_DEV_FB_RESERVED``); utilization from ``DCGM_FI_DEV_GPU_UTIL``; no per-process memory
(``processes: null``, DCGM does not export it).

``oomload sample --serve`` writes the same DCGM names (``render_dcgm_text``) so that one reader
serves both, and adds exact values the MiB gauges cannot carry: ``oomload_gpu_{total,used,free}_bytes``,
``oomload_gpu_process_count`` and ``oomload_gpu_process_used_bytes{gpu,pid}``. When those are there,
the reader uses them and labels the samples ``source: "remote"``; otherwise ``"dcgm"``.

``DcgmReader`` fetches such an endpoint (a ``GpuSource``); samples are stamped with the local clock
when the answer arrives, so they share the clock of the load steps even when the GPU host's clock
differs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from oomload.errors import OomloadError, SamplerUnavailableError
from oomload.telemetry.gpu_sample import GpuSample, ProcessMemory
from oomload.telemetry.scrape import fetch_text

MIB = 1024 * 1024
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
EXACT_PREFIX = "oomload_gpu_"


def parse_dcgm_metrics(
    text: str, *, t_unix_s: float, devices: Sequence[int] | None = None
) -> list[GpuSample]:
    """DCGM-form Prometheus text → one ``GpuSample`` per GPU (sorted by index, filtered by ``devices``)."""
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as err:
        raise SamplerUnavailableError(
            f"the GPU metrics endpoint did not answer Prometheus text ({err})"
        ) from err
    values: dict[str, dict[int, float]] = {}
    processes: dict[int, list[ProcessMemory]] = {}
    names: dict[int, str] = {}
    uuids: dict[int, str] = {}
    for family in families:
        for sample in family.samples:
            labels = sample.labels
            index = _gpu_index(labels)
            if index is None:
                continue
            if sample.name == "oomload_gpu_process_used_bytes":
                processes.setdefault(index, []).append(
                    ProcessMemory(pid=int(labels.get("pid", "0")), used_bytes=_optional_int(sample.value))
                )
                continue
            values.setdefault(sample.name, {}).setdefault(index, float(sample.value))
            if "modelName" in labels:
                names.setdefault(index, labels["modelName"])
            if "UUID" in labels:
                uuids.setdefault(index, labels["UUID"])
    used_mib = values.get(FB_USED, {})
    if not used_mib:
        raise SamplerUnavailableError(
            f"the GPU metrics endpoint has no {FB_USED} series: it is not a DCGM exporter "
            "or an `oomload sample --serve` endpoint"
        )
    exact = f"{EXACT_PREFIX}used_bytes" in values
    wanted = sorted(used_mib) if devices is None else list(devices)
    missing = [d for d in wanted if d not in used_mib]
    if missing:
        present = ", ".join(str(d) for d in sorted(used_mib))
        raise SamplerUnavailableError(
            f"GPU index {missing[0]} is not at the GPU metrics endpoint (GPUs there: {present})"
        )
    samples: list[GpuSample] = []
    for index in wanted:
        if exact and index in values.get(f"{EXACT_PREFIX}used_bytes", {}):
            used = int(values[f"{EXACT_PREFIX}used_bytes"][index])
            free = int(values.get(f"{EXACT_PREFIX}free_bytes", {}).get(index, 0.0))
            total = int(values.get(f"{EXACT_PREFIX}total_bytes", {}).get(index, float(used + free)))
            known = index in values.get(f"{EXACT_PREFIX}process_count", {})
            procs: tuple[ProcessMemory, ...] | None = tuple(processes.get(index, [])) if known else None
            source = "remote"
        else:
            used = round(used_mib[index] * MIB)
            free = round(values.get(FB_FREE, {}).get(index, 0.0) * MIB)
            reserved = round(values.get(FB_RESERVED, {}).get(index, 0.0) * MIB)
            total_mib = values.get(FB_TOTAL, {}).get(index)
            total = round(total_mib * MIB) if total_mib is not None else used + free + reserved
            procs = None
            source = "dcgm"
        util = values.get(GPU_UTIL, {}).get(index)
        samples.append(
            GpuSample(
                t_unix_s=t_unix_s,
                source=source,
                device=index,
                total_bytes=total,
                used_bytes=used,
                free_bytes=free,
                util_pct=util,
                processes=procs,
                name=names.get(index),
                uuid=uuids.get(index),
            )
        )
    return samples


def render_dcgm_text(samples: Iterable[GpuSample], *, hostname: str = "") -> str:
    """Prometheus text with DCGM's names (MiB) plus oomload's exact-byte and per-process series."""
    rows = list(samples)
    lines: list[str] = []

    def family(name: str, help_text: str, values: Iterable[tuple[dict[str, str], float | int]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in values:
            lines.append(f"{name}{{{_labels(labels)}}} {_number(value)}")

    def base(s: GpuSample) -> dict[str, str]:
        labels = {"gpu": str(s.device), "UUID": s.uuid or "", "modelName": s.name or ""}
        if hostname:
            labels["Hostname"] = hostname
        return labels

    family(FB_USED, "Framebuffer memory used (in MiB).", ((base(s), s.used_bytes / MIB) for s in rows))
    family(FB_FREE, "Framebuffer memory free (in MiB).", ((base(s), s.free_bytes / MIB) for s in rows))
    family(FB_TOTAL, "Framebuffer memory total (in MiB).", ((base(s), s.total_bytes / MIB) for s in rows))
    family(
        GPU_UTIL,
        "GPU utilization (in %).",
        ((base(s), s.util_pct) for s in rows if s.util_pct is not None),
    )
    family(f"{EXACT_PREFIX}used_bytes", "GPU memory used, bytes.", ((base(s), s.used_bytes) for s in rows))
    family(f"{EXACT_PREFIX}free_bytes", "GPU memory free, bytes.", ((base(s), s.free_bytes) for s in rows))
    family(f"{EXACT_PREFIX}total_bytes", "GPU memory total, bytes.", ((base(s), s.total_bytes) for s in rows))
    family(
        f"{EXACT_PREFIX}process_count",
        "Compute processes on the GPU (absent when NVML cannot tell).",
        ((base(s), len(s.processes)) for s in rows if s.processes is not None),
    )
    family(
        f"{EXACT_PREFIX}process_used_bytes",
        "GPU memory held by one compute process, bytes (NaN when NVML cannot tell).",
        (
            (
                {"gpu": str(s.device), "pid": str(p.pid)},
                float("nan") if p.used_bytes is None else p.used_bytes,
            )
            for s in rows
            for p in (s.processes or ())
        ),
    )
    family(
        f"{EXACT_PREFIX}sample_timestamp_seconds",
        "When the sample was taken (Unix seconds, the GPU host's clock).",
        ((base(s), s.t_unix_s) for s in rows),
    )
    return "\n".join(lines) + "\n"


class DcgmReader:
    """Reads GPU memory from a DCGM exporter or ``oomload sample --serve``; a ``GpuSource``."""

    def __init__(
        self,
        url: str,
        *,
        devices: Sequence[int] | None = None,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        fetch: Callable[[str, float], str] | None = None,
    ) -> None:
        self.url = dcgm_url(url)
        self._devices = None if devices is None else list(devices)
        self.timeout_s = timeout_s
        self._clock = clock
        self._fetch = fetch_text if fetch is None else fetch

    def open(self) -> None:
        """Read once: the endpoint must answer and carry ``DCGM_FI_DEV_FB_USED`` for the devices."""
        self.sample()

    def sample(self) -> list[GpuSample]:
        try:
            text = self._fetch(self.url, self.timeout_s)
        except OomloadError as err:
            raise SamplerUnavailableError(f"cannot read GPU memory: {err}") from err
        return parse_dcgm_metrics(text, t_unix_s=self._clock(), devices=self._devices)

    def close(self) -> None:
        return None


def dcgm_url(url: str) -> str:
    """``http://host:9400`` → ``http://host:9400/metrics``; a URL with a path is used as given."""
    scheme_sep = url.find("://")
    rest = url[scheme_sep + 3 :] if scheme_sep >= 0 else url
    if "/" not in rest.rstrip("/"):
        return url.rstrip("/") + "/metrics"
    return url


def _gpu_index(labels: dict[str, str]) -> int | None:
    raw = labels.get("gpu")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _optional_int(value: Any) -> int | None:
    number = float(value)
    return None if number != number else int(number)


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    return repr(float(value))
