"""Server death: the real vLLM is SIGKILLed (API server, EngineCore and Worker at once) in the middle of
a step. oomload must record the step and the time, classify the failed requests, stop, exit with the
documented code (a ``no-oom-up-to`` gate fails → 1) and ``oomload report`` must render the partial run.

The kill must find requests that cannot have finished, and timing cannot promise that here: on 2 cores
the engine's busy loop starves the API server, oomload and this test alike, so the test tends to wake
just as the engine goes idle — when every running request has produced its last token (kills timed from
the test's clock found nothing to cut 4 times in 14 runs; waiting for vLLM's gauges to show a request
waiting outlasted the step 2 times in 3). So the server is frozen first (SIGSTOP to its process group):
it can compute and send nothing more, the CPU is free, and oomload reads whatever was already sent. Half
a second later every connection oomload still holds to the server is a request that cannot complete (a
fresh connection per request) or one of oomload's own /metrics and /health checks (at most one of each
at a time); with more than those two, SIGKILL lands; otherwise the server is resumed and frozen again a
moment later.
Requests are 256 + 1024 tokens (5 blocks of the 12-block pool): at concurrency 4 some queue.

The kill must land inside the step at 4, so that step's hold must outlast the test's own waiting in it:
the first request the step finishes, then up to ``FREEZE_TIMEOUT_S`` of freezing. With a 30 s hold a CI
run saw the hold end first (the death was then recorded in the step at 8): ``HOLD_S`` leaves room for
both, and the run ends at the kill, so the longer hold costs only the first step's extra time.

This test kills its server, so it runs last (files run in name order) and the pool starts a fresh one
should anything run after it.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import psutil
import pytest
from harness import FIGURES, Run, ServerPool, write_trace_file

from clirun import oomload
from oomload.errors import ExitCode
from oomload.realvllm.server import RealVllmServer

pytestmark = pytest.mark.e2e

GATE = "no-oom-up-to:8"
PROMPT_TOKENS, OUTPUT_TOKENS = 256, 1024
TELEMETRY_CONNECTIONS = 2  # oomload's /metrics scrape and /health check, one of each at most
FREEZE_TIMEOUT_S = 20.0
HOLD_S = 60  # > the step at 4's first finished request + FREEZE_TIMEOUT_S (module docstring)


def test_killing_vllm_mid_step_is_recorded_and_reported(vllm_servers: ServerPool, tmp_path: Path) -> None:
    server = vllm_servers.get()
    trace = write_trace_file(tmp_path / "t.jsonl", [(PROMPT_TOKENS, OUTPUT_TOKENS)] * 200)
    run_dir = tmp_path / "run"
    argv = [
        *(sys.executable, "-m", "oomload", "replay", str(trace), "--url", server.url),
        *("--run-dir", str(run_dir), "--gpu", "none", "--gate", GATE),
        *(
            "--concurrency",
            "2,4,8",
            "--hold-s",
            str(HOLD_S),
            "--warmup-s",
            "0",
            "--no-refine",
            "--stop-on",
            "never",
        ),
    ]
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True)
        try:
            step = _wait_for_requests_in_step(run_dir, concurrency=4, proc=proc, timeout_s=HOLD_S + 90.0)
            unanswered = _freeze_with_requests_in_flight(server, proc, timeout_s=FREEZE_TIMEOUT_S)
            killed_at = time.time()
            server.kill()  # returns once every process of the server has exited
            gone_at = time.time()
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in stderr, stderr
    assert code == ExitCode.GATE_FAILED, stderr

    run = Run.read(run_dir)
    assert run.status is not None
    assert run.status["end_reason"] == "server_dead"
    ends = [s for s in run.steps if s["event"] == "end"]
    assert (ends[-1]["step"], ends[-1]["reason"]) == (step, "server_dead")
    deaths = [e for e in run.events if e["kind"] == "server_dead"]
    assert deaths and deaths[0]["step"] == step and deaths[0]["t_unix_s"] >= killed_at

    before = [r for r in run.requests if r["end_unix_s"] < killed_at]
    after = [r for r in run.requests if r["end_unix_s"] >= killed_at]
    assert before and {r["outcome"] for r in before} == {"ok"}
    assert {(r["usage_prompt_tokens"], r["usage_completion_tokens"]) for r in before} == {
        (PROMPT_TOKENS, OUTPUT_TOKENS)
    }
    assert after, "the requests in flight at the kill must be recorded"
    in_flight = [r for r in after if r["start_unix_s"] < killed_at]
    sent_to_the_dead = [r for r in after if r["start_unix_s"] >= killed_at]
    # A response whose last bytes left the server just before SIGKILL landed may still be read (ok, and
    # then complete) a moment after `killed_at`; every other request in flight failed: a stream cut in the
    # middle is "transport_error" ("stream broke").
    completed = [r for r in in_flight if r["outcome"] == "ok"]
    assert all(
        (r["usage_prompt_tokens"], r["usage_completion_tokens"]) == (PROMPT_TOKENS, OUTPUT_TOKENS)
        for r in completed
    )
    failed = [r for r in in_flight if r["outcome"] != "ok"]
    assert len(failed) >= unanswered >= 1, (unanswered, in_flight)
    assert {r["outcome"] for r in failed} <= {"truncated", "transport_error", "engine_dead"}
    assert all((r.get("usage_completion_tokens") or 0) < OUTPUT_TOKENS for r in failed)
    # Sent while the processes were dying (SIGKILL sent, listening socket not yet closed by the kernel),
    # a request is accepted and then reset: "transport_error", "closed before an answer" (CI saw four).
    # Sent once every process had exited, it is refused: "engine_dead" (refused after answers). The
    # watch usually declares the death before a backed-off user sends again, so the second group may
    # be empty; when it is not, every one of them must be engine_dead.
    dying = [r for r in sent_to_the_dead if r["start_unix_s"] < gone_at]
    gone = [r for r in sent_to_the_dead if r["start_unix_s"] >= gone_at]
    reset = ("closed before an answer", "connect failed")
    assert all(
        r["outcome"] == "engine_dead" or (r["outcome"] == "transport_error" and r["error"].startswith(reset))
        for r in dying
    ), dying
    assert {r["outcome"] for r in gone} <= {"engine_dead"}, gone
    assert (run_dir / "repro" / "server_death.jsonl").exists()

    report = oomload("report", str(run_dir), "--gate", GATE, timeout_s=120)
    assert "Traceback" not in report.stderr + report.stdout
    assert report.returncode == ExitCode.GATE_FAILED
    summary = Run.read(run_dir).summary
    assert summary is not None
    death = summary["verdict"]["onsets"]["engine_death"]
    assert (death["step"], death["concurrency"]) == (step, 4)
    assert summary["verdict"]["requests"]["total"] == len(run.requests)
    assert summary["verdict"]["requests"]["ok"] == len(before) + len(completed)
    FIGURES.append(
        f"server death: step {step} (concurrency 4); {len(before)} ok before the kill, at least {unanswered} "
        f"unanswered when frozen, {len(in_flight)} in "
        f"flight ({sorted({r['outcome'] for r in in_flight})}), {len(dying)} sent while it died "
        f"({sorted({r['outcome'] for r in dying})}), {len(gone)} after "
        f"({sorted({r['outcome'] for r in gone})})"
    )
    assert (run_dir / "report.md").read_text().strip()


def _wait_for_requests_in_step(
    run_dir: Path, concurrency: int, proc: subprocess.Popen[bytes], timeout_s: float
) -> int:
    """Wait until the step at ``concurrency`` has finished a request; returns its index."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"replay exited early with {proc.returncode}"
        run = _try_read(run_dir)
        if run is not None:
            starts = [s for s in run.steps if s["event"] == "start" and s["concurrency"] == concurrency]
            if starts and any(r["step"] == starts[0]["step"] for r in run.requests):
                return int(starts[0]["step"])
        time.sleep(0.2)
    raise AssertionError(f"no request finished at concurrency {concurrency} in time")


def _freeze_with_requests_in_flight(
    server: RealVllmServer, proc: subprocess.Popen[bytes], timeout_s: float
) -> int:
    """Leave the server frozen (SIGSTOP) while oomload holds an unanswered request to it; returns how
    many requests at least (the connections held, less one /metrics scrape and one /health check)."""
    port = urllib.parse.urlsplit(server.url).port
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"replay exited early with {proc.returncode}"
        server.pause()
        time.sleep(0.5)  # oomload reads what was sent before the freeze, and closes those connections
        held = [
            c
            for c in psutil.Process(proc.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port
        ]
        if len(held) > TELEMETRY_CONNECTIONS:
            return len(held) - TELEMETRY_CONNECTIONS
        server.resume()
        time.sleep(0.2)
    raise AssertionError("oomload never held a request to the server at concurrency 4")


def _try_read(run_dir: Path) -> Run | None:
    try:
        return Run.read(run_dir)
    except ValueError:  # a line caught mid-write
        return None
