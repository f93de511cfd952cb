"""The simulated server's engine loop: admission, stepping ``EngineModel`` in time, engine death.

``EngineLoop`` is the part of the simulated vLLM between its HTTP face (``oomload.sim.server``) and
the pure engine (``oomload.sim.model``), as ``AsyncLLM`` + ``EngineCore`` are in vLLM:

- **Admission** (``submit``): a dead engine answers 500; 503 "The engine is currently busy…" when
  WAITING already holds ``max_num_queued_reqs`` requests, or would hold more than
  ``max_num_queued_tokens`` prompt tokens (each rejection counted by reason in the engine's stats).
  An admitted request becomes a ``Flight``: the engine's request plus the event that wakes its
  handler.
- **Stepping** (``run``, one asyncio task): whenever there is work, run ``EngineModel.step``, sleep
  the modelled step time × ``time_scale``, then wake the handlers of the requests that produced
  tokens. Steps whose scaled duration is shorter than ``BATCH_S`` run back to back (at most
  ``BATCH_S`` of real time), then every handler that got tokens is woken once and the loop sleeps
  for the modelled time not yet spent. Timing stays faithful on average; tokens arrive at most
  ``BATCH_S`` late, and each wake-up carries several tokens, which is what makes hundreds of streams
  cheap on one core.
- **Death**: a modelled CUDA OOM (a step's activations), or a host allocation a per-process limit
  refused (``oomload.sim.hostmem``, kind ``process``), logs vLLM's lines for that death
  (``oomload.sim.vllmlog.engine_death_lines``), fails every request in flight with 500 and vLLM's
  message for a dead engine (a stream gets it as an SSE error event; later requests get the same),
  and after ``exit_delay_s`` sets ``stop_event`` with ``exit_code`` 1 (the server process exits with
  status 1). A container limit (kind ``container``) ends the process at once with SIGKILL instead:
  nothing is logged and no request is answered.
- **Host memory** (``host``, when the model is on): after every batch of steps the ballast follows
  the tokens of the requests in flight, and ``run_host`` lets it follow the wall clock (the leak)
  every ``LEAK_TICK_S``.
- **Abort** (``finish``): a handler that ends before its request finished (the client went away)
  aborts it, freeing its blocks (``finished_reason="abort"``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from oomload.capacity.scheduler import SimRequest
from oomload.sim.hostmem import LEAK_TICK_S, AllocationFailed, HostMemory
from oomload.sim.model import EngineModel, OomEvent
from oomload.sim.openai_request import RequestError
from oomload.sim.vllmlog import (
    FatalError,
    cpu_alloc_failure,
    cuda_oom,
    dead_client_message,
    engine_death_lines,
)

BUSY_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
BATCH_S = 0.005  # tokens are delivered in batches of at most this much modelled time


@dataclass(slots=True, eq=False)
class Flight:
    """A request in flight: the engine's view plus how the handler is woken."""

    req: SimRequest
    event: asyncio.Event
    stream: bool
    error: RequestError | None = None


class EngineLoop:
    """Admission, the stepping task and engine death for one ``EngineModel``."""

    def __init__(
        self,
        engine: EngineModel,
        *,
        time_scale: float,
        max_num_queued_reqs: int | None,
        max_num_queued_tokens: int | None,
        exit_delay_s: float,
        log: Callable[[str], None],
        vllm_version: str = "0.32.0",
        model_name: str = "",
        host: HostMemory | None = None,
    ) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.max_num_queued_reqs = max_num_queued_reqs
        self.max_num_queued_tokens = max_num_queued_tokens
        self.exit_delay_s = exit_delay_s
        self._log = log
        self.vllm_version = vllm_version
        self.model_name = model_name
        self.dead_message = dead_client_message(vllm_version)
        self.host = host
        self._wake = asyncio.Event()
        self._flights: dict[SimRequest, Flight] = {}
        self.stop_event = asyncio.Event()
        self.exit_code = 0

    async def run(self) -> None:
        """Run engine steps until the engine dies; deliver their tokens in batches of ``BATCH_S``."""
        engine = self.engine
        loop = asyncio.get_running_loop()
        scale = self.time_scale
        flights = self._flights
        while engine.dead is None:
            if not engine.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            started = loop.time()
            base = time.monotonic()
            modelled = 0.0
            touched: set[SimRequest] = set()
            while True:
                report = engine.step(base + modelled, scale)
                modelled += report.duration_s * scale
                touched.update(report.result.sampled)
                if report.oom is not None or not engine.scheduler.has_work:
                    break
                if modelled >= BATCH_S or loop.time() - started >= BATCH_S:
                    break
            delay = modelled - (loop.time() - started)
            await asyncio.sleep(delay if delay > 0 else 0)
            if report.oom is None and engine.dead is not None:  # the host memory failed meanwhile
                return
            for req in touched:
                flight = flights.get(req)
                if flight is not None and (flight.stream or req.finished):
                    flight.event.set()
            if report.oom is not None:
                result = report.result
                self._die(cuda_oom(report.oom.message), len(result.scheduled), result.num_batched_tokens)
                return
            if self.host is not None:
                self.update_host()

    async def run_host(self) -> None:
        """Let the host memory follow the wall clock (its leak) until the engine dies."""
        while self.host is not None and self.engine.dead is None:
            self.update_host()
            await asyncio.sleep(LEAK_TICK_S)

    def update_host(self) -> None:
        """Resize the host ballast to the requests in flight now; a refused growth kills the engine."""
        if self.host is None or self.engine.dead is not None:
            return
        tokens = sum(flight.req.num_tokens for flight in self._flights.values())
        failed = self.host.update(tokens, time.monotonic())
        if failed is not None:
            self._host_failed(failed)

    def _host_failed(self, failed: AllocationFailed) -> None:
        error = cpu_alloc_failure(failed.tried_bytes)
        self.engine.dead = OomEvent(error.message, failed.tried_bytes)
        self._die(error, self.engine.num_running, 0)

    def submit(self, req: SimRequest, stream: bool) -> Flight:
        """Admit ``req`` and hand it to the engine; ``RequestError`` 500 (dead) or 503 (queue full)."""
        if self.engine.dead is not None:
            raise RequestError(500, self.dead_message, "InternalServerError")
        self._check_admission(req)
        req.arrival_s = time.monotonic()
        flight = Flight(req, asyncio.Event(), stream)
        self._flights[req] = flight
        self.engine.add(req)
        self._wake.set()
        if self.host is not None:
            self.update_host()  # a refused growth fails this request with the others in flight
        return flight

    def finish(self, flight: Flight) -> None:
        """The handler is done with ``flight``: abort its request if the engine still runs it."""
        self._flights.pop(flight.req, None)
        if not flight.req.finished and self.engine.dead is None:
            self.engine.abort(flight.req, time.monotonic())

    def _check_admission(self, req: SimRequest) -> None:
        stats = self.engine.stats
        if self.max_num_queued_reqs is not None and self.engine.num_waiting >= self.max_num_queued_reqs:
            stats.admission_rejections["max_num_queued_reqs"] += 1
            raise RequestError(503, BUSY_MESSAGE, "Service Unavailable")
        if self.max_num_queued_tokens is not None and (
            self.engine.waiting_tokens() + req.prompt_tokens > self.max_num_queued_tokens
        ):
            stats.admission_rejections["max_num_queued_tokens"] += 1
            raise RequestError(503, BUSY_MESSAGE, "Service Unavailable")

    def _die(self, error: FatalError, scheduled_requests: int, scheduled_tokens: int) -> None:
        flights = list(self._flights.values())
        lines = engine_death_lines(
            error,
            pid=os.getpid(),
            when_s=time.time(),
            vllm_version=self.vllm_version,
            model_name=self.model_name,
            max_model_len=self.engine.engine.max_model_len,
            scheduled_requests=scheduled_requests,
            scheduled_tokens=scheduled_tokens,
            request_ids=[flight.req.request_id for flight in flights],
        )
        self._log("\n".join(lines))
        err = RequestError(500, self.dead_message, "InternalServerError")
        for flight in flights:
            flight.error = err
            flight.event.set()
        self.exit_code = 1
        self._wake.set()
        asyncio.get_running_loop().call_later(self.exit_delay_s, self.stop_event.set)
