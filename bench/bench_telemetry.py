"""How much do a 10 Hz GPU sampler and a 1 Hz ``/metrics`` scrape slow the load generator?

The "load" is a CPU-bound loop in this process (N ``json.loads`` of a request-result-sized line,
the kind of work a load generator does per request). It runs alternately:

* baseline: the loop alone;
* telemetry: the loop while ``GpuSamplerProcess`` runs ``oomload sample`` at 10 Hz in its child
  process (NVML replaced by the fake, through ``tests/fakesampler.py``: no GPU here, but the real
  subprocess, file streaming and JSON path) and ``MetricsPoller`` scrapes, at 1 Hz, a loopback
  server answering the real vLLM capture (``tests/fixtures/vllm-metrics.txt``, 629 lines)
  from its own process, as vLLM would.

Both are measured in the same run, interleaved, and the ratio of the medians is printed (1.00 =
no cost). On a shared 2-core machine the noise is a few percent.
"""

from __future__ import annotations

import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oomload.telemetry.gpu import GpuSamplerProcess
from oomload.telemetry.poller import MetricsPoller

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "tests" / "fixtures" / "vllm-metrics.txt"
FAKE_SAMPLER = [sys.executable, str(REPO / "tests" / "fakesampler.py"), "{}"]  # oomload sample, fake NVML
ROUNDS = 6
TARGET_ROUND_S = 1.0
LINE = json.dumps(
    {
        "request_id": "r-000123",
        "step": 7,
        "concurrency": 48,
        "start_unix_s": 1718000000.123,
        "ttft_ms": 812.5,
        "latency_ms": 10234.1,
        "prompt_tokens": 3187,
        "output_tokens": 412,
        "expected_output_tokens": 412,
        "outcome": "ok",
        "http_status": 200,
        "error": None,
        "itl_ms": [21.5, 22.0, 19.8, 23.1, 20.4, 22.2, 21.9, 20.0],
    }
)


def load_loop(n: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds — all its threads) to parse ``LINE`` ``n`` times."""
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(n):
        json.loads(LINE)
    return time.perf_counter() - start, time.process_time() - cpu_start


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the metrics fixture server did not listen on port {port}")


def main() -> None:
    if not CAPTURE.exists():
        print(f"skipped: {CAPTURE} is missing")
        return
    tmp = Path(tempfile.mkdtemp(prefix="oomload-bench-telemetry-"))
    shutil.copy(CAPTURE, tmp / "metrics")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
        per_parse_s = load_loop(20_000)[0] / 20_000
        n = max(10_000, int(TARGET_ROUND_S / per_parse_s))
        baseline: list[tuple[float, float]] = []
        with_telemetry: list[tuple[float, float]] = []
        gpu_lines = 0
        scrapes = failures = 0
        for round_index in range(ROUNDS):
            baseline.append(load_loop(n))
            out = tmp / f"gpu-{round_index}.jsonl"
            sampler = GpuSamplerProcess(out, interval_s=0.1, program=FAKE_SAMPLER)
            poller = MetricsPoller(f"http://127.0.0.1:{port}", None, interval_s=1.0)
            if not sampler.start():
                raise RuntimeError(f"the fake GPU sampler did not start: {sampler.unavailable_reason}")
            poller.start()
            time.sleep(0.2)  # past the first scrape, into the steady state
            try:
                with_telemetry.append(load_loop(n))
            finally:
                poller.stop()
                sampler.stop()
            gpu_lines += len(out.read_text().splitlines())
            scrapes += poller.scrapes
            failures += poller.failures
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    base_s, tele_s = (statistics.median(x[0] for x in rounds) for rounds in (baseline, with_telemetry))
    base_cpu, tele_cpu = (statistics.median(x[1] for x in rounds) for rounds in (baseline, with_telemetry))
    print(f"load loop: {n} json.loads per round, {ROUNDS} rounds each, interleaved")
    print(f"baseline  wall median {base_s:.3f} s  (rounds: {_rounds(baseline)})")
    print(f"telemetry wall median {tele_s:.3f} s  (rounds: {_rounds(with_telemetry)})")
    print(f"telemetry did: {gpu_lines} GPU samples (10 Hz), {scrapes} scrapes (1 Hz, {failures} failed)")
    print(f"ratio telemetry/baseline, wall time:          {tele_s / base_s:.3f}  (1.00 = no slowdown)")
    print(
        f"ratio telemetry/baseline, this process's CPU: {tele_cpu / base_cpu:.3f}  (incl. the poller thread)"
    )


def _rounds(rounds: list[tuple[float, float]]) -> str:
    return ", ".join(f"{wall:.3f}" for wall, _ in rounds)


if __name__ == "__main__":
    main()
