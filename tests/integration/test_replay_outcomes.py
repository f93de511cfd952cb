"""The HTTP adapter against a tiny raw stdlib server: every misbehaviour ends in the right outcome.

``send`` runs on gevent sockets (no monkey-patching needed: the test's main greenlet drives the
hub); the server is a plain thread answering canned bytes.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from oomload.load.http import Endpoint, send
from oomload.load.payload import CompletionPayloads, PayloadOptions
from oomload.outcome import Outcome
from oomload.trace.model import TraceRecord

Handler = Callable[[socket.socket], None]


class RawServer:
    """Accepts connections and hands each to ``handler`` on its own thread."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            _read_request(conn)
            self.handler(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            v
            for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        )
    )
    while len(body) < length:
        body += conn.recv(65536)
    return body


def _answer(status: str, ctype: str, body: bytes) -> Handler:
    def handler(conn: socket.socket) -> None:
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )

    return handler


def _sse(events: list[bytes], *, cut: bool = False) -> Handler:
    def handler(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for event in events:
            payload = b"data: " + event + b"\n\n"
            conn.sendall(b"%x\r\n%s\r\n" % (len(payload), payload))
        if not cut:
            conn.sendall(b"0\r\n\r\n")

    return handler


def _chunk(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None}]}).encode()


def _usage(prompt: int, completion: int) -> bytes:
    return json.dumps(
        {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    ).encode()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], RawServer]]:
    servers: list[RawServer] = []

    def start(handler: Handler) -> RawServer:
        server = RawServer(handler)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def _send(
    url: str, *, output: int = 3, timeout_s: float = 5.0, answered: bool = False
) -> tuple[Outcome, object]:
    payloads = CompletionPayloads(PayloadOptions(model="m"))
    request = payloads.build(TraceRecord("r", 0.0, 5, output), 0)
    ex = send(
        Endpoint.from_url(url),
        request,
        timeout_s=timeout_s,
        stream=True,
        exact_output=True,
        server_answered_before=answered,
    )
    return ex.outcome, ex


def test_ok_stream_with_exact_usage(serve: Callable[[Handler], RawServer]) -> None:
    server = serve(_sse([_chunk("a"), _chunk("b"), _chunk("c"), _usage(5, 3), b"[DONE]"]))
    outcome, ex = _send(server.url)
    assert outcome is Outcome.OK
    assert ex.usage_prompt_tokens == 5 and ex.usage_completion_tokens == 3  # type: ignore[attr-defined]
    assert ex.ttft_ms is not None and ex.http_status == 200  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (_answer("200 OK", "text/html", b"<html>login</html>"), Outcome.SERVER_ERROR),
        (_answer("502 Bad Gateway", "text/html", b"<html>bad gateway</html>"), Outcome.SERVER_ERROR),
        (
            _answer("503 Service Unavailable", "text/html", b"<html>down</html>"),
            Outcome.RATE_LIMITED,
        ),  # a proxy's
        (
            _answer(
                "503 Service Unavailable",
                "application/json",
                b'{"error":{"message":"The engine is currently busy","type":"Service Unavailable"}}',
            ),
            Outcome.ADMISSION_REJECTED,  # vLLM's own
        ),
        (
            _answer(
                "400 Bad Request", "application/json", b'{"error":{"message":"maximum context length is 8"}}'
            ),
            Outcome.CONTEXT_OVERFLOW,
        ),
        (_answer("500 Internal Server Error", "application/json", b""), Outcome.ENGINE_DEAD),
        (_sse([_chunk("a"), _usage(5, 1), b"[DONE]"]), Outcome.TRUNCATED),  # clamped: 1 < 3
        (_sse([_chunk("a"), _usage(10**12, 3), b"[DONE]"]), Outcome.SERVER_ERROR),  # usage disagrees
        (_sse([_chunk("a"), _usage(5, 10**12), b"[DONE]"]), Outcome.SERVER_ERROR),
        (
            _answer(
                "200 OK",
                "application/json",
                b'{"choices":[{}],"usage":{"prompt_tokens":4,"completion_tokens":3}}',
            ),
            Outcome.SERVER_ERROR,
        ),  # a prompt shorter than sent
        (_sse([_chunk("a"), _chunk("b")], cut=True), Outcome.TRANSPORT_ERROR),  # stream broke: no [DONE]
        (
            _sse([b'{"error":{"message":"busy","type":"Service Unavailable","code":503}}', b"[DONE]"]),
            Outcome.ADMISSION_REJECTED,
        ),
        (
            _sse([_chunk("a"), b'{"error":{"message":"CUDA out of memory. Tried to allocate"}}']),
            Outcome.ENGINE_DEAD,
        ),
    ],
)
def test_misbehaving_servers(
    serve: Callable[[Handler], RawServer], handler: Handler, expected: Outcome
) -> None:
    server = serve(handler)
    assert _send(server.url)[0] is expected
    assert server.requests == 1  # never retried


def test_never_answering_server_times_out(serve: Callable[[Handler], RawServer]) -> None:
    stop = threading.Event()

    def never_answer(conn: socket.socket) -> None:
        stop.wait(5)

    server = serve(never_answer)
    outcome, ex = _send(server.url, timeout_s=0.5)
    stop.set()
    assert outcome is Outcome.TIMEOUT and ex.http_status is None  # type: ignore[attr-defined]


def test_closed_before_answer_and_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert _send(url)[0] is Outcome.TRANSPORT_ERROR  # refused: nothing ever answered
    assert _send(url, answered=True)[0] is Outcome.ENGINE_DEAD  # refused after the server had answered


def test_reset_before_answer_is_a_transport_error(serve: Callable[[Handler], RawServer]) -> None:
    def reset(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    server = serve(reset)
    assert _send(server.url)[0] is Outcome.TRANSPORT_ERROR


def test_an_exchange_abandoned_in_flight_becomes_a_cancelled_result(
    serve: Callable[[Handler], RawServer],
) -> None:
    import gevent

    from oomload.load.http import ExchangeProgress, cancelled_exchange

    release = threading.Event()

    def slow(conn: socket.socket) -> None:
        _sse([_chunk("a"), _chunk("b")], cut=True)(conn)
        release.wait(5)  # the stream stays open: the client is mid-request when it is killed

    server = serve(slow)
    payloads = CompletionPayloads(PayloadOptions(model="m"))
    request = payloads.build(TraceRecord("r", 0.0, 5, 50), 0)
    progress = ExchangeProgress()
    kw = {"timeout_s": 5.0, "stream": True, "exact_output": True, "server_answered_before": False}
    greenlet = gevent.spawn(send, Endpoint.from_url(server.url), request, progress=progress, **kw)
    deadline = gevent.Timeout(5)
    deadline.start()
    try:
        while progress.sse.token_events < 2:
            gevent.sleep(0.01)
    finally:
        deadline.close()
    greenlet.kill(block=True)  # what Locust does to a user it stops
    release.set()
    ex = cancelled_exchange(progress)
    assert ex.outcome is Outcome.CANCELLED and not ex.outcome.is_error
    assert ex.http_status == 200 and ex.ttft_ms is not None and ex.ttft_ms <= ex.e2e_ms
    assert (ex.reason, ex.detail) == ("abandoned by oomload", "after 2 token events")
    assert ex.start_unix_s == progress.start_unix_s
