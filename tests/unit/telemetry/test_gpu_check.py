"""``bench/gpu_check.py``'s verdict logic (the GPU part runs only on a GPU machine: ``make gpu-check``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"
MIB = 1024 * 1024
GIB = 1024 * MIB


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_check = load_script()


def lines(used: int, processes: list[dict[str, Any]] | None, n: int = 5) -> list[dict[str, Any]]:
    return [{"device": 0, "t_unix_s": float(i), "used_bytes": used, "processes": processes} for i in range(n)]


def verdict(
    baseline: list[dict[str, Any]], allocated: list[dict[str, Any]], freed: list[dict[str, Any]]
) -> dict[str, bool]:
    checks = gpu_check.evaluate(
        baseline, allocated, freed, alloc_bytes=2 * GIB, tolerance_bytes=64 * MIB, pid=42
    )
    return {c.name: c.ok for c in checks}


def test_pass_when_the_sampler_sees_the_allocation() -> None:
    base = 500 * MIB
    result = verdict(
        lines(base, [{"pid": 42, "used_bytes": 300 * MIB}]),
        lines(base + 2 * GIB + 2 * MIB, [{"pid": 42, "used_bytes": 300 * MIB + 2 * GIB}]),
        lines(base + MIB, [{"pid": 42, "used_bytes": 300 * MIB}]),
    )
    assert result == {"rise": True, "drop": True, "process": True}


def test_fail_when_the_rise_is_off() -> None:
    base = 500 * MIB
    result = verdict(lines(base, []), lines(base + GIB, [{"pid": 42, "used_bytes": GIB}]), lines(base, []))
    assert result["rise"] is False
    assert result["process"] is False  # the process holds less than the allocation


def test_fail_when_memory_is_not_released() -> None:
    base = 500 * MIB
    procs = [{"pid": 42, "used_bytes": 2 * GIB}]
    result = verdict(lines(base, []), lines(base + 2 * GIB, procs), lines(base + 2 * GIB, procs))
    assert result == {"rise": True, "drop": False, "process": True}


def test_container_pid_namespace_matches_by_growth() -> None:
    base = 500 * MIB
    result = verdict(
        lines(base, [{"pid": 90001, "used_bytes": 300 * MIB}]),
        lines(base + 2 * GIB, [{"pid": 90001, "used_bytes": 300 * MIB + 2 * GIB}]),
        lines(base, []),
    )
    assert result["process"] is True
    other = verdict(
        lines(base, []), lines(base + 2 * GIB, [{"pid": 7, "used_bytes": 10 * MIB}]), lines(base, [])
    )
    assert other["process"] is False


def test_process_list_unavailable_is_not_a_failure() -> None:
    base = 500 * MIB
    assert verdict(lines(base, None), lines(base + 2 * GIB, None), lines(base, None))["process"] is True


def test_missing_samples_fail() -> None:
    assert verdict([], lines(1, []), lines(1, [])) == {"samples": False}


def test_without_torch_exit_2_with_a_sentence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    assert gpu_check.main([]) == 2
    assert capsys.readouterr().out == (
        "gpu-check: cannot run: PyTorch is not installed (it allocates the known amount of GPU memory)\n"
    )
