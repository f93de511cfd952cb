"""``oomload sim serve``: the simulated vLLM's HTTP face, an OpenAI-compatible server on aiohttp.

Three parts, as in vLLM: this module routes requests and shapes the answers (JSON or SSE, vLLM's
field order and error bodies); ``oomload.sim.openai_request`` validates a request the way vLLM does
and says which ``max_tokens`` the engine will run; ``oomload.sim.engine`` admits it (or answers
503), steps the pure ``EngineModel`` in time and wakes this module's handlers when their requests
produced tokens.

A streaming handler writes every token it has not sent yet in one ``write`` (token emission is
batched per engine step, and naturally coalesces when the writer lags), so one core serves hundreds
of streams. Handlers never block the loop; a client that goes away aborts its request.

Behaviour of the HTTP face copied from vLLM (reference ``vllm-facts.md`` §4.3, §5, §6 and
``vllm-cpu.md`` §4):

- Errors are vLLM's JSON bodies (``{"error": {"message", "type", "param", "code"}}``); malformed
  bodies get 400, never a crash; unknown routes 404 ``NotFoundError``.
- A rejected *stream* (503) gets, every ``--stream-reject-every``-th time, HTTP 200 followed by
  ``data: {"error": …}`` and ``data: [DONE]``.
- After a modelled CUDA OOM (or a host allocation a per-process limit refused), in-flight requests
  get 500 with vLLM's dead-engine message (streams an SSE error event), later ones 500, ``/health``
  503, and after ``--exit-delay-s`` the process exits with status 1; the log has vLLM's lines for
  that death (``oomload.sim.vllmlog``). Over a container limit the process SIGKILLs itself
  (``oomload.sim.hostmem``).
- Log lines carry vLLM's process prefixes and headers (``(APIServer pid=N) INFO 11-30 01:50:12
  [file.py:line] …``), the pid being this process's own.
- Idle keep-alive connections are closed after ``--keepalive-timeout-s`` (5 s, uvicorn's default).
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

from oomload.capacity.scheduler import SimRequest
from oomload.errors import ConfigError
from oomload.sim.engine import EngineLoop, Flight
from oomload.sim.hostmem import HostMemory, HostMemoryConfig
from oomload.sim.metrics import EngineCollector, build_registry, cache_config_labels, dcgm_text
from oomload.sim.model import EngineModel
from oomload.sim.openai_request import Generation, RequestError, RequestRules, decode_body
from oomload.sim.tokenizer import FIRST_ORDINARY_ID, ToyTokenizer
from oomload.sim.vllmlog import log_lines

NO_GPU_MESSAGE = (
    "No GPU is modelled: this simulated server was started without --gpu (only --num-gpu-blocks or "
    "--kv-cache-memory-bytes), so it has no device memory to report. Start it with --gpu to get "
    "DCGM framebuffer metrics."
)
PIECE_TABLE_SIZE = 1024


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
    host_memory: HostMemoryConfig | None = None  # None (or all zero): no ballast, no host limit


class SimService:
    """The HTTP front end of one simulated vLLM server over its ``EngineLoop``."""

    def __init__(
        self, engine: EngineModel, options: ServerOptions, *, log: Callable[[str], None] | None = None
    ):
        self.engine = engine
        self.opts = options
        self.tokenizer = ToyTokenizer(engine.model.vocab_size)
        self.max_model_len = engine.engine.max_model_len
        self.created = int(time.time())
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.rules = RequestRules(
            self.tokenizer, options.served_model_name, self.max_model_len, options.context_overflow
        )
        self.engine_loop = EngineLoop(
            engine,
            time_scale=options.time_scale,
            max_num_queued_reqs=options.max_num_queued_reqs,
            max_num_queued_tokens=options.max_num_queued_tokens,
            exit_delay_s=options.exit_delay_s,
            log=self.log,
            vllm_version=options.vllm_version,
            model_name=options.model_root,
        )
        self._counter = 0
        self._rejected_streams = 0
        self._pieces = [
            self.tokenizer.piece(FIRST_ORDINARY_ID + (i * 7919) % 1000) for i in range(PIECE_TABLE_SIZE)
        ]
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
        self._tasks: list[asyncio.Task[None]] = []

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

    @property
    def stop_event(self) -> asyncio.Event:
        """Set when the server should exit (a signal, or ``exit_delay_s`` after the engine died)."""
        return self.engine_loop.stop_event

    @property
    def exit_code(self) -> int:
        return self.engine_loop.exit_code

    async def _start_loop(self, app: web.Application) -> None:
        loop = asyncio.get_running_loop()
        host = self.opts.host_memory
        if host is not None and host.enabled:
            self.engine_loop.host = HostMemory(host, start_s=time.monotonic())
            self.engine_loop.update_host()  # the base is held before the server accepts requests
            self._tasks.append(loop.create_task(self.engine_loop.run_host()))
        self._tasks.append(loop.create_task(self.engine_loop.run()))

    async def _stop_loop(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.engine_loop.host is not None:
            self.engine_loop.host.release()

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
            ids = self.rules.chat_ids(body["messages"], bool(body.get("add_generation_prompt", True)))
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
        self.rules.check_vocab(tokens)
        return web.json_response({"prompt": self.tokenizer.decode(tokens)})

    # -- generation ----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, self.rules.completion(await _json_body(request)))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, self.rules.chat(await _json_body(request)))

    async def _generate(self, request: web.Request, gen: Generation) -> web.StreamResponse:
        self._counter += 1
        prefix = "chatcmpl" if gen.chat else "cmpl"
        rid = f"{prefix}-{self.opts.seed:04x}{self._counter:012x}"
        req = SimRequest(rid, gen.prompt_tokens, gen.max_tokens, prompt_ids=gen.prompt_ids)
        try:
            flight = self.engine_loop.submit(req, gen.stream)
        except RequestError as err:
            if gen.stream and err.status == 503 and self._in_band_reject():
                return await self._stream_error(request, err)
            raise
        try:
            if gen.stream:
                return await self._stream(request, flight, chat=gen.chat, include_usage=gen.include_usage)
            return await self._unary(flight, chat=gen.chat)
        finally:
            self.engine_loop.finish(flight)

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

    async def _unary(self, flight: Flight, *, chat: bool) -> web.StreamResponse:
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
        self, request: web.Request, flight: Flight, *, chat: bool, include_usage: bool
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
    return decode_body(await request.read())


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
    pid, now = os.getpid(), time.time()
    # vLLM V1 states its prefill budget at start-up: a reader of the log (``realvllm.limits``) takes it
    tokens = service.engine.engine.max_num_batched_tokens
    budget = f"Chunked prefill is enabled with max_num_batched_tokens={tokens}."
    service.log("\n".join(log_lines("APIServer", pid, "INFO", "scheduler.py:233", budget, now)))
    for line in service.engine.layout.startup_lines():
        service.log("\n".join(log_lines("EngineCore", pid, "INFO", "kv_cache_utils.py:1087", line, now)))
    shown = f"[{host}]" if ":" in host else host
    service.log(f"(APIServer pid={pid}) INFO:     Started server process [{pid}]")
    running = f"Uvicorn running on http://{shown}:{bound_port} (Press CTRL+C to quit)"
    service.log(f"(APIServer pid={pid}) INFO:     {running}")
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
