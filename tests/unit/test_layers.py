"""The pure core must not import Locust, gevent or NVML (Locust monkey-patches the whole process)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

# Modules that form the pure core. Each one that exists must import without heavy I/O libraries.
CORE_MODULES = [
    "oomload.errors",
    "oomload.trace",
    "oomload.outcome",
    "oomload.rundir",
    "oomload.cli",
    "oomload.stats",
    "oomload.synth",
    "oomload.ingest.clocks",
    "oomload.schedule",
    "oomload.capacity",
    "oomload.verdict",
    "oomload.runview",
    "oomload.stepfacts",
    "oomload.death",
    "oomload.confidence",
    "oomload.prediction",
    "oomload.recommend",
    "oomload.gate",
    "oomload.sim.model",
    "oomload.sim.geometry",
    "oomload.sim.scheduler",
    "oomload.sim.tokenizer",
    "oomload.sim.planner",
    "oomload.telemetry.vllm_metrics",
    "oomload.telemetry.gpu_sample",
]
FORBIDDEN = ["locust", "gevent", "pynvml", "geventhttpclient"]


def test_core_does_not_import_locust_gevent_or_nvml() -> None:
    present = [m for m in CORE_MODULES if _exists(m)]
    assert "oomload.trace" in present
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in present)
        + f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core modules pulled in: {out.stdout.strip()}"


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
