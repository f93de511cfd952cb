"""Incremental SSE parsing and the one-outcome-per-request classification."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.load.classify import Observation, classify, error_fields
from oomload.load.sse import SseStream, error_message, parse_json_body
from oomload.outcome import Outcome


def _completion_stream(tokens: int, usage: bool = True) -> bytes:
    out = b""
    for i in range(tokens):
        chunk = {"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}]}
        out += b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    if usage:
        u = {
            "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens},
        }
        out += b"data: " + json.dumps(u, separators=(",", ":")).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


@given(tokens=st.integers(1, 40), cuts=st.lists(st.integers(1, 5000), max_size=30))
def test_parse_is_independent_of_how_the_body_is_split(tokens: int, cuts: list[int]) -> None:
    body = _completion_stream(tokens)
    stream = SseStream()
    positions = sorted({c % len(body) for c in cuts} | {0, len(body)})
    for i, (a, b) in enumerate(itertools.pairwise(positions)):
        stream.feed(body[a:b], float(i))
    stream.close(99.0)
    assert stream.done and stream.error is None
    assert stream.token_events == tokens
    assert stream.usage_prompt_tokens == 7 and stream.usage_completion_tokens == tokens
    assert stream.first_token_s is not None and stream.last_token_s is not None


def test_chat_role_chunk_is_not_a_token_and_gaps_are_measured() -> None:
    stream = SseStream()
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n'
    stream.feed_line(role, 1.0)
    stream.feed_line(b"\n", 1.0)
    for t in (1.5, 1.6, 2.6):
        stream.feed_line(b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n', t)
        stream.feed_line(b"\n", t)
    assert stream.token_events == 3 and stream.first_token_s == 1.5
    assert abs(stream.max_gap_s - 1.0) < 1e-9


def test_error_event_inside_a_200_stream() -> None:
    stream = SseStream()
    err = {"error": {"message": "The engine is currently busy", "type": "Service Unavailable", "code": 503}}
    stream.feed(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n", 0.0)
    message, code, kind = error_fields(stream.error)
    assert kind == "Service Unavailable"
    obs = Observation(http_status=200, error_text=message, error_code=code, stream_error=True)
    assert classify(obs)[0] is Outcome.ADMISSION_REJECTED
    assert stream.token_events == 0


def test_a_refusal_streamed_inside_a_200_is_named_by_its_code() -> None:
    """The real vLLM streams an out-of-vocabulary token id's 400 as an error event (seen on 0.32): named
    "400 inside a 200 stream", as a refusal sent as the status is "http 400"; an event without a
    code stays "error event in stream"."""
    stream = SseStream()
    err = {"error": {"message": "Token id 3002 is out of vocabulary", "type": "BadRequestError", "code": 400}}
    stream.feed(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n", 0.0)
    message, code, kind = error_fields(stream.error)
    obs = Observation(
        http_status=200, error_text=message, error_code=code, error_type=kind, stream_error=True
    )
    assert classify(obs) == (Outcome.SERVER_ERROR, "400 inside a 200 stream", "BadRequestError")
    uncoded = Observation(http_status=200, error_text="boom", stream_error=True)
    assert classify(uncoded)[:2] == (Outcome.SERVER_ERROR, "error event in stream")


def test_a_429_is_a_limit_in_front_of_the_engine_as_status_or_streamed() -> None:
    """A gateway's 429 read "server_error" like a 500, so the verdict told a limit in front of the engine
    from the engine's own failure by nothing: now it is ``rate_limited``, and never an engine death or a
    context overflow by mistake (a 429 whose text names neither)."""
    obs = Observation(http_status=429, error_text="Too many requests", error_type="rate_limit_error")
    assert classify(obs) == (Outcome.RATE_LIMITED, "http 429", "rate_limit_error")
    stream = SseStream()
    err = {"error": {"message": "Rate limit reached", "type": "RateLimitError", "code": 429}}
    stream.feed(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n", 0.0)
    message, code, kind = error_fields(stream.error)
    streamed = Observation(
        http_status=200, error_text=message, error_code=code, error_type=kind, stream_error=True
    )
    assert classify(streamed) == (Outcome.RATE_LIMITED, "429 inside a 200 stream", "RateLimitError")
    # what the engine says still comes first: its death, a prompt over its window
    assert classify(Observation(http_status=429, error_text="EngineDeadError"))[0] is Outcome.ENGINE_DEAD
    overflow = Observation(http_status=429, error_text="maximum context length is 2048 tokens")
    assert classify(overflow)[0] is Outcome.CONTEXT_OVERFLOW


VLLM_BUSY = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different "
    "instance."
)


def test_a_503_is_the_engines_queue_limit_only_when_vllm_says_so() -> None:
    """A bare 503 read ``admission_rejected``, vLLM's queue limit, so a gateway answering 503 at its own
    limit (nginx's ``limit_req`` and ``limit_conn`` do by default, Envoy's overflow and HAProxy's "no
    server is available" too) made the level unsafe and the advice a ``max_num_seqs`` cut. vLLM's own
    answer says "engine is currently busy" with the type "Service Unavailable" (as the status or inside
    a 200 stream); any other 503 is a limit in front of the engine, like a 429."""
    vllm = Observation(http_status=503, error_text=VLLM_BUSY, error_type="Service Unavailable")
    assert classify(vllm) == (Outcome.ADMISSION_REJECTED, "http 503", "engine is currently busy")
    by_type = Observation(
        http_status=200, error_text="x", error_code=503, error_type="Service Unavailable", stream_error=True
    )
    assert classify(by_type)[:2] == (Outcome.ADMISSION_REJECTED, "503 inside a 200 stream")
    nginx = "<html><head><title>503 Service Temporarily Unavailable</title></head></html>"
    haproxy = (
        "<html><body><h1>503 Service Unavailable</h1>No server is available to handle this request.</body>"
    )
    envoy = "upstream connect error or disconnect/reset before headers. reset reason: overflow"
    for text in (nginx, haproxy, envoy, ""):
        assert classify(Observation(http_status=503, error_text=text))[:2] == (
            Outcome.RATE_LIMITED,
            "http 503",
        )
    streamed = Observation(http_status=200, error_text="upstream busy", error_code=503, stream_error=True)
    assert classify(streamed)[:2] == (Outcome.RATE_LIMITED, "503 inside a 200 stream")
    # the engine's death behind the 503 still comes first
    assert classify(Observation(http_status=503, error_text="EngineDeadError"))[0] is Outcome.ENGINE_DEAD


def test_multiline_data_and_comments() -> None:
    stream = SseStream()
    stream.feed(b': ping\nevent: x\ndata: {"choices":[],\ndata: "usage":{"completion_tokens":3}}\n\n', 0.0)
    assert stream.usage_completion_tokens == 3


def test_error_body_shapes() -> None:
    new = b'{"error":{"message":"This model\'s maximum context length is 2048 tokens.","code":400}}'
    old = b'{"object":"error","message":"maximum context length is 64","code":400}'
    assert "maximum context length" in error_message(new)
    assert "maximum context length" in error_message(old)
    assert error_message(b"<html>bad gateway</html>").startswith("<html>")
    assert parse_json_body(
        b'{"choices":[{"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}'
    ) == (
        3,
        2,
        None,
        True,
    )


def _outcome(**kw: object) -> Outcome:
    return classify(Observation(**kw))[0]  # type: ignore[arg-type]


def test_each_outcome_class() -> None:
    ok = {"http_status": 200, "usage_completion_tokens": 8, "output_tokens_asked": 8}
    assert _outcome(**ok) is Outcome.OK
    assert _outcome(http_status=400, error_text="This model's maximum context length is 64") is (
        Outcome.CONTEXT_OVERFLOW
    )
    assert _outcome(http_status=503, error_text="The engine is currently busy") is Outcome.ADMISSION_REJECTED
    assert _outcome(http_status=500, error_text="") is Outcome.ENGINE_DEAD
    assert _outcome(http_status=500, error_text="EngineCore encountered an issue.") is Outcome.ENGINE_DEAD
    assert _outcome(http_status=200, stream_error=True, error_text="CUDA out of memory. Tried") is (
        Outcome.ENGINE_DEAD
    )
    assert _outcome(http_status=500, error_text="division by zero") is Outcome.SERVER_ERROR
    assert _outcome(http_status=502, error_text="<html>") is Outcome.SERVER_ERROR
    assert _outcome(http_status=200, body_ok=False) is Outcome.SERVER_ERROR
    assert _outcome(timed_out=True) is Outcome.TIMEOUT
    assert _outcome(http_status=200, timed_out=True, stream_complete=False) is Outcome.TIMEOUT
    assert _outcome(transport_error="connection reset") is Outcome.TRANSPORT_ERROR
    assert _outcome(refused=True, transport_error="connection refused") is Outcome.TRANSPORT_ERROR
    assert _outcome(refused=True, server_answered_before=True) is Outcome.ENGINE_DEAD
    # a complete answer (usage present, or [DONE] seen) with fewer tokens than asked is truncated …
    cut = {"http_status": 200, "stream_complete": False, "output_tokens_asked": 8}
    assert _outcome(**cut, usage_completion_tokens=3) is Outcome.TRUNCATED
    assert _outcome(http_status=200, usage_completion_tokens=None) is Outcome.TRUNCATED
    # … a stream that broke (EOF/reset before [DONE], no usage) is a transport error: a dying server
    broke = classify(Observation(http_status=200, stream_complete=False, output_tokens_asked=8))
    assert broke[:2] == (Outcome.TRANSPORT_ERROR, "stream broke")
    reset = Observation(http_status=200, stream_complete=False, transport_error="ECONNRESET before the end")
    assert classify(reset) == (Outcome.TRANSPORT_ERROR, "stream broke", "ECONNRESET before the end")
    clamped = {"http_status": 200, "usage_completion_tokens": 8, "output_tokens_asked": 100}
    assert _outcome(**clamped) is Outcome.TRUNCATED
    assert _outcome(**clamped, exact_output=False) is Outcome.OK


def test_usage_that_contradicts_what_was_sent_is_a_server_error() -> None:
    """A 200 whose usage says other lengths than were sent did not carry the trace's load (the hostile
    drill's 10¹² tokens counted ok before): prompt off by more than the slack, or output over max_tokens."""
    sent = {"http_status": 200, "output_tokens_asked": 8, "prompt_tokens_sent": 812}
    assert _outcome(**sent, usage_prompt_tokens=812, usage_completion_tokens=8) is Outcome.OK
    liar = classify(Observation(**sent, usage_prompt_tokens=10**12, usage_completion_tokens=8))
    assert liar == (Outcome.SERVER_ERROR, "usage disagrees", "prompt_tokens 1000000000000, 812 sent")
    short = classify(Observation(**sent, usage_prompt_tokens=811, usage_completion_tokens=8))
    assert short[:2] == (Outcome.SERVER_ERROR, "usage disagrees")  # a truncated prompt is one too
    over = classify(Observation(**sent, usage_prompt_tokens=812, usage_completion_tokens=9))
    assert over == (Outcome.SERVER_ERROR, "usage disagrees", "completion_tokens 9 > max_tokens 8")
    loose = {**sent, "exact_output": False}  # --no-exact-output allows fewer tokens, never more
    assert _outcome(**loose, usage_prompt_tokens=812, usage_completion_tokens=9) is Outcome.SERVER_ERROR
    # a calibrated chat prompt: within its slack is ok, beyond it is not
    chat = {**sent, "prompt_slack_tokens": 4, "usage_completion_tokens": 8}
    assert (
        _outcome(**chat, usage_prompt_tokens=808) is _outcome(**chat, usage_prompt_tokens=816) is Outcome.OK
    )
    assert _outcome(**chat, usage_prompt_tokens=817) is Outcome.SERVER_ERROR
    # nothing to hold it to: the prompt sent unknown, or the usage without prompt_tokens
    assert _outcome(**{**chat, "prompt_tokens_sent": None}, usage_prompt_tokens=5) is Outcome.OK
    assert _outcome(**chat, usage_prompt_tokens=None) is Outcome.OK
    # a clamped answer with a wrong prompt count: the disagreement is the finding
    assert _outcome(**sent, usage_prompt_tokens=5, usage_completion_tokens=3) is Outcome.SERVER_ERROR


def test_precedence_engine_dead_beats_everything() -> None:
    obs = Observation(http_status=503, error_text="EngineDeadError: maximum context length", timed_out=True)
    assert classify(obs)[0] is Outcome.ENGINE_DEAD
    obs = Observation(http_status=400, error_text="maximum context length; service unavailable")
    assert classify(obs)[0] is Outcome.CONTEXT_OVERFLOW


ECHOING_ERRORS = [
    # a pydantic validation error echoes the input; a proxy answers with its own page
    (400, "1 validation error: prompt Input should be a valid string [input_value='SECRET PROMPT 4711']"),
    (
        400,
        "This model's maximum context length is 2048 tokens. However, you requested 3000 tokens "
        "(SECRET PROMPT 4711 …). Please reduce the length of the messages or completion.",
    ),
    (500, "CUDA out of memory while processing 'SECRET PROMPT 4711'"),
    (503, "Service Unavailable: SECRET PROMPT 4711"),
    (502, "<html><body>SECRET PROMPT 4711</body></html>"),
    (200, "error event: SECRET PROMPT 4711"),
]


@pytest.mark.parametrize(("status", "text"), ECHOING_ERRORS)
def test_error_details_never_copy_server_text(status: int, text: str) -> None:
    obs = Observation(http_status=status, error_text=text, error_type="BadRequestError", stream_error=True)
    outcome, reason, detail = classify(obs)
    assert outcome is not Outcome.OK
    for part in (reason or "", detail or ""):
        assert "SECRET" not in part and "4711" not in part and "<html>" not in part


def test_error_details_keep_the_numbers_of_a_context_overflow() -> None:
    text = "This model's maximum context length is 2048 tokens. However, you requested 3000 tokens."
    outcome, reason, detail = classify(Observation(http_status=400, error_text=text))
    assert (outcome, reason) == (Outcome.CONTEXT_OVERFLOW, "maximum context length")
    assert detail == "maximum context length (2048, 3000)"


@given(st.text(max_size=300))
def test_no_observation_leaks_its_error_text(text: str) -> None:
    marker = "zq" + text + "qz"  # free text never appears in what is stored
    _, reason, detail = classify(Observation(http_status=400, error_text=marker, error_type=marker))
    assert marker not in (reason or "") and marker not in (detail or "")
