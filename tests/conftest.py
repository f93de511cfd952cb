"""Shared fixtures. Paths to the real public traces live in ``../shared/traces`` beside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis' per-example deadline is a timed assertion: on this shared 2-core machine (and beside a
# real vLLM in CI) an example can take over 200 ms for no reason of ours. Performance lives in bench/.
settings.register_profile("oomload", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("oomload")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` (read-only reference material and real traces). Its absence is a setup error."""
    if not SHARED.is_dir():
        raise RuntimeError(f"{SHARED} is missing: the tests read the real traces from ../shared/traces")
    return SHARED
