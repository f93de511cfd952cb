"""What the simulated server accepts: vLLM's validation of OpenAI requests, and its error bodies (pure).

``RequestRules`` turns the JSON body of ``/v1/completions`` or ``/v1/chat/completions`` into a
``Generation`` (prompt length, the ``max_tokens`` the engine will run, stream flags), or raises
``RequestError``, an OpenAI-style error with vLLM's status, type and message. The checks run in
vLLM's order, so a body with several faults gets the error vLLM would give first:

1. the body is a JSON object; ``model`` is absent or the served name (else vLLM's 404
   ``NotFoundError`` "The model `x` does not exist.");
2. the prompt: a string (counted by the toy tokenizer), token ids inside the vocabulary, or a list
   of one of those; chat ``messages`` a list of message objects; an empty prompt gets 400 "The
   decoder prompt cannot be empty";
3. ``max_tokens`` (chat: ``max_completion_tokens`` first) and ``min_tokens`` integers, ``stream`` a
   boolean, ``stream_options`` only with ``stream=True``;
4. the context: a prompt longer than ``max_model_len`` (or exactly as long) gets 400; ``prompt +
   max_tokens > max_model_len`` silently clamps ``max_tokens`` (vLLM ≥ 0.33, ``clamp_max_tokens``),
   or gets the 0.20 error with ``context_overflow="reject"``; ``max_tokens`` above ``max_model_len``
   gets 400; no ``max_tokens`` means up to the end of the context;
5. ``min_tokens`` in ``[0, max_tokens]``.

Reference: ``vllm-facts.md`` §4.3, §5 and ``vllm-cpu.md`` §4.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from oomload.sim.model import clamp_max_tokens
from oomload.sim.tokenizer import ToyTokenizer

# vLLM's V1 input processor rejects an empty prompt with ValueError(f"The {prompt_type} prompt cannot
# be empty"), prompt_type "decoder" (vllm/v1/engine/processor.py; vLLM's tests match 'decoder prompt
# cannot be empty' in tests/entrypoints/llm/test_prompt_validation.py); the server answers 400.
EMPTY_PROMPT_MESSAGE = "The decoder prompt cannot be empty"


class RequestError(Exception):
    """An OpenAI-style error response (status + vLLM JSON body)."""

    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }


@dataclass(frozen=True, slots=True)
class Generation:
    """A valid generation request, as the engine will run it."""

    prompt_tokens: int
    prompt_ids: list[int] | None  # the token ids, when the prompt came as ids or messages
    max_tokens: int  # after clamping to the context
    stream: bool
    include_usage: bool  # stream_options.include_usage
    chat: bool


@dataclass(frozen=True, slots=True)
class RequestRules:
    """vLLM's checks for one served model."""

    tokenizer: ToyTokenizer
    served_model_name: str
    max_model_len: int
    context_overflow: str = "clamp"  # "clamp" (vLLM >= 0.33) or "reject" (0.20)

    def completion(self, body: dict[str, Any]) -> Generation:
        """``/v1/completions``: a prompt string, token ids, or a list holding one of those."""
        self.check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids: list[int] | None = None
            prompt_tokens = self.tokenizer.count(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            self.check_vocab(prompt)
            prompt_ids = prompt
            prompt_tokens = len(prompt)
        else:
            raise RequestError(
                400, "'prompt' must be a string or a list of token ids (one prompt)", param="prompt"
            )
        if prompt_tokens == 0:
            raise RequestError(400, EMPTY_PROMPT_MESSAGE, param="prompt")
        max_tokens = opt_int(body, "max_tokens", 16)
        return self._generation(body, prompt_tokens, prompt_ids, max_tokens, chat=False)

    def chat(self, body: dict[str, Any]) -> Generation:
        """``/v1/chat/completions``: the messages through the toy chat template."""
        self.check_model(body)
        ids = self.chat_ids(body.get("messages"), True)
        max_tokens = opt_int(body, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = opt_int(body, "max_tokens", None)
        return self._generation(body, len(ids), ids, max_tokens, chat=True)

    def check_model(self, body: dict[str, Any]) -> None:
        """404 for a model the server does not serve, as vLLM's ``OpenAIServing._check_model``."""
        model = body.get("model")
        if model is None or model == self.served_model_name:
            return
        if not isinstance(model, str):
            raise RequestError(400, f"'model' must be a string, got {model!r}", param="model")
        raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", param="model")

    def chat_ids(self, messages: Any, add_generation_prompt: bool) -> list[int]:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise RequestError(400, "'messages' must be a list of message objects", param="messages")
        try:
            return self.tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt)
        except TypeError as err:
            raise RequestError(400, str(err), param="messages") from err

    def check_vocab(self, ids: list[int]) -> None:
        bad = self.tokenizer.out_of_vocab(ids)
        if bad is not None:
            raise RequestError(400, f"Token id {bad} is out of vocabulary", param="prompt")

    def _generation(
        self,
        body: dict[str, Any],
        prompt_tokens: int,
        prompt_ids: list[int] | None,
        max_tokens: int | None,
        *,
        chat: bool,
    ) -> Generation:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(400, "'stream' must be a boolean", param="stream")
        stream_options = body.get("stream_options")
        if stream_options is not None and not stream:
            raise RequestError(
                400, "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        include_usage = bool(isinstance(stream_options, dict) and stream_options.get("include_usage"))
        min_tokens = opt_int(body, "min_tokens", 0) or 0
        limit = self.resolve_max_tokens(prompt_tokens, max_tokens)
        if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
            raise RequestError(
                400, f"min_tokens must be in [0, max_tokens], got {min_tokens}", param="min_tokens"
            )
        return Generation(prompt_tokens, prompt_ids, limit, stream, include_usage, chat)

    def resolve_max_tokens(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The ``max_tokens`` the engine runs: vLLM's context checks, then the clamp (rule 4 above)."""
        limit = self.max_model_len
        if prompt_tokens > limit:
            raise RequestError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                f"{prompt_tokens} input tokens, which exceeds this limit even without any output "
                "tokens. Please "
                f"reduce the length of the input prompt. (parameter=input_tokens, value={prompt_tokens})",
                param="input_tokens",
            )
        if prompt_tokens == limit:
            raise RequestError(
                400,
                f"The decoder prompt (length {prompt_tokens}) plus the number of requested output "
                "tokens (at least "
                f"1) is longer than the maximum model length of {limit}. Make sure that "
                "`max_model_len` is no "
                "smaller than the number of text tokens plus `max_tokens`.",
                param="input_tokens",
            )
        if max_tokens is None:
            return limit - prompt_tokens
        if max_tokens < 1:
            raise RequestError(400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        if self.context_overflow == "reject" and prompt_tokens + max_tokens > limit:
            total = prompt_tokens + max_tokens
            raise RequestError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{max_tokens} output "
                f"tokens and your prompt contains {prompt_tokens} input tokens, for a total of "
                f"{total} tokens. "
                "Please reduce the length of the input prompt or the number of requested output tokens. "
                f"(parameter=input_tokens, value={prompt_tokens})",
                param="input_tokens",
            )
        if max_tokens > limit:
            raise RequestError(
                400,
                f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please request fewer "
                "output tokens.",
                param="max_tokens",
            )
        return clamp_max_tokens(prompt_tokens, max_tokens, limit)


def decode_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; 400 for anything else."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError(400, f"Invalid JSON body: {err}") from err
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object")
    return body


def opt_int(body: dict[str, Any], key: str, default: int | None) -> int | None:
    """An optional integer field (``default`` when absent or null); 400 for a non-integer."""
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"'{key}' must be an integer, got {value!r}", param=key)
    return value
