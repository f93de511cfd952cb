"""Shared fixtures. Paths to the real public traces live in ``../shared/traces`` beside the repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
