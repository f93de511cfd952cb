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

One exchange is four steps: ``_connect`` (a socket, TLS if asked), ``_send`` (the request, then the
response head), ``_read`` (a stream or a body) and ``classify``. Each step records how the exchange
ended in a small ``_Wire``, an ``Ending`` (answered, refused, connect failed, no answer, broke, timed
out) plus what the answer said, and the next step runs only after an answered one.
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
from enum import Enum
from typing import Any

import gevent
import gevent.socket
from geventhttpclient.response import HTTPSocketResponse

from oomload.load.baseurl import BaseUrl
from oomload.load.classify import Observation, classify, error_fields
from oomload.load.payload import PreparedRequest
from oomload.load.sse import SseStream, error_message, error_type, parse_json_body
from oomload.outcome import Outcome
from oomload.outfile import TOO_MANY_OPEN_FILES

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
        base = BaseUrl.parse(url)
        default = (base.tls and base.port == 443) or (not base.tls and base.port == 80)
        host_header = base.host if default else f"{base.host}:{base.port}"
        lines = f"Host: {host_header}\r\n"
        if api_key:
            lines += f"Authorization: Bearer {api_key}\r\n"
        return cls(base.host, base.port, base.tls, base.path, lines.encode("latin-1"))


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


def unsent_exchange(reason: str, detail: str, *, refused: bool, server_answered_before: bool) -> Exchange:
    """The result of a request that could not be built because the server did not help (a chat
    prompt whose ``/tokenize`` failed): judged as a send that got no answer (``reason``), so a refusal
    after the server had answered is the engine's death, as for a send."""
    now = time.time()
    obs = Observation(transport_error=reason, refused=refused, server_answered_before=server_answered_before)
    outcome, judged, _ = classify(obs)
    return Exchange(
        outcome=outcome,
        reason=judged,
        detail=detail,
        start_unix_s=now,
        end_unix_s=now,
        http_status=None,
        usage_prompt_tokens=None,
        usage_completion_tokens=None,
        ttft_ms=None,
        tpot_ms=None,
        itl_max_ms=None,
        e2e_ms=0.0,
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
    """Send one request on a fresh connection and classify how it ended.

    ``_exchange`` connects, sends and reads under one timeout and returns a ``_Wire``: how the
    exchange ended (``Ending``) and what the answer said (``_Answer``); ``_observation`` turns that
    into ``classify``'s ``Observation``; ``_result`` adds the timings.
    """
    message = _request_bytes(endpoint, request)
    progress = progress if progress is not None else ExchangeProgress()
    progress.start_unix_s = time.time()
    progress.t0 = time.perf_counter()
    wire = _exchange(endpoint, message, stream=stream, timeout_s=timeout_s, progress=progress)
    t_end = time.perf_counter()
    obs = _observation(wire, progress.sse, request, exact_output, server_answered_before)
    return _result(progress, obs, t_end, stream=stream)


class Ending(Enum):
    """How an exchange ended on the wire, before its answer is judged."""

    ANSWERED = "answered"  # the answer was read to its end (a stream may still lack [DONE])
    REFUSED = "refused"  # connect refused: the request provably never reached the server
    CONNECT_FAILED = "connect failed"  # no address, unreachable, reset during the handshake, …
    NO_ANSWER = "no answer"  # the request could not be sent, or the connection closed before a head
    BROKE = "broke"  # the answer broke off before its end
    TIMED_OUT = "timed out"  # the request timeout elapsed (at any point)


@dataclass(slots=True)
class _Answer:
    """What the server's answer said (filled as it is read)."""

    read_to_end: bool = True  # a stream: [DONE] seen; a body: read whole
    well_formed: bool = True  # a 200 body was JSON with choices or an error, or an event stream
    error: tuple[str | None, int | None, str | None] = (None, None, None)  # (text, code, type)
    error_in_200: bool = False  # the error came inside a 200 (an error event or a JSON error body)
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None


@dataclass(slots=True)
class _Wire:
    """One exchange as the socket saw it: how it ended, the HTTP status, the answer."""

    ending: Ending = Ending.ANSWERED
    socket_error: str | None = None  # errno name or exception type, for the failed endings
    http_status: int | None = None
    answer: _Answer = field(default_factory=_Answer)

    @property
    def transport_error(self) -> str | None:
        """The short text of a failed connection (``None`` when answered or timed out)."""
        why = self.socket_error
        if self.ending is Ending.CONNECT_FAILED and why in ("EMFILE", "ENFILE"):  # this host, not the server
            return f"connect failed ({why}): {TOO_MANY_OPEN_FILES}"
        return {
            Ending.REFUSED: "connection refused",
            Ending.CONNECT_FAILED: f"connect failed ({why})",
            Ending.NO_ANSWER: f"closed before an answer ({why})",
            Ending.BROKE: f"{why} before the end",
        }.get(self.ending)

    @property
    def complete(self) -> bool:
        """The answer was not cut off (vacuously true when there was none)."""
        return self.ending not in (Ending.BROKE, Ending.TIMED_OUT) and self.answer.read_to_end


def _request_bytes(endpoint: Endpoint, request: PreparedRequest) -> bytes:
    head = (
        f"POST {endpoint.base_path}{request.path} HTTP/1.1\r\n".encode("latin-1")
        + endpoint.header_lines
        + b"Content-Type: application/json\r\nAccept: text/event-stream, application/json\r\n"
        + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(request.body)
    )
    return head + request.body


def _exchange(
    endpoint: Endpoint, message: bytes, *, stream: bool, timeout_s: float, progress: ExchangeProgress
) -> _Wire:
    """Connect, send, read, all under one ``gevent.Timeout``; what was seen, however it ended."""
    wire = _Wire()
    sock: socket.socket | None = None
    timer = gevent.Timeout(timeout_s)
    timer.start()
    try:
        sock = _connect(endpoint, wire)
        if sock is not None:
            response = _send(sock, message, wire)
            if response is not None:
                wire.http_status = progress.http_status = response.status_code
                _read(response, stream, progress.sse, wire)
    except gevent.Timeout as timeout:
        if timeout is not timer:
            raise
        wire.ending = Ending.TIMED_OUT
    finally:
        timer.close()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
    return wire


def _connect(endpoint: Endpoint, wire: _Wire) -> socket.socket | None:
    """A connected socket, its TLS handshake done when the endpoint is ``https``; or ``None`` with the
    failure in ``wire`` (the name is resolved anew next time). A handshake that fails (reset, closed,
    a certificate refused) is a failed connect like an unreachable host: nothing was sent."""
    addresses = endpoint.cache.addresses
    try:
        sock = connect(addresses.addresses())
    except ConnectionRefusedError:
        addresses.forget()
        wire.ending = Ending.REFUSED
        return None
    except OSError as err:
        addresses.forget()
        wire.ending, wire.socket_error = Ending.CONNECT_FAILED, _errname(err)
        return None
    try:
        return _wrap_tls(endpoint, sock)
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError; a bad server name a ValueError
        sock.close()
        addresses.forget()
        why = (err.reason or type(err).__name__) if isinstance(err, ssl.SSLError) else _errname(err)
        wire.ending, wire.socket_error = Ending.CONNECT_FAILED, f"TLS handshake: {why}"
        return None
    except BaseException:  # the request timeout, a kill: the socket still closes
        sock.close()
        raise


def _wrap_tls(endpoint: Endpoint, sock: socket.socket) -> socket.socket:
    if not endpoint.tls:
        return sock
    cache = endpoint.cache
    if cache.tls_context is None:
        cache.tls_context = ssl.create_default_context()
    return cache.tls_context.wrap_socket(sock, server_hostname=endpoint.host)


def _send(sock: socket.socket, message: bytes, wire: _Wire) -> HTTPSocketResponse | None:
    """Write the request and parse the response head; ``None`` with the failure in ``wire``."""
    try:
        sock.sendall(message)
        return HTTPSocketResponse(sock, block_size=BLOCK_BYTES, method="POST")
    except _WIRE_ERRORS as err:
        wire.ending, wire.socket_error = Ending.NO_ANSWER, _errname(err)
        return None


def _read(response: HTTPSocketResponse, stream: bool, sse: SseStream, wire: _Wire) -> None:
    """Read the answer to its end into ``wire.answer`` (stream events go to ``sse`` as they arrive)."""
    ctype = str(response.get("content-type") or "")
    try:
        if wire.http_status == 200 and stream and ctype.startswith("text/event-stream"):
            _read_stream(response, sse, wire.answer)
        else:
            _read_body(response, wire.http_status, ctype, sse, wire.answer)
    except _WIRE_ERRORS as err:
        wire.ending, wire.socket_error = Ending.BROKE, _errname(err)


def _read_stream(response: HTTPSocketResponse, sse: SseStream, answer: _Answer) -> None:
    while True:
        line = response.readline(b"\n")
        if not line:
            break
        sse.feed_line(line, time.perf_counter())
    sse.close(time.perf_counter())
    answer.read_to_end = sse.done


def _read_body(
    response: HTTPSocketResponse, status: int | None, ctype: str, sse: SseStream, answer: _Answer
) -> None:
    body = _read_capped(response)
    if status != 200:
        answer.error = (error_message(body), None, error_type(body))
        return
    answer.usage_prompt_tokens, answer.usage_completion_tokens, body_error, has_choices = parse_json_body(
        body
    )
    if body_error is not None:
        answer.error, answer.error_in_200 = error_fields(body_error), True
    answer.well_formed = has_choices or body_error is not None
    if ctype.startswith("text/event-stream"):  # streamed although not asked
        sse.feed(body, time.perf_counter())
        sse.close(time.perf_counter())
        answer.well_formed = sse.events > 0


def _observation(
    wire: _Wire,
    sse: SseStream,
    request: PreparedRequest,
    exact_output: bool,
    server_answered_before: bool,
) -> Observation:
    """What ``classify`` judges: the wire's ending and the answer, an SSE error event and usage first,
    and what the request sent for its usage to be held to."""
    answer = wire.answer
    error, error_in_200 = answer.error, answer.error_in_200
    if sse.error is not None:
        error, error_in_200 = error_fields(sse.error), True
    usage_prompt, usage_completion = answer.usage_prompt_tokens, answer.usage_completion_tokens
    if sse.events:
        usage_prompt, usage_completion = sse.usage_prompt_tokens, sse.usage_completion_tokens
    error_text, error_code, error_type_name = error
    return Observation(
        http_status=wire.http_status,
        error_text=error_text,
        error_code=error_code,
        error_type=error_type_name,
        stream_error=error_in_200,
        timed_out=wire.ending is Ending.TIMED_OUT,
        transport_error=wire.transport_error,
        refused=wire.ending is Ending.REFUSED,
        server_answered_before=server_answered_before,
        body_ok=answer.well_formed,
        malformed=sse.malformed > 0,
        stream_complete=wire.complete,
        usage_prompt_tokens=usage_prompt,
        usage_completion_tokens=usage_completion,
        output_tokens_asked=request.output_tokens,
        exact_output=exact_output,
        prompt_tokens_sent=request.usage_prompt_tokens,
        prompt_slack_tokens=request.usage_slack_tokens,
    )


def _result(progress: ExchangeProgress, obs: Observation, t_end: float, *, stream: bool) -> Exchange:
    """The classified exchange with its timings: TTFT, TPOT and the longest gap from the token events
    (a non-streamed ok answer's TTFT is its end to end time)."""
    outcome, reason, detail = classify(obs)
    sse, t0 = progress.sse, progress.t0
    ttft_ms = tpot_ms = itl_max_ms = None
    if sse.first_token_s is not None:
        ttft_ms = (sse.first_token_s - t0) * 1000.0
        tokens = obs.usage_completion_tokens or sse.token_events
        if sse.last_token_s is not None and tokens >= 2:
            tpot_ms = (sse.last_token_s - sse.first_token_s) * 1000.0 / (tokens - 1)
        if sse.token_events >= 2:
            itl_max_ms = sse.max_gap_s * 1000.0
    elif obs.http_status == 200 and not stream and outcome is Outcome.OK:
        ttft_ms = (t_end - t0) * 1000.0
    e2e_ms = (t_end - t0) * 1000.0
    return Exchange(
        outcome=outcome,
        reason=reason,
        detail=detail,
        start_unix_s=progress.start_unix_s,
        end_unix_s=progress.start_unix_s + e2e_ms / 1000.0,
        http_status=obs.http_status,
        usage_prompt_tokens=obs.usage_prompt_tokens,
        usage_completion_tokens=obs.usage_completion_tokens,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        itl_max_ms=itl_max_ms,
        e2e_ms=e2e_ms,
    )


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
