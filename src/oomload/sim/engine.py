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
- **Death**: a modelled CUDA OOM logs vLLM's fatal-error lines, fails every request in flight with
  500 (a stream gets it as an SSE error event), and after ``exit_delay_s`` sets ``stop_event`` with
  ``exit_code`` 1 (the server process exits with status 1).
- **Abort** (``finish``): a handler that ends before its request finished (the client went away)
  aborts it, freeing its blocks (``finished_reason="abort"``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from oomload.sim.model import EngineModel
from oomload.sim.openai_request import RequestError
from oomload.sim.scheduler import SimRequest

BUSY_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
DEAD_MESSAGE = "The server had an error while processing your request."
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
    ) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.max_num_queued_reqs = max_num_queued_reqs
        self.max_num_queued_tokens = max_num_queued_tokens
        self.exit_delay_s = exit_delay_s
        self._log = log
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

    def submit(self, req: SimRequest, stream: bool) -> Flight:
        """Admit ``req`` and hand it to the engine; ``RequestError`` 500 (dead) or 503 (queue full)."""
        if self.engine.dead is not None:
            raise RequestError(500, DEAD_MESSAGE, "InternalServerError")
        self._check_admission(req)
        req.arrival_s = time.monotonic()
        flight = Flight(req, asyncio.Event(), stream)
        self._flights[req] = flight
        self.engine.add(req)
        self._wake.set()
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
        asyncio.get_running_loop().call_later(self.exit_delay_s, self.stop_event.set)
