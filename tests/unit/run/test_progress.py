"""The per-step line: printed when a step ends, with that step's own results (not running totals)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rich.console import Console

from oomload.load.context import ReplayContext
from oomload.load.payload import PreparedRequest
from oomload.outcome import Outcome, RequestResult
from oomload.run.progress import ProgressView, step_line

END = {
    "event": "end",
    "step": 3,
    "concurrency": 8,
    "phase": "ramp",
    "t_unix_s": 1000.0,
    "duration_s": 4.0,
    "reason": "hold_done",
    "started": 14,
    "ended": 13,
    "ended_ok": 12,
    "ended_errors": 1,
    "ended_cancelled": 0,
    "ended_outcomes": {"context_overflow": 1, "ok": 12},
    "preemptions": 2,
    "achieved_concurrency_mean": 7.94,
    "achieved_concurrency_max": 8,
}


def test_the_step_line_gives_the_steps_own_results() -> None:
    assert step_line(END, 12.04, 0.812) == (
        "   12.0s step 3 ramp   concurrency 8 (achieved 7.9) · sent 14 · ended: context_overflow 1, ok 12 · "
        "3.25 req/s · preemptions 2 · KV max 81% · hold_done"
    )


def test_unknowns_are_question_marks() -> None:
    line = {**END, "preemptions": None, "duration_s": 0.0, "ended_outcomes": {}, "started": None}
    del line["achieved_concurrency_mean"]
    assert step_line(line, 1.0, None) == (
        "    1.0s step 3 ramp   concurrency 8 · ended: none ended · ? req/s · preemptions ? · KV max ? · "
        "hold_done"
    )


class FakePoller:
    def __init__(self) -> None:
        self.latest: dict[str, Any] | None = None


def test_without_the_live_panel_each_ended_step_prints_one_line_with_its_kv_maximum() -> None:
    console = Console(record=True, width=300, force_terminal=False)
    poller = FakePoller()
    driver = SimpleNamespace(step_started_unix_s=996.0)
    view = ProgressView(SimpleNamespace(poller=poller, context=None, driver=driver), console, live=False)
    view.start()
    assert view.live is None
    view.step(SimpleNamespace(index=3))
    for t, kv in ((997.0, 0.2), (998.0, 0.9), (999.0, 0.5)):
        poller.latest = {"t_unix_s": t, "kv_cache_usage": kv}
        view.sample()
    view.step_ended(END)
    driver.step_started_unix_s = 1000.0
    view.step(SimpleNamespace(index=4))  # the next step's KV maximum starts afresh
    poller.latest = {"t_unix_s": 1001.0, "kv_cache_usage": 0.3}
    view.step_ended({**END, "step": 4, "t_unix_s": 1004.0})
    printed = console.export_text().splitlines()
    assert len(printed) == 2
    assert "step 3 " in printed[0] and "KV max 90%" in printed[0]
    assert "step 4 " in printed[1] and "KV max 30%" in printed[1]


def _request(i: int) -> PreparedRequest:
    return PreparedRequest(f"r{i}", "/v1/completions", b"{}", 10, 5)


def _result(i: int, step: int, outcome: Outcome, end_s: float) -> RequestResult:
    return RequestResult(
        request_id=f"r{i}",
        step=step,
        concurrency=2,
        start_unix_s=0.0,
        end_unix_s=end_s,
        outcome=outcome,
        prompt_tokens_asked=10,
        output_tokens_asked=5,
    )


def test_a_step_counts_what_it_started_and_what_ended_in_it() -> None:
    clock = [0.0]
    ctx = ReplayContext(order=None, payloads=None, sink=None, clock=lambda: clock[0])  # type: ignore[arg-type]
    ctx.begin_step(0, 2, "ramp")
    for i in range(3):
        ctx.started(_request(i), 0.0)
    ctx.finished(_result(0, 0, Outcome.OK, 1.0))
    clock[0] = 2.0
    step0 = ctx.begin_step(1, 4, "ramp")
    assert (step0.started, step0.completed, dict(step0.outcomes)) == (3, 1, {Outcome.OK: 1})
    ctx.finished(_result(1, 0, Outcome.OK, 2.5))  # step 0's stragglers end in step 1
    ctx.finished(_result(2, 0, Outcome.CANCELLED, 2.6))
    step1 = ctx.begin_step(2, 8, "ramp")
    assert (step1.started, step1.completed, step1.cancelled) == (0, 1, 1)
    assert dict(step1.outcomes) == {Outcome.OK: 1, Outcome.CANCELLED: 1}


def test_between_steps_nothing_new_is_sent() -> None:
    ctx = ReplayContext(order=None, payloads=None, sink=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    ctx.begin_step(0, 2, "ramp")
    assert not ctx.between_steps
    ctx.end_step()
    assert ctx.between_steps
    ctx.begin_step(1, 4, "ramp")
    assert not ctx.between_steps


def test_a_lower_step_waits_for_the_surplus_users_not_only_for_the_requests_in_flight() -> None:
    from oomload.load.context import ContextMeter

    ctx = ReplayContext(order=None, payloads=None, sink=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    users = [16]
    ctx.live_users = lambda: users[0]
    for i in range(8):
        ctx.started(_request(i), 0.0)
    meter = ContextMeter(ctx)
    assert meter.in_flight() == 16  # 4 users Locust is stopping are still alive: not settled at 12
    users[0] = 12
    assert meter.in_flight() == 12  # the surplus is gone: the step at 12 may begin


def _starving_end(achieved: float, wait_share: float) -> dict[str, object]:
    entry = {
        "duration_s": 2.0,
        "cpu_s": 0.1,
        "cpu_wait_s": 2.0 * wait_share,
        "cpu_wait_share": wait_share,
        "loop_lag_max_ms": 210.0 if wait_share > 0.5 else 3.0,
        "loop_lag_p99_ms": 20.0,
    }
    return {**END, "concurrency": 11, "achieved_concurrency_mean": achieved, "loadgen": [entry]}


def test_the_step_line_says_when_the_load_generator_was_starved() -> None:
    line = step_line(_starving_end(2.4, 0.93), 12.0, 0.5)
    assert line.endswith(
        " · hold_done · the load generator was starved (waited 93 % of the step for a CPU; loop lag up to "
        "210 ms): more --processes, a separate load host, --workers, or a server here at nice -n 10"
    )


def test_the_step_line_says_nothing_of_a_client_that_had_its_cpu_or_held() -> None:
    assert "starved" not in step_line(_starving_end(2.4, 0.04), 12.0, 0.5)  # not held: not the client's
    assert "starved" not in step_line(_starving_end(10.8, 0.93), 12.0, 0.5)  # held: nothing to explain
