"""``make test`` runs the suite on 2 pytest-xdist workers: one that a test patched with gevent (by
importing Locust in-process, as an in-process ``oomload replay`` does), or a test module at its
collection, still runs every test after it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
AFTER = 40  # tests that run after the patch, more than a worker is sent at once: it waits for some


def test_a_worker_that_locust_patched_runs_the_tests_after_it(tmp_path: Path) -> None:
    body = "def test_0_imports_locust():\n    import locust  # monkey-patches this worker with gevent\n"
    body += "".join(f"\n\ndef test_{i}_after():\n    pass\n" for i in range(1, AFTER + 1))
    (tmp_path / "test_patched.py").write_text(body)
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    _passes(tmp_path, AFTER + 2)


def test_a_worker_that_a_module_patched_at_collection_runs_its_tests(tmp_path: Path) -> None:
    """A test module that imports Locust at its top patches each worker that collects it, before any
    test: ``make test`` on a clean clone once crashed so ("LoopExit", no test run)."""
    body = "import locust  # noqa: F401  (monkey-patches the worker as it collects this module)\n"
    body += "".join(f"\n\ndef test_{i}():\n    pass\n" for i in range(AFTER))
    (tmp_path / "test_patched_at_collection.py").write_text(body)
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    _passes(tmp_path, AFTER + 1)


def _passes(tmp_path: Path, tests: int) -> None:
    argv = ["-q", "-p", "no:cacheprovider", "-p", "xdistgevent", "-n", "2", "--dist", "worksteal"]
    argv += ["-W", "ignore::gevent.monkey.MonkeyPatchWarning", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{tests} passed" in done.stdout
    assert "INTERNALERROR" not in done.stdout + done.stderr
