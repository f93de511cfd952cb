"""``ReplayContext.may_send``: nothing is sent once the server is declared dead, here or in the master."""

from __future__ import annotations

from pathlib import Path

from oomload.load.context import ReplayContext
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
