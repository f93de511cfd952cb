"""Where the tests find the real public traces beside the clone, and what happens when they are not there.

Imported by ``tests/conftest.py`` and by the test of this rule (``tests/unit/test_shared_data.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

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


def shared_traces_missing(shared: Path, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the real traces cannot be used (None when they can); ``pytest.fail`` when CI requires them."""
    if (shared / "traces").is_dir():
        return None
    reason = TRACES_MISSING.format(where=shared / "traces")
    if environ.get(REQUIRE_SHARED_ENV, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE_SHARED_ENV} is set and {reason}", pytrace=False)
    return reason
