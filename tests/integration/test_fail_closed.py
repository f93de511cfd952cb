"""Fail closed on the wire: `oomload replay` with gate rules against a loopback server that fails in
each known way, through the real Locust replay path.

Issue 24, finding 1: against a server that closed every stream mid-response, 100 % of the requests
failed yet ``no-preemption-below`` and ``no-oom-up-to`` said PASS "(measured)", exit 0; likewise with
timeouts, 429s and malformed SSE (which also read "Confidence high" with no failed-requests line).
The fault server looks like vLLM everywhere but in its completions: ``/v1/models`` names the model
and ``/metrics`` serves a real vLLM capture (no preemption, ever), so the telemetry side alone would
vouch for "no preemption".
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from clirun import oomload
from oomload.errors import ExitCode
from oomload.load.backoff import failing_backoff_s
from oomload.trace.model import TraceHeader, TraceRecord, write_trace
from stubserver import StubHandler, stdlib_server

METRICS = (Path(__file__).parents[1] / "fixtures" / "vllm-metrics.txt").read_bytes()
STALL_S = 3.0  # how long the "timeout" mode holds a request (bounded; the client gives up after 1 s)
GATES = ("no-preemption-below:2", "no-oom-up-to:2", "max-kv-usage<0.95")

# mode → (outcome, reason) the client must name it by
EXPECTED = {
    "stream-closed": ("transport_error", "stream broke"),
    "timeout": ("timeout", "request timeout"),
    "http-429": ("rate_limited", "http 429"),
    "http-503": ("rate_limited", "http 503"),  # not vLLM's own answer: a limit in front of it
    "vllm-busy": ("admission_rejected", "http 503"),  # vLLM's queue limit
    "http-500": ("server_error", "http 500"),
    "malformed-sse": ("server_error", "malformed event stream"),
}
MODES = tuple(sorted(EXPECTED))


class FaultHandler(StubHandler):
    """vLLM-shaped GETs; every completion fails the way ``mode`` says."""

    protocol_version = "HTTP/1.1"
    mode: ClassVar[str] = "stream-closed"
    posts: ClassVar[int] = 0
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            self.send_body(200, "application/json", json.dumps(
                {"object": "list", "data": [{"id": "tiny-model", "object": "model", "max_model_len": 2048}]}
            ).encode())  # fmt: skip
        elif self.path.startswith("/metrics"):
            self.send_body(200, "text/plain; version=0.0.4", METRICS)
        elif self.path.startswith("/health"):
            self.send_body(200, "application/json", b"{}")
        else:
            self.send_body(404, "text/plain", b"not found")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        mode = FaultHandler.mode
        if mode == "mixed":  # every kind in turn
            with FaultHandler.lock:
                FaultHandler.posts += 1
                mode = MODES[FaultHandler.posts % len(MODES)]
        if mode == "timeout":
            time.sleep(STALL_S)
            self.close_connection = True
            return
        if mode == "vllm-busy":
            error = {"message": "The engine is currently busy", "type": "Service Unavailable", "code": 503}
            self.send_body(503, "application/json", json.dumps({"error": error}).encode())
            return
        if mode.startswith("http-"):
            status = int(mode[5:])
            error = {"message": "request failed", "type": "ServiceError", "code": status}
            self.send_body(status, "application/json", json.dumps({"error": error}).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        token = json.dumps(
            {"id": "cmpl-x", "object": "text_completion", "choices": [{"index": 0, "text": "a"}]}
        )
        if mode == "stream-closed":
            events = [f"data: {token}\n\n"]
        else:  # malformed-sse: a torn JSON event, then a proper end
            events = [
                f"data: {token}\n\n",
                'data: {"choices": [{"index": 0, "text": "b"\n\n',
                "data: [DONE]\n\n",
            ]
        for event in events:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        if mode == "malformed-sse":
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True
        if mode == "stream-closed":
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def fault_server(mode: str) -> Iterator[str]:
    FaultHandler.mode = mode
    with stdlib_server(FaultHandler) as url:
        yield url


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _replay(tmp_path: Path, mode: str) -> tuple[Any, Path, list[dict[str, Any]]]:
    """``oomload replay`` with ``GATES`` against the fault server in ``mode``; its decided requests."""
    trace = tmp_path / "t.jsonl"
    records = [TraceRecord(f"r{i}", 0.0, 32, 16) for i in range(6)]
    write_trace(trace, records, TraceHeader(source=("fail-closed",), format="synthetic"))
    run_dir = tmp_path / "run"
    gates = [arg for rule in GATES for arg in ("--gate", rule)]
    with fault_server(mode) as url:
        proc = oomload(
            *("replay", str(trace), "--url", url, "--run-dir", str(run_dir), "--gpu", "none"),
            *("--concurrency", "1,2", "--hold-s", "2", "--warmup-s", "0", "--no-refine", "--no-evidence"),
            *("--request-timeout-s", "1", "--stop-on", "never", "--metrics-interval-s", "0.5", *gates),
        )
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    requests = [r for f in sorted(run_dir.glob("requests*.jsonl")) for r in _lines(f)]
    decided = [r for r in requests if r["outcome"] != "cancelled"]
    assert decided, proc.stdout + proc.stderr
    return proc, run_dir, decided


def _assert_nothing_to_judge(proc: Any, run_dir: Path, decided: list[dict[str, Any]]) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [g["status"] for g in summary["gates"]] == ["not_evaluated"] * len(GATES), summary["gates"]
    assert all("requests failed (" in g["reason"] for g in summary["gates"]), summary["gates"]
    assert proc.returncode == ExitCode.UNREACHABLE == summary["exit_code"], proc.stdout
    assert summary["verdict"]["confidence"]["level"] == "low"
    failed_run = summary["verdict"]["requests"]["failed_run"]
    # a request turned away before it ran — by a limit in front of the engine, or by vLLM's queue limit
    # (its engine was full) — is left out of what says whether the server was loaded
    reached = [r for r in decided if r["outcome"] not in ("rate_limited", "admission_rejected")]
    assert failed_run.startswith(f"{len(reached)} of {len(reached)} requests failed (")
    assert "NOTHING TO JUDGE" in proc.stdout and "Failed requests" in proc.stdout
    assert "PASS" not in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stream-closed", "malformed-sse"])
def test_a_server_that_fails_every_request_never_passes_a_gate(tmp_path: Path, mode: str) -> None:
    """The two cases of the issue: every stream closed mid-response, and malformed SSE."""
    proc, run_dir, decided = _replay(tmp_path, mode)
    outcome, reason = EXPECTED[mode]
    # the failure is named: the outcome and its reason, on every request
    assert {(r["outcome"], r["error"].split(":")[0]) for r in decided} == {(outcome, reason)}
    _assert_nothing_to_judge(proc, run_dir, decided)
    failed_run = json.loads((run_dir / "summary.json").read_text())["verdict"]["requests"]["failed_run"]
    assert f"({outcome} {len(decided)} [{reason}" in failed_run  # with its reason (verdict.failures)


def test_every_failure_kind_in_one_run_is_named_and_never_passes_a_gate(tmp_path: Path) -> None:
    """Stream closed, timeout, 429, a bare 503, vLLM's own 503, 500 and malformed SSE in turn: each named
    as itself."""
    FaultHandler.posts = 0
    proc, run_dir, decided = _replay(tmp_path, "mixed")
    named = {(r["outcome"], r["error"].split(":")[0]) for r in decided}
    assert named == set(EXPECTED.values())
    _assert_nothing_to_judge(proc, run_dir, decided)


def test_the_ramp_stops_after_a_step_in_which_no_request_was_answered(tmp_path: Path) -> None:
    """Every completion a 500: the default run (``--stop-on oom``) used to climb every level, sending
    thousands of requests a second for nothing. It stops after the first step (``capacity.schedule``,
    "No answer"), says where and why, and names the failures' reason, not only their outcome; and the
    user, failed again and again, waits between its requests (``load.backoff.failing_backoff_s``): the
    step's 2 s took hundreds of requests without the wait, a dozen with it (11 at most when every pause
    is on time; a busy host only lengthens them, so each gap is checked against its pause)."""
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 32, 16) for i in range(6)], TraceHeader(format="synthetic"))
    run_dir = tmp_path / "run"
    with fault_server("http-500") as url:
        proc = oomload(
            *("replay", str(trace), "--url", url, "--run-dir", str(run_dir), "--gpu", "none", "--no-html"),
            *("--concurrency", "1,2,4", "--hold-s", "2", "--no-evidence", "--metrics-interval-s", "0.5"),
        )
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stdout + proc.stderr
    assert json.loads((run_dir / "status.json").read_text())["end_reason"] == "no_answer"
    ends = [line for line in _lines(run_dir / "steps.jsonl") if line["event"] == "end"]
    assert [e["concurrency"] for e in ends] == [1], ends
    summary = json.loads((run_dir / "summary.json").read_text())["verdict"]["requests"]
    n = summary["failed"]
    assert 4 <= n <= 30 and summary["ok"] == 0
    requests = [r for f in run_dir.glob("requests*.jsonl") for r in _lines(f)]
    sent = sorted((r["start_unix_s"], r["end_unix_s"]) for r in requests)
    assert len(sent) == n
    for failures, ((_, ended), (started, _)) in enumerate(itertools.pairwise(sent), start=1):
        assert started - ended >= failing_backoff_s(failures) - 0.005, (failures, started - ended)
    assert summary["top_errors"] == {"server_error": {"error": "http 500: ServiceError", "requests": n}}
    assert summary["failed_run"].startswith(
        f"{n} of {n} requests failed (server_error {n} [http 500: ServiceError])"
    )
    screen = " ".join(proc.stdout.replace("│", " ").split())
    assert "the run stopped at concurrency 1 (step 0): no request that ended there was answered" in screen
