"""Shared fixtures. Paths to the real public traces live in ``../shared/traces`` beside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` (read-only reference material and real traces). Its absence is a setup error."""
    if not SHARED.is_dir():
        raise RuntimeError(f"{SHARED} is missing: the tests read the real traces from ../shared/traces")
    return SHARED
