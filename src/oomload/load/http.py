"""One HTTP exchange on gevent sockets: send a prepared request, read the SSE stream incrementally.

**A fresh connection per request** (``Connection: close``). vLLM's uvicorn closes idle keep-alive
sockets after 5 s; a pooled client that writes a request onto a socket the server is closing loses
it, and because the request may or may not have reached the server, it cannot safely be retried
(POST is not idempotent). On the real vLLM at concurrency ≥ 16, pooled clients lost 6–23 of 32–128
requests this way; a fresh connection per request lost none. A loopback connect costs tens of µs,
small next to one request, as long as nothing else rides along: the host's addresses are resolved
once (an IP literal never; a name every ``ADDRESS_TTL_S`` and after a failed connect) because
gevent's default resolver runs ``getaddrinfo`` on a thread, a hub round trip that cost a median
9 ms per request at 128 users; and the connect is tried twice before waiting, because on loopback the
handshake has already completed when the first non-blocking ``connect`` returns ``EINPROGRESS``.
The TLS context is built once per endpoint.

Nothing is ever retried: a refused connect provably never reached the server (and after the server
had answered, it means the server died); every other failure is a transport error (a stream that
broke before ``[DONE]`` without usage is one: a dying server), a timeout or a truncated answer.

``send`` keeps what it has seen so far in an ``ExchangeProgress`` the caller may pass: when the user's
greenlet is killed mid-request (oomload abandoning it), ``cancelled_exchange`` turns that progress
into a ``cancelled`` result with the start time, the TTFT and the tokens streamed until then.

The response head is parsed by ``geventhttpclient``'s C parser (``HTTPSocketResponse``); the body is
read line by line (``readline``) and fed to ``SseStream`` as it arrives, so TTFT is the time of the
first token event, not of the first buffer full. The whole exchange runs under one ``gevent.Timeout``.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import ipaddress
import math
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.socket
from geventhttpclient.response import HTTPSocketResponse

from oomload.errors import ConfigError
from oomload.load.classify import Observation, classify, error_fields
from oomload.load.payload import PreparedRequest
from oomload.load.sse import SseStream, error_message, error_type, parse_json_body
from oomload.outcome import Outcome

MAX_ERROR_BODY_BYTES = 1 << 20
# socket errors, and geventhttpclient's parse errors (http.client.HTTPException subclasses)
_WIRE_ERRORS = (OSError, ValueError, http.client.HTTPException)
BLOCK_BYTES = 64 * 1024
ADDRESS_TTL_S = 30.0  # a host name is resolved again after this long (an IP literal never)

SocketAddress = tuple[int, Any]  # (address family, sockaddr as ``socket.connect`` takes it)


class AddressCache:
    """The socket addresses of one host and port, resolved at most every ``ttl_s``.

    An IP literal is never resolved. A name is resolved through gevent (``getaddrinfo``) on first use,
    again once ``ttl_s`` has passed, and again after ``forget`` (called when a connect fails).
    """

    __slots__ = ("_addresses", "_clock", "_expires_s", "_literal", "host", "port", "ttl_s")

    def __init__(
        self,
        host: str,
        port: int,
        ttl_s: float = ADDRESS_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host, self.port, self.ttl_s, self._clock = host, port, ttl_s, clock
        literal = _literal_address(host, port)
        self._literal = literal is not None
        self._addresses: list[SocketAddress] = [] if literal is None else [literal]
        self._expires_s = math.inf if literal is not None else -math.inf

    def addresses(self) -> list[SocketAddress]:
        """The addresses to try, in ``getaddrinfo`` order (``OSError`` if the name does not resolve)."""
        now = self._clock()
        if now >= self._expires_s:
            infos = gevent.socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)
            self._addresses = [(family, sockaddr) for family, _, _, _, sockaddr in infos]
            self._expires_s = now + self.ttl_s
        return self._addresses

    def forget(self) -> None:
        """Resolve a name again on the next use (an IP literal stays)."""
        if not self._literal:
            self._expires_s = -math.inf


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where requests go: host, port, TLS, path prefix and the extra header lines (API key).

    ``cache`` holds what this process derives once per endpoint: the resolved addresses and the TLS
    context (built on first use).
    """

    host: str
    port: int
    tls: bool
    base_path: str
    header_lines: bytes
    cache: _EndpointCache = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache", _EndpointCache(AddressCache(self.host, self.port)))

    @classmethod
    def from_url(cls, url: str, api_key: str | None = None) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"URL {url!r} must look like http://HOST:PORT")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        default = (tls and port == 443) or (not tls and port == 80)
        host_header = parts.hostname if default else f"{parts.hostname}:{port}"
        lines = f"Host: {host_header}\r\n"
        if api_key:
            lines += f"Authorization: Bearer {api_key}\r\n"
        return cls(parts.hostname, port, tls, parts.path.rstrip("/"), lines.encode("latin-1"))


class _EndpointCache:
    __slots__ = ("addresses", "tls_context")

    def __init__(self, addresses: AddressCache) -> None:
        self.addresses = addresses
        self.tls_context: ssl.SSLContext | None = None


@dataclass(frozen=True, slots=True)
class Exchange:
    """What one request produced, ready to become a ``RequestResult``."""

    outcome: Outcome
    reason: str | None
    detail: str | None
    start_unix_s: float
    end_unix_s: float
    http_status: int | None
    usage_prompt_tokens: int | None
    usage_completion_tokens: int | None
    ttft_ms: float | None
    tpot_ms: float | None
    itl_max_ms: float | None
    e2e_ms: float


class ExchangeProgress:
    """What one exchange has seen so far (filled by ``send`` as it goes)."""

    __slots__ = ("http_status", "sse", "start_unix_s", "t0")

    def __init__(self) -> None:
        self.start_unix_s = time.time()
        self.t0 = time.perf_counter()
        self.sse = SseStream()
        self.http_status: int | None = None


def cancelled_exchange(progress: ExchangeProgress, reason: str = "abandoned by oomload") -> Exchange:
    """The ``cancelled`` result of an exchange abandoned in flight (no classification: not the server's)."""
    t_end = time.perf_counter()
    sse = progress.sse
    ttft_ms = None if sse.first_token_s is None else (sse.first_token_s - progress.t0) * 1000.0
    e2e_ms = (t_end - progress.t0) * 1000.0
    detail = f"after {sse.token_events} token events" if sse.token_events else None
    return Exchange(
        outcome=Outcome.CANCELLED,
        reason=reason,
        detail=detail,
        start_unix_s=progress.start_unix_s,
        end_unix_s=progress.start_unix_s + e2e_ms / 1000.0,
        http_status=progress.http_status,
        usage_prompt_tokens=sse.usage_prompt_tokens,
        usage_completion_tokens=sse.usage_completion_tokens,
        ttft_ms=ttft_ms,
        tpot_ms=None,
        itl_max_ms=None,
        e2e_ms=e2e_ms,
    )


def send(
    endpoint: Endpoint,
    request: PreparedRequest,
    *,
    timeout_s: float,
    stream: bool,
    exact_output: bool,
    server_answered_before: bool,
    progress: ExchangeProgress | None = None,
) -> Exchange:
    """Send one request on a fresh connection and classify how it ended."""
    head = (
        f"POST {endpoint.base_path}{request.path} HTTP/1.1\r\n".encode("latin-1")
        + endpoint.header_lines
        + b"Content-Type: application/json\r\nAccept: text/event-stream, application/json\r\n"
        + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(request.body)
    )
    progress = progress if progress is not None else ExchangeProgress()
    start_unix_s = progress.start_unix_s = time.time()
    t0 = progress.t0 = time.perf_counter()
    sse = progress.sse
    status: int | None = None
    timed_out = refused = False
    transport: str | None = None
    body_ok = True
    complete = True
    err_text: str | None = None
    err_code: int | None = None
    err_type: str | None = None
    stream_error = False
    usage_prompt = usage_completion = None
    sock: socket.socket | None = None
    timer = gevent.Timeout(timeout_s)
    timer.start()
    try:
        cache = endpoint.cache
        try:
            sock = connect(cache.addresses.addresses())
        except ConnectionRefusedError:
            cache.addresses.forget()
            refused, transport = True, "connection refused"
            raise _Done() from None
        except OSError as err:
            cache.addresses.forget()
            transport = f"connect failed ({_errname(err)})"
            raise _Done() from None
        if endpoint.tls:
            if cache.tls_context is None:
                cache.tls_context = ssl.create_default_context()
            sock = cache.tls_context.wrap_socket(sock, server_hostname=endpoint.host)
        try:
            sock.sendall(head + request.body)
            resp = HTTPSocketResponse(sock, block_size=BLOCK_BYTES, method="POST")
        except _WIRE_ERRORS as err:
            transport = f"closed before an answer ({_errname(err)})"
            raise _Done() from None
        status = progress.http_status = resp.status_code
        ctype = str(resp.get("content-type") or "")
        try:
            if status == 200 and stream and ctype.startswith("text/event-stream"):
                complete = False
                while True:
                    line = resp.readline(b"\n")
                    if not line:
                        break
                    sse.feed_line(line, time.perf_counter())
                sse.close(time.perf_counter())
                complete = sse.done
            else:
                body = _read_capped(resp)
                if status == 200:
                    usage_prompt, usage_completion, body_error, has_choices = parse_json_body(body)
                    if body_error is not None:
                        err_text, err_code, err_type = error_fields(body_error)
                        stream_error = True
                    body_ok = has_choices or body_error is not None
                    if ctype.startswith("text/event-stream"):  # streamed although not asked
                        sse.feed(body, time.perf_counter())
                        sse.close(time.perf_counter())
                        body_ok = sse.events > 0
                else:
                    err_text, err_type = error_message(body), error_type(body)
        except _WIRE_ERRORS as err:
            complete = False
            transport = f"{_errname(err)} before the end"
    except gevent.Timeout as timeout:
        if timeout is not timer:
            raise
        timed_out = True
        complete = False
    except _Done:
        pass
    finally:
        timer.close()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
    t_end = time.perf_counter()
    if sse.error is not None:
        err_text, err_code, err_type = error_fields(sse.error)
        stream_error = True
    if sse.events:
        usage_prompt, usage_completion = sse.usage_prompt_tokens, sse.usage_completion_tokens
    obs = Observation(
        http_status=status,
        error_text=err_text,
        error_code=err_code,
        error_type=err_type,
        stream_error=stream_error,
        timed_out=timed_out,
        transport_error=transport,
        refused=refused,
        server_answered_before=server_answered_before,
        body_ok=body_ok,
        stream_complete=complete,
        usage_prompt_tokens=usage_prompt,
        usage_completion_tokens=usage_completion,
        output_tokens_asked=request.output_tokens,
        exact_output=exact_output,
    )
    outcome, reason, detail = classify(obs)
    ttft_ms = tpot_ms = itl_max_ms = None
    if sse.first_token_s is not None:
        ttft_ms = (sse.first_token_s - t0) * 1000.0
        tokens = usage_completion or sse.token_events
        if sse.last_token_s is not None and tokens >= 2:
            tpot_ms = (sse.last_token_s - sse.first_token_s) * 1000.0 / (tokens - 1)
        if sse.token_events >= 2:
            itl_max_ms = sse.max_gap_s * 1000.0
    elif status == 200 and not stream and outcome is Outcome.OK:
        ttft_ms = (t_end - t0) * 1000.0
    e2e_ms = (t_end - t0) * 1000.0
    return Exchange(
        outcome=outcome,
        reason=reason,
        detail=detail,
        start_unix_s=start_unix_s,
        end_unix_s=start_unix_s + e2e_ms / 1000.0,
        http_status=status,
        usage_prompt_tokens=usage_prompt,
        usage_completion_tokens=usage_completion,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        itl_max_ms=itl_max_ms,
        e2e_ms=e2e_ms,
    )


class _Done(Exception):
    """Internal: the exchange ended early (connect or send failed)."""


def connect(addresses: list[SocketAddress]) -> gevent.socket.socket:
    """A connected TCP socket (``TCP_NODELAY``) to the first address that accepts; else the last error.

    The first ``connect`` is non-blocking; one that is still in progress is completed by gevent's
    ``connect``, which tries once more before it waits for the socket to become writable (on loopback
    the handshake is done by then, so the request goes out without a hub round trip).
    """
    if not addresses:
        raise OSError(errno.EADDRNOTAVAIL, "getaddrinfo returned no address")
    last: OSError | None = None
    for family, sockaddr in addresses:
        sock = gevent.socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(0.0)
            try:
                sock.connect(sockaddr)
            except BlockingIOError:
                sock.settimeout(None)
                sock.connect(sockaddr)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as err:
            sock.close()
            last = err
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    assert last is not None
    raise last


def _literal_address(host: str, port: int) -> SocketAddress | None:
    """``(family, sockaddr)`` of an IP literal without a scope id; ``None`` for a name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 4:
        return socket.AF_INET, (host, port)
    if "%" in host:
        return None  # a scoped IPv6 address: getaddrinfo fills in the scope id
    return socket.AF_INET6, (host, port, 0, 0)


def _read_capped(resp: HTTPSocketResponse) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < MAX_ERROR_BODY_BYTES:
        data = resp.read(BLOCK_BYTES)
        if not data:
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)


def _errname(err: BaseException) -> str:
    code = getattr(err, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return errno.errorcode[code]
    return type(err).__name__
