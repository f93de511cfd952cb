"""Shared fixtures.

The real public traces live in ``../shared/traces`` beside the repository (CI puts them there; a
user's clone has none). Tests that need them skip with the data's name and where it is published;
``OOMLOAD_REQUIRE_SHARED=1`` (set by ``.ci/run``) turns that skip into a failure, so CI always runs
them. The real vLLM captures (``/metrics``, request logs) are committed under ``tests/fixtures`` and
made by ``tests/fixtures/regenerate.py`` with the project's real-vLLM harness.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from sharedtraces import FIXTURES, SHARED, shared_traces_missing

# Hypothesis' per-example deadline is a timed assertion: on this shared 2-core machine (and beside a
# real vLLM in CI) an example can take over 200 ms for no reason of ours. Performance lives in bench/.
settings.register_profile("oomload", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("oomload")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` with the real public traces; the test skips without them (fails in CI)."""
    reason = shared_traces_missing(SHARED, os.environ)
    if reason is not None:
        pytest.skip(reason)
    return SHARED


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``tests/fixtures``: real vLLM captures made by ``tests/fixtures/regenerate.py`` (committed)."""
    return FIXTURES
