"""Load delivered to a server that competes for the CPU: oomload next to a minimal asyncio client.

No vLLM needed. A stub OpenAI server (its own process) behaves like vLLM's API server on a small
host: parsing a request costs CPU (tokenization), every streamed token costs CPU (detokenization,
SSE framing), ``/metrics`` costs CPU (rendering every histogram), and an "engine" process spins on
the CPU whenever requests are running — so the client, the API server and the engine fight for the
same cores, as they do beside a CPU vLLM, or a GPU vLLM whose host is busy. Tokens come every
``TPOT_MS``; the stub keeps vLLM's ``vllm:e2e_request_latency_seconds_sum`` so that the load it held
is read the way oomload reads vLLM's (Little's law).

For each target level, ``PAIRS`` interleaved pairs (oomload's replay, then the reference client
``bench.refclient``, alternating who goes first) each hold the level for ``HOLD_S``; a line prints,
per client, what the client held and what the stub held (Δ latency sum / Δt over the middle of the
hold) and the client's CPU time per finished request, and the ratio oomload / reference of the
server-held load. Goal (issue 10): ≥ 0.9, and
oomload's own figure ≥ 0.9 × the target wherever the reference's is.

``python -m bench delivery``; ``OOMLOAD_BENCH_LEVELS``, ``OOMLOAD_BENCH_PAIRS`` and
``OOMLOAD_BENCH_HOLD_S`` change the plan.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEVELS = [int(x) for x in os.environ.get("OOMLOAD_BENCH_LEVELS", "8,32").split(",")]
PAIRS = int(os.environ.get("OOMLOAD_BENCH_PAIRS", "2"))
HOLD_S = float(os.environ.get("OOMLOAD_BENCH_HOLD_S", "12"))
PROMPT, OUTPUT = 200, 64
TPOT_MS = 10.0
REQUEST_CPU_MS = 2.0  # tokenizing the prompt, building the request
TOKEN_CPU_MS = 0.1  # detokenizing and framing one streamed token
METRICS_CPU_MS = 8.0  # rendering /metrics (measured on the real CPU vLLM: ~8 ms of API-server CPU)


def _burn(ms: float) -> None:
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


def _engine(running: mp.Value, stop: mp.Event) -> None:  # type: ignore[type-arg]
    """The engine: spins while requests are running, sleeps otherwise (like vLLM's busy loop)."""
    while not stop.is_set():
        if running.value > 0:
            _burn(5.0)
        else:
            time.sleep(0.005)


def _serve(port_file: str, running: mp.Value) -> None:  # type: ignore[type-arg]
    state = {"e2e_sum": 0.0, "finished": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = next(
                (int(x.split(":", 1)[1]) for x in lines if x.lower().startswith("content-length")), 0
            )
            body = await reader.readexactly(length) if length else b""
            if path.endswith("/v1/models"):
                payload = json.dumps({"object": "list", "data": [{"id": "stub", "max_model_len": 4096}]})
                writer.write(_response(200, "application/json", payload.encode()))
            elif path == "/health":
                writer.write(_response(200, "text/plain", b""))
            elif path == "/metrics":
                _burn(METRICS_CPU_MS)
                text = (
                    f'vllm:num_requests_running{{model_name="stub"}} {running.value}\n'
                    f'vllm:num_requests_waiting{{model_name="stub"}} 0\n'
                    f'vllm:kv_cache_usage_perc{{model_name="stub"}} 0.1\n'
                    f'vllm:num_preemptions_total{{model_name="stub"}} 0\n'
                    f'vllm:e2e_request_latency_seconds_sum{{model_name="stub"}} {state["e2e_sum"]}\n'
                    f'vllm:e2e_request_latency_seconds_count{{model_name="stub"}} {state["finished"]}\n'
                )
                writer.write(_response(200, "text/plain; version=0.0.4", text.encode()))
            elif method == "POST" and path.endswith("/v1/completions"):
                arrival = time.perf_counter()
                _burn(REQUEST_CPU_MS)
                req = json.loads(body)
                prompt, output = len(req["prompt"]), int(req["max_tokens"])
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                )
                running.value += 1
                try:
                    for i in range(output):
                        await asyncio.sleep(TPOT_MS / 1000.0)
                        _burn(TOKEN_CPU_MS)
                        chunk = {
                            "id": "c",
                            "object": "text_completion",
                            "choices": [{"index": 0, "text": f"t{i}"}],
                        }
                        writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    usage = {
                        "prompt_tokens": prompt,
                        "completion_tokens": output,
                        "total_tokens": prompt + output,
                    }
                    done = {"id": "c", "object": "text_completion", "choices": [], "usage": usage}
                    writer.write(b"data: " + json.dumps(done).encode() + b"\n\ndata: [DONE]\n\n")
                    await writer.drain()
                finally:
                    running.value -= 1
                state["e2e_sum"] += time.perf_counter() - arrival
                state["finished"] += 1
            else:
                writer.write(_response(404, "application/json", b'{"error": "not found"}'))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _response(status: int, ctype: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


def _e2e_sum(url: str) -> tuple[float, float, int]:
    """(time, latency sum, finished requests) from the stub's /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    t = time.time()
    values = {
        x.split("{", 1)[0]: float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:")
    }
    return (
        t,
        values["vllm:e2e_request_latency_seconds_sum"],
        int(values["vllm:e2e_request_latency_seconds_count"]),
    )


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _window(url: str, seconds: float, pid: int) -> tuple[float, float]:
    """(server-held mean, client CPU ms per finished request) over ``seconds`` from now."""
    t0, a, n0 = _e2e_sum(url)
    c0 = _cpu_s(pid)
    time.sleep(seconds)
    t1, b, n1 = _e2e_sum(url)
    c1 = _cpu_s(pid)
    return (b - a) / (t1 - t0), 1000 * (c1 - c0) / max(n1 - n0, 1)


def _oomload(url: str, trace: Path, level: int, run_dir: Path) -> tuple[float, float, float]:
    cmd = [
        sys.executable, "-m", "oomload", "replay", str(trace), "--url", url, "--concurrency", str(level),
        "--hold-s", str(HOLD_S), "--no-refine", "--stop-on", "never", "--gpu", "none", "--no-live",
        "--run-dir", str(run_dir),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    steps = run_dir / "steps.jsonl"
    while not (steps.exists() and steps.read_text()):
        if proc.poll() is not None:
            raise RuntimeError(
                f"oomload exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.05)
    time.sleep(2.0)
    served, cpu_ms = _window(url, HOLD_S - 4.0, proc.pid)
    proc.wait(timeout=HOLD_S + 120)
    end = [json.loads(x) for x in steps.read_text().splitlines()][-1]
    return float(end.get("achieved_concurrency_mean") or 0.0), served, cpu_ms


def _reference(url: str, level: int) -> tuple[float, float, float]:
    cmd = [
        sys.executable, "-m", "bench.refclient", url, "--model", "stub", "--concurrency", str(level),
        "--duration-s", str(HOLD_S), "--prompt", str(PROMPT), "--output", str(OUTPUT),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    time.sleep(3.0)
    served, cpu_ms = _window(url, HOLD_S - 4.0, proc.pid)
    out, _ = proc.communicate(timeout=HOLD_S + 120)
    return float(json.loads(out.strip().splitlines()[-1])["held"]), served, cpu_ms


def main() -> None:
    sys.path.insert(0, str(REPO / "src"))
    from oomload.trace.model import TraceHeader, TraceRecord, write_trace

    running = mp.Value("i", 0)
    stop = mp.Event()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        port_file = tmp / "port"
        server = mp.Process(target=_serve, args=(str(port_file), running), daemon=True)
        engine = mp.Process(target=_engine, args=(running, stop), daemon=True)
        server.start()
        engine.start()
        try:
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            url = f"http://127.0.0.1:{port_file.read_text()}"
            trace = tmp / "fixed.jsonl"
            records = [TraceRecord(f"r{i}", 0.0, PROMPT, OUTPUT) for i in range(64)]
            write_trace(trace, records, TraceHeader(source=("bench",), format="synthetic"))
            print(
                f"stub {url}: {PROMPT}+{OUTPUT} tokens, {TPOT_MS:g} ms/token, CPU per request "
                f"{REQUEST_CPU_MS:g} ms + {TOKEN_CPU_MS:g} ms/token, /metrics {METRICS_CPU_MS:g} ms, "
                "a spinning engine while requests run; hold "
                f"{HOLD_S:g} s"
            )
            print("level pair first      | oomload: client server cpu/req | reference: client server cpu/req")
            for level in LEVELS:
                ratios, own = [], []
                for pair in range(PAIRS):
                    first = "oomload" if pair % 2 == 0 else "reference"
                    result = {}
                    for who in (first, "reference" if first == "oomload" else "oomload"):
                        if who == "oomload":
                            result[who] = _oomload(url, trace, level, tmp / f"run-{level}-{pair}")
                        else:
                            result[who] = _reference(url, level)
                    (oc, os_, ocpu), (rc, rs, rcpu) = result["oomload"], result["reference"]
                    ratios.append(os_ / rs if rs else float("nan"))
                    own.append(oc / level)
                    print(
                        f"{level:5d} {pair:4d} {first:<10} | {oc:7.2f} {os_:6.2f} {ocpu:5.1f}ms "
                        f"| {rc:9.2f} {rs:6.2f} {rcpu:5.1f}ms",
                        flush=True,
                    )
                print(
                    f"level {level}: server-held oomload / reference {statistics.median(ratios):.2f}x "
                    f"(median of {PAIRS}; goal >= 0.90); oomload's own held / target "
                    f"{statistics.median(own):.2f}",
                    flush=True,
                )
        finally:
            stop.set()
            server.terminate()
            engine.terminate()


if __name__ == "__main__":
    main()
