"""Streamed tokens/s and client-visible TTFT of ``oomload sim serve`` at 256 concurrent streams.

The server runs in its own process (``SimServer``, ``--time-scale 0`` so the engine is never idle);
this process is the client: 256 keep-alive connections on raw asyncio sockets, each sending
``/v1/completions`` streams (16 prompt ids, 256 output tokens, ``ignore_eos``) back to back for a
fixed time and counting token events. Baseline, measured in the same run: a static SSE server on the
same stack (aiohttp, one process) that answers every request with the same number and size of
events and no engine. Ratios: sim / baseline.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oomload.trace.stats import percentile

STREAMS = 256
OUTPUT_TOKENS = 256
DURATION_S = 6.0
REQUEST = json.dumps(
    {
        "prompt": list(range(16, 32)),
        "max_tokens": OUTPUT_TOKENS,
        "min_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
).encode()
HTTP_REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(REQUEST), REQUEST)
)

STATIC_SERVER = r"""
import asyncio, sys
from aiohttp import web
N = int(sys.argv[2])
CHOICE = '{"index":0,"text":" abc","logprobs":null,"finish_reason":null,"stop_reason":null}'
PRE = 'data: {"id":"cmpl-0","object":"text_completion","created":0,"model":"tiny-model","choices":['
HEAD = PRE + CHOICE + ']}\n\n'
BODY = (HEAD * N + "data: [DONE]\n\n").encode()
async def handle(request):
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    step = 8 * len(HEAD)
    for i in range(0, len(BODY), step):  # a few tokens per write, like the engine's per-step batches
        await resp.write(BODY[i:i + step])
    await resp.write_eof()
    return resp
async def main():
    app = web.Application(); app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app, access_log=None); await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0); await site.start()
    port = site._server.sockets[0].getsockname()[1]
    open(sys.argv[1], "w").write(str(port))
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def _stream_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, float]:
    start = time.perf_counter()
    writer.write(HTTP_REQUEST)
    buf = b""
    ttft = -1.0
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        if ttft < 0 and b'"text":' in chunk:
            ttft = time.perf_counter() - start
        buf += chunk
        if b"data: [DONE]" in buf and buf.endswith(b"0\r\n\r\n"):
            return buf.count(b'"text":'), ttft


async def _client(port: int, deadline: float, tokens: list[int], ttfts: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline:
            n, ttft = await _stream_once(reader, writer)
            tokens.append(n)
            ttfts.append(ttft)
    finally:
        writer.close()


async def _load(port: int) -> tuple[float, list[int], list[float]]:
    tokens: list[int] = []
    ttfts: list[float] = []
    start = time.perf_counter()
    deadline = start + DURATION_S
    await asyncio.gather(*(_client(port, deadline, tokens, ttfts) for _ in range(STREAMS)))
    return time.perf_counter() - start, tokens, ttfts


def _measure(label: str, port: int) -> tuple[float, float]:
    elapsed, tokens, ttfts = asyncio.run(_load(port))
    rate = sum(tokens) / elapsed
    complete = sum(1 for t in tokens if t == OUTPUT_TOKENS)
    p50, p99 = percentile(ttfts, 50) * 1e3, percentile(ttfts, 99) * 1e3
    print(f"{label:>9}: {rate:>9,.0f} streamed tokens/s  {len(tokens):>5} streams ({complete} complete)  "
          f"TTFT p50 {p50:6.1f} ms  p99 {p99:6.1f} ms")  # fmt: skip
    return rate, p50


def main() -> None:
    from oomload.sim.process import SimServer

    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        static = subprocess.Popen(
            [sys.executable, "-c", STATIC_SERVER, str(port_file), str(OUTPUT_TOKENS)], start_new_session=True
        )
        try:
            for _ in range(200):
                if port_file.is_file() and port_file.read_text().strip():
                    break
                time.sleep(0.05)
            base_rate, base_ttft = _measure("baseline", int(port_file.read_text()))
        finally:
            static.terminate()
            static.wait(10)
    args = ["--model", "tiny", "--num-gpu-blocks", "4096", "--block-size", "128", "--max-model-len", "2048",
            "--max-num-seqs", "512", "--time-scale", "0"]  # fmt: skip
    with SimServer(args) as server:
        port = int(server.url.rsplit(":", 1)[1])
        sim_rate, sim_ttft = _measure("sim", port)
    print(
        f"sim / baseline: {sim_rate / base_rate:.2f}x tokens/s; "
        f"TTFT p50 {sim_ttft / max(base_ttft, 1e-9):.2f}x"
    )
    print(f"sim vs the real CPU vLLM's ~5,000 tokens/s (reference vllm-cpu.md §7): {sim_rate / 5000:.1f}x")


if __name__ == "__main__":
    main()
