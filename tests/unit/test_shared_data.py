"""The real public traces are optional beside a user's clone and required in CI (OOMLOAD_REQUIRE_SHARED)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharedtraces import FIXTURES, REQUIRE_SHARED_ENV, shared_traces_missing


def test_missing_traces_are_a_skip_that_names_the_data_and_where_it_is_published(tmp_path: Path) -> None:
    reason = shared_traces_missing(tmp_path / "shared", {})
    assert reason is not None
    for name in ("azure_code_2023.csv", "Azure/AzurePublicDataset", "kvcache-ai/Mooncake", "mooncake"):
        assert name in reason
    assert shared_traces_missing(tmp_path / "shared", {REQUIRE_SHARED_ENV: "0"}) == reason


def test_ci_turns_the_skip_into_a_failure(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=REQUIRE_SHARED_ENV):
        shared_traces_missing(tmp_path / "shared", {REQUIRE_SHARED_ENV: "1"})


def test_present_traces_are_used(tmp_path: Path) -> None:
    (tmp_path / "shared" / "traces").mkdir(parents=True)
    assert shared_traces_missing(tmp_path / "shared", {REQUIRE_SHARED_ENV: "1"}) is None


def test_ci_requires_the_traces() -> None:
    script = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert f"export {REQUIRE_SHARED_ENV}=1" in script


def test_no_test_reads_the_reference_folder_beside_the_clone() -> None:
    """The real vLLM captures are committed fixtures; only the public traces may come from ../shared."""
    tests = Path(__file__).resolve().parents[1]
    offenders = [
        str(p.relative_to(tests))
        for p in tests.rglob("*.py")
        if p.name != Path(__file__).name and '/ "reference" /' in p.read_text(encoding="utf-8")
    ]
    assert offenders == []
    assert (FIXTURES / "vllm-metrics.txt").is_file() and (FIXTURES / "regenerate.py").is_file()
