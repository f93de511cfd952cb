"""A loopback HTTP server around a stdlib handler class, for tests that fake a misbehaving endpoint."""

from __future__ import annotations

import contextlib
import http.client
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import urlsplit


class StubHandler(BaseHTTPRequestHandler):
    """A handler for ``stdlib_server``: ``send_body`` answers with a whole body; nothing is logged."""

    def send_body(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@contextlib.contextmanager
def stdlib_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (a free port) in a daemon thread; yield its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# what a gateway answers a request over its limit: ``(status, content type, body)``
TOO_MANY = (
    429,
    "application/json",
    b'{"error": {"message": "Too many requests", "type": "rate_limit_error", "code": 429}}',
)
NGINX_503 = (  # nginx's limit_req / limit_conn answer, by default
    503,
    "text/html",
    b"<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n"
    b"<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n",
)


class _LimitingGateway(StubHandler):
    """Forwards every request to ``upstream`` (answers buffered whole); a POST beyond ``limit`` in flight
    gets ``refusal`` at once, as a gateway's concurrency limit answers."""

    protocol_version = "HTTP/1.1"
    upstream: ClassVar[str] = ""
    limit: ClassVar[int] = 1
    refusal: ClassVar[tuple[int, str, bytes]] = TOO_MANY
    in_flight: ClassVar[int] = 0
    lock: ClassVar[threading.Lock]
    metrics_delay_s: ClassVar[float] = 0.0  # each /metrics answered this late (a slow or busy server)

    def do_GET(self) -> None:
        if self.path.startswith("/metrics"):
            time.sleep(self.metrics_delay_s)
        self.send_body(*self._forward(None))

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        with cls.lock:
            admitted = cls.in_flight < cls.limit
            cls.in_flight += admitted
        if not admitted:
            self.send_body(*cls.refusal)
            return
        try:
            answer = self._forward(body)
        finally:  # the slot is free before the client has its answer: it may send again at once
            with cls.lock:
                cls.in_flight -= 1
        self.send_body(*answer)

    def _forward(self, body: bytes | None) -> tuple[int, str, bytes]:
        target = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=120)
        try:
            headers = {"Content-Type": self.headers.get("Content-Type") or "application/json"}
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.getheader("Content-Type") or "application/json", answer.read()
        finally:
            conn.close()


@contextlib.contextmanager
def limiting_gateway(
    upstream: str, limit: int, refusal: tuple[int, str, bytes] = TOO_MANY, *, metrics_delay_s: float = 0.0
) -> Iterator[str]:
    """A loopback gateway in front of ``upstream`` that lets ``limit`` requests through at a time and
    answers ``refusal`` (an HTTP 429, or nginx's bare 503) to the rest, and ``/metrics`` after
    ``metrics_delay_s``; yields its base URL."""
    attrs = {
        "upstream": upstream,
        "limit": limit,
        "refusal": refusal,
        "lock": threading.Lock(),
        "metrics_delay_s": metrics_delay_s,
    }
    handler = type("Gateway", (_LimitingGateway,), attrs)
    with stdlib_server(handler) as url:
        yield url
