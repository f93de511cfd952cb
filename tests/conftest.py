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

# Hypothesis' per-example deadline is a timed assertion: on this shared 2-core machine (and beside a
# real vLLM in CI) an example can take over 200 ms for no reason of ours. Performance lives in bench/.
settings.register_profile("oomload", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("oomload")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = REPO / "tests" / "fixtures"
REQUIRE_SHARED_ENV = "OOMLOAD_REQUIRE_SHARED"
TRACES_MISSING = (
    "the real public traces are not beside this clone ({where}): azure_code_2023.csv is "
    "data/AzureLLMInferenceTrace_code.csv from github.com/Azure/AzurePublicDataset, "
    "mooncake_conversation_first10min.jsonl the first 10 minutes of "
    "FAST25-release/traces/conversation_trace.jsonl from github.com/kvcache-ai/Mooncake"
)


def shared_traces_missing(shared: Path, environ: dict[str, str] | os._Environ[str]) -> str | None:
    """Why the real traces cannot be used (None when they can); ``pytest.fail`` when CI requires them."""
    if (shared / "traces").is_dir():
        return None
    reason = TRACES_MISSING.format(where=shared / "traces")
    if environ.get(REQUIRE_SHARED_ENV, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE_SHARED_ENV} is set and {reason}", pytrace=False)
    return reason


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
