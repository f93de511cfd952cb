"""A malformed event stream is a failure, named: never an answer ("truncated, no usage") or an ok."""

from __future__ import annotations

import pytest

from oomload.load.classify import Observation, classify
from oomload.load.sse import SseStream
from oomload.outcome import Outcome

TOKEN = b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"


def _stream(body: bytes) -> SseStream:
    stream = SseStream()
    stream.feed(body, 0.0)
    stream.close(1.0)
    return stream


@pytest.mark.parametrize(
    "bad",
    [
        b"data: not json at all\n\n",  # not an object
        b'data: {"choices": [{"index": 0, "text": "b"\n\n',  # torn JSON
        b'data: {"choices":[],"usage":{"prompt_tokens":3,}}\n\n',  # a usage chunk that does not parse
        b'data: {"error": {"message": "x"}, oops}\n\n',  # an error chunk that does not parse
        b"data: [1, 2, 3]\n\n",  # JSON, but not an object
    ],
)
def test_a_malformed_event_is_counted_and_makes_the_request_a_named_server_error(bad: bytes) -> None:
    stream = _stream(TOKEN + bad + TOKEN + USAGE + DONE)
    assert stream.malformed == 1 and stream.done
    obs = Observation(
        http_status=200,
        malformed=stream.malformed > 0,
        usage_completion_tokens=stream.usage_completion_tokens,
        output_tokens_asked=2,
    )
    assert classify(obs) == (Outcome.SERVER_ERROR, "malformed event stream", None)


def test_a_well_formed_stream_has_no_malformed_event() -> None:
    stream = _stream(TOKEN + TOKEN + USAGE + DONE)
    assert (stream.malformed, stream.token_events, stream.usage_completion_tokens) == (0, 2, 2)
    obs = Observation(http_status=200, usage_completion_tokens=2, output_tokens_asked=2)
    assert classify(obs) == (Outcome.OK, None, None)
