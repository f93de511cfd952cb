"""Shared fixtures.

The real public traces live in ``../shared/traces`` beside the repository (CI puts them there; a
user's clone has none). Tests that need them skip with the data's name and where it is published;
``OOMLOAD_REQUIRE_SHARED=1`` (set by ``.ci/run``) turns that skip into a failure, so CI always runs
them. The real vLLM captures (``/metrics``, request logs) are committed under ``tests/fixtures`` and
made by ``tests/fixtures/regenerate.py`` with the project's real-vLLM harness.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from sharedtraces import FIXTURES, SHARED, shared_traces_missing

pytest_plugins = ("xdistgevent",)  # xdist workers that Locust monkey-patched keep running (make test's -n 2)

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


BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The OS's Chromium (``make test`` installs Debian's ``chromium``); the browser tests skip only
    when it is genuinely absent. Playwright drives it; its own browser download is never used."""
    import shutil

    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on PATH: `make test` installs it (apt-get install -y chromium)")


@pytest.fixture
def browser_page(chromium_path: str) -> Iterator[Any]:
    """A Playwright page in headless Chromium; ``page.oomload_errors`` collects console errors and
    uncaught exceptions from the page and its frames."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            page.oomload_errors = errors
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``tests/fixtures``: real vLLM captures made by ``tests/fixtures/regenerate.py`` (committed)."""
    return FIXTURES
