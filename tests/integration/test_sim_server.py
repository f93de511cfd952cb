"""``oomload sim serve`` on loopback: the openai client, vLLM's error shapes, /metrics, memory deaths."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from oomload.sim.process import SimServer

ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
MIB = 1024**2
TINY = ["--model", "tiny", "--num-gpu-blocks", "32", "--block-size", "128", "--max-model-len", "2048",
        "--max-num-seqs", "64", "--time-scale", "0.2"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny() -> Iterator[SimServer]:
    with SimServer(TINY) as server:
        yield server


def call(
    server: SimServer, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, bytes]:
    url = urlparse(server.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def metrics(server: SimServer) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    status, body = call(server, "GET", "/metrics")
    assert status == 200
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def one(values: dict[tuple[tuple[str, str], ...], float]) -> float:
    assert len(values) == 1
    return next(iter(values.values()))


def test_openai_client_completions_exact_lengths_streaming_and_not(tiny: SimServer) -> None:
    client = OpenAI(base_url=f"{tiny.url}/v1", api_key="unused", max_retries=0)
    extra = {"ignore_eos": True, "min_tokens": 24}
    resp = client.completions.create(
        model="tiny-model", prompt=list(range(20, 120)), max_tokens=24, extra_body=extra
    )
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (100, 24)
    assert resp.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model="tiny-model", prompt="abcd" * 30, max_tokens=17, stream=True,
        stream_options={"include_usage": True}, extra_body=extra | {"min_tokens": 17},
    )  # fmt: skip
    texts, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
            reasons.append(chunk.choices[0].finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage
    assert len(texts) == 17 and reasons[-1] == "length"
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (30, 17)


def test_openai_client_chat_streaming_and_not_with_calibrated_prompt(tiny: SimServer) -> None:
    client = OpenAI(base_url=f"{tiny.url}/v1", api_key="unused", max_retries=0)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word" * 50}]
    status, body = call(tiny, "POST", "/tokenize", {"messages": messages})
    assert status == 200
    counted = json.loads(body)
    assert counted["count"] == 50 + 5 + 3 and counted["max_model_len"] == 2048
    resp = client.chat.completions.create(model="tiny-model", messages=messages, max_tokens=9)
    assert resp.usage is not None and (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (58, 9)
    stream = client.chat.completions.create(
        model="tiny-model", messages=messages, max_tokens=6, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 6
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_models_version_health_tokenize_detokenize(tiny: SimServer) -> None:
    status, body = call(tiny, "GET", "/v1/models")
    card = json.loads(body)["data"][0]
    assert status == 200 and card["id"] == "tiny-model" and card["max_model_len"] == 2048
    assert json.loads(call(tiny, "GET", "/version")[1]) == {"version": "0.32.0"}
    assert call(tiny, "GET", "/health") == (200, b"")
    status, body = call(tiny, "POST", "/detokenize", {"tokens": [100, 200]})
    assert status == 200 and len(json.loads(body)["prompt"]) == 8
    assert call(tiny, "POST", "/detokenize", {"tokens": [99999]})[0] == 400


def test_errors_have_vllms_status_and_json_shape(tiny: SimServer) -> None:
    status, body = call(tiny, "POST", "/v1/completions", {"prompt": [5] * 3000, "max_tokens": 4})
    assert status == 400
    expected = (
        "This model's maximum context length is 2048 tokens. However, your prompt contains 3000 input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the "
        "input prompt. (parameter=input_tokens, value=3000)"
    )
    error = {"message": expected, "type": "BadRequestError", "param": "input_tokens", "code": 400}
    assert json.loads(body) == {"error": error}
    # prompt + max_tokens > max_model_len is clamped silently (vLLM >= 0.33, and the CPU 0.32 build)
    status, body = call(tiny, "POST", "/v1/completions", {"prompt": [5] * 2040, "max_tokens": 100})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 8
    for raw in (b"{not json", b"[1, 2]"):
        status, body = call(tiny, "POST", "/v1/completions", raw=raw)
        assert status == 400 and json.loads(body)["error"]["code"] == 400
    bad_bodies: list[dict[str, Any]] = [
        {"prompt": {"a": 1}},
        {"prompt": [1, 2], "max_tokens": "ten"},
        {"prompt": [1, 99999]},
        {"prompt": [1, 2], "stream_options": {"include_usage": True}},
        {"prompt": [1, 2], "max_tokens": 0},
        {"prompt": [1, 2], "max_tokens": 5000},
    ]
    for body_obj in bad_bodies:
        status, body = call(tiny, "POST", "/v1/completions", body_obj)
        assert status == 400, body_obj
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    assert call(tiny, "POST", "/v1/chat/completions", {"messages": "hi"})[0] == 400
    assert call(tiny, "GET", "/no/such/path")[0] == 404
    for empty in ("", []):
        status, body = call(tiny, "POST", "/v1/completions", {"model": "tiny-model", "prompt": empty})
        error = {
            "message": "The decoder prompt cannot be empty",
            "type": "BadRequestError",
            "param": "prompt",
        }
        assert (status, json.loads(body)) == (400, {"error": {**error, "code": 400}})
    messages = [{"role": "user", "content": "hi"}]
    for path, req in (
        ("/v1/completions", {"prompt": [1, 2]}),
        ("/v1/chat/completions", {"messages": messages}),
    ):
        status, body = call(tiny, "POST", path, {"model": "gpt-4o", **req})
        not_found = {
            "message": "The model `gpt-4o` does not exist.",
            "type": "NotFoundError",
            "param": "model",
        }
        assert (status, json.loads(body)) == (404, {"error": {**not_found, "code": 404}})
    assert call(tiny, "GET", "/health")[0] == 200  # still alive


def test_preemption_counter_rises_above_the_onset_only(tiny: SimServer) -> None:
    def burst(conc: int) -> float:
        before = one(metrics(tiny)["vllm:num_preemptions_total"])
        body = {"prompt": list(range(16, 528)), "max_tokens": 512, "min_tokens": 512, "ignore_eos": True}
        with ThreadPoolExecutor(conc) as pool:
            results = list(pool.map(lambda _: call(tiny, "POST", "/v1/completions", body), range(conc)))
        assert all(status == 200 for status, _ in results)
        assert all(json.loads(b)["usage"]["completion_tokens"] == 512 for _, b in results)
        return one(metrics(tiny)["vllm:num_preemptions_total"]) - before

    assert burst(3) == 0  # 3 × 8 blocks ≤ 31 usable
    assert burst(8) > 0  # 8 × 8 blocks > 31
    m = metrics(tiny)
    assert one(m["vllm:kv_cache_usage_perc"]) == 0.0
    assert one(m["vllm:num_requests_running"]) == 0


def test_metrics_have_vllm_names_labels_and_cache_config(tiny: SimServer) -> None:
    m = metrics(tiny)
    labels = dict(next(iter(m["vllm:num_requests_running"])))
    assert labels == {"engine": "0", "model_name": "tiny-model"}
    for name in ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:num_preemptions_created"):  # fmt: skip
        assert name in m, name
    reasons = {dict(k)["finished_reason"] for k in m["vllm:request_success_total"]}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    assert {dict(k)["reason"] for k in m["vllm:admission_rejections_total"]} == {
        "max_num_queued_reqs", "max_num_queued_tokens"
    }  # fmt: skip
    info = dict(next(iter(m["vllm:cache_config_info"])))
    assert (info["num_gpu_blocks"], info["block_size"], info["kv_cache_size_tokens"]) == ("32", "128", "4096")
    assert info["kv_cache_max_concurrency"] == "2.0" and info["engine"] == "0"


def test_client_disconnect_aborts_and_frees_blocks(tiny: SimServer) -> None:
    before = metrics(tiny)["vllm:request_success_total"][(("engine", "0"), ("finished_reason", "abort"),
                                                          ("model_name", "tiny-model"))]  # fmt: skip
    url = urlparse(tiny.url)
    sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 0))
    body = json.dumps({"prompt": [7] * 200, "max_tokens": 1500, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    assert b"200" in sock.recv(4096)
    sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = metrics(tiny)
        aborted = m["vllm:request_success_total"][(("engine", "0"), ("finished_reason", "abort"),
                                                   ("model_name", "tiny-model"))]  # fmt: skip
        if aborted == before + 1:
            break
        time.sleep(0.05)
    assert aborted == before + 1
    assert one(m["vllm:kv_cache_usage_perc"]) == 0.0


def test_dcgm_endpoint_reports_framebuffer_mib() -> None:
    with SimServer(["--model", "llama-3.1-8b", "--gpu", "h100", "--time-scale", "0"]) as server:
        status, body = call(server, "GET", "/dcgm/metrics")
        assert status == 200
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        used = fams["DCGM_FI_DEV_FB_USED"].samples[0].value
        free = fams["DCGM_FI_DEV_FB_FREE"].samples[0].value
        assert used + free == 81559  # MiB of an H100 80GB
        assert 0.85 * 81559 < used < 0.93 * 81559  # vLLM preallocates ~util × total


def test_dcgm_endpoint_is_404_when_no_gpu_is_modelled(tiny: SimServer) -> None:
    status, body = call(tiny, "GET", "/dcgm/metrics")
    error = json.loads(body)["error"]
    assert status == 404 and error["type"] == "NotFoundError"
    assert error["message"].startswith("No GPU is modelled")


def test_admission_rejections_503_and_in_band_stream_errors_and_keepalive_close() -> None:
    args = [*TINY, "--max-num-queued-reqs", "0", "--keepalive-timeout-s", "0.5"]
    with SimServer(args) as server:
        status, body = call(server, "POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
        assert status == 503
        busy = (
            "The engine is currently busy and cannot accept new requests. "
            "Please try again later or on a different instance."
        )
        error = {"message": busy, "type": "Service Unavailable", "param": None, "code": 503}
        assert json.loads(body) == {"error": error}
        streamed = [
            call(server, "POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 2, "stream": True})
            for _ in range(4)
        ]
        assert [s for s, _ in streamed] == [503, 200, 503, 200]
        events = streamed[1][1].decode().strip().split("\n\n")
        assert json.loads(events[0].removeprefix("data: "))["error"]["code"] == 503
        assert events[-1] == "data: [DONE]"
        m = metrics(server)
        rejected = m["vllm:admission_rejections_total"][
            (("model_name", "tiny-model"), ("reason", "max_num_queued_reqs"))
        ]
        assert rejected == 5
        url = urlparse(server.url)
        sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 0), timeout=5)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(1.2)
        assert sock.recv(4096) == b""  # the idle keep-alive connection was closed by the server
        sock.close()


def test_legacy_metrics_profile_uses_old_names() -> None:
    with SimServer([*TINY, "--metrics-profile", "legacy"]) as server:
        call(server, "POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3})
        m = metrics(server)
        assert "vllm:gpu_cache_usage_perc" in m and "vllm:kv_cache_usage_perc" not in m
        assert dict(next(iter(m["vllm:num_requests_running"]))) == {"model_name": "tiny-model"}
        assert one(m["vllm:generation_tokens_total"]) == 3
        assert "vllm:admission_rejections_total" not in m
        info = dict(next(iter(m["vllm:cache_config_info"])))
        assert info["num_gpu_blocks"] == "32" and "swap_space_bytes" in info
        assert json.loads(call(server, "GET", "/version")[1]) == {"version": "0.6.6"}


def test_modelled_cuda_oom_gives_500s_then_the_server_exits(tmp_path: Path) -> None:
    # the server exits 3 s after the OOM: room for the 500 below on a busy machine
    args = ["--model", "llama-3.1-8b", "--gpu", "l4", "--max-model-len", "4096", "--num-gpu-blocks", "3200",
            "--time-scale", "0", "--exit-delay-s", "3"]  # fmt: skip
    log = tmp_path / "sim.log"
    with SimServer(args, log_path=log) as server:
        assert server.log_path == log
        assert call(server, "POST", "/v1/completions", {"prompt": [9] * 16, "max_tokens": 4})[0] == 200
        status, body = call(
            server, "POST", "/v1/completions", {"prompt": [9] * 2000, "max_tokens": 4, "stream": True}
        )
        assert status == 200
        events = body.decode().strip().split("\n\n")
        assert json.loads(events[-2].removeprefix("data: "))["error"] == {
            "message": ENGINE_DEAD, "type": "InternalServerError", "param": None, "code": 500,
        }  # fmt: skip
        status, body = call(server, "POST", "/v1/completions", {"prompt": [9] * 16, "max_tokens": 4})
        assert status == 500 and json.loads(body)["error"]["message"] == ENGINE_DEAD
        assert server.wait(15) == 1
        pid = server.pid
    assert server.returncode == 1  # kept after stop, as the log is
    text = log.read_text()
    # what a classifier of the server's log keys on, in vLLM V1's order and with its process prefixes
    fatal = re.search(rf"^\(EngineCore pid={pid}\) ERROR \d\d-\d\d [\d:]{{8}} \[core\.py:\d+\] "
                      r"EngineCore encountered a fatal error\.$", text, re.M)  # fmt: skip
    oom = re.search(
        rf"^\(EngineCore pid={pid}\) ERROR .*\] torch\.OutOfMemoryError: CUDA out of memory\. "
        r"Tried to allocate (?P<tried>[\d.]+) MiB\. GPU 0 has a total capacity of (?P<total>[\d.]+) GiB "
        r"of which (?P<free>[\d.]+) MiB is free\. Including non-PyTorch memory, this process has "
        r"(?P<used>[\d.]+) GiB memory in use\.",
        text,
        re.M,
    )
    dead = re.search(
        rf"^\(APIServer pid={pid}\) ERROR .*\] vllm\.v1\.engine\.exceptions\.EngineDeadError: "
        + re.escape(ENGINE_DEAD),
        text,
        re.M,
    )
    assert fatal and oom and dead, text[-3000:]
    assert fatal.start() < oom.start() < dead.start()
    assert float(oom["tried"]) > float(oom["free"])  # the step's activations did not fit
    assert float(oom["total"]) == 22.49 and float(oom["used"]) <= float(oom["total"])
    assert text.count("Traceback (most recent call last):") == 3  # EngineCore, AsyncLLM, Process EngineCore
    assert len(re.findall(r"\] Request cmpl-\w+ failed \(engine dead\)\.$", text, re.M)) == 1


def test_container_memory_limit_is_a_sigkill_with_nothing_logged(tmp_path: Path) -> None:
    """Over ``--host-memory-limit-mib`` the server's real RSS takes the kernel OOM killer's way out."""
    args = [*TINY, "--time-scale", "1", "--host-bytes-per-token", "65536", "--host-memory-limit-mib", "200"]
    log = tmp_path / "sim.log"
    with SimServer(args, log_path=log) as server:
        assert server.pid is not None
        before = _rss_bytes(server.pid)
        # one request of 1,016 tokens holds 63.5 MiB: it fits under the limit and is answered
        assert call(server, "POST", "/v1/completions", {"prompt": [9] * 1000, "max_tokens": 16})[0] == 200
        assert _rss_bytes(server.pid) < 200 * MIB
        with ThreadPoolExecutor(4) as pool:  # four at once need 254 MiB more: over the limit
            answers = list(pool.map(lambda _: _try_call(server, [9] * 1000, 64), range(4)))
        assert server.wait(10) == -signal.SIGKILL
    assert all(status is None for status, _ in answers), answers  # killed: no request was answered
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text and "EngineDeadError" not in text
    assert before < 200 * MIB


def test_process_memory_limit_fails_the_allocation_with_the_cpu_allocators_words(tmp_path: Path) -> None:
    args = [*TINY, "--time-scale", "1", "--host-bytes-per-token", "65536", "--host-memory-limit-mib", "200",
            "--host-limit-kind", "process", "--exit-delay-s", "1"]  # fmt: skip
    log = tmp_path / "sim.log"
    with SimServer(args, log_path=log) as server:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: _try_call(server, [9] * 1000, 64), range(4)))
        assert server.wait(10) == 1
    assert {status for status, _ in answers} == {500}
    assert {json.loads(body)["error"]["message"] for _, body in answers} == {ENGINE_DEAD}
    text = log.read_text()
    assert re.search(
        r"^\(Worker pid=\d+\) ERROR .*\] RuntimeError: \[enforce fail at alloc_cpu\.cpp:127\] err == 0\. "
        r"DefaultCPUAllocator: can't allocate memory: you tried to allocate \d+ bytes\. Error code 12 "
        r"\(Cannot allocate memory\)$",
        text,
        re.M,
    ), text[-3000:]
    assert "EngineCore encountered a fatal error." in text and "EngineDeadError" in text


def test_host_leak_grows_the_real_rss_at_the_configured_rate() -> None:
    """``--host-leak-mib-per-min 600``: 10 MiB of real, resident memory per wall-clock second. The rate is
    the slope fitted to 3 s of samples, 0.1 s apart: the leak grows on the engine loop's 0.1 s ticks,
    so two samples alone read a stall of the loop at either end (0.8 s of one would leave the band)."""
    with SimServer([*TINY, "--host-leak-mib-per-min", "600"]) as server:
        assert server.pid is not None
        samples = []
        for _ in range(31):
            samples.append((time.monotonic(), _rss_bytes(server.pid) / MIB))
            time.sleep(0.1)
    rate_mib_per_s = float(np.polyfit(*zip(*samples, strict=True), 1)[0])
    assert 6.0 <= rate_mib_per_s <= 14.0, rate_mib_per_s


def test_the_simulator_dies_with_its_parent_after_a_kill_9(tmp_path: Path) -> None:
    """Issue #24: after a ``kill -9`` of ``oomload replay`` the simulator it started kept running."""
    parent_code = (
        "import sys, time\n"
        "from oomload.sim.process import SimServer\n"
        f"server = SimServer({TINY!r}).start()\n"
        "print(server.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child_pid = -1
    with subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, env=env, start_new_session=True
    ) as parent:
        try:
            assert parent.stdout is not None
            child_pid = int(parent.stdout.readline())
            assert _running(child_pid)
            parent.kill()  # SIGKILL: the parent gets no chance to stop its child
            parent.wait(timeout=10)
            for _ in range(100):  # bounded: 100 × 0.1 s
                if not _running(child_pid):
                    break
                time.sleep(0.1)
            assert not _running(child_pid), "the simulator outlived its parent"
        finally:
            parent.kill()
            if _running(child_pid):
                os.kill(child_pid, signal.SIGKILL)


def _rss_bytes(pid: int) -> int:
    """``VmRSS`` of ``/proc/PID/status``, as a host-memory sampler reads it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _try_call(server: SimServer, prompt: list[int], max_tokens: int) -> tuple[int | None, bytes]:
    """A completion that may find the server gone: ``(None, b"")`` when no HTTP answer came."""
    try:
        return call(server, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens})
    except (OSError, http.client.HTTPException):
        return None, b""


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan's reaper may be slow to reap)."""
    if pid <= 0:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
