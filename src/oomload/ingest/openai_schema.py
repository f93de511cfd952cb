"""What of an OpenAI-style log line is read: msgspec schemas that declare only the fields a trace needs.

Every key a schema does not declare (the prompt and completion text) is skipped while the line is
scanned — no Python string is built for it. Three families, from narrow to wide:

- ``Plain`` (``PlainParts`` with the prompt parts): the usual gateway line, every field of one
  type, so a whole piece of such lines decodes in one ``decode_lines`` call into columns;
- ``Line`` (``LineParts``): every place ``openai_log.parse_openai_line`` looks, each with the
  types it takes without a second look (a ``Time`` is a number or a string, an ``error`` any
  value — a non-null one sends the line to the exact path); a line that holds anything else fails
  to decode and goes to the exact path;
- ``PartsLine``: only the prompt parts (``system``, ``tools``, ``messages``, ``prompt``, and the
  Responses API's ``instructions`` and ``input``, at the top or under ``request`` / ``request.body``),
  as raw JSON: the parts of a line the exact path read.

The ``*Parts`` variants add the prompt parts as ``msgspec.Raw`` (never decoded into text) for a
build that derives prefix chains (``openai_parts``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

UNSET = msgspec.UNSET
Unset = msgspec.UnsetType
INT64_MAX = 2**63 - 1
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]  # negative or past int64: the exact path decides
Number = Annotated[int, msgspec.Meta(ge=-INT64_MAX, le=INT64_MAX)] | float
Time = Number | str | None | Unset
Key = str | Number | None | Unset  # an id-like value; only a non-empty string is used
IntLike = Number | str | None | Unset  # what ``_int_or_none`` may turn into an int


class Usage(msgspec.Struct, gc=False):
    prompt_tokens: Count | Unset = UNSET
    completion_tokens: Count | Unset = UNSET
    input_tokens: Count | Unset = UNSET
    output_tokens: Count | Unset = UNSET


class Body(msgspec.Struct, gc=False):
    """A response body (chat/completions response, or the Batch output's ``body``)."""

    id: Key = UNSET
    model: Key = UNSET
    usage: Usage | Unset | None = UNSET
    created: Time = UNSET
    created_at: Time = UNSET  # the Responses API's
    error: msgspec.Raw | Unset = UNSET  # any but null: the exact path decides (``_fast_row``)


class Response(Body):
    body: Body | str | Unset | None = UNSET  # a string: a gateway's access log (``openai_log._body``)
    status_code: IntLike = UNSET
    status: IntLike = UNSET  # an access log's HTTP status beside its ``body``


class RequestBody(msgspec.Struct, gc=False):
    model: Key = UNSET
    max_tokens: IntLike = UNSET
    max_completion_tokens: IntLike = UNSET
    max_output_tokens: IntLike = UNSET


class Request(RequestBody):
    body: RequestBody | str | Unset = UNSET


class PartsBody(msgspec.Struct, gc=False):
    """The parts of a prompt, as raw JSON (``prompt_parts``): never decoded into text."""

    system: msgspec.Raw | Unset = UNSET
    tools: msgspec.Raw | Unset = UNSET
    messages: tuple[msgspec.Raw, ...] | Unset = UNSET
    prompt: msgspec.Raw | Unset = UNSET
    instructions: msgspec.Raw | Unset = UNSET  # the Responses API's system prompt
    input: msgspec.Raw | Unset = UNSET  # the Responses API's messages (a list of items) or text


class PartsRequest(PartsBody):
    body: PartsBody | str | Unset = UNSET


class PartsLine(PartsBody):
    request: PartsRequest | Unset = UNSET


PARTS_DECODER = msgspec.json.Decoder(PartsLine)
PARTS_BODY_DECODER = msgspec.json.Decoder(PartsBody)


class Line(msgspec.Struct, gc=False):
    request: Request | Unset | None = UNSET
    response: Response | Unset | None = UNSET
    status_code: IntLike = UNSET
    status: IntLike = UNSET
    chunks: Unset | None = UNSET
    error: msgspec.Raw | Unset = UNSET  # any but null: the exact path decides (``_fast_row``)
    usage: Usage | Unset | None = UNSET
    prompt_tokens: Count | Unset | None = UNSET  # LiteLLM's counts, at the top level
    completion_tokens: Count | Unset | None = UNSET
    timestamp: Time = UNSET
    created_at: Time = UNSET
    start_time: Time = UNSET
    request_time: Time = UNSET
    time: Time = UNSET
    startTime: Time = UNSET  # LiteLLM spend logs
    started_at: Time = UNSET  # an API gateway's access log (Kong's http-log)
    at_timestamp: Time = msgspec.field(default=UNSET, name="@timestamp")  # the same, as ISO-8601
    custom_id: Key = UNSET
    request_id: Key = UNSET
    id: Key = UNSET
    messages: msgspec.Raw | Unset = UNSET
    prompt: msgspec.Raw | Unset = UNSET
    model: Key = UNSET
    max_tokens: IntLike = UNSET
    max_completion_tokens: IntLike = UNSET
    max_output_tokens: IntLike = UNSET


class RequestBodyParts(RequestBody):
    """``RequestBody`` with the prompt parts (``PartsBody``'s): one decode gives the row and its parts."""

    system: msgspec.Raw | Unset = UNSET
    tools: msgspec.Raw | Unset = UNSET
    messages: tuple[msgspec.Raw, ...] | Unset = UNSET
    prompt: msgspec.Raw | Unset = UNSET
    instructions: msgspec.Raw | Unset = UNSET  # the Responses API's system prompt
    input: msgspec.Raw | Unset = UNSET  # the Responses API's messages (a list of items) or text


class RequestParts(RequestBodyParts):
    body: RequestBodyParts | str | Unset = UNSET


class LineParts(Line):
    """``Line`` with the prompt parts, for a build that derives prefix chains (``line_parts``)."""

    request: RequestParts | Unset | None = UNSET  # type: ignore[assignment]
    system: msgspec.Raw | Unset = UNSET
    tools: msgspec.Raw | Unset = UNSET
    messages: tuple[msgspec.Raw, ...] | Unset = UNSET  # type: ignore[assignment]
    instructions: msgspec.Raw | Unset = UNSET
    input: msgspec.Raw | Unset = UNSET


LINE_DECODER = msgspec.json.Decoder(Line)
REQUEST_BODY_DECODER = msgspec.json.Decoder(RequestBody)
REQUEST_BODY_PARTS_DECODER = msgspec.json.Decoder(RequestBodyParts)
BODY_DECODER = msgspec.json.Decoder(Body)
NULL = msgspec.Raw(b"null")
PARTS_LINE_DECODER = msgspec.json.Decoder(LineParts)


class PlainUsage(msgspec.Struct, gc=False):
    prompt_tokens: Count
    completion_tokens: Count


class PlainResponse(msgspec.Struct, gc=False):
    usage: PlainUsage
    id: str | Unset | None = UNSET
    model: str | Unset | None = UNSET
    error: Unset | None = UNSET
    body: Unset = UNSET


class PlainRequest(msgspec.Struct, gc=False):
    model: str | Unset | None = UNSET
    max_tokens: Count | Unset | None = UNSET
    max_completion_tokens: Count | Unset | None = UNSET
    max_output_tokens: Count | Unset | None = UNSET
    body: Unset = UNSET


class PlainPartsRequest(PlainRequest):
    """``PlainRequest`` with the prompt parts (a build that derives prefix chains: ``PartsBody``'s)."""

    system: msgspec.Raw | Unset = UNSET
    tools: msgspec.Raw | Unset = UNSET
    messages: tuple[msgspec.Raw, ...] | Unset = UNSET
    prompt: msgspec.Raw | Unset = UNSET
    instructions: msgspec.Raw | Unset = UNSET  # the Responses API's system prompt
    input: msgspec.Raw | Unset = UNSET  # the Responses API's messages (a list of items) or text


Success = Annotated[int, msgspec.Meta(ge=200, le=299)]


class Plain(msgspec.Struct, gc=False):
    """The usual gateway line, every field of one type: read in columns (``_plain_columns``)."""

    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    request: PlainRequest
    response: PlainResponse
    status_code: Success | Unset = UNSET
    status: Success | Unset = UNSET
    error: Unset | None = UNSET
    chunks: Unset | None = UNSET
    custom_id: str | Unset | None = UNSET
    request_id: str | Unset | None = UNSET
    id: str | Unset | None = UNSET


class PlainParts(Plain):
    request: PlainPartsRequest


PLAIN_DECODER = msgspec.json.Decoder(Plain)
PLAIN_PARTS_DECODER = msgspec.json.Decoder(PlainParts)
