"""Fault drills: `oomload replay` as a subprocess under signals, bad input and misbehaving endpoints.

Every drill runs the real CLI (``python -m oomload replay``) and checks what a user would see: the
exit code, one clear sentence and never a traceback, a run directory that holds everything measured
up to the fault, ``oomload report`` rendering it, no process left behind, and no secret anywhere.
Servers: the simulated vLLM (``SimServer``) and tiny stdlib servers that refuse, stall, answer HTML or
break an SSE stream in the middle.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import psutil
import pytest

from clirun import oomload
from oomload.errors import ExitCode
from oomload.realvllm.server import free_port, group_members
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace
from stubserver import stdlib_server

SECRET = "sk-test-SECRET123"
# A small pool (128 blocks of 32 tokens) and slow-enough steps, so a step is still running when the
# drill strikes.
SIM_ARGS = ("--model", "tiny", "--num-gpu-blocks", "128", "--block-size", "32", "--max-model-len", "2048")


def write_fixed_trace(path: Path, count: int, prompt_tokens: int, output_tokens: int) -> Path:
    records = [TraceRecord(f"r{i}", 0.0, prompt_tokens, output_tokens) for i in range(count)]
    write_trace(path, records, TraceHeader(source=("fault-drill",), format="synthetic"))
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout, proc.stdout


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(SIM_ARGS) as server:
        yield server


# --- signals --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "to_group", "processes"),
    [(signal.SIGINT, True, 1), (signal.SIGTERM, False, 2)],
    ids=["ctrl-c-to-the-group", "sigterm-to-the-pid-with-workers"],
)
def test_signal_mid_step_leaves_a_complete_run_dir_and_no_orphans(
    sim: SimServer, tmp_path: Path, sig: signal.Signals, to_group: bool, processes: int
) -> None:
    trace = write_fixed_trace(tmp_path / "t.jsonl", 400, 64, 512)
    run_dir = tmp_path / "run"
    argv = [
        *(sys.executable, "-m", "oomload", "replay", str(trace), "--url", sim.url),
        *("--concurrency", "2,4,8", "--hold-s", "60", "--warmup-s", "0", "--no-refine"),
        *("--stop-on", "never", "--gpu", "none", "--run-dir", str(run_dir), "--processes", str(processes)),
    ]
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            _wait_until_mid_step(run_dir, proc, timeout_s=90.0)
            descendants = psutil.Process(proc.pid).children(recursive=True)
            measured_before = sum(len(_safe_lines(f)) for f in run_dir.glob("requests*.jsonl"))
            if to_group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
            proc.wait(timeout=90)  # a liveness bound for a loaded machine
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    stderr = err_path.read_text()
    assert proc.returncode == ExitCode.INTERRUPTED, stderr
    assert "Traceback" not in stderr, stderr
    assert measured_before >= 1
    # No Locust worker, sampler or other child outlives the run.
    assert group_members(proc.pid) == []
    assert [p.pid for p in descendants if _alive(p)] == []

    status = json.loads((run_dir / "status.json").read_text())
    assert (status["finished"], status["end_reason"]) == (False, "interrupted")
    steps = lines(run_dir / "steps.jsonl")
    assert steps[-1]["event"] == "end" and steps[-1]["reason"] == "interrupted"
    assert "interrupted" in [e["kind"] for e in lines(run_dir / "events.jsonl")]
    requests = [r for f in sorted(run_dir.glob("requests*.jsonl")) for r in lines(f)]
    assert len(requests) >= measured_before, "the requests finished before the signal must be on disk"
    assert all(r["prompt_tokens_asked"] == 64 and r["output_tokens_asked"] == 512 for r in requests)

    report = oomload("report", str(run_dir))  # HANG_S: it once took over 60 s beside the e2e suite
    no_traceback(report)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"]["run"]["end_reason"] == "interrupted"
    assert summary["verdict"]["requests"]["total"] == len(requests)
    assert (run_dir / "report.md").exists()


def _wait_until_mid_step(run_dir: Path, proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """Until a step has started and at least one request has been written (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"replay exited early with {proc.returncode}")
        started = any(s.get("event") == "start" for s in _safe_lines(run_dir / "steps.jsonl"))
        written = sum(len(_safe_lines(f)) for f in run_dir.glob("requests*.jsonl"))
        if started and written >= 2:
            return
        time.sleep(0.2)
    raise AssertionError("no step with finished requests within the time limit")


def _safe_lines(path: Path) -> list[dict[str, Any]]:
    try:
        return lines(path)
    except (OSError, ValueError):
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- bad trace files --------------------------------------------------------------------------------


def _bad_traces(tmp: Path) -> dict[str, tuple[Path, str]]:
    good = write_fixed_trace(tmp / "good.jsonl", 5, 32, 8)
    text = good.read_text(encoding="utf-8")
    truncated = tmp / "truncated.jsonl"
    truncated.write_text(text[: len(text) - 20], encoding="utf-8")  # the last line cut mid-JSON
    garbage = tmp / "garbage.jsonl"
    rows = text.splitlines()
    garbage.write_text(
        "\n".join([*rows[:3], "\x00\x01 not json at all {", *rows[3:]]) + "\n", encoding="utf-8"
    )
    empty = tmp / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    return {
        "truncated": (truncated, f"{truncated}:{len(rows)}"),
        "garbage": (garbage, f"{garbage}:4"),
        "empty": (empty, str(empty)),
    }


@pytest.mark.parametrize("kind", ["truncated", "garbage", "empty"])
def test_bad_trace_files_fail_with_a_clear_error(sim: SimServer, tmp_path: Path, kind: str) -> None:
    trace, where = _bad_traces(tmp_path)[kind]
    before = _prompt_tokens_served(sim.url)
    proc = oomload(
        "replay", str(trace), "--url", sim.url, "--run-dir", str(tmp_path / "run"), "--gpu", "none"
    )
    no_traceback(proc)
    assert proc.returncode == ExitCode.USAGE
    assert where in proc.stderr
    assert _prompt_tokens_served(sim.url) == before, "no load may be sent for an unreadable trace"


def _prompt_tokens_served(url: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prompt_tokens_total")
    )


# --- endpoints that refuse, stall, answer HTML, break streams ----------------------------------------


@contextlib.contextmanager
def raw_server(on_connect: Callable[[socket.socket], bool]) -> Iterator[str]:
    """A loopback listener that hands every connection to ``on_connect``; connections it returns True
    for are held open until exit (bounded: everything is closed on exit)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn = sock.accept()[0]
                if on_connect(conn):
                    held.append(conn)
                else:
                    conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        sock.close()


def silent_server() -> contextlib.AbstractContextManager[str]:
    """Accepts connections and never answers."""
    return raw_server(lambda conn: True)


class HtmlHandler(BaseHTTPRequestHandler):
    def _html(self) -> None:
        body = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _html
    do_POST = _html

    def log_message(self, *args: Any) -> None:
        del args


class BrokenStreamHandler(BaseHTTPRequestHandler):
    """A vLLM look-alike whose completion streams break after two chunks (no usage, no [DONE])."""

    protocol_version = "HTTP/1.1"
    posts = 0
    lock = threading.Lock()

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            self._json(
                {"object": "list", "data": [{"id": "tiny-model", "object": "model", "max_model_len": 2048}]}
            )
        elif self.path.startswith("/health"):
            self._json({})
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        with BrokenStreamHandler.lock:
            BrokenStreamHandler.posts += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(2):
            event = {"id": "cmpl-x", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i}"}]}
            data = f"data: {json.dumps(event)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _json(self, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        del args


def _replay_against(
    url: str, tmp_path: Path, *extra: str, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    trace = write_fixed_trace(tmp_path / "t.jsonl", 6, 32, 16)
    return oomload(
        *("replay", str(trace), "--url", url, "--run-dir", str(tmp_path / "run"), "--gpu", "none"),
        *(
            "--concurrency",
            "1,2",
            "--hold-s",
            "1",
            "--warmup-s",
            "0",
            "--no-refine",
            "--request-timeout-s",
            "5",
        ),
        *extra,
        timeout_s=timeout_s,
    )


def test_a_url_that_refuses_connections_is_a_clear_unreachable_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = _replay_against(url, tmp_path)
    no_traceback(proc)
    assert proc.returncode == ExitCode.UNREACHABLE
    assert url in proc.stderr + proc.stdout


def test_a_url_that_never_answers_is_bounded_by_the_runs_duration_and_clear(tmp_path: Path) -> None:
    with silent_server() as url:
        proc = _replay_against(url, tmp_path, "--max-duration-s", "2", timeout_s=45.0)
    no_traceback(proc)
    assert proc.returncode == ExitCode.UNREACHABLE
    # the preflight never waits longer than the whole run may last, and says how long it waited
    assert f"{url}/v1/models did not answer within 2 s" in proc.stderr + proc.stdout


def banner_server(banner: bytes) -> contextlib.AbstractContextManager[str]:
    """Writes ``banner`` to every connection and closes it (an SSH daemon on the wrong port)."""

    def send(conn: socket.socket) -> bool:
        with contextlib.suppress(OSError):
            conn.sendall(banner)
        return False

    return raw_server(send)


def test_a_port_that_answers_a_non_http_banner_is_one_sentence(tmp_path: Path) -> None:
    with banner_server(b"SSH-2.0-OpenSSH_9.6\r\n") as url:
        proc = _replay_against(url, tmp_path)
    no_traceback(proc)
    assert proc.returncode == ExitCode.UNREACHABLE
    assert f"{url}/v1/models did not answer HTTP" in proc.stderr + proc.stdout
    assert not (tmp_path / "run").exists()


def test_a_base_url_ending_in_v1_is_used_without_it(sim: SimServer, tmp_path: Path) -> None:
    proc = _replay_against(sim.url + "/v1", tmp_path, "--concurrency", "1", "--min-requests", "1")
    no_traceback(proc)
    assert f"--url ends in /v1: using {sim.url}" in proc.stdout
    assert json.loads((tmp_path / "run" / "config.json").read_text())["url"] == sim.url
    assert lines(tmp_path / "run" / "requests.jsonl")


def test_a_server_that_answers_html_is_not_mistaken_for_vllm(tmp_path: Path) -> None:
    with stdlib_server(HtmlHandler) as url:
        proc = _replay_against(url, tmp_path)
    no_traceback(proc)
    assert proc.returncode == ExitCode.UNREACHABLE
    assert "JSON" in proc.stderr + proc.stdout


@pytest.mark.slow
def test_sse_that_breaks_mid_stream_is_classified_and_nothing_is_lost(tmp_path: Path) -> None:
    BrokenStreamHandler.posts = 0
    with stdlib_server(BrokenStreamHandler) as url:
        proc = _replay_against(url, tmp_path, "--stop-on", "never", "--min-requests", "2")
    no_traceback(proc)
    run_dir = tmp_path / "run"
    requests = [r for f in sorted(run_dir.glob("requests*.jsonl")) for r in lines(f)]
    # nothing sent is lost: the run drains what is in flight at its end (a broken stream ends at once)
    assert len(requests) == BrokenStreamHandler.posts > 0
    # a stream cut before [DONE] without usage is the transport breaking, not a short answer
    outcomes = {(r["outcome"], r["error"].split(":")[0]) for r in requests}
    assert outcomes == {("transport_error", "stream broke")}
    assert all((r.get("usage_completion_tokens") or 0) < r["output_tokens_asked"] for r in requests)
    report = oomload("report", str(run_dir))  # HANG_S: it once took over 60 s beside the e2e suite
    no_traceback(report)
    summary = json.loads((run_dir / "summary.json").read_text())
    counts = summary["verdict"]["requests"]  # summary.json/1 only adds keys: compare the ones we know
    assert {k: counts[k] for k in ("total", "ok", "error_rate")} == {
        "total": len(requests),
        "ok": 0,
        "error_rate": 1.0,
    }


# --- secrets ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_api_key_from_the_environment_is_never_written(sim: SimServer, tmp_path: Path) -> None:
    trace = write_fixed_trace(tmp_path / "t.jsonl", 6, 32, 8)
    run_dir = tmp_path / "run"
    env = {"OPENAI_API_KEY": SECRET, "OOMLOAD_TEST_KEY": SECRET}
    proc = oomload(
        *("replay", str(trace), "--url", sim.url, "--run-dir", str(run_dir), "--gpu", "none"),
        *("--concurrency", "1,2", "--hold-s", "1", "--warmup-s", "0", "--no-refine"),
        env=env,
    )
    no_traceback(proc)
    assert lines(run_dir / "steps.jsonl"), proc.stderr
    other = oomload("replay", str(trace), "--url", sim.url, "--api-key-env", "OOMLOAD_TEST_KEY",
                    "--run-dir", str(tmp_path / "run2"), "--gpu", "none", "--concurrency", "1",
                    "--hold-s", "1", "--warmup-s", "0", "--no-refine", env=env)  # fmt: skip
    no_traceback(other)
    report = oomload("report", str(run_dir), "--format", "json", "md", "html", "junit", env=env)
    outputs = [proc.stdout, proc.stderr, other.stdout, other.stderr, report.stdout, report.stderr]
    assert not [i for i, text in enumerate(outputs) if SECRET in text]
    files = [p for d in (run_dir, tmp_path / "run2") for p in d.rglob("*") if p.is_file()]
    assert len(files) >= 5
    assert [str(p) for p in files if SECRET.encode() in p.read_bytes()] == []
