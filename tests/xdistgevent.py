"""pytest-xdist workers that Locust has monkey-patched with gevent keep running their tests.

``import locust`` monkey-patches the whole process with gevent (``oomload.run.runner`` does it before
any socket is made, so an in-process ``oomload replay`` does too). In a serial run the rest of the
session simply runs patched. In an xdist worker, the test loop waits for its next test on a
``threading.Event`` that xdist's receiver thread (a real thread, started before the patch) sets; once
the process is patched, that wait is a gevent one that no real thread can wake ("LoopExit: This
operation would block forever": the worker crashes). So, the first time a worker finds itself
patched after its collection (a test module that imports Locust at its top) or after a test, its test
queue's event becomes one that polls with the original ``time.sleep``, and the worker goes on exactly
as a serial run would. Loaded by ``tests/conftest.py``; a plugin of its own (``-p xdistgevent``) so
that ``tests/unit/test_xdist_gevent.py`` can load it in a fresh run.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest


class _PollingEvent:
    """``threading.Event`` on the original (unpatched) ``time.sleep``: set by a real thread, waited on
    by a process that gevent has monkey-patched since."""

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


def pytest_collection_finish(session: pytest.Session) -> None:
    """After collection: a test module that imports Locust at its top patched the worker before its
    first test (``make test`` once crashed so, no test run)."""
    _poll_if_patched()


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """After each test: a worker that is patched now waits for its next test on a ``_PollingEvent``."""
    _poll_if_patched()


def _poll_if_patched() -> None:
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
