"""``oomload replay --web`` in a real headless Chromium (Playwright driving the OS's chromium).

One run against the built-in simulator (so the SIMULATED badge must show), small enough to end on
its own: the oomload tab draws its four charts from the run directory, and once the run is over the
web UI keeps serving — the tab shows the verdict, the ``vllm serve`` line of ``summary.json`` and a
working link to ``report.html``; Locust's NEW button is gone; Locust's statistics hold one entry per
request (no TTFT entry doubling the totals); no console error on the way. Ctrl-C then ends the
process with the run's own exit code. Every wait is bounded; nothing is timed.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from oomload.trace.model import TraceHeader, TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]
# 150 blocks of 16 tokens; requests of 32 + 600 tokens grow to 40 blocks: 3 fit, 8 preempt
SIM = "--num-gpu-blocks 150 --block-size 16 --max-model-len 2048 --time-scale 0.05"
CHARTS = ("kv", "pre", "queue", "gpu")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_web(url: str, proc: subprocess.Popen[str], bound_s: float) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/oomload/telemetry", timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise AssertionError(f"the web UI never answered (exit {proc.poll()})")


@pytest.mark.slow
def test_the_tab_draws_live_charts_and_serves_the_verdict_after_the_run(
    tmp_path: Path, browser_page: Any
) -> None:
    page = browser_page
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 32, 600) for i in range(60)], TraceHeader(format="test"))
    run_dir = tmp_path / "run"
    port = _free_port()
    web = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "oomload", "replay", str(trace), f"--sim={SIM}", "--concurrency", "2,8",
            "--hold-s", "2", "--no-refine", "--metrics-interval-s", "0.5", "--web", "--web-port", str(port),
            "--run-dir", str(run_dir), "--no-live"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        _wait_for_web(web, proc, 90)
        page.goto(web + "/?tab=oomload")
        cockpit = page.frame_locator("#oomload-cockpit")
        cockpit.locator("svg[data-key=kv]").wait_for(timeout=60_000)  # drawn while the run goes
        cockpit.locator("body[data-state=over]").wait_for(state="attached", timeout=180_000)
        frame = page.frame(url=re.compile(r"/oomload$"))
        assert frame is not None
        summary = json.loads((run_dir / "summary.json").read_text())

        assert frame.is_visible("#sim"), "the SIMULATED badge is hidden for the built-in simulator"
        for key in CHARTS:
            points = frame.get_attribute(f"svg[data-key={key}]", "data-points")
            assert points is not None and int(points) > 0, (key, points)
        assert frame.locator("#chart-kv svg rect").count() >= 2  # the two steps, shaded

        assert frame.is_visible("#verdict")
        assert frame.inner_text("#flags") == summary["recommendation"]["flag_line"]
        onset = summary["verdict"]["onsets"]["preemption"]
        onset_text = frame.inner_text("td[data-key=preemption_onset]")
        assert onset is not None and onset_text.startswith(f"concurrency {onset['concurrency']} "), onset_text
        href = frame.get_attribute("#report", "href")
        assert href is not None
        report = page.request.get(web + href if href.startswith("/") else href)
        assert report.status == 200 and "oomload verdict" in report.text()

        # Locust's side once the run is over: no NEW button, a notice, one statistics entry per request
        page.goto(web + "/")
        page.wait_for_selector("#oomload-over", timeout=30_000)
        page.wait_for_timeout(1000)  # the page script hides the button on its next pass (300 ms)
        assert page.get_by_role("button", name="New", exact=True).filter(visible=True).count() == 0
        stats = page.request.get(web + "/stats/requests").json()
        entries = [s for s in stats["stats"] if s["name"] != "Aggregated"]
        assert [(s["method"], s["name"]) for s in entries] == [("POST", "/v1/completions")]
        sent = len((run_dir / "requests.jsonl").read_text().splitlines())
        assert entries[0]["num_requests"] <= sent
        assert page.oomload_errors == []

        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == summary["exit_code"] == 0, err[-2000:]
    assert "keeps serving its verdict" in out and "until Ctrl-C" in out, out[-2000:]
