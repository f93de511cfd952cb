"""Client cost of oomload's Locust user next to a minimal FastHttpUser SSE reader, in the same run.

A stub SSE server (its own process, asyncio) streams completions like an engine: requests join a
batch, and every ``tpot`` one token chunk goes to every active stream after a ``ttft`` delay; then a
usage chunk and ``[DONE]``. Each client runs in its own process (Locust in-process, N closed-loop
users, no wait) and measures its own CPU time (getrusage) over a fixed window, the tokens it received,
its median TTFT, and its in-flight count.

* full speed (ttft 0, tpot 0): client CPU per streamed token and per request — the goal is oomload's
  user ≤ 1.5× the minimal reader's CPU per token;
* paced (ttft 50 ms, tpot 5 ms): the median TTFT the client sees minus the server's true 50 ms — the
  goal is ≤ +5 ms at concurrency 128; and the achieved concurrency must equal the target.

The stub's own lateness is part of that figure: its engine ticks every ``tpot``, so a first token
goes out at the first tick after its due time (on average half a tick late, more when the 2 cores
are busy). The stub measures that lag (first token written − request parsed − ttft) and hands the
median over the window to the client (``GET /stats``); the line shows it and what is left once it
is taken off: what the client and the transport (connect, send, wake-up) add.

Prompts are 256 token ids, outputs 128 tokens, streaming. ``python -m bench client`` runs it; on a
shared 2-core machine the numbers wobble, the ratios are what matter.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 128
WINDOW_S = float(os.environ.get("OOMLOAD_BENCH_WINDOW_S", "6"))
WARMUP_S = 2.0


# -- the stub server (child process) ----------------------------------------------------------------
@dataclass(slots=True)
class _Stream:
    """One streamed answer in the stub's batch."""

    writer: asyncio.StreamWriter
    tokens_left: int
    tokens_asked: int
    due_s: float  # time.monotonic() of its next token
    done: asyncio.Future[None]
    parsed_s: float  # time.monotonic() when its request was parsed
    first: bool = True  # no token written yet


def _header_int(pattern: re.Pattern[bytes], data: bytes) -> int:
    match = pattern.search(data)
    if match is None:
        raise ValueError(f"stub server: no {pattern.pattern!r} in {data[:200]!r}")
    return int(match.group(1))


def serve(port_file: str, ttft_s: float, tpot_s: float) -> None:
    content_length_re = re.compile(rb"(?i)content-length:\s*(\d+)")
    max_tokens_re = re.compile(rb'"max_tokens":\s*(\d+)')
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    active: list[_Stream] = []
    lags_ms: list[float] = []  # per request: first token written − parsed − ttft

    def stats() -> bytes:
        body = json.dumps({"lag_ms_p50": statistics.median(lags_ms) if lags_ms else None}).encode()
        lags_ms.clear()
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    def chunk(payload: bytes) -> bytes:
        data = b"data: " + payload + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    token = chunk(
        b'{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" hi","logprobs":null,'
        b'"finish_reason":null}],"model":"stub"}'
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if raw.startswith(b"GET /stats"):
                    writer.write(stats())
                    continue
                if raw.startswith(b"GET "):  # what a whole `oomload replay` asks besides completions
                    writer.write(_get_answer(raw))
                    if b"connection: close" in raw.lower():
                        writer.close()
                        return
                    continue
                body = await reader.readexactly(_header_int(content_length_re, raw))
                close = b"connection: close" in raw.lower()
                asked = _header_int(max_tokens_re, body)
                writer.write(head + (b"Connection: close\r\n\r\n" if close else b"\r\n"))
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                now = time.monotonic()
                active.append(_Stream(writer, asked, asked, now + ttft_s, done, now))
                await done
                if close:
                    writer.close()
                    return
        except ConnectionError:
            return

    async def engine() -> None:
        while True:
            now = time.monotonic()
            for entry in list(active):
                w = entry.writer
                if w.is_closing():  # the client went away (end of a run)
                    active.remove(entry)
                    entry.done.set_result(None)
                    continue
                if now < entry.due_s:
                    continue
                if entry.first:
                    entry.first = False
                    lags_ms.append((time.monotonic() - entry.parsed_s - ttft_s) * 1000.0)
                if tpot_s == 0:
                    w.write(token * entry.tokens_left)
                    entry.tokens_left = 0
                else:
                    w.write(token)
                    entry.tokens_left -= 1
                if entry.tokens_left == 0:
                    usage = b'{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}' % (
                        PROMPT_TOKENS,
                        entry.tokens_asked,
                    )
                    w.write(chunk(usage) + chunk(b"[DONE]") + b"0\r\n\r\n")
                    active.remove(entry)
                    entry.done.set_result(None)
            await asyncio.sleep(tpot_s if tpot_s else 0.001)

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        await engine()

    asyncio.run(main())


# -- a client (child process) -----------------------------------------------------------------------
def client(kind: str, url: str, users: int, out_path: str) -> None:
    import resource

    import gevent
    from locust import FastHttpUser, constant, task
    from locust.env import Environment

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from oomload.load.payload import PayloadOptions
    from oomload.run.runner import LoadOptions, build_user_class
    from oomload.rundir import RunWriter
    from oomload.trace.model import TraceRecord

    ttfts: list[float] = []
    tokens = [0]
    in_flight = [0]
    samples: list[int] = []
    body = json.dumps(
        {
            "model": "stub",
            "prompt": list(range(100, 100 + PROMPT_TOKENS)),
            "max_tokens": OUTPUT_TOKENS,
            "min_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    run_dir = tempfile.TemporaryDirectory(prefix="oomload-bench-")  # removed when this process exits
    tmp = run_dir.name
    context = None
    if kind == "oomload":
        options = LoadOptions(url=url, payload=PayloadOptions(model="stub"))
        records = [TraceRecord(f"r{i}", 0.0, PROMPT_TOKENS, OUTPUT_TOKENS) for i in range(64)]
        user_class, context = build_user_class(options, records=records, api_key=None, sink=RunWriter(tmp))
    else:

        class MinimalReader(FastHttpUser):
            wait_time = constant(0)
            host = url

            @task
            def read(self) -> None:
                t0 = time.perf_counter()
                first = None
                in_flight[0] += 1
                try:
                    with self.client.post(
                        "/v1/completions",
                        data=body,
                        stream=True,
                        catch_response=True,
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        raw = resp._response
                        while True:
                            line = raw.readline(b"\n")
                            if not line:
                                break
                            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                                obj = json.loads(line[6:])
                                if obj.get("choices"):
                                    if first is None:
                                        first = time.perf_counter()
                                    tokens[0] += 1
                finally:
                    in_flight[0] -= 1
                if first is not None:
                    ttfts.append((first - t0) * 1000.0)

        user_class = MinimalReader

    env = Environment(user_classes=[user_class], host=url)
    runner = env.create_local_runner()
    runner.start(users, spawn_rate=min(users, 100))
    gevent.sleep(WARMUP_S)

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def count_tokens() -> int:
        return context.completion_tokens if context is not None else tokens[0]

    def count_requests() -> int:
        return sum(context.outcomes.values()) if context is not None else len(ttfts)

    def sample() -> None:
        while True:
            samples.append(len(context.in_flight) if context is not None else in_flight[0])
            gevent.sleep(0.05)

    sampler = gevent.spawn(sample)
    _stub_stats(url)  # forget the lags of the warm-up
    c0, k0, n0, t0 = cpu(), count_tokens(), count_requests(), time.perf_counter()
    w0 = time.time()
    first_ttft = len(ttfts)
    gevent.sleep(WINDOW_S)
    c1, k1, n1, t1 = cpu(), count_tokens(), count_requests(), time.perf_counter()
    w1 = time.time()
    stub_lag_ms = _stub_stats(url)
    sampler.kill()
    runner.quit()
    if context is not None:
        for line in Path(tmp, "requests.jsonl").read_text().splitlines():
            obj = json.loads(line)
            if obj.get("ttft_ms") is not None and w0 <= obj["start_unix_s"] <= w1:
                ttfts.append(obj["ttft_ms"])
        window_ttfts = ttfts
    else:
        window_ttfts = ttfts[first_ttft:]
    result = {
        "cpu_s": c1 - c0,
        "tokens": k1 - k0,
        "requests": n1 - n0,
        "wall_s": t1 - t0,
        "ttft_median_ms": statistics.median(window_ttfts) if window_ttfts else None,
        "in_flight_mean": statistics.fmean(samples) if samples else 0.0,
        "stub_lag_ms_p50": stub_lag_ms,
    }
    Path(out_path).write_text(json.dumps(result))


def _get_answer(raw: bytes) -> bytes:
    """The stub's answer to a GET: a model list (for a replay's preflight), ``/health``, else 404."""
    if raw.startswith(b"GET /v1/models"):
        body = b'{"object":"list","data":[{"id":"stub","object":"model","max_model_len":4096}]}'
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            body,
        )
    if raw.startswith(b"GET /health"):
        return b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


def _stub_stats(url: str) -> float | None:
    """The stub's median first-token lag since the last call (and reset it)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.request("GET", "/stats")
        lag: float | None = json.loads(conn.getresponse().read())["lag_ms_p50"]
    finally:
        conn.close()
    return lag


# -- orchestration ----------------------------------------------------------------------------------
def _start_server(ttft_s: float, tpot_s: float, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = str(workdir / f"port-{ttft_s}-{tpot_s}")
    proc = subprocess.Popen([sys.executable, __file__, "serve", port_file, str(ttft_s), str(tpot_s)])
    deadline = time.time() + 15
    while not os.path.exists(port_file) or not Path(port_file).read_text():
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("stub server did not start")
        time.sleep(0.05)
    port = int(Path(port_file).read_text())
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    return proc, f"http://127.0.0.1:{port}"


def _run_client(kind: str, url: str, users: int, workdir: Path) -> dict[str, float]:
    """The client's figures; one it could not measure is NaN."""
    out = str(workdir / f"out-{kind}-{users}-{time.monotonic_ns()}.json")
    subprocess.run([sys.executable, __file__, "client", kind, url, str(users), out], check=True, timeout=120)
    raw: dict[str, float | None] = json.loads(Path(out).read_text())
    return {key: float("nan") if value is None else float(value) for key, value in raw.items()}


def main() -> None:
    print(
        f"prompt {PROMPT_TOKENS}, output {OUTPUT_TOKENS} tokens, streaming; "
        f"window {WINDOW_S:.0f} s per client"
    )
    with tempfile.TemporaryDirectory(prefix="oomload-bench-client-") as workdir:
        for mode, ttft_s, tpot_s in (("full speed", 0.0, 0.0), ("paced 50 ms + 5 ms/token", 0.05, 0.005)):
            _bench_mode(mode, ttft_s, tpot_s, Path(workdir))


def _bench_mode(mode: str, ttft_s: float, tpot_s: float, workdir: Path) -> None:
    """Both clients at 32 and 128 users against one stub server paced as given."""
    server, url = _start_server(ttft_s, tpot_s, workdir)
    try:
        for users in (32, 128):
            base = _run_client("minimal", url, users, workdir)
            ours = _run_client("oomload", url, users, workdir)
            per_tok = [r["cpu_s"] / max(1, r["tokens"]) * 1e6 for r in (base, ours)]
            per_req = [r["cpu_s"] / max(1, r["requests"]) * 1e3 for r in (base, ours)]
            line = (
                f"{mode:>26} c={users:<4} CPU/token µs: minimal {per_tok[0]:6.1f}"
                f"  oomload {per_tok[1]:6.1f}  ratio {per_tok[1] / per_tok[0]:4.2f}"
                f" | CPU/request ms: {per_req[0]:5.2f} vs {per_req[1]:5.2f}"
                f" | tokens/s {base['tokens'] / base['wall_s']:7.0f}"
                f" vs {ours['tokens'] / ours['wall_s']:7.0f}"
                f" | in flight {base['in_flight_mean']:5.1f} vs {ours['in_flight_mean']:5.1f}"
            )
            if ttft_s:
                added = [r["ttft_median_ms"] - ttft_s * 1000 for r in (base, ours)]
                lag = [r["stub_lag_ms_p50"] for r in (base, ours)]
                line += (
                    f" | TTFT p50 added ms: {added[0]:+5.1f} vs {added[1]:+5.1f}"
                    f" (stub's own lag {lag[0]:.1f} / {lag[1]:.1f};"
                    f" client side {added[0] - lag[0]:+5.1f} vs {added[1] - lag[1]:+5.1f})"
                )
            print(line, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    elif sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
