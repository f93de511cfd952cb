"""Under Locust's gevent monkey-patching (in a child process), the poller and the GPU sampler still work."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from fakesampler import fake_sample_program

SCRIPT = textwrap.dedent(
    """
    from gevent import monkey

    monkey.patch_all()

    import json, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from pathlib import Path

    from oomload.rundir import RunWriter
    from oomload.telemetry.gpu import GpuSamplerProcess
    from oomload.telemetry.poller import MetricsPoller

    TEXT = Path(sys.argv[2]).read_text().encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(TEXT)))
            self.end_headers()
            self.wfile.write(TEXT)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    run_dir = Path(sys.argv[1])
    with RunWriter(run_dir) as writer:
        poller = MetricsPoller(f"http://127.0.0.1:{httpd.server_address[1]}", writer, interval_s=0.05)
        sampler = GpuSamplerProcess(run_dir / "gpu.jsonl", interval_s=0.02, program=json.loads(sys.argv[3]))
        started = sampler.start()
        poller.start()
        ticks = 0
        deadline = time.monotonic() + 15
        while (poller.scrapes < 3 or len(sampler.latest_by_device()) < 1) and time.monotonic() < deadline:
            time.sleep(0.02)  # a cooperative sleep: the poller greenlet runs meanwhile
            ticks += 1
        poller.stop()
        sampler.stop()
    httpd.shutdown()
    print(json.dumps({"started": started, "scrapes": poller.scrapes, "failures": poller.failures,
                      "latest": poller.latest, "rc": sampler.returncode, "ticks": ticks}))
    """
)


def test_poller_and_sampler_under_gevent(tmp_path: Path, fixtures_dir: Path) -> None:
    capture = fixtures_dir / "vllm-metrics.txt"
    manifest = json.loads((fixtures_dir / "manifest.json").read_text())["full"]
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(capture), json.dumps(fake_sample_program("{}"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["started"] is True
    assert report["scrapes"] >= 3 and report["failures"] == 0
    assert (
        report["latest"]["num_preemptions_total"] == manifest["idle_counters"]["vllm:num_preemptions_total"]
    )
    assert report["rc"] == 0
    assert report["ticks"] >= 1
    gpu_lines = (tmp_path / "gpu.jsonl").read_text().splitlines()
    assert len(gpu_lines) >= 1
    assert json.loads(gpu_lines[0])["source"] == "nvml"
