"""The per-endpoint address cache and the connect that avoids a resolver / hub round trip."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from oomload.load.http import AddressCache, Endpoint, connect, send
from oomload.load.payload import PreparedRequest
from oomload.outcome import Outcome


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_ip_literal_is_never_resolved() -> None:
    v4 = AddressCache("127.0.0.1", 8000)
    v6 = AddressCache("::1", 8000)
    v4.forget()
    assert v4.addresses() == [(socket.AF_INET, ("127.0.0.1", 8000))]
    assert v6.addresses() == [(socket.AF_INET6, ("::1", 8000, 0, 0))]


def test_a_name_is_resolved_once_per_ttl_and_after_forget(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []

    def fake_getaddrinfo(host: str, port: int, *_: object) -> list[tuple[object, ...]]:
        calls.append((host, port))
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"10.0.0.{len(calls)}", port))]

    monkeypatch.setattr("oomload.load.http.gevent.socket.getaddrinfo", fake_getaddrinfo)
    clock = FakeClock()
    cache = AddressCache("vllm.internal", 8000, ttl_s=30.0, clock=clock)
    assert cache.addresses() == [(socket.AF_INET, ("10.0.0.1", 8000))]
    clock.now_s = 29.9
    assert cache.addresses() == [(socket.AF_INET, ("10.0.0.1", 8000))]
    clock.now_s = 30.0
    assert cache.addresses() == [(socket.AF_INET, ("10.0.0.2", 8000))]
    cache.forget()
    assert cache.addresses() == [(socket.AF_INET, ("10.0.0.3", 8000))]
    assert calls == [("vllm.internal", 8000)] * 3


def test_endpoint_caches_per_instance_and_compares_by_value() -> None:
    a = Endpoint.from_url("http://127.0.0.1:8000/v1")
    b = Endpoint.from_url("http://127.0.0.1:8000/v1")
    assert a == b
    assert a.cache is not b.cache
    assert a.cache.addresses.addresses() == [(socket.AF_INET, ("127.0.0.1", 8000))]


def test_connect_reaches_a_listener_with_nodelay(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    sock = connect([(socket.AF_INET, ("127.0.0.1", port))])
    try:
        assert sock.getpeername() == ("127.0.0.1", port)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert sock.gettimeout() is None
    finally:
        sock.close()


def test_connect_tries_the_next_address_after_a_refusal(listener: socket.socket, closed_port: int) -> None:
    port = listener.getsockname()[1]
    sock = connect([(socket.AF_INET, ("127.0.0.1", closed_port)), (socket.AF_INET, ("127.0.0.1", port))])
    try:
        assert sock.getpeername() == ("127.0.0.1", port)
    finally:
        sock.close()


def test_connect_raises_the_last_refusal(closed_port: int) -> None:
    with pytest.raises(ConnectionRefusedError):
        connect([(socket.AF_INET, ("127.0.0.1", closed_port))])
    with pytest.raises(OSError):
        connect([])


def _serve_once(listener: socket.socket, answer: bytes | None) -> threading.Thread:
    """Accept one connection and read the ClientHello; answer ``answer`` (not TLS), or ``None``: reset
    the connection (RST)."""

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            if answer is None:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            conn.sendall(answer)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("answer", "why"),
    [(None, "TLS handshake: ECONNRESET"), (b"HTTP/1.1 400 Bad Request\r\n\r\n", "TLS handshake: ")],
)
def test_a_failed_tls_handshake_is_a_failed_connect(
    listener: socket.socket, answer: bytes | None, why: str
) -> None:
    """A reset or a plain-HTTP answer during the handshake was raised out of ``send`` (recorded as
    cancelled, a traceback from Locust); it is a connect that failed: nothing was sent, no HTTP status
    (so the user backs off and the death watch checks /health, as for a refused connect)."""
    port = listener.getsockname()[1]
    thread = _serve_once(listener, answer)
    endpoint = Endpoint.from_url(f"https://127.0.0.1:{port}")
    request = PreparedRequest("r0", "/v1/completions", b"{}", 10, 5)
    ex = send(endpoint, request, timeout_s=10, stream=True, exact_output=False, server_answered_before=True)
    thread.join(10)
    assert ex.outcome is Outcome.TRANSPORT_ERROR and ex.http_status is None
    assert ex.reason is not None and ex.reason.startswith(f"connect failed ({why}"), ex.reason
