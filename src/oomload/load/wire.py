"""What an oomload master and its Locust workers say to each other: the message names and bodies,
carried by Locust's own master/worker protocol (ZeroMQ + msgpack, ``runner.send_message`` /
``runner.register_message``). Pure: no Locust, no sockets.

A worker (``oomload worker``, local or on another host) first does what any Locust worker does —
``client_ready``, acknowledged by the master — and then proves, and makes the master prove, that both
hold the same **worker token** (a shared secret, ``OOMLOAD_WORKER_TOKEN`` or a token file; it never
travels) before any configuration or result moves::

    worker → master   oomload_hello     {oomload_version, locust_version, host, pid, local_index, nonce}
    master → worker   oomload_challenge {nonce, proof}    proof = HMAC(token, "master", both nonces, id)
                  or  oomload_refused   {error}           (version mismatch)
    worker → master   oomload_auth      {proof}           proof = HMAC(token, "worker", both nonces, id)
                  or  (nothing: a master whose proof is wrong is refused, the worker leaves, exit 2)
    --- from here on every message below is sealed (``LinkKeys``) ---
    master → worker   oomload_config    {worker, workers, user_class, options, trace}
                  or  oomload_refused   {error}                   (wrong token, one worker too many)
    worker → master   oomload_ready     {worker}                  (user class bound: load may start)
                  or  oomload_failed    {worker, error}           (e.g. the master's URL is not trusted)
    master → worker   oomload_step      {step, concurrency, phase}   oomload_step_end {step}
    worker → master   oomload_step_count {step, started, outcomes, …}  (its step report at the step's end)
    worker → master   oomload_results   {worker, seq, rows}       (batched RequestResult rows)
    master → worker   oomload_stop      {grace_s, seq}            (no new requests; drain)
    worker → master   oomload_drained   {worker, seq}             (every row it had was sent first)

**Sealing.** Both nonces are fresh per connection (``secrets``), so a recorded handshake proves
nothing the next time. Each side derives a session key from the token, the nonces and the worker's
Locust id; a sealed message is ``{seq, body, mac}`` with ``mac`` = HMAC-SHA256(session key, direction,
message type, seq, the body as canonical JSON). The receiver drops (and counts) a body that is
unsealed, badly sealed, sealed for the other direction or another type, or whose ``seq`` it has
accepted before (a replay). Locust's own messages (heartbeats, spawn, statistics)
cannot be sealed; the master passes them on only from workers that completed the handshake, on the
connection they completed it on, and the worker only from a master that proved the token.

**Results are typed records.** ``result_from_wire`` admits a row only as a ``RequestResult`` with
known fields of the right types within bounds (``RESULT_BOUNDS``), for a step the master has begun;
anything else is dropped and counted, never written.

Each worker's step report (achieved concurrency, requests in flight, started, outcomes) rides on
Locust's own statistics report once a second (``report_to_master``, key ``"oomload"``), and once more,
sealed as ``oomload_step_count``, in answer to ``oomload_step_end``: the worker has stopped sending
for that step, so that report's counts are the step's final ones (the master writes the step's end
line from them).

What never travels: the worker token, the API key (each worker reads it from its own environment,
through a variable of its own choosing: the name in ``options`` is ignored), prompt or completion
text (a trace holds lengths only; rows hold lengths, timings and outcomes). The link is authenticated
and integrity-checked, not encrypted: the trace's lengths and the target URL are readable on the
wire, so it belongs on a private network or in a tunnel (docs/replay.md, "Security").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oomload.errors import ConfigError
from oomload.outcome import Outcome, RequestResult
from oomload.trace.model import TraceRecord

HELLO = "oomload_hello"
CONFIG = "oomload_config"
REFUSED = "oomload_refused"
READY = "oomload_ready"
FAILED = "oomload_failed"
STEP = "oomload_step"
STEP_END = "oomload_step_end"
STEP_COUNT = "oomload_step_count"  # a worker's step report at the step's end
RESULTS = "oomload_results"
STOP = "oomload_stop"
DRAINED = "oomload_drained"
CHALLENGE = "oomload_challenge"
AUTH = "oomload_auth"
REPORT = "oomload_report"  # the sealed step report inside Locust's statistics report
SEALED = (CONFIG, READY, FAILED, STEP, STEP_END, STEP_COUNT, RESULTS, STOP, DRAINED)

REPLAY_WINDOW = 1024  # sequence numbers: how far out of order a sealed message may arrive
TOKEN_ENV = "OOMLOAD_WORKER_TOKEN"  # the worker token, in the environment of the master and workers
MIN_TOKEN_CHARS = 32
MAX_TOKEN_CHARS = 1024

DEFAULT_MASTER_PORT = 5557  # Locust's own default master port


def parse_master_address(text: str) -> tuple[str, int]:
    """``HOST[:PORT]`` (``[v6]:PORT`` too) → ``(host, port)``; Locust's 5557 when no port is given."""
    value = text.strip()
    if not value:
        raise ConfigError("--master needs HOST[:PORT], e.g. 10.0.0.5:5557")
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError(f"--master {text!r} is not HOST[:PORT]")
        port_text = rest[1:] if rest else ""
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
    else:
        host, port_text = value, ""
    if not host or any(c.isspace() or c in "/@" for c in host):
        raise ConfigError(f"--master {text!r} is not HOST[:PORT]")
    if not port_text:
        return host, DEFAULT_MASTER_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"--master {text!r}: the port must be a number within 1..65535")
    return host, int(port_text)


WILDCARD_HOSTS = frozenset({"", "*", "0.0.0.0", "::"})  # a master bound to every address


def local_master_address(bind_host: str, port: int) -> str:
    """Where a worker on the master's own host reaches a master bound to ``bind_host``: that address
    when it is a specific one (a master bound to 10.0.0.5 listens on nothing else), ``127.0.0.1``
    for a wildcard bind; ``--master``'s form (``[v6]:PORT`` for an IPv6 address)."""
    host = bind_host.strip()
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_key(url: str) -> str:
    """A URL in the form two URLs of the same server share: scheme and host in lower case, the
    scheme's default port made explicit, no trailing slash, no query or fragment."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(str(url).strip())
        port = parts.port
    except ValueError:
        return str(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    netloc = f"[{host}]" if ":" in host else host
    return f"{scheme}://{netloc}:{port}{parts.path.rstrip('/')}"


def version_mismatch(master: Mapping[str, str], worker: Mapping[str, Any]) -> str | None:
    """Why a worker cannot serve this master (a sentence), or None. oomload's version must be the
    same (the messages and the request shape are versioned with it); Locust's major.minor too."""
    theirs = str(worker.get("oomload_version"))
    if theirs != master["oomload_version"]:
        return f"it runs oomload {theirs}, the master {master['oomload_version']}; install the same version"
    mine_locust, their_locust = master["locust_version"], str(worker.get("locust_version"))
    if mine_locust.split(".")[:2] != their_locust.split(".")[:2]:
        return f"it runs Locust {their_locust}, the master {mine_locust}; install the same version"
    return None


def trace_to_wire(records: Sequence[TraceRecord]) -> list[dict[str, Any]]:
    """The trace as the master sends it: one JSON object per record (lengths, timing and ids only)."""
    return [r.to_json() for r in records]


def trace_from_wire(rows: Any) -> list[TraceRecord]:
    """The inverse of ``trace_to_wire``; ``ConfigError`` for a body this version cannot read."""
    if not isinstance(rows, list) or not rows:
        raise ConfigError("the master sent no trace to replay")
    try:
        return [TraceRecord.from_json(row) for row in rows]
    except (KeyError, ValueError, TypeError) as err:
        raise ConfigError(f"the master's trace has a shape this worker cannot read ({err})") from err


# -- the worker token and the handshake ---------------------------------------------------------------


class LinkRejected(Exception):
    """A message that is dropped and counted: ``reason`` is a short, fixed word (never peer text)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def new_token() -> str:
    """A fresh worker token: 256 random bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def new_nonce() -> str:
    return secrets.token_hex(16)


def check_token(value: str, where: str) -> str:
    """The token in ``value`` (one trailing line break of a file dropped); ``ConfigError`` naming
    ``where`` (a variable or a file, never the value) when it cannot be one."""
    token = value[:-1] if value.endswith("\n") else value
    token = token[:-1] if token.endswith("\r") else token
    if not token:
        raise ConfigError(f"the worker token in {where} is empty")
    if len(token) > MAX_TOKEN_CHARS or any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise ConfigError(
            f"the worker token in {where} is not one word of printable ASCII of at most "
            f"{MAX_TOKEN_CHARS} characters (its value is not shown)"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the worker token in {where} has {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\x1f".join(parts).encode(), hashlib.sha256).hexdigest()


def handshake_proof(token: str, role: str, worker_nonce: str, master_nonce: str, client_id: str) -> str:
    """What ``role`` (``master`` or ``worker``) shows to prove it holds the token, bound to both fresh
    nonces and the worker's Locust id (a proof seen once is worth nothing on another connection)."""
    return _mac(token.encode(), "oomload-link-proof", role, worker_nonce, master_nonce, client_id)


def proof_matches(expected: str, given: Any) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected, given)


def nonce_ok(value: Any) -> bool:
    return isinstance(value, str) and 16 <= len(value) <= 128 and value.isascii() and value.isalnum()


def canonical(body: Any) -> str:
    """The text a seal covers: JSON with sorted keys, no spaces (the same on both ends after msgpack)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclass
class LinkKeys:
    """The sealing of one authenticated master–worker connection, from one end (``me``).

    ``seal`` wraps a body for the other end; ``open`` returns a body the other end sealed, or raises
    ``LinkRejected`` (unsealed, a wrong seal, a sequence number seen before or older than the last
    ``REPLAY_WINDOW``: a replay). Two greenlets of one end may send out of their sealing order when a
    send has to wait, so an unseen number within the window is accepted."""

    key: bytes
    me: str  # "master" or "worker"
    sent: int = 0
    received: int = 0  # the highest sequence number accepted
    _peer: str = field(init=False)
    _seen: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self._peer = "worker" if self.me == "master" else "master"

    @classmethod
    def derive(cls, token: str, me: str, worker_nonce: str, master_nonce: str, client_id: str) -> LinkKeys:
        key = hmac.new(
            token.encode(),
            "\x1f".join(("oomload-link-session", worker_nonce, master_nonce, client_id)).encode(),
            hashlib.sha256,
        ).digest()
        return cls(key=key, me=me)

    def seal(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.sent += 1
        mac = _mac(self.key, self.me, kind, str(self.sent), canonical(body))
        return {"seq": self.sent, "body": dict(body), "mac": mac}

    def open(self, kind: str, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or set(data) != {"seq", "body", "mac"}:
            raise LinkRejected("unsealed")
        seq, body, mac = data["seq"], data["body"], data["mac"]
        if type(seq) is not int or not isinstance(body, dict) or not isinstance(mac, str):
            raise LinkRejected("unsealed")
        try:
            text = canonical(body)
        except (TypeError, ValueError) as err:
            raise LinkRejected("malformed") from err
        if not hmac.compare_digest(_mac(self.key, self._peer, kind, str(seq), text), mac):
            raise LinkRejected("bad_seal")
        if seq <= self.received - REPLAY_WINDOW or seq in self._seen:
            raise LinkRejected("replayed")
        self._seen.add(seq)
        if seq > self.received:
            self.received = seq
            if len(self._seen) > 2 * REPLAY_WINDOW:
                self._seen = {n for n in self._seen if n > seq - REPLAY_WINDOW}
        return body


# -- results as typed records -------------------------------------------------------------------------

MAX_BATCH_ROWS = 4096  # a worker sends at most 256 (``resultstream.BATCH_MAX_ROWS``)
MAX_ID_CHARS = 1024
MAX_ERROR_CHARS = 2000
MAX_TOKENS = 100_000_000
MAX_MS = 1e10
MAX_UNIX_S = 1e11
_INT_FIELDS = ("step", "concurrency", "prompt_tokens_asked", "output_tokens_asked")
_OPT_INT_FIELDS = ("usage_prompt_tokens", "usage_completion_tokens", "http_status")
_FLOAT_FIELDS = ("start_unix_s", "end_unix_s")
_OPT_FLOAT_FIELDS = ("ttft_ms", "tpot_ms", "itl_max_ms", "e2e_ms")
_FIELDS = frozenset(
    ("request_id", "outcome", "error", *_INT_FIELDS, *_OPT_INT_FIELDS, *_FLOAT_FIELDS, *_OPT_FLOAT_FIELDS)
)


def _int(obj: Mapping[str, Any], name: str, low: int, high: int, *, optional: bool = False) -> int | None:
    value = obj.get(name)
    if value is None and optional:
        return None
    if type(value) is not int or not low <= value <= high:
        raise LinkRejected("bad_row")
    return value


def _float(obj: Mapping[str, Any], name: str, high: float, *, optional: bool = False) -> float | None:
    value = obj.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise LinkRejected("bad_row")
    if not math.isfinite(value) or not 0.0 <= value <= high:
        raise LinkRejected("bad_row")
    return float(value)


def result_from_wire(obj: Any, *, last_step: int) -> RequestResult:
    """One result row from a worker as a ``RequestResult``, or ``LinkRejected("bad_row")``: known
    fields only, each of its type and within bounds (ids and error texts short, counts and times
    finite and non-negative, an HTTP status 100..599), for a step the master has begun (0..last_step)."""
    if not isinstance(obj, dict) or not obj.keys() <= _FIELDS:
        raise LinkRejected("bad_row")
    request_id, outcome, error = obj.get("request_id"), obj.get("outcome"), obj.get("error")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_ID_CHARS:
        raise LinkRejected("bad_row")
    if not isinstance(outcome, str) or outcome not in Outcome._value2member_map_:
        raise LinkRejected("bad_row")
    if error is not None and (not isinstance(error, str) or len(error) > MAX_ERROR_CHARS):
        raise LinkRejected("bad_row")
    step = _int(obj, "step", 0, MAX_TOKENS)
    if step is None or step > last_step:
        raise LinkRejected("wrong_step")
    return RequestResult(
        request_id=request_id,
        step=step,
        concurrency=_int(obj, "concurrency", 1, MAX_TOKENS) or 1,
        start_unix_s=_float(obj, "start_unix_s", MAX_UNIX_S) or 0.0,
        end_unix_s=_float(obj, "end_unix_s", MAX_UNIX_S) or 0.0,
        outcome=Outcome(outcome),
        prompt_tokens_asked=_int(obj, "prompt_tokens_asked", 0, MAX_TOKENS) or 0,
        output_tokens_asked=_int(obj, "output_tokens_asked", 0, MAX_TOKENS) or 0,
        usage_prompt_tokens=_int(obj, "usage_prompt_tokens", 0, MAX_TOKENS, optional=True),
        usage_completion_tokens=_int(obj, "usage_completion_tokens", 0, MAX_TOKENS, optional=True),
        ttft_ms=_float(obj, "ttft_ms", MAX_MS, optional=True),
        tpot_ms=_float(obj, "tpot_ms", MAX_MS, optional=True),
        itl_max_ms=_float(obj, "itl_max_ms", MAX_MS, optional=True),
        e2e_ms=_float(obj, "e2e_ms", MAX_MS, optional=True),
        http_status=_int(obj, "http_status", 100, 599, optional=True),
        error=error,
    )
