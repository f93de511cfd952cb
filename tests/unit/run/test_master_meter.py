"""The master's step meter over its workers (``oomload.run.master_meter``), with a real worker session
and the real sealed link between them; Locust's transport is a fake that delivers each message at once.

A step's end line must count every request the workers started in it — also those sent after a worker's
last once-a-second report — or the verdict's ``requests_missing`` check cannot see a lost request.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from oomload.load import wire
from oomload.load.context import ReplayContext
from oomload.run.master_meter import MasterMeter
from oomload.run.worker_node import WorkerSession, WorkerTrust
from oomload.run.worker_pool import WorkerInfo, WorkerPool

TOKEN = "t" * 40
CLIENT = "loadhost_0123abcd"
WORKER_NONCE, MASTER_NONCE = "a" * 32, "b" * 32


class Event:
    """Locust's event hook: listeners called in order."""

    def __init__(self) -> None:
        self.listeners: list[Callable[..., Any]] = []

    def add_listener(self, listener: Callable[..., Any]) -> None:
        self.listeners.append(listener)

    def fire(self, **kw: Any) -> None:
        for listener in self.listeners:
            listener(**kw)


class Transport:
    """Locust's custom messages, both ways, delivered at once (``deliver_to_worker``: off, a worker
    that does not answer)."""

    def __init__(self) -> None:
        self.at_master: dict[str, Callable[..., Any]] = {}
        self.at_worker: dict[str, Callable[..., Any]] = {}
        self.deliver_to_worker = True
        self.master = SimpleNamespace(
            clients={CLIENT: object()},
            register_message=lambda kind, handler: self.at_master.__setitem__(kind, handler),
            send_message=self.to_worker,
        )
        self.worker = SimpleNamespace(
            client_id=CLIENT,
            user_count=0,
            register_message=lambda kind, handler: self.at_worker.__setitem__(kind, handler),
            send_message=self.to_master,
        )

    def to_worker(self, kind: str, data: Any, client_id: str | None = None) -> None:
        assert client_id == CLIENT
        if self.deliver_to_worker and kind in self.at_worker:
            self.at_worker[kind](environment=None, msg=SimpleNamespace(type=kind, data=data, node_id=None))

    def to_master(self, kind: str, data: Any) -> None:
        if kind in self.at_master:
            self.at_master[kind](environment=None, msg=SimpleNamespace(type=kind, data=data, node_id=CLIENT))


class Writer:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, kind: str, **detail: Any) -> None:
        self.events.append((kind, detail))


class Link:
    """A master meter and one worker (index 0) past the handshake, the worker's context live."""

    def __init__(self) -> None:
        self.transport = transport = Transport()
        self.writer = Writer()
        session = SimpleNamespace(
            runner=transport.master,
            env=None,
            writer=self.writer,
            console=SimpleNamespace(print=lambda *_a, **_kw: None),
        )
        pool = WorkerPool(session)
        session.pool = pool
        master_keys = wire.LinkKeys.derive(TOKEN, "master", WORKER_NONCE, MASTER_NONCE, CLIENT)
        pool.workers[CLIENT] = WorkerInfo(0, CLIENT, "loadhost", 4711, True, keys=master_keys, ready=True)
        self.pool = pool
        self.master_events = SimpleNamespace(worker_report=Event())
        self.meter = MasterMeter(session, SimpleNamespace(replay_path="/v1/completions"))
        self.meter.listen(SimpleNamespace(events=self.master_events, runner=transport.master))

        self.worker_events = SimpleNamespace(report_to_master=Event(), test_stop=Event())
        worker = WorkerSession(
            SimpleNamespace(events=self.worker_events),
            WorkerTrust(TOKEN, (), "OPENAI_API_KEY"),
            "127.0.0.1:5557",
            local_index=0,
            run_dir=None,
            results_path=None,
        )
        worker.runner = transport.worker
        worker.keys = wire.LinkKeys.derive(TOKEN, "worker", WORKER_NONCE, MASTER_NONCE, CLIENT)
        worker.index, worker.workers = 0, 1
        self.context = worker.context = ReplayContext(order=None, payloads=None, sink=None)  # type: ignore[arg-type]
        worker.listen()

    def begin(self, step: int) -> None:
        """The master opens ``step`` (the worker learns it from ``oomload_step``) and meters it."""
        self.pool.broadcast(wire.STEP, {"step": step, "concurrency": 2, "phase": "ramp"})
        self.meter.begin(SimpleNamespace(index=step, concurrency=2, phase="ramp"))

    def start(self, requests: int) -> None:
        """The worker's users start ``requests`` requests."""
        for _ in range(requests):
            n = self.context.counters.started
            request = SimpleNamespace(request_id=f"r{n}", prompt_tokens=8, output_tokens=4)
            self.context.started(request, self.context.clock())

    def report(self) -> None:
        """The worker's once-a-second report, on Locust's statistics report, reaches the master."""
        data: dict[str, Any] = {}
        self.worker_events.report_to_master.fire(client_id=CLIENT, data=data)
        self.master_events.worker_report.fire(client_id=CLIENT, data=data)


def test_the_end_line_counts_the_requests_started_after_the_last_report() -> None:
    link = Link()
    link.begin(0)
    link.start(3)
    link.report()
    assert link.meter.count().started == 3  # while the step runs: as last reported
    link.start(2)  # after the worker's last report, before the step's end reached it
    link.meter.end()
    count = link.meter.count()
    assert count.started == 5
    assert link.context.counters.started == 5 and link.context.between_steps
    assert link.writer.events == []
    link.begin(1)  # the next step starts from nothing: the last step's final counts are not its own
    assert link.meter.count().started is None
    link.start(4)
    link.report()
    link.start(1)
    link.meter.end()
    assert link.meter.count().started == 5


def test_a_worker_that_does_not_answer_counts_by_its_last_report_and_is_named() -> None:
    link = Link()
    link.meter.final_count_wait_s = 0.0
    link.begin(0)
    link.start(3)
    link.report()
    link.start(2)
    link.transport.deliver_to_worker = False  # the step's end never reaches it
    link.meter.end()
    assert link.meter.count().started == 3  # a lower bound, and said so
    assert link.writer.events == [("step_count_late", {"step": 0, "workers": [0]})]


def test_an_unsealed_final_count_is_dropped_and_counted() -> None:
    link = Link()
    link.begin(0)
    link.start(3)
    link.report()
    forged = {"step": 0, "mean": 1.0, "max": 9, "started": 99, "outcomes": {}}
    link.transport.to_master(wire.STEP_COUNT, forged)
    assert link.meter.count().started == 3
    assert link.pool.dropped == {"unsealed": 1}
    assert ("link_rejected", {"reason": "unsealed", "peer": CLIENT}) in link.writer.events
