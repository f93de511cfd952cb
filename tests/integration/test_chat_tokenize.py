"""``--api chat`` against servers whose ``/tokenize`` is missing or stops answering.

Seen here before: a stub without ``/tokenize`` made every user's task raise, Locust printed the same
traceback for every attempt (112,000 lines in a 3 s step), and the verdict read "complete". Now a
server without it is one sentence before any load, and a ``/tokenize`` that fails mid-run makes each
request it could not build a recorded failure, after which the user backs off.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from clirun import oomload
from oomload.errors import ExitCode
from oomload.load.http import unsent_exchange
from oomload.outcome import Outcome
from oomload.trace.model import TraceHeader, TraceRecord, write_trace
from stubserver import StubHandler, stdlib_server

HOLD_S = 2.0


class _ChatStub(StubHandler):
    """A chat server whose ``/tokenize`` answers its first ``tokenize_calls`` calls, then 404s."""

    tokenize_calls: ClassVar[int] = 0
    calls: ClassVar[list[int]] = [0]

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self.send_body(200, "application/json", b'{"data":[{"id":"m","max_model_len":4096}]}')
        else:
            self.send_body(404, "application/json", b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        words = len(body.get("messages", [{}])[0].get("content", "").split()) if "messages" in body else 0
        if self.path == "/tokenize":
            self.calls[0] += 1
            if self.calls[0] <= self.tokenize_calls:
                self.send_body(200, "application/json", json.dumps({"count": 5 + words}).encode())
            else:
                self.send_body(404, "application/json", b'{"detail":"Not Found"}')
        elif self.path == "/v1/chat/completions":
            out = int(body.get("max_tokens", 1))
            chunks = [{"choices": [{"index": 0, "delta": {"content": "x"}}]}] * out
            chunks.append({"choices": [], "usage": {"prompt_tokens": 5 + words, "completion_tokens": out}})
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            self.send_body(200, "text/event-stream", text.encode())
        else:
            self.send_body(404, "application/json", b'{"detail":"Not Found"}')


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    records = [TraceRecord(f"r{i}", 0.0, 20 + 7 * i, 3) for i in range(60)]  # 60 distinct lengths
    write_trace(path, records, TraceHeader(source=("chat-tokenize",), format="synthetic"))
    return path


@contextlib.contextmanager
def _stub(tokenize_calls: int) -> Iterator[str]:
    handler = type("Stub", (_ChatStub,), {"tokenize_calls": tokenize_calls, "calls": [0]})
    with stdlib_server(handler) as url:
        yield url


def _replay(url: str, trace: Path, run_dir: Path) -> Any:
    return oomload(
        *("replay", str(trace), "--url", url, "--run-dir", str(run_dir), "--gpu", "none", "--api", "chat"),
        *("--concurrency", "2", "--hold-s", str(HOLD_S), "--warmup-s", "0", "--no-refine", "--no-evidence"),
        timeout_s=120.0,
    )


def test_a_server_without_tokenize_is_one_sentence_before_any_load(trace: Path, tmp_path: Path) -> None:
    with _stub(tokenize_calls=0) as url:
        proc = _replay(url, trace, tmp_path / "run")
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"oomload: error: --api chat calibrates every prompt through the server's /tokenize, and "
        f"{url}/tokenize answered HTTP 404: replay over the completions API (the default), or point --url at "
        "the vLLM server itself"
    ]
    assert not (tmp_path / "run").exists()


def test_a_tokenize_that_stops_answering_mid_run_is_recorded_not_a_traceback_flood(
    trace: Path, tmp_path: Path
) -> None:
    with _stub(tokenize_calls=12) as url:
        proc = _replay(url, trace, tmp_path / "run")
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and len(out.splitlines()) < 100, out[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r["outcome"] == "transport_error"]
    assert failed and {r["error"] for r in failed} == {"tokenize failed: answered HTTP 404"}
    assert all(r["outcome"] in ("ok", "transport_error", "cancelled") for r in rows)
    assert len(failed) <= 2 * (HOLD_S / 0.5 + 2)  # each user backs off 0.5 s after each
    assert proc.returncode == ExitCode.UNREACHABLE  # mostly failed: nothing to judge


@pytest.mark.parametrize(
    ("refused", "answered", "expected"),
    [
        (False, False, (Outcome.TRANSPORT_ERROR, "tokenize failed")),
        (False, True, (Outcome.TRANSPORT_ERROR, "tokenize failed")),
        (True, False, (Outcome.TRANSPORT_ERROR, "tokenize failed")),
        (True, True, (Outcome.ENGINE_DEAD, "connection refused after the server had answered")),
    ],
)
def test_an_unbuilt_request_is_judged_as_a_send_without_an_answer(
    refused: bool, answered: bool, expected: tuple[Outcome, str]
) -> None:
    """A /tokenize refused after the server had answered is its death, as a refused send is."""
    ex = unsent_exchange(
        "tokenize failed", "refused the connection", refused=refused, server_answered_before=answered
    )
    assert (ex.outcome, ex.reason) == expected and ex.http_status is None


@pytest.mark.parametrize(
    ("refused", "outcome"), [(True, Outcome.ENGINE_DEAD), (False, Outcome.TRANSPORT_ERROR)]
)
def test_a_user_records_an_unbuilt_request_and_a_refusal_wakes_the_monitor(
    refused: bool, outcome: Outcome
) -> None:
    """The user's side: the request is recorded once, and a refused /tokenize (a dead server) flags a
    /health check as a refused send does; a 404 does not."""
    from locust.env import Environment

    from oomload.load.context import ReplayContext
    from oomload.load.http import Endpoint
    from oomload.load.payload import PreparedRequest, PromptBuildError, RequestOrder, TokenizeError
    from oomload.load.user import ReplayUser

    class Unbuildable:
        def build(self, record: TraceRecord, sequence: int) -> PreparedRequest:
            request = PreparedRequest(f"{record.id}#{sequence}", "/v1/chat/completions", b"", 5, 3)
            failed = TokenizeError("/tokenize refused", "refused the connection", refused=refused)
            raise PromptBuildError(request, failed)

    ctx = ReplayContext(order=RequestOrder([TraceRecord("r", 0.0, 5, 3)]), payloads=Unbuildable(), sink=None)
    ctx.server_answered = True
    user_class = type(
        "U",
        (ReplayUser,),
        {"abstract": False, "replay": ctx, "endpoint": Endpoint.from_url("http://127.0.0.1:1")},
    )
    user = user_class(Environment(user_classes=[user_class]))
    user.replay_one()
    assert dict(ctx.outcomes) == {outcome: 1} and not ctx.in_flight
    assert ctx.death_suspected is refused
