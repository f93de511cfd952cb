"""``ReplayContext.may_send``: nothing is sent once the server is declared dead, here or in the master."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from oomload.load.context import ReplayContext
from oomload.outcome import Outcome, RequestResult
from oomload.rundir import mark_server_dead, server_marked_dead


def _context() -> ReplayContext:
    return ReplayContext(order=None, payloads=None, sink=None, clock=lambda: 0.0)  # type: ignore[arg-type]


def test_a_worker_stops_sending_when_the_master_marks_the_server_dead(tmp_path: Path) -> None:
    ctx = _context()
    ctx.declared_dead = lambda: server_marked_dead(tmp_path)
    assert ctx.may_send()
    mark_server_dead(tmp_path)  # the master, before its stop message reaches this worker
    assert not ctx.may_send() and ctx.stopping


def test_stopping_alone_stops_sending() -> None:
    ctx = _context()
    assert ctx.may_send()
    ctx.stopping = True
    assert not ctx.may_send()


def test_a_user_sends_its_conversations_turns_in_order_before_taking_another() -> None:
    """Turn k of a conversation goes out from the same user as turn k - 1, after it (one request at a
    time per user); other users take other conversations; a stopped user's remaining turns are dropped."""
    import json

    from oomload.load.payload import CompletionPayloads, PayloadOptions, RequestOrder
    from oomload.trace.model import TraceRecord

    def turn(rid: str, session: str | None, k: int | None, ids: tuple[int, ...]) -> TraceRecord:
        return TraceRecord(rid, 0.0, 64, 4, hash_ids=ids, session=session, turn=k)

    records = [
        turn("a1", "A", 1, (1, 2)),  # out of order in the file: turn 1 before turn 0
        turn("b0", "B", 0, (7,)),
        turn("a0", "A", 0, (1,)),
        turn("solo", None, None, ()),
        turn("a2", "A", 2, (1, 2, 3)),
    ]
    payloads = CompletionPayloads(PayloadOptions(model="m", prefix_block_tokens=16), trace_requests=5)
    ctx = ReplayContext(order=RequestOrder(records), payloads=payloads, sink=None, clock=lambda: 0.0)

    def send(user: int) -> tuple[str, list[int]]:
        picked = ctx.next_request(user)
        assert picked is not None
        body = json.loads(picked[0].body)
        return picked[0].request_id.split("#")[0], body["prompt"]

    first, prompt_a0 = send(1)
    other, _ = send(2)
    second, prompt_a1 = send(1)
    third, prompt_a2 = send(1)
    assert (first, second, third) == ("a0", "a1", "a2") and other == "b0"
    assert prompt_a0[:16] == prompt_a1[:16] == prompt_a2[:16]  # turn k repeats the history's blocks
    assert prompt_a1[:32] == prompt_a2[:32]
    assert send(1)[0] == "solo"
    ctx.forget(2)  # user 2 was stopped mid-conversation (B had one turn: nothing left anyway)
    assert send(3)[0] == "a0"  # the trace's second pass begins with conversation A
    ctx.forget(3)
    assert send(4)[0] == "b0"  # A's remaining turns went with user 3


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class _SelfCheck:
    def begin(self) -> None:
        pass

    def report(self) -> dict[str, object]:
        return {"duration_s": 1.0, "cpu_s": 0.1, "cpu_wait_s": 0.0, "cpu_wait_share": 0.0}


def test_an_open_loop_counts_each_send_against_its_arrival_time_and_why_it_was_late() -> None:
    """On time (woke 20 ms late), late from a late wake-up (taken in time, sent 300 ms late), and late
    because no user was free (taken 500 ms after its arrival time): 3 timed, 2 late, 1 of them busy."""
    from oomload.load.payload import CompletionPayloads, PayloadOptions, RequestOrder
    from oomload.trace.model import TraceRecord

    records = [TraceRecord(f"r{i}", float(i), 64, 4) for i in range(3)]  # arrivals 0, 1, 2 s
    payloads = CompletionPayloads(PayloadOptions(model="m"), trace_requests=3)
    clock = _Clock()
    ctx = ReplayContext(order=RequestOrder(records), payloads=payloads, sink=None, clock=clock)
    ctx.selfcheck = _SelfCheck()  # type: ignore[assignment]
    assert ctx.loadgen_report() == _SelfCheck().report()  # closed loop so far: no lateness fields
    ctx.start_open_loop(100.0, 1.0)
    for taken_s, sent_s in ((100.0, 100.02), (100.5, 101.3), (102.5, 102.6)):
        clock.now_s = taken_s
        picked = ctx.next_request(0)
        assert picked is not None
        ctx.started(picked[0], sent_s)
    line = ctx.loadgen_report()
    assert line is not None
    assert (line["sends_timed"], line["sends_late"], line["sends_late_busy"]) == (3, 2, 1)
    assert line["send_late_max_ms"] == 600.0


def test_an_open_loop_is_done_only_when_no_taken_request_waits_for_its_arrival_time() -> None:
    """32 users take the last requests at once and sleep until their arrival times: the trace is
    exhausted with nothing in flight, yet not sent (a step that ended there sent 39 of 64)."""
    from oomload.load.payload import CompletionPayloads, PayloadOptions, RequestOrder
    from oomload.trace.model import TraceRecord

    records = [TraceRecord(f"r{i}", float(i), 64, 4) for i in range(2)]
    payloads = CompletionPayloads(PayloadOptions(model="m"), trace_requests=2)
    clock = _Clock()
    ctx = ReplayContext(order=RequestOrder(records), payloads=payloads, sink=None, clock=clock)
    ctx.start_open_loop(100.0, 1.0)
    taken = [ctx.next_request(u) for u in range(3)]
    assert taken[2] is None and ctx.exhausted and not ctx.in_flight
    assert not ctx.open_loop_done  # two users still sleep on r0 and r1
    for picked in taken[:2]:
        assert picked is not None
        ctx.started(picked[0], 101.0)
    assert not ctx.open_loop_done  # in flight
    ctx.in_flight.clear()
    assert ctx.open_loop_done


def test_the_oldest_request_in_flight_and_the_workers_report_of_it() -> None:
    """What tells a server that answers nothing from one that serves slowly (``capacity.schedule``, "No
    answer"): the age of the oldest request on the wire, 0 when none is."""
    now = [100.0]
    ctx = ReplayContext(order=None, payloads=None, sink=None, clock=lambda: now[0])  # type: ignore[arg-type]
    assert ctx.oldest_in_flight_s() == 0.0
    for name, at in (("a", 100.0), ("b", 101.0)):
        ctx.started(SimpleNamespace(request_id=name, prompt_tokens=8, output_tokens=8), at)  # type: ignore[arg-type]
    now[0] = 102.5
    assert ctx.oldest_in_flight_s() == 2.5 and ctx.step_report()["oldest_s"] == 2.5
    ctx.finished(RequestResult("a", 0, 2, 100.0, 102.5, Outcome.OK, 8, 8))
    assert ctx.oldest_in_flight_s() == 1.5
