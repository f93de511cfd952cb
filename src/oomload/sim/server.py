"""``oomload sim serve``: an OpenAI-compatible HTTP server on aiohttp that drives the pure engine.

One asyncio task (the engine loop) runs ``EngineModel.step`` whenever there is work, sleeps the
modelled step time × ``time_scale``, then wakes the handlers of the requests that produced tokens.
A streaming handler writes every token it has not sent yet in one ``write`` (token emission is
batched per engine step, and naturally coalesces when the writer lags), so one core serves hundreds
of streams. Handlers never block the loop; a client that goes away aborts its request (blocks freed,
``finished_reason="abort"``).

Behaviour copied from vLLM (reference ``vllm-facts.md`` §4.3, §5, §6 and ``vllm-cpu.md`` §4):

- 400 ``BadRequestError`` JSON for a prompt longer than ``max_model_len``; ``prompt + max_tokens >
  max_model_len`` silently clamps ``max_tokens`` (vLLM ≥ 0.33; ``--context-overflow reject`` gives the
  0.20 error instead). Malformed bodies get 400, never a crash.
- 503 "The engine is currently busy…" when WAITING already holds ``--max-num-queued-reqs`` requests
  (or ``--max-num-queued-tokens`` prompt tokens). A rejected *stream* gets, every
  ``--stream-reject-every``-th time, HTTP 200 followed by ``data: {"error": …}`` and ``data: [DONE]``.
- A modelled CUDA OOM kills the engine: in-flight requests get 500 (streams an SSE error event),
  later ones 500, ``/health`` 503, and after ``--exit-delay-s`` the process exits with status 1.
- Idle keep-alive connections are closed after ``--keepalive-timeout-s`` (5 s, uvicorn's default).
- A request naming another model than the served one gets vLLM's 404 ``NotFoundError``
  ("The model `x` does not exist."); an empty prompt gets 400 "The decoder prompt cannot be empty".
- ``/dcgm/metrics`` answers 404 when no GPU is modelled (only blocks or KV bytes were given): there is
  no device memory to report, and made-up figures would mislead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from oomload.errors import ConfigError
from oomload.sim.metrics import EngineCollector, build_registry, cache_config_labels, dcgm_text
from oomload.sim.model import EngineModel
from oomload.sim.scheduler import SimRequest
from oomload.sim.tokenizer import FIRST_ORDINARY_ID, ToyTokenizer

BUSY_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
DEAD_MESSAGE = "The server had an error while processing your request."
NO_GPU_MESSAGE = (
    "No GPU is modelled: this simulated server was started without --gpu (only --num-gpu-blocks or "
    "--kv-cache-memory-bytes), so it has no device memory to report. Start it with --gpu to get "
    "DCGM framebuffer metrics."
)
# vLLM's V1 input processor rejects an empty prompt with ValueError(f"The {prompt_type} prompt cannot
# be empty"), prompt_type "decoder" (vllm/v1/engine/processor.py; vLLM's tests match 'decoder prompt
# cannot be empty' in tests/entrypoints/llm/test_prompt_validation.py); the server answers 400.
EMPTY_PROMPT_MESSAGE = "The decoder prompt cannot be empty"
PIECE_TABLE_SIZE = 1024
BATCH_S = 0.005  # tokens are delivered in batches of at most this much modelled time


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Front-end behaviour of the simulated server (the engine's own config lives in EngineModel)."""

    served_model_name: str
    model_root: str
    time_scale: float = 1.0
    metrics_profile: str = "current"
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    context_overflow: str = "clamp"  # "clamp" (vLLM >= 0.33) or "reject" (0.20)
    stream_reject_every: int = 2  # every Nth rejected stream gets 200 + SSE error; 0 = never
    keepalive_timeout_s: float = 5.0
    exit_delay_s: float = 2.0
    vllm_version: str = "0.32.0"
    seed: int = 0
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    user_block_size: bool = False
    gpu_name: str = "NVIDIA GPU"
    num_gpus: int = 1


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


@dataclass(slots=True, eq=False)
class _Flight:
    """A request in flight: the engine's view plus how the handler is woken."""

    req: SimRequest
    event: asyncio.Event
    stream: bool
    error: RequestError | None = None


class SimService:
    """The HTTP front end and the engine loop of one simulated vLLM server."""

    def __init__(
        self, engine: EngineModel, options: ServerOptions, *, log: Callable[[str], None] | None = None
    ):
        self.engine = engine
        self.opts = options
        self.tokenizer = ToyTokenizer(engine.model.vocab_size)
        self.max_model_len = engine.engine.max_model_len
        self.created = int(time.time())
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._wake = asyncio.Event()
        self._flights: dict[SimRequest, _Flight] = {}
        self._counter = 0
        self._rejected_streams = 0
        self._pieces = [
            self.tokenizer.piece(FIRST_ORDINARY_ID + (i * 7919) % 1000) for i in range(PIECE_TABLE_SIZE)
        ]
        self.stop_event = asyncio.Event()
        self.exit_code = 0
        collector = EngineCollector(
            engine,
            model_name=options.served_model_name,
            profile=options.metrics_profile,
            created_unix_s=time.time(),
            cache_config=cache_config_labels(
                engine,
                profile=options.metrics_profile,
                kv_cache_memory_bytes=options.kv_cache_memory_bytes,
                num_gpu_blocks_override=options.num_gpu_blocks_override,
                user_block_size=options.user_block_size,
            ),
        )
        self.registry = build_registry(collector)
        self._loop_task: asyncio.Task[None] | None = None

    # -- app -----------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._errors])
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_get("/metrics", self.metrics)
        r.add_get("/dcgm/metrics", self.dcgm)
        r.add_get("/load", self.load)
        app.on_startup.append(self._start_loop)
        app.on_cleanup.append(self._stop_loop)
        return app

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except RequestError as err:
            return web.json_response(err.body(), status=err.status)
        except web.HTTPException as err:
            if err.status >= 400:
                body = RequestError(
                    err.status,
                    err.reason or "error",
                    "NotFoundError" if err.status == 404 else "BadRequestError",
                ).body()
                return web.json_response(body, status=err.status)
            raise

    async def _start_loop(self, app: web.Application) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._engine_loop())

    async def _stop_loop(self, app: web.Application) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task

    # -- engine loop ---------------------------------------------------------------------------
    async def _engine_loop(self) -> None:
        """Run engine steps; deliver their tokens in batches of at most ``BATCH_S`` of modelled time.

        Steps whose scaled duration is shorter than ``BATCH_S`` run back to back (at most ``BATCH_S``
        of real time), then every handler that got tokens is woken once and the loop sleeps for the
        modelled time not yet spent. Timing stays faithful on average; tokens arrive at most
        ``BATCH_S`` late, and each wake-up carries several tokens, which is what makes hundreds of
        streams cheap.
        """
        engine = self.engine
        loop = asyncio.get_running_loop()
        scale = self.opts.time_scale
        flights = self._flights
        while True:
            if not engine.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            started = loop.time()
            base = time.monotonic()
            modelled = 0.0
            touched: set[SimRequest] = set()
            oom = None
            while True:
                report = engine.step(base + modelled, scale)
                modelled += report.duration_s * scale
                touched.update(report.result.sampled)
                oom = report.oom
                if oom is not None or not engine.scheduler.has_work:
                    break
                if modelled >= BATCH_S or loop.time() - started >= BATCH_S:
                    break
            delay = modelled - (loop.time() - started)
            await asyncio.sleep(delay if delay > 0 else 0)
            for req in touched:
                flight = flights.get(req)
                if flight is not None and (flight.stream or req.finished):
                    flight.event.set()
            if oom is not None:
                self._die(oom.message)
                return

    def _die(self, message: str) -> None:
        self._log("ERROR [dump_input.py] Dumping input data for V1 LLM engine")
        self._log(f"ERROR [core.py] EngineCore encountered a fatal error.\ntorch.OutOfMemoryError: {message}")
        self._log("ERROR [async_llm.py] AsyncLLM output_handler failed.")
        err = RequestError(500, DEAD_MESSAGE, "InternalServerError")
        for flight in list(self._flights.values()):
            self._log(f"ERROR [async_llm.py] Request {flight.req.request_id} failed (engine dead).")
            flight.error = err
            flight.event.set()
        self.exit_code = 1
        asyncio.get_running_loop().call_later(self.opts.exit_delay_s, self.stop_event.set)

    def _submit(self, req: SimRequest, stream: bool) -> _Flight:
        if self.engine.dead is not None:
            raise RequestError(500, DEAD_MESSAGE, "InternalServerError")
        self._check_admission(req)
        req.arrival_s = time.monotonic()
        flight = _Flight(req, asyncio.Event(), stream)
        self._flights[req] = flight
        self.engine.add(req)
        self._wake.set()
        return flight

    def _check_admission(self, req: SimRequest) -> None:
        opts = self.opts
        stats = self.engine.stats
        if opts.max_num_queued_reqs is not None and self.engine.num_waiting >= opts.max_num_queued_reqs:
            stats.admission_rejections["max_num_queued_reqs"] += 1
            raise RequestError(503, BUSY_MESSAGE, "Service Unavailable")
        if opts.max_num_queued_tokens is not None and (
            self.engine.waiting_tokens() + req.prompt_tokens > opts.max_num_queued_tokens
        ):
            stats.admission_rejections["max_num_queued_tokens"] += 1
            raise RequestError(503, BUSY_MESSAGE, "Service Unavailable")

    def _finish(self, flight: _Flight) -> None:
        self._flights.pop(flight.req, None)
        if not flight.req.finished and self.engine.dead is None:
            self.engine.abort(flight.req, time.monotonic())

    # -- simple endpoints ----------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.engine.dead is not None:
            return web.Response(status=503 if self.opts.metrics_profile == "current" else 500)
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.opts.vllm_version})

    async def load(self, request: web.Request) -> web.Response:
        return web.json_response({"server_load": 0})

    async def models(self, request: web.Request) -> web.Response:
        name = self.opts.served_model_name
        card = {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.opts.model_root,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{self.opts.seed:x}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def dcgm(self, request: web.Request) -> web.Response:
        if not self.engine.layout.gpu_total_bytes:
            raise RequestError(404, NO_GPU_MESSAGE, "NotFoundError")
        text = dcgm_text(self.engine, gpu_name=self.opts.gpu_name, num_gpus=self.opts.num_gpus)
        return web.Response(text=text, content_type="text/plain")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if "messages" in body:
            ids = self._chat_ids(body["messages"], bool(body.get("add_generation_prompt", True)))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise RequestError(400, "'prompt' must be a string (or give 'messages')", param="prompt")
            ids = self.tokenizer.encode(prompt)
        strs = [self.tokenizer.piece(t) for t in ids] if body.get("return_token_strs") else None
        return web.json_response(
            {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise RequestError(400, "'tokens' must be a list of integers", param="tokens")
        self._check_vocab(tokens)
        return web.json_response({"prompt": self.tokenizer.decode(tokens)})

    # -- generation ----------------------------------------------------------------------------
    def _check_model(self, body: dict[str, Any]) -> None:
        """404 for a model the server does not serve, as vLLM's ``OpenAIServing._check_model``."""
        model = body.get("model")
        if model is None or model == self.opts.served_model_name:
            return
        if not isinstance(model, str):
            raise RequestError(400, f"'model' must be a string, got {model!r}", param="model")
        raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", param="model")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids: list[int] | None = None
            prompt_tokens = self.tokenizer.count(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            self._check_vocab(prompt)
            prompt_ids = prompt
            prompt_tokens = len(prompt)
        else:
            raise RequestError(
                400, "'prompt' must be a string or a list of token ids (one prompt)", param="prompt"
            )
        if prompt_tokens == 0:
            raise RequestError(400, EMPTY_PROMPT_MESSAGE, param="prompt")
        max_tokens = _opt_int(body, "max_tokens", 16)
        return await self._generate(request, body, prompt_tokens, prompt_ids, max_tokens, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        self._check_model(body)
        ids = self._chat_ids(body.get("messages"), True)
        max_tokens = _opt_int(body, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", None)
        return await self._generate(request, body, len(ids), ids, max_tokens, chat=True)

    def _chat_ids(self, messages: Any, add_generation_prompt: bool) -> list[int]:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise RequestError(400, "'messages' must be a list of message objects", param="messages")
        try:
            return self.tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt)
        except TypeError as err:
            raise RequestError(400, str(err), param="messages") from err

    def _check_vocab(self, ids: list[int]) -> None:
        bad = self.tokenizer.out_of_vocab(ids)
        if bad is not None:
            raise RequestError(400, f"Token id {bad} is out of vocabulary", param="prompt")

    def _resolve_max_tokens(self, prompt_tokens: int, max_tokens: int | None) -> int:
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
        if self.opts.context_overflow == "reject" and prompt_tokens + max_tokens > limit:
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
        return min(max_tokens, limit - prompt_tokens)

    async def _generate(
        self,
        request: web.Request,
        body: dict[str, Any],
        prompt_tokens: int,
        prompt_ids: list[int] | None,
        max_tokens: int | None,
        *,
        chat: bool,
    ) -> web.StreamResponse:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(400, "'stream' must be a boolean", param="stream")
        stream_options = body.get("stream_options")
        if stream_options is not None and not stream:
            raise RequestError(
                400, "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        include_usage = bool(isinstance(stream_options, dict) and stream_options.get("include_usage"))
        min_tokens = _opt_int(body, "min_tokens", 0) or 0
        limit = self._resolve_max_tokens(prompt_tokens, max_tokens)
        if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
            raise RequestError(
                400, f"min_tokens must be in [0, max_tokens], got {min_tokens}", param="min_tokens"
            )
        self._counter += 1
        prefix = "chatcmpl" if chat else "cmpl"
        rid = f"{prefix}-{self.opts.seed:04x}{self._counter:012x}"
        req = SimRequest(rid, prompt_tokens, limit, prompt_ids=prompt_ids)
        try:
            flight = self._submit(req, stream)
        except RequestError as err:
            if stream and err.status == 503 and self._in_band_reject():
                return await self._stream_error(request, err)
            raise
        try:
            if stream:
                return await self._stream(request, flight, chat=chat, include_usage=include_usage)
            return await self._unary(flight, chat=chat)
        finally:
            self._finish(flight)

    def _in_band_reject(self) -> bool:
        every = self.opts.stream_reject_every
        self._rejected_streams += 1
        return every > 0 and self._rejected_streams % every == 0

    async def _stream_error(self, request: web.Request, err: RequestError) -> web.StreamResponse:
        resp = _sse_response()
        await resp.prepare(request)
        await resp.write(f"data: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def _unary(self, flight: _Flight, *, chat: bool) -> web.StreamResponse:
        req = flight.req
        while not req.finished and flight.error is None:
            await flight.event.wait()
            flight.event.clear()
        if flight.error is not None:
            raise flight.error
        text = self._text(req, 0, req.num_output_tokens)
        usage = {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.num_output_tokens,
            "completion_tokens": req.num_output_tokens,
            "prompt_tokens_details": None,
        }
        reason = req.finish_reason or "length"
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
            obj = "text_completion"
        payload = {
            "id": req.request_id,
            "object": obj,
            "created": int(time.time()),
            "model": self.opts.served_model_name,
            "choices": [choice],
            "usage": usage,
            "system_fingerprint": f"vllm-{self.opts.vllm_version}-sim",
        }
        return web.json_response(payload)

    def _text(self, req: SimRequest, start: int, end: int) -> str:
        base = zlib.crc32(req.request_id.encode()) & (PIECE_TABLE_SIZE - 1)
        pieces = self._pieces
        mask = PIECE_TABLE_SIZE - 1
        return "".join(pieces[(base + i) & mask] for i in range(start, end))

    async def _stream(
        self, request: web.Request, flight: _Flight, *, chat: bool, include_usage: bool
    ) -> web.StreamResponse:
        req = flight.req
        model = json.dumps(self.opts.served_model_name)
        created = int(time.time())
        if chat:
            head = (
                f'data: {{"id":"{req.request_id}","object":"chat.completion.chunk",'
                f'"created":{created},"model":{model},'
            )
            tok_pre = head + '"choices":[{"index":0,"delta":{"content":"'
            tok_post = '"},"logprobs":null,"finish_reason":null}]}\n\n'
            last_post = '"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
            opening = (
                head
                + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                + '"logprobs":null,"finish_reason":null}]}\n\n'
            )
        else:
            head = (
                f'data: {{"id":"{req.request_id}","object":"text_completion",'
                f'"created":{created},"model":{model},'
            )
            tok_pre = head + '"choices":[{"index":0,"text":"'
            tok_post = '","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            last_post = '","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
            opening = ""
        resp = _sse_response()
        await resp.prepare(request)
        if opening:
            await resp.write(opening.encode())
        sent = 0
        base = zlib.crc32(req.request_id.encode()) & (PIECE_TABLE_SIZE - 1)
        pieces = self._pieces
        mask = PIECE_TABLE_SIZE - 1
        while True:
            await flight.event.wait()
            flight.event.clear()
            parts: list[str] = []
            produced = req.num_output_tokens
            done = req.finished
            if produced > sent:
                last = produced if done else -1
                for i in range(sent, produced):
                    post = last_post if i + 1 == last else tok_post
                    parts.append(tok_pre + pieces[(base + i) & mask] + post)
                sent = produced
            if flight.error is not None:
                parts.append(f"data: {json.dumps(flight.error.body())}\n\n")
                parts.append("data: [DONE]\n\n")
            elif done:
                if include_usage:
                    usage = (
                        f'"choices":[],"usage":{{"prompt_tokens":{req.prompt_tokens},"total_tokens":'
                        f'{req.prompt_tokens + produced},"completion_tokens":{produced}}}}}\n\n'
                    )
                    parts.append(head + usage)
                parts.append("data: [DONE]\n\n")
            if parts:
                await resp.write("".join(parts).encode())
            if done or flight.error is not None:
                break
        await resp.write_eof()
        return resp


def _sse_response() -> web.StreamResponse:
    return web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError(400, f"Invalid JSON body: {err}") from err
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object")
    return body


def _opt_int(body: dict[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"'{key}' must be an integer, got {value!r}", param=key)
    return value


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 = any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(service: SimService, host: str, port: int, port_file: Path | None = None) -> int:
    """Run the server until SIGTERM/SIGINT (exit 0) or a modelled engine death (exit 1)."""
    try:
        sock = bind_socket(host, port)
    except OSError as err:
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror or err}") from err
    bound_port = sock.getsockname()[1]
    runner = web.AppRunner(
        service.build_app(),
        access_log=None,
        keepalive_timeout=service.opts.keepalive_timeout_s,
        handle_signals=False,
    )
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # non-main thread
            loop.add_signal_handler(sig, service.stop_event.set)
    for line in service.engine.layout.startup_lines():
        service._log(f"INFO [sim] {line}")
    shown = f"[{host}]" if ":" in host else host
    service._log(f"INFO:     Uvicorn running on http://{shown}:{bound_port} (Press CTRL+C to quit)")
    try:
        if port_file is not None:
            write_port_file(port_file, bound_port)
        await service.stop_event.wait()
    finally:
        await runner.cleanup()
    return service.exit_code


def check_port_file(path: Path) -> None:
    """Refuse, before anything starts, a port file whose directory is missing or not writable."""
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"cannot write the port file {path}: the directory {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"cannot write the port file {path}: the directory {folder} is not writable")


def write_port_file(path: Path, port: int) -> None:
    """Write the bound port atomically (a reader never sees a partial file)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(f"{port}\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        raise ConfigError(f"cannot write the port file {path}: {err.strerror or err}") from err
