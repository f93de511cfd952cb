"""Every answer's ``usage`` is held to what was sent, on the real vLLM.

- Chat: prompts calibrated through ``/tokenize`` and shuffled per request come back within the chat
  slack (``payload.CHAT_SLACK_TOKENS``) of the calibrated count, so no honest answer is called a
  disagreement; the server counts exactly what its usage reports.
- A gateway that rewrites prompts (a loopback proxy here that appends 7 token ids to every
  completions prompt, as a gateway that injects a system prompt would) is caught by the real
  server's own ``usage``: every answer is a ``server_error`` "usage disagrees", and the run is nothing
  to judge, saying why (exit 3).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import FIGURES, Run, ServerPool, replay, write_trace_file
from probe import scrape

from oomload.load.payload import CHAT_SLACK_TOKENS
from stubserver import StubHandler, stdlib_server

pytestmark = pytest.mark.e2e

ADDED_IDS = [101, 102, 103, 104, 105, 106, 107]  # what the rewriting proxy appends to each prompt
SHORT_RUN = ("--hold-s", "4", "--warmup-s", "0", "--no-refine", "--no-evidence", "--stop-on", "never")


def test_chat_prompts_are_held_to_their_calibrated_count(vllm_servers: ServerPool, tmp_path: Path) -> None:
    server = vllm_servers.get()
    lengths = [(40 + 97 * i, 8) for i in range(12)]  # 40 … 1,107 prompt tokens, each its own calibration
    trace = write_trace_file(tmp_path / "t.jsonl", lengths)
    before = scrape(server.url)
    proc = replay(server.url, trace, tmp_path / "run", "--api", "chat", "--concurrency", "2,4", *SHORT_RUN)
    after = scrape(server.url)
    assert "Traceback" not in proc.stderr, proc.stderr
    run = Run.read(tmp_path / "run")
    answered = [r for r in run.requests if r["outcome"] != "cancelled"]  # abandoned at the run's end
    assert len(answered) >= 10 and {r["outcome"] for r in answered} == {"ok"}, proc.stdout
    off = [r["usage_prompt_tokens"] - r["prompt_tokens_asked"] for r in answered]
    assert all(abs(d) <= CHAT_SLACK_TOKENS for d in off), off
    assert run.summary is not None and run.summary["verdict"]["requests"]["usage_disagrees"] == 0
    if len(answered) == len(run.requests):  # the server counts what its usage reported
        served = sum(r["usage_prompt_tokens"] for r in answered)
        assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == served
    FIGURES.append(f"chat usage: {len(answered)} answers, usage − trace prompt {min(off)}…{max(off)} tokens")


class _RewritingProxy(StubHandler):
    """Forwards everything to ``upstream``; a ``/v1/completions`` prompt gets ``ADDED_IDS`` appended.
    Answers are buffered whole (the client reads an event stream all the same)."""

    upstream = ""

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/completions":
            obj = json.loads(body)
            obj["prompt"] = [*obj["prompt"], *ADDED_IDS]
            body = json.dumps(obj).encode()
        self._forward(body)

    def _forward(self, body: bytes | None) -> None:
        request = urllib.request.Request(self.upstream + self.path, data=body, method=self.command)
        request.add_header("Content-Type", self.headers.get("Content-Type") or "application/json")
        try:
            with urllib.request.urlopen(request, timeout=120) as resp:
                status, ctype, data = resp.status, resp.headers.get("Content-Type"), resp.read()
        except urllib.error.HTTPError as err:
            status, ctype, data = err.code, err.headers.get("Content-Type"), err.read()
        self.send_body(status, ctype or "application/json", data)


@pytest.fixture
def rewriting_proxy(vllm_servers: ServerPool) -> Iterator[str]:
    handler = type("Proxy", (_RewritingProxy,), {"upstream": vllm_servers.get().url})
    with stdlib_server(handler) as url:
        yield url


def test_a_gateway_that_lengthens_prompts_is_caught_by_the_real_usage(
    vllm_servers: ServerPool, rewriting_proxy: str, tmp_path: Path
) -> None:
    server = vllm_servers.get()
    trace = write_trace_file(tmp_path / "t.jsonl", [(64, 8), (200, 8), (333, 8)])
    before = scrape(server.url)
    proc = replay(rewriting_proxy, trace, tmp_path / "run", "--concurrency", "2", *SHORT_RUN)
    after = scrape(server.url)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 3, proc.stdout + proc.stderr  # nothing to judge
    run = Run.read(tmp_path / "run")
    answered = [r for r in run.requests if r["outcome"] != "cancelled"]
    assert answered, proc.stdout
    for r in answered:
        sent = r["prompt_tokens_asked"]
        assert r["outcome"] == "server_error", r
        assert r["error"] == f"usage disagrees: prompt_tokens {sent + len(ADDED_IDS)}, {sent} sent", r
    if len(answered) == len(run.requests):  # the server ran (and counted) what its usage reported
        served = sum(r["usage_prompt_tokens"] for r in answered)
        assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == served
    assert run.summary is not None
    verdict = run.summary["verdict"]
    assert verdict["requests"]["usage_disagrees"] == len(answered)
    assert "answers' usage contradicted the lengths sent" in verdict["requests"]["failed_run"]
    assert "NOTHING TO JUDGE" in proc.stdout
    assert "so the load was not the trace's" in (tmp_path / "run" / "report.md").read_text(encoding="utf-8")
    FIGURES.append(f"rewriting gateway: {len(answered)} answers, all 'usage disagrees' (+7 tokens)")


def test_a_server_that_refuses_every_request_stops_the_ramp_and_says_why(
    vllm_servers: ServerPool, tmp_path: Path
) -> None:
    """Token ids outside the vocabulary (the tiny model has 2048): the real vLLM refuses every request
    with HTTP 400. The run stops after its first level (``capacity.schedule``, "No answer") instead of
    climbing the rest, exits 3, and the verdict names the reason and the flag to fix."""
    server = vllm_servers.get()
    trace = write_trace_file(tmp_path / "t.jsonl", [(64, 16)] * 50)
    run_dir = tmp_path / "run"
    proc = replay(
        server.url,
        trace,
        run_dir,
        *("--concurrency", "1,2,4", "--hold-s", "4", "--warmup-s", "0", "--no-evidence"),
        *("--token-id-range", "3000:4000"),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 3, proc.stdout + proc.stderr
    run = Run.read(run_dir)
    assert json.loads((run_dir / "status.json").read_text())["end_reason"] == "no_answer"
    assert [s["concurrency"] for s in run.steps if s["event"] == "end"] == [1]
    assert run.summary is not None
    requests = run.summary["verdict"]["requests"]
    top = requests["top_errors"]["server_error"]
    # streamed (the default), vLLM 0.32 refuses inside a 200: an error event with code 400
    assert top["error"] == "400 inside a 200 stream: BadRequestError", top
    assert top["requests"] == requests["failed"] >= 10, requests
    assert "were refused with a 400 (the request itself): every token id" in requests["failed_run"]
    FIGURES.append(f"refused every request: {requests['failed']} × {top['error']}, the run stopped at 1")
