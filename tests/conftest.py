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


class _PollingEvent:
    """``threading.Event`` on the original (unpatched) ``time.sleep``: set by a real thread, waited on
    by a process that gevent has monkey-patched since (see ``pytest_runtest_logfinish``)."""

    def __init__(self, is_set: bool) -> None:
        from gevent import monkey

        self._flag = is_set
        self._sleep = monkey.get_original("time", "sleep")

    def set(self) -> None:
        self._flag = True

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        waited_s = 0.0
        while not self._flag and (timeout is None or waited_s < timeout):
            self._sleep(0.002)
            waited_s += 0.002
        return self._flag


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Keep a pytest-xdist worker alive once a test has imported Locust in this process.

    ``import locust`` monkey-patches the whole process with gevent (``oomload.run.runner`` does it
    before any socket is made, so an in-process ``oomload replay`` does too). In a serial run the
    rest of the session simply runs patched. In an xdist worker, the test loop waits for its next
    test on a ``threading.Event`` that xdist's real receiver thread sets; once patched, that wait is
    a gevent one that no real thread can wake ("LoopExit: This operation would block forever"). So,
    the first time the worker finds itself patched, its test queue's event becomes one that polls
    with the original ``time.sleep``: the worker goes on exactly as a serial run would.
    """
    import sys

    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return
    for plugin in _xdist_worker_plugins():
        queue = plugin.torun
        if not isinstance(queue._has_items_event, _PollingEvent):
            queue._has_items_event = _PollingEvent(queue._has_items_event.is_set())


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG.append(config)


def _xdist_worker_plugins() -> list[Any]:
    """xdist's ``WorkerInteractor`` when this process is an xdist worker (else none). Found by its
    test queue: xdist runs ``xdist.remote`` in the worker as execnet's ``__channelexec__`` source, so
    its class is not the importable ``xdist.remote.WorkerInteractor``."""
    if not _CONFIG or not hasattr(_CONFIG[0], "workerinput"):
        return []
    return [p for p in _CONFIG[0].pluginmanager.get_plugins() if hasattr(p, "torun")]
