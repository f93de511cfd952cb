"""The per-step table fits an 80-column CI log without truncating any cell."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from oomload.outcome import Outcome
from oomload.report.terminal import step_table
from oomload.verdict import build_verdict
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, cpu_knee_steps, write_run


def _render(run: Path) -> str:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(step_table(build_verdict(load_run(run))))
    return out.getvalue()


def _header(text: str) -> str:
    return next(line for line in text.splitlines() if line.lstrip().startswith("step "))


def test_step_table_fits_80_columns_with_device_memory_in_gib(tmp_path: Path) -> None:
    text = _render(write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE))
    assert "…" not in text
    assert "dev GiB" in text and " GiB" not in text.replace("dev GiB", "")
    assert "cncl" not in _header(text)  # nothing was cancelled: no empty column


def test_no_device_column_without_gpu_samples(tmp_path: Path) -> None:
    text = _render(write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE, gpu=False))
    assert "dev GiB" not in text and "…" not in text


def test_every_column_at_once_still_fits_80_columns(tmp_path: Path) -> None:
    # cancelled requests, vLLM's own running count (srv) and device memory: the widest table there is,
    # with four-character cells in the narrow columns (22.0 preemptions per 100 requests, 16.0 held)
    steps = cpu_knee_steps()
    for step in steps:
        step.server_share = 0.9
        step.requests = 50
    steps[-1].failures = {Outcome.CANCELLED: 3}
    text = _render(write_run(tmp_path / "run", steps, cache_config=CPU_CACHE))
    header = _header(text)
    assert all(name in header for name in ("cncl", "/100", "held", "srv", "dev GiB")), header
    assert "…" not in text
    assert max(map(len, text.splitlines())) <= 80
