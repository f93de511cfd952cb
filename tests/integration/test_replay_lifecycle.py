"""How a replay's users start, step down, stop and fail — real Locust against the simulated vLLM.

* a refinement step that lowers the user count lets the stopped users finish their request (nothing
  is cancelled before the run's end);
* ``--web``: the Locust web UI carries the server's telemetry (the oomload tab, ``/oomload/telemetry``;
  the browser's view of it is tests/integration/test_webui_browser.py);
* a worker process that fails at start ends the run with one sentence, never a traceback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oomload.rundir import RunReader
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]
# 150 blocks of 16 tokens; requests of 32 + 600 tokens grow to 40 blocks: 3 fit, 4 and more preempt
# A generous grace: on a starved 2-core box the surplus 632-token requests may take over 3 s to drain,
# and a grace that runs out cancels them (what this test must not see). How long a settle may take —
# never past the grace, never longer than the drain — is pinned on a fake clock in
# tests/unit/load/test_shape.py; here only the order of events is checked (no wall-clock bound).
GRACE_S = 10.0
SIM_PREEMPTING = ("--num-gpu-blocks", "150", "--block-size", "16", "--max-model-len", "2048")


def _trace(path: Path, count: int, prompt: int, output: int) -> Path:
    records = [TraceRecord(f"r{i}", 0.0, prompt, output) for i in range(count)]
    write_trace(path, records, TraceHeader(format="test"))
    return path


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "oomload", "replay", *args, "--no-live"]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer((*SIM_PREEMPTING, "--time-scale", "0.05")) as server:
        yield server


@pytest.mark.slow
def test_a_lower_step_lets_the_stopped_users_finish_their_request(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", 40, 32, 600)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        _cmd(str(trace), "--url", sim.url, "--concurrency", "2,8", "--hold-s", "1", "--gpu", "none",
             "--stop-on", "first-preemption", "--ramp-down-grace-s", str(GRACE_S), "--run-dir", str(run_dir)),
        capture_output=True, text=True, timeout=90, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout  # no gate: 0, whatever the verdict
    reader = RunReader(run_dir)
    starts = [s for s in reader.stream("steps") if s["event"] == "start"]
    levels = [s["concurrency"] for s in starts]
    assert levels[:2] == [2, 8] and levels[2] < 8, levels  # the refinement stepped down
    results = reader.requests()
    last = starts[-1]["step"]
    by_step = Counter((r.step, r.outcome.value) for r in results)
    # users stopped by a lower step finished their request: no cancelled result before the last step
    assert [r for r in results if r.outcome.value == "cancelled" and r.step != last] == [], by_step
    assert all(by_step[(s["step"], "ok")] >= 1 for s in starts), by_step
    ends = [s for s in reader.stream("steps") if s["event"] == "end"]
    for end, start in zip(ends, starts[1:], strict=False):
        if start["concurrency"] > end["concurrency"]:
            assert start["t_unix_s"] == end["t_unix_s"]  # a step up starts at once
        else:  # a step down settles first: it starts once the requests in flight fell to its level
            assert start["t_unix_s"] >= end["t_unix_s"]
            settled = _first_time_at_most(results, end["t_unix_s"], start["concurrency"])
            assert start["t_unix_s"] >= settled, (start, end, settled)
    # a lower step begins once the surplus users are gone: it never has more in flight than its level
    assert [
        (e["step"], e["achieved_concurrency_max"])
        for e in ends
        if e["achieved_concurrency_max"] > e["concurrency"]
    ] == []
    # no request is sent between steps: each step's own request lines are counted when it ends
    sent = Counter(r.step for r in results)
    assert [e["started"] for e in ends] == [sent[e["step"]] for e in ends]


def _first_time_at_most(results: list[Any], after_s: float, level: int) -> float:
    """The first moment at or after ``after_s`` with at most ``level`` requests in flight."""
    for t in sorted({after_s, *(r.end_unix_s for r in results if r.end_unix_s > after_s)}):
        if sum(1 for r in results if r.start_unix_s <= t < r.end_unix_s) <= level:
            return t
    return after_s


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def sim_with_gpu() -> Iterator[SimServer]:
    """A simulated server that models a GPU, so its ``/dcgm/metrics`` reports device memory."""
    with SimServer(("--model", "tiny", "--gpu-memory-gib", "2", "--time-scale", "0.05")) as server:
        yield server


def test_the_web_ui_shows_the_servers_telemetry(sim_with_gpu: SimServer, tmp_path: Path) -> None:
    sim = sim_with_gpu
    trace = _trace(tmp_path / "t.jsonl", 20, 32, 400)
    port = _free_port()
    web = f"http://127.0.0.1:{port}"
    argv = _cmd(str(trace), "--url", sim.url, "--concurrency", "4", "--hold-s", "40", "--no-refine",
                "--web", "--web-port", str(port), "--gpu", f"dcgm:{sim.url}/dcgm/metrics",
                "--metrics-interval-s", "0.5", "--run-dir", str(tmp_path / "run"))  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    snapshot: dict[str, Any] = {}
    rows: list[dict[str, str]] = []
    page = ""
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                snapshot = _get_json(web + "/oomload/telemetry")
                stats = _get_json(web + "/stats/requests")
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.3)
                continue
            rows = next((e["data"] for e in stats.get("extended_stats", []) if e["key"] == "oomload"), [])
            metrics = snapshot.get("metrics") or {}
            if (metrics.get("num_requests_running") or 0) > 0 and snapshot.get("gpu"):
                with urllib.request.urlopen(web + "/oomload", timeout=5) as resp:
                    page = resp.read().decode()
                break
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    metrics = snapshot["metrics"]
    assert metrics["ok"] is True and 0 < metrics["kv_cache_usage"] <= 1
    assert metrics["num_requests_running"] > 0 and "num_requests_waiting" in metrics
    assert snapshot["step"]["concurrency"] == 4
    assert snapshot["preemptions_since_start"] is not None
    assert snapshot["gpu"]["used_bytes"] > 0 and snapshot["gpu"]["total_bytes"] > 0
    what = {r["what"]: r["value"] for r in rows}
    assert what["KV cache usage"].endswith("%") and what["GPU memory"].endswith("(dcgm)"), what
    assert {"running requests", "waiting requests", "preemptions since start"} <= set(what)
    # /oomload is the cockpit page: it draws what /oomload/telemetry and /oomload/timeline answer
    assert "<title>oomload cockpit</title>" in page and "/oomload/telemetry" in page


def test_the_web_uis_stop_ends_the_run_as_an_interruption(sim: SimServer, tmp_path: Path) -> None:
    """Locust's STOP button (``POST /stop`` from the UI's own page) stopped Locust's shape, and the run
    sat idle until --max-duration-s + 30 s, its step recorded as max_duration. Now it ends the run as
    Ctrl-C does: within the bound below (a hang detector: the run would otherwise last 10 minutes)."""
    trace = _trace(tmp_path / "t.jsonl", 20, 32, 200)
    run_dir = tmp_path / "run"
    port = _free_port()
    web = f"http://127.0.0.1:{port}"
    argv = _cmd(str(trace), "--url", sim.url, "--concurrency", "1,2", "--hold-s", "300", "--no-refine",
                "--web", "--web-port", str(port), "--web-keep-s", "0", "--gpu", "none",
                "--max-duration-s", "600", "--no-html", "--run-dir", str(run_dir))  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                snapshot = _get_json(web + "/oomload/telemetry")
            except (urllib.error.URLError, OSError, ValueError):
                snapshot = {}
            if snapshot.get("plan", {}).get("state") == "running" and snapshot.get("outcomes"):
                break
            time.sleep(0.3)
        stop = urllib.request.Request(web + "/stop", method="POST", headers={"Origin": web})
        with urllib.request.urlopen(stop, timeout=60) as resp:
            assert resp.status == 200
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out[-3000:] + err[-3000:]
    assert "stopped from the web UI" in out and "Traceback" not in out + err
    reader = RunReader(run_dir)
    assert reader.json("status.json")["end_reason"] == "interrupted"
    ends = [line for line in reader.stream("steps") if line.get("event") == "end"]
    assert ends and ends[-1]["reason"] == "interrupted", ends
    events = [e for e in reader.stream("events") if e.get("kind") == "interrupted"]
    assert [e.get("by") for e in events] == ["web_ui"], events
    assert (run_dir / "summary.json").is_file() and (run_dir / "report.md").is_file()


def test_a_failing_worker_is_one_sentence(sim: SimServer, tmp_path: Path) -> None:
    # every worker process dies at start as the integration review saw it (a KeyError in Locust)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, traceback\n"
        "if os.environ.get('OOMLOAD_LOCAL_WORKER'):\n"
        "    try:\n"
        "        raise KeyError('OomloadReplayUser')\n"
        "    except KeyError:\n"
        "        traceback.print_exc()\n"
        "    os._exit(1)\n"
    )
    trace = _trace(tmp_path / "t.jsonl", 10, 32, 8)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        _cmd(str(trace), "--url", sim.url, "--concurrency", "2", "--hold-s", "1", "--processes", "2",
             "--gpu", "none", "--run-dir", str(run_dir)),
        capture_output=True, text=True, timeout=90, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(error_lines) == 1, proc.stderr
    assert "worker process" in error_lines[0] and "KeyError: 'OomloadReplayUser'" in error_lines[0]
    assert "Traceback" in (run_dir / "worker.0.log").read_text()  # the details stay in the run dir
