"""The worker link against hostile peers written with Locust's own protocol (tests/rogue.py).

* A rogue master that names ``AWS_SECRET_ACCESS_KEY`` and its own URL: without the worker token the
  worker refuses at the handshake; with the token but a URL the worker was not told to trust it
  refuses the configuration; with a trusted URL it loads it with its *own* key. In no case does the
  secret reach the rogue's HTTP server (which records every ``Authorization`` header).
* A stranger on a real master's port that never authenticates: its forged engine-death rows,
  Locust messages in its own and another's name, undecodable frames and a guessed proof are
  dropped and counted (``link_rejected`` events); the run completes, its verdict unaffected.

The right-token path is tests/integration/test_distributed.py. Assertions are on exit codes, rows,
headers and events, never on timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from onsetload import SIM, fixed_trace, free_port
from oomload.rundir import RunReader

REPO = Path(__file__).resolve().parents[2]
ROGUE = REPO / "tests" / "rogue.py"
AWS_SECRET = "aws-secret-never-to-leave-this-host-0815"
OWN_KEY = "sk-worker-own-key-4711"
TOKEN = "oomload-test-worker-token-4711-abcdefghijklmnopqrstuvwxyz"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OOMLOAD_WORKER_TOKEN"}
    return {**env, "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "OPENAI_API_KEY": OWN_KEY, **extra}


def _against_rogue_master(tmp_path: Path, mode: str, trusted: str | None) -> tuple[Any, str, list[str]]:
    """Run a real ``oomload worker`` against the rogue master; returns (worker, its output, headers)."""
    port, http_port = free_port(), free_port()
    headers = tmp_path / "headers.txt"
    rogue_env = _env(OOMLOAD_WORKER_TOKEN=TOKEN) if mode == "token" else _env()
    rogue = subprocess.Popen(
        [sys.executable, str(ROGUE), "master", str(port), str(http_port), str(headers), mode],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=rogue_env, cwd=REPO,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not headers.exists():  # the rogue is listening once it made the file
            assert rogue.poll() is None, rogue.communicate()[0]
            assert time.monotonic() < deadline, "the rogue master did not start within 30 s"
            time.sleep(0.1)
        url = trusted or f"http://127.0.0.1:{http_port}"
        worker = subprocess.run(
            [sys.executable, "-m", "oomload", "worker", "--master", f"127.0.0.1:{port}",
             "--connect-timeout-s", "20", "--url", url],
            capture_output=True, text=True, timeout=90, env=_env(OOMLOAD_WORKER_TOKEN=TOKEN), cwd=REPO,
        )  # fmt: skip
    finally:
        if rogue.poll() is None:
            rogue.kill()
        rogue.communicate(timeout=30)
    return worker, worker.stdout + worker.stderr, headers.read_text().splitlines()


@pytest.mark.slow
def test_a_rogue_master_without_the_token_is_refused_and_gets_no_secret(tmp_path: Path) -> None:
    worker, out, headers = _against_rogue_master(tmp_path, "guess", None)
    assert worker.returncode == 2, out
    assert "Traceback" not in out
    assert "did not prove that it holds this worker's token" in worker.stderr, out
    assert headers == []  # not one request reached the rogue's server
    assert AWS_SECRET not in out and TOKEN not in out


@pytest.mark.slow
def test_a_master_with_the_token_but_an_untrusted_url_is_refused(tmp_path: Path) -> None:
    worker, out, headers = _against_rogue_master(tmp_path, "token", "http://127.0.0.1:9")
    assert worker.returncode == 2, out
    assert "Traceback" not in out
    error = [line for line in worker.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "which it was not told to trust" in error[0], out
    assert headers == []
    assert AWS_SECRET not in out and TOKEN not in out


@pytest.mark.slow
def test_the_worker_sends_its_own_key_never_the_variable_the_master_names(tmp_path: Path) -> None:
    _worker, out, headers = _against_rogue_master(tmp_path, "token", None)
    assert "Traceback" not in out
    assert headers, f"the worker sent no request to its trusted URL: {out}"
    assert set(headers) == {f"Bearer {OWN_KEY}"}
    assert AWS_SECRET not in out and TOKEN not in out


@pytest.mark.slow
def test_a_stranger_on_the_worker_port_is_dropped_counted_and_changes_nothing(tmp_path: Path) -> None:
    trace = fixed_trace(tmp_path / "t.jsonl")
    port, run_dir = free_port(), tmp_path / "run"
    cmd = [
        sys.executable, "-m", "oomload", "replay", str(trace), "--sim", SIM,
        "--concurrency", "2,3", "--hold-s", "3", "--stop-on", "never", "--no-refine", "--gpu", "none",
        "--no-live", "--max-duration-s", "60", "--run-dir", str(run_dir), "--processes", "1",
        "--workers", "1", "--master-bind-port", str(port),
    ]  # fmt: skip
    master = subprocess.Popen(  # its local worker gets this token through its environment
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env=_env(OOMLOAD_WORKER_TOKEN=TOKEN),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        steps = run_dir / "steps.jsonl"
        while not (steps.exists() and steps.read_text().strip()):  # the load has begun
            assert master.poll() is None, master.communicate()
            assert time.monotonic() < deadline, "the run did not begin within 60 s"
            time.sleep(0.1)
        rogue = subprocess.run(
            [sys.executable, str(ROGUE), "worker", str(port)],
            capture_output=True, text=True, timeout=60, env=_env(), cwd=REPO,
        )  # fmt: skip
        assert rogue.returncode == 0, rogue.stdout + rogue.stderr
        out, err = master.communicate(timeout=120)
    finally:
        if master.poll() is None:
            master.kill()
            master.communicate()
    assert master.returncode == 0, out[-3000:] + err[-3000:]
    assert "Traceback" not in out + err
    status = RunReader(run_dir).status()
    assert status is not None and status["end_reason"] == "completed"
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert rows and not [r for r in rows if r["request_id"].startswith("forged")]
    assert not [r for r in rows if r["outcome"] == "engine_dead"]
    verdict = json.loads((run_dir / "summary.json").read_text())["verdict"]
    assert verdict["onsets"]["engine_death"] is None
    events = list(RunReader(run_dir).stream("events"))
    assert not [e for e in events if e["kind"] == "worker_lost"]
    first = {e["reason"] for e in events if e["kind"] == "link_rejected"}
    assert {"unauthenticated", "malformed", "forged_sender", "bad_token"} <= first, events
    totals = [e["counts"] for e in events if e["kind"] == "link_rejected_total"]
    assert len(totals) == 1, events
    assert totals[0]["unauthenticated"] >= 4 and totals[0]["malformed"] >= 2, totals
    assert "dropped a message on the worker port" in out and "[yellow]" not in out  # markup read, not shown
    assert "messages dropped on the worker port (" in (run_dir / "report.html").read_text()
    assert TOKEN not in out + err
    for path in run_dir.rglob("*"):  # config.json, events.jsonl, worker.0.log, …
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_token_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    proc = subprocess.run(
        [sys.executable, "-m", "oomload", "worker", "--master", "127.0.0.1:1", "--url",
         "http://127.0.0.1:8000", "--token-file", str(path)],
        capture_output=True, text=True, timeout=60, env=_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"chmod 600 {path}" in proc.stderr and TOKEN not in proc.stdout + proc.stderr
