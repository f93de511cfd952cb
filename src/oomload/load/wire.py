"""What an oomload master and its Locust workers say to each other: the message names and bodies,
carried by Locust's own master/worker protocol (ZeroMQ + msgpack, ``runner.send_message`` /
``runner.register_message``). Pure: no Locust, no sockets.

A worker (``oomload worker``, local or on another host) first does what any Locust worker does —
``client_ready``, acknowledged by the master — and then::

    worker → master   oomload_hello    {oomload_version, locust_version, host, pid, local_index}
    master → worker   oomload_config   {worker, workers, user_class, options, trace}
                  or  oomload_refused  {error}                  (version mismatch, one worker too many)
    worker → master   oomload_ready    {worker}                  (user class bound: load may start)
                  or  oomload_failed   {worker, error}           (e.g. its API key variable is unusable)
    master → worker   oomload_step     {step, concurrency, phase}   oomload_step_end {step}
    worker → master   oomload_results  {worker, seq, rows}       (batched RequestResult rows)
    master → worker   oomload_stop     {grace_s, seq}            (no new requests; drain)
    worker → master   oomload_drained  {worker, seq}             (every row it had was sent first)

Each worker's step report (achieved concurrency, requests in flight, started, outcomes) rides on
Locust's own statistics report once a second (``report_to_master``, key ``"oomload"``).

What never travels: the API key (each worker reads it from its own environment; ``options`` holds the
variable's name only), prompt or completion text (a trace holds lengths only; rows hold lengths,
timings and outcomes). The protocol has no authentication: the master listens on loopback unless told
otherwise, and belongs on a private network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from oomload.errors import ConfigError
from oomload.trace import TraceRecord

HELLO = "oomload_hello"
CONFIG = "oomload_config"
REFUSED = "oomload_refused"
READY = "oomload_ready"
FAILED = "oomload_failed"
STEP = "oomload_step"
STEP_END = "oomload_step_end"
RESULTS = "oomload_results"
STOP = "oomload_stop"
DRAINED = "oomload_drained"

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
