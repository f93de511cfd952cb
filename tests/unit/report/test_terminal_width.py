"""The per-step table fits an 80-column CI log without truncating any cell."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from runbuilder import CPU_CACHE, cpu_knee_steps, write_run

from oomload.report.terminal import step_table
from oomload.verdict import build_verdict
from oomload.verdict.runview import load_run


def _render(run: Path) -> str:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(step_table(build_verdict(load_run(run))))
    return out.getvalue()


def test_step_table_fits_80_columns_with_device_memory_in_gib(tmp_path: Path) -> None:
    text = _render(write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE))
    assert "…" not in text
    assert "dev GiB" in text and " GiB" not in text.replace("dev GiB", "")
    assert "cncl" not in text.splitlines()[2]  # nothing was cancelled: no empty column


def test_no_device_column_without_gpu_samples(tmp_path: Path) -> None:
    text = _render(write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE, gpu=False))
    assert "dev GiB" not in text and "…" not in text
