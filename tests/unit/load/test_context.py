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
