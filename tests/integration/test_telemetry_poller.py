"""MetricsPoller against a real loopback HTTP server: failures, slow answers, the background loop."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from oomload.rundir import RunWriter
from oomload.telemetry.poller import MetricsPoller


class MetricsServer:
    """Serves ``text`` at /metrics with an optional delay and status; counts concurrent requests."""

    def __init__(self) -> None:
        self.text = ""
        self.status = 200
        self.delay_s = 0.0
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with server._lock:
                    server.requests += 1
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay_s)
                finally:
                    # before the answer goes out: once the client has it, it may scrape again before
                    # this thread runs on, and that must not read as two scrapes at once
                    with server._lock:
                        server.in_flight -= 1
                body = server.text.encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                del format, args

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(fixtures_dir: Path) -> Iterator[MetricsServer]:
    srv = MetricsServer()
    srv.text = (fixtures_dir / "vllm-metrics.txt").read_text()
    yield srv
    srv.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_real_capture_over_http(server: MetricsServer, tmp_path: Path, fixtures_dir: Path) -> None:
    manifest = json.loads((fixtures_dir / "manifest.json").read_text())["full"]
    with RunWriter(tmp_path) as writer:
        record = MetricsPoller(server.url, writer).poll_once()
    assert record["ok"] is True
    assert record["num_preemptions_total"] == manifest["idle_counters"]["vllm:num_preemptions_total"] >= 1
    config = json.loads((tmp_path / "cache_config.json").read_text())
    assert config["num_gpu_blocks"] == 12
    assert config["kv_cache_size_tokens"] == 3072


def test_http_error_is_recorded(server: MetricsServer) -> None:
    server.status = 500
    record = MetricsPoller(server.url, None).poll_once()
    assert record["ok"] is False
    assert "HTTP 500" in record["error"]


def test_connection_refused_is_recorded() -> None:
    poller = MetricsPoller(f"http://127.0.0.1:{free_port()}", None, timeout_s=2.0)
    record = poller.poll_once()
    assert record["ok"] is False
    assert "connection refused" in record["error"]
    assert poller.consecutive_failures == 1


def test_timeout_is_recorded(server: MetricsServer) -> None:
    server.delay_s = 1.0
    record = MetricsPoller(server.url, None, timeout_s=0.2).poll_once()
    assert record["ok"] is False
    assert "timed out" in record["error"]


def test_loop_never_piles_up_scrapes_on_a_slow_server(server: MetricsServer, tmp_path: Path) -> None:
    server.delay_s = 0.15  # slower than the interval
    with RunWriter(tmp_path) as writer:
        poller = MetricsPoller(server.url, writer, interval_s=0.02, timeout_s=2.0)
        poller.start()
        deadline = time.monotonic() + 10.0
        while poller.scrapes < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        poller.stop()
        scrapes = poller.scrapes
    assert scrapes >= 4
    assert server.max_in_flight == 1
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == scrapes
    assert all(r["ok"] for r in records)
    times = [r["t_unix_s"] for r in records]
    assert times == sorted(times)


def test_loop_survives_a_server_that_goes_away(server: MetricsServer, tmp_path: Path) -> None:
    with RunWriter(tmp_path) as writer:
        poller = MetricsPoller(server.url, writer, interval_s=0.02, timeout_s=1.0)
        poller.start()
        deadline = time.monotonic() + 10.0
        while poller.scrapes < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.close()
        while poller.consecutive_failures < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        poller.stop()
    assert poller.consecutive_failures >= 3
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["scrape_failed"]
