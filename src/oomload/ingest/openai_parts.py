"""A request's prompt parts and the ``hash_ids`` chained over them, for OpenAI-style logs.

A request's prompt, as a chat template lays it out, is its ``system`` (the Responses API's
``instructions``), its ``tools``, each of its ``messages`` (or of the Responses API's ``input``
items) and its ``prompt``, in that order — the *parts*, kept as raw JSON (never decoded into
text). ``PartMarks`` turns the parts of a chunk's requests into their ``hash_ids`` (``oomload.trace.prefix``):
each piece's parts are reduced at once to their lengths and CRC-32s (and token counts), while the
piece is still in the CPU cache; a part's tokens are counted with ``--tokenizer`` when given, else
estimated as its JSON's bytes / ``CHARS_PER_TOKEN`` — the same for the same message in every
request, so identical histories line up block for block — and each chain stops at the request's
``usage.prompt_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa

from oomload.ingest.openai_log import message_text
from oomload.ingest.openai_schema import (
    PARTS_BODY_DECODER,
    PARTS_DECODER,
    UNSET,
    LineParts,
    PartsBody,
    PartsRequest,
    PlainPartsRequest,
    RequestBodyParts,
)
from oomload.ingest.tokens import TokenCounter
from oomload.trace.blockhash import crc32
from oomload.trace.prefix import BlockHasher, chain_marks, message_block_ids, part_marks

Parts = Sequence[Any]  # a prompt's parts, raw JSON: a list, or the tuple its messages decode as
CHARS_PER_TOKEN = 4  # the estimate of a message's tokens without --tokenizer (its JSON's bytes / 4)


def line_parts(line: LineParts) -> Parts:
    """``prompt_parts`` of a line decoded as ``LineParts`` (which ``PartsLine`` decodes too, but for a
    null ``request``, which it refuses: no parts). A string request body is decoded here only when
    ``openai_fast._fast_row`` has not already put it, decoded, in the string's place (every reader of
    today calls this after ``_fast_row``)."""
    request = line.request
    if request is None:
        return []
    if request is not UNSET:
        body = request.body
        if isinstance(body, str):
            return body_text_parts(body)
        return parts_of(body if body is not UNSET else request)
    return parts_of(line)


def body_text_parts(body: str) -> Parts:
    """The prompt parts of a request body an access log wrote as a JSON string (empty when it is not
    a request object)."""
    try:  # from the string itself: msgspec reads its UTF-8 form, and the raw parts point into it
        return parts_of(PARTS_BODY_DECODER.decode(body))
    except msgspec.DecodeError:
        return []


def parts_of(body: PartsBody | PlainPartsRequest | RequestBodyParts | LineParts) -> Parts:
    """A request's prompt parts (raw JSON, not copied) in a chat template's order: system, tools, messages.

    The Responses API's ``instructions`` is its system prompt and its ``input`` its messages: a list
    of items (each a part, as a message is) or one text (one part).
    """
    if body.system is UNSET and body.tools is UNSET and body.instructions is UNSET:
        messages, prompt, items = body.messages, body.prompt, body.input
        if items is UNSET:
            if prompt is UNSET:
                return [] if messages is UNSET else messages  # the usual chat request
            return [prompt] if messages is UNSET else [*messages, prompt]  # a completions request
        if messages is UNSET and prompt is UNSET:  # the usual Responses API request
            return [items] if memoryview(items)[0] != _LIST else _items(items)
    return _every_part(body)


def _every_part(body: Any) -> list[Any]:
    """``parts_of`` a request of any other shape: every part present, in a chat template's order."""
    parts: list[Any] = [p for p in (body.system, body.instructions, body.tools) if p is not UNSET]
    if body.messages is not UNSET:
        parts += body.messages
    if body.input is not UNSET:
        parts += _items(body.input)
    if body.prompt is not UNSET:
        parts.append(body.prompt)
    return parts


_ITEMS = msgspec.json.Decoder(tuple[msgspec.Raw, ...])
_LIST = ord("[")


def _items(value: msgspec.Raw) -> Parts:
    """The Responses API's ``input``: its items when it is a list, else itself (one text)."""
    if memoryview(value)[0] != _LIST:  # a Raw starts at its value's first byte (no leading space)
        return [value]
    try:
        return _ITEMS.decode(value)
    except msgspec.DecodeError:
        return [value]


def prompt_parts(line: bytes) -> Parts:
    """The prompt parts of a line read by the slower paths (empty when it has none or another shape)."""
    try:
        obj = PARTS_DECODER.decode(line)
    except msgspec.DecodeError:
        return []
    request = obj.request
    if isinstance(request, PartsRequest):
        if isinstance(request.body, str):
            return body_text_parts(request.body)
        return parts_of(request.body if isinstance(request.body, PartsBody) else request)
    return parts_of(obj)


def _part_tokens(part: Any, counter: TokenCounter) -> int:
    """A part's tokens counted with ``--tokenizer``: a message's text (``message_text``: content and tool
    calls), a text as it is, anything else (tool definitions) as its JSON."""
    try:
        value = orjson.loads(memoryview(part))
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return counter.count(message_text(value))
    if isinstance(value, str):
        return counter.count(value)
    return counter.count(bytes(part).decode("utf-8", errors="replace"))


class PartMarks:
    """The prompt parts of a chunk's requests, reduced to numbers a piece at a time (``add``), and
    their ``hash_ids`` column (``chains``); one per chunk.

    ``add`` takes each piece's parts while its bytes are still in the CPU cache: each part's length,
    CRC-32 and token count go into arrays (C loops over the parts, ``np.fromiter``) and the raw
    parts are let go; ``chains`` then chains a whole chunk's marks at once (``oomload.trace.prefix``).
    """

    def __init__(self, counter: TokenCounter | None) -> None:
        self.counter = counter
        self.parts_per_prompt: list[npt.NDArray[np.int64]] = []
        self.sizes: list[npt.NDArray[np.int64]] = []
        self.crcs: list[npt.NDArray[np.uint64]] = []
        self.tokens: list[npt.NDArray[np.int64]] = []  # with ``counter`` only

    def add(self, prompts: list[Parts]) -> None:
        """Take the parts of more prompts (one list of raw JSON parts a prompt, in prompt order)."""
        self.parts_per_prompt.append(np.fromiter(map(len, prompts), np.int64, len(prompts)))
        flat = list(chain.from_iterable(prompts))
        self.sizes.append(np.fromiter(map(len, flat), np.int64, len(flat)))
        self.crcs.append(np.fromiter(map(crc32, flat), np.uint64, len(flat)))
        if self.counter is not None:
            counter = self.counter
            self.tokens.append(np.fromiter((_part_tokens(p, counter) for p in flat), np.int64, len(flat)))

    def chains(self, limits: list[int], hasher: BlockHasher) -> pa.Array:
        """The ``hash_ids`` column of the prompts taken (``oomload.trace.prefix``), each cut at its limit.

        A part's tokens are counted with the counter, else estimated as its JSON's bytes /
        ``CHARS_PER_TOKEN`` — the same for the same message in every request.
        """
        sizes = _joined(self.sizes, np.int64)
        per_prompt = _joined(self.parts_per_prompt, np.int64)
        tokens = -(-sizes // CHARS_PER_TOKEN) if self.counter is None else _joined(self.tokens, np.int64)
        marks = part_marks(sizes, _joined(self.crcs, np.uint64))
        keys = chain_marks(hasher.chain_key, marks, per_prompt)
        limit_tokens = np.asarray(limits, dtype=np.int64)
        values, offsets = message_block_ids(
            hasher.block_key, keys, tokens, per_prompt, limit_tokens, hasher.block_tokens
        )
        empty = np.diff(offsets) == 0  # no full block: null, as the other readers leave it
        mask = pa.array(empty) if empty.any() else None
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int64()), mask=mask)


def _joined(arrays: list[npt.NDArray[Any]], dtype: type[np.generic]) -> npt.NDArray[Any]:
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=dtype)
