"""DeathWatch.check_health against a port nobody listens on: refused twice → dead, with evidence."""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from oomload.run.deathwatch import DeathWatch
from oomload.rundir import server_marked_dead


class Events:
    def __init__(self, path: Path) -> None:
        self.path = path  # the run directory: the server-dead marker goes there
        self.lines: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> None:
        self.lines.append({"kind": kind, **fields})


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _session(url: str, run_dir: Path, served: Any = None) -> SimpleNamespace:
    context = SimpleNamespace(death_suspected=False, outcomes=Counter(), stopping=False)
    return SimpleNamespace(
        url=url,
        writer=Events(run_dir),
        context=context,
        poller=None,
        config=SimpleNamespace(processes=1),
        distributed=False,
        pool=None,
        driver=SimpleNamespace(current=SimpleNamespace(index=3, concurrency=8)),
        console=SimpleNamespace(print=lambda *a, **k: None),
        served=served,
    )


def test_refused_twice_is_death_with_both_failures_in_the_evidence(tmp_path: Path) -> None:
    session = _session(f"http://127.0.0.1:{_closed_port()}", tmp_path)
    watch = DeathWatch(session)
    watch.check_health()
    assert watch.dead_evidence is None and not session.context.stopping  # one refusal is not death
    watch.check_health()
    assert watch.dead_evidence is not None
    assert watch.dead_evidence.startswith("/health failed 2x in a row (last: ")
    assert "Connection refused" in watch.dead_evidence
    assert session.context.stopping
    kinds = [e["kind"] for e in session.writer.lines]
    assert kinds == ["health_failed", "health_failed", "server_dead"]
    assert session.writer.lines[-1]["step"] == 3
    assert server_marked_dead(tmp_path)  # the other processes stop sending too


def test_a_suspecting_user_makes_one_refusal_enough(tmp_path: Path) -> None:
    session = _session(f"http://127.0.0.1:{_closed_port()}", tmp_path)
    watch = DeathWatch(session)
    watch.check_health(suspected=True)
    assert watch.dead_evidence is not None and "Connection refused" in watch.dead_evidence
    assert " in a row" not in watch.dead_evidence  # one failure: no count


class Exited:
    """A server process oomload started, which has exited with ``status`` (``None``: still running)."""

    def __init__(self, status: int | None) -> None:
        self.pid = 4242
        self.status = status

    def poll(self) -> int | None:
        return self.status


def test_a_started_server_that_exited_is_dead_at_once_with_its_exit_status(tmp_path: Path) -> None:
    with socket.socket() as listening:  # /health would answer: the exit alone decides
        listening.bind(("127.0.0.1", 0))
        session = _session(f"http://127.0.0.1:{listening.getsockname()[1]}", tmp_path, Exited(-9))
        watch = DeathWatch(session)
        watch.check_health()
    assert watch.dead_evidence == "the server process was killed by SIGKILL (exit status -9)"
    assert [e["kind"] for e in session.writer.lines] == ["server_dead"]


def test_a_started_server_still_running_is_judged_by_health_as_before(tmp_path: Path) -> None:
    session = _session(f"http://127.0.0.1:{_closed_port()}", tmp_path, Exited(None))
    watch = DeathWatch(session)
    watch.check_health()
    assert watch.dead_evidence is None
