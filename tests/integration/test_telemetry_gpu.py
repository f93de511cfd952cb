"""GpuSamplerProcess and ``oomload sample`` as real child processes, NVML replaced by the fake.

The fake comes in through ``fakesampler`` (the command's own code with ``FakeNvml`` passed in).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fakesampler import fake_sample_program
from oomload.errors import SamplerUnavailableError
from oomload.rundir import RunWriter
from oomload.telemetry.dcgm import DcgmReader
from oomload.telemetry.fake_nvml import GIB
from oomload.telemetry.gpu import GpuSamplerProcess

SPEC = json.dumps(
    {
        "devices": [
            {
                "name": "Fake A",
                "total_bytes": 16 * GIB,
                "used_bytes": GIB,
                "used_step_bytes": 1024,
                "util_pct": 40,
                "processes": [{"pid": 321, "used_bytes": GIB}],
            },
            {"name": "Fake A", "total_bytes": 16 * GIB, "used_bytes": 2 * GIB},
        ]
    }
)
FAKE = fake_sample_program(SPEC)
DCGM_TEXT = (
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-x",modelName="NVIDIA L4"} 20000\n'
    "# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
    'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-x",modelName="NVIDIA L4"} 2528\n'
)


def read_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(predicate: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


@pytest.fixture
def dcgm_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = DCGM_TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_streams_samples_and_stops_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "gpu.jsonl"
    sampler = GpuSamplerProcess(out, interval_s=0.02, program=FAKE)
    assert sampler.start() is True
    assert sampler.unavailable_reason is None
    wait_for(lambda: len(out.read_text().splitlines()) >= 10)
    latest = sampler.latest_by_device()
    sampler.stop()
    assert sampler.returncode == 0  # SIGTERM is a clean stop, not a kill
    assert not sampler.running
    lines = read_lines(out)
    assert len(lines) >= 10
    assert {line["device"] for line in lines} == {0, 1}
    gpu0 = [line for line in lines if line["device"] == 0]
    used = [line["used_bytes"] for line in gpu0]
    assert used == sorted(used) and used[-1] > used[0]  # memory that moves is seen moving
    assert gpu0[0]["processes"] == [{"pid": 321, "used_bytes": GIB}]
    assert gpu0[0]["source"] == "nvml"
    assert set(latest) == {0, 1}
    times = [line["t_unix_s"] for line in gpu0]
    assert times == sorted(times)


def test_unavailable_is_a_reason_and_an_event(tmp_path: Path) -> None:
    with RunWriter(tmp_path) as writer:
        sampler = GpuSamplerProcess(
            tmp_path / "gpu.jsonl",
            writer=writer,
            program=fake_sample_program('{"error": "DRIVER_NOT_LOADED"}'),
        )
        assert sampler.start() is False
    assert sampler.unavailable_reason == (
        "no NVIDIA GPU can be sampled here: the NVIDIA driver is not loaded (NVML_ERROR_DRIVER_NOT_LOADED)"
    )
    events = read_lines(tmp_path / "events.jsonl")
    assert [(e["kind"], e["detail"]) for e in events] == [("sampler_unavailable", sampler.unavailable_reason)]
    assert sampler.latest() is None


def test_required_raises(tmp_path: Path) -> None:
    sampler = GpuSamplerProcess(tmp_path / "gpu.jsonl", devices=[4], required=True, program=FAKE)
    with pytest.raises(
        SamplerUnavailableError, match=r"GPU index 4 is out of range: this machine has 2 GPU\(s\)"
    ):
        sampler.start()


def test_dcgm_source_through_the_child(tmp_path: Path, dcgm_server: str) -> None:
    out = tmp_path / "gpu.jsonl"
    with GpuSamplerProcess(out, interval_s=0.05, source="dcgm", url=dcgm_server) as sampler:
        wait_for(lambda: sampler.latest() is not None)
        latest = sampler.latest()
    assert latest is not None
    assert latest["source"] == "dcgm"
    assert latest["used_bytes"] == 20000 * 2**20
    assert latest["total_bytes"] == 22528 * 2**20
    assert latest["processes"] is None


def test_dcgm_url_that_does_not_answer(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sampler = GpuSamplerProcess(tmp_path / "gpu.jsonl", source="remote", url=f"http://127.0.0.1:{port}")
    assert sampler.start() is False
    assert sampler.unavailable_reason == (
        f"cannot read GPU memory: GET http://127.0.0.1:{port}/metrics failed: "
        "connection refused (is the server running?)"
    )


def test_serve_then_read_remotely(tmp_path: Path) -> None:
    cmd = [*FAKE, "--serve", "--port", "0", "--interval-s", "0.05"]
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        try:
            announce = proc.stderr.readline()
            match = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", announce)
            assert match, announce
            reader = DcgmReader(f"http://127.0.0.1:{match.group(1)}", clock=lambda: 7.0)
            reader.open()
            wait_for(lambda: reader.sample()[0].used_bytes > GIB)
            samples = reader.sample()
        finally:
            proc.terminate()
            rest = proc.stderr.read()
            rc = proc.wait(timeout=10)
    assert rc == 0
    assert "Traceback" not in rest
    assert [s.source for s in samples] == ["remote", "remote"]
    assert samples[0].used_bytes % 1024 == 0 and samples[0].used_bytes > GIB  # exact bytes, not MiB
    assert samples[0].processes is not None
    assert [(p.pid, p.used_bytes) for p in samples[0].processes] == [(321, GIB)]
    assert samples[1].used_bytes == 2 * GIB
    assert samples[0].t_unix_s == 7.0


def test_sampler_exits_when_its_parent_is_gone(tmp_path: Path) -> None:
    out = tmp_path / "gpu.jsonl"
    result = subprocess.run(
        [*FAKE, "--out", str(out), "--interval-s", "0.05", "--parent-pid", "999999999"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0
    assert len(read_lines(out)) == 2  # one tick, then it noticed its parent is not there
