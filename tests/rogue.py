"""Hostile peers of an oomload worker link, written with Locust's own protocol (``locust.rpc``: its
ZeroMQ ``Server``/``Client`` and ``Message``), run as a subprocess by tests/integration/test_worker_link.py
(Locust patches the whole process with gevent; the test process stays clean). Every loop is bounded
in count and time; everything listens on and talks to 127.0.0.1 only.

``python tests/rogue.py master PORT HTTP_PORT OUT MODE`` — a rogue master on PORT and a tiny HTTP
server on HTTP_PORT that records every ``Authorization`` header it is sent to OUT (one line each).
It names ``AWS_SECRET_ACCESS_KEY`` as the API key's variable and its own HTTP server as the target:

* ``guess``: it does not hold the worker token; it answers a hello with a challenge whose proof is a
  guess *and* with the configuration as an unauthenticated master would;
* ``token``: it holds the token ($OOMLOAD_WORKER_TOKEN) and completes the handshake, then sends the
  sealed configuration (to a worker that speaks no handshake: the configuration unsealed).

Once a worker says ready it dispatches one user (Locust's ``spawn``), waits for a request to arrive
(at most 10 s) and quits the worker.

``python tests/rogue.py worker PORT`` — a stranger on a master's port that never authenticates: it
says Locust's ``client_ready``, sends forged result rows (an engine death), Locust ``stats`` and
``quit`` in another worker's name, an undecodable frame and a hello whose proof is a guess.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from locust.rpc import Message, zmqrpc

import gevent  # isort: skip

DEADLINE_S = 40.0


def _serve_http(port: int, out: Path) -> ThreadingHTTPServer:
    class Recorder(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            with open(out, "a", encoding="utf-8") as fh:
                fh.write(f"{self.headers.get('Authorization')}\n")
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(min(length, 1 << 20))
            body = b'{"error": "rogue"}'
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _config(url: str) -> dict[str, Any]:
    from oomload.load import wire
    from oomload.load.payload import PayloadOptions
    from oomload.run.config import LoadOptions
    from oomload.trace.model import TraceRecord

    options = LoadOptions(
        url=url,
        payload=PayloadOptions(model="rogue", api="completions", stream=True),
        api_key_env="AWS_SECRET_ACCESS_KEY",
        request_timeout_s=5.0,
    )
    trace = [TraceRecord(f"r{i}", 0.0, 16, 4) for i in range(4)]
    return {
        "worker": 0,
        "workers": 1,
        "user_class": "ScenarioUser",
        "options": options.to_json(),
        "trace": wire.trace_to_wire(trace),
    }


def rogue_master(port: int, http_port: int, out: Path, mode: str) -> int:
    import os

    from oomload.load import wire

    out.write_text("")
    _serve_http(http_port, out)
    server = zmqrpc.Server("127.0.0.1", port)
    url = f"http://127.0.0.1:{http_port}"
    keys: dict[str, wire.LinkKeys] = {}
    nonces: dict[str, str] = {}
    token = os.environ.get("OOMLOAD_WORKER_TOKEN", "")
    deadline = time.time() + DEADLINE_S
    spawned_at: float | None = None

    def send(client: str, kind: str, data: Any) -> None:
        server.send_to_client(Message(kind, data, client))

    def spawn(client: str) -> None:
        job = {
            "timestamp": time.time(),
            "user_classes_count": {"ScenarioUser": 1},
            "host": url,
            "stop_timeout": 0,
            "parsed_options": {},
        }
        send(client, "spawn", job)

    clients: set[str] = set()
    while time.time() < deadline:
        if spawned_at is not None and (out.read_text() or time.time() > spawned_at + 10):
            for client in clients:
                send(client, "quit", None)
            gevent.sleep(0.5)
            return 0
        with gevent.Timeout(0.5, False):
            client, msg = server.recv_from_client()
            clients.add(client)
            data = msg.data if isinstance(msg.data, dict) else {}
            if msg.type == "client_ready":
                send(client, "ack", {"index": 0})
            elif msg.type == "heartbeat":
                send(client, "heartbeat", None)
            # names as strings: this rogue also runs against an oomload without the handshake
            elif msg.type == "oomload_hello" and "nonce" in data and mode == "token":
                nonces[client] = wire.new_nonce()
                proof = wire.handshake_proof(token, "master", data["nonce"], nonces[client], client)
                send(client, "oomload_challenge", {"nonce": nonces[client], "proof": proof})
                keys[client] = wire.LinkKeys.derive(token, "master", data["nonce"], nonces[client], client)
            elif msg.type == "oomload_hello":
                if "nonce" in data:  # a guess: the token is not known
                    send(client, "oomload_challenge", {"nonce": "ab" * 16, "proof": "0" * 64})
                send(client, "oomload_config", _config(url))  # as a master without authentication would
            elif msg.type == "oomload_auth" and client in keys:
                send(client, "oomload_config", keys[client].seal("oomload_config", _config(url)))
            elif msg.type == "oomload_ready" and spawned_at is None:
                spawn(client)
                spawned_at = time.time()
    return 0


def rogue_worker(port: int) -> int:
    import msgpack

    me = f"rogue_{uuid.uuid4().hex}"
    client = zmqrpc.Client("127.0.0.1", port, me)
    client.send(Message("client_ready", "2.47.0", me))
    deadline = time.time() + 15
    acked = False
    while not acked and time.time() < deadline:
        with gevent.Timeout(0.5, False):
            acked = client.recv().type == "ack"
    forged = [
        {
            "request_id": f"forged-{i}",
            "step": 0,
            "concurrency": 2,
            "start_unix_s": time.time(),
            "end_unix_s": time.time(),
            "outcome": "engine_dead",
            "prompt_tokens_asked": 256,
            "output_tokens_asked": 256,
            "http_status": 500,
            "error": "CUDA out of memory",
        }
        for i in range(20)
    ]
    client.send(Message("oomload_results", {"worker": 0, "seq": 0, "rows": forged}, me))
    badly_sealed = {"seq": 1, "body": {"worker": 0, "seq": 1, "rows": forged}, "mac": "0" * 64}
    client.send(Message("oomload_results", badly_sealed, me))
    client.send(
        Message("stats", {"stats": [], "errors": {"x": {"error": "engine_dead", "occurrences": 9}}}, me)
    )
    client.send(Message("oomload_drained", {"worker": 0, "seq": 1}, me))
    client.socket.send(msgpack.dumps(5))  # an undecodable frame: not a (type, data, node_id) triple
    client.socket.send(b"\xc1\xc1\xc1")  # not msgpack at all
    client.send(Message("quit", None, "someone_else"))  # in another peer's name
    import locust

    from oomload import __version__

    hello = {"oomload_version": __version__, "locust_version": locust.__version__, "nonce": "ab" * 16}
    client.send(Message("oomload_hello", hello, me))
    gevent.sleep(0.5)
    client.send(Message("oomload_auth", {"proof": "0" * 64}, me))
    gevent.sleep(0.5)
    client.send(Message("oomload_results", {"worker": 0, "seq": 2, "rows": forged}, me))
    gevent.sleep(0.5)
    client.close(linger=0)
    print("rogue worker done", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "master":
        sys.exit(rogue_master(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]))
    sys.exit(rogue_worker(int(sys.argv[2])))
