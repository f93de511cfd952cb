"""The live step line's KV max counts the scrapes the report gives the step (``runview.owns_sample``,
docs/report.md "Step windows"): the boundary scrape that opened a step is the step before's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from oomload.run.progress import ProgressView
from oomload.rundir.records import MetricsRow, parse_step_lines
from oomload.verdict import kv_percent
from oomload.verdict.runview import assemble_run
from oomload.verdict.stepsummary import summarize_step

T0 = 1_700_000_000.0


class FakePoller:
    def __init__(self) -> None:
        self.latest: dict[str, Any] | None = None


def _view() -> tuple[ProgressView, FakePoller, Any, Console]:
    console = Console(record=True, width=300, force_terminal=False)
    poller = FakePoller()
    driver = SimpleNamespace(step_started_unix_s=None)
    view = ProgressView(SimpleNamespace(poller=poller, context=None, driver=driver), console, live=False)
    return view, poller, driver, console


def _end(step: int, t_unix_s: float) -> dict[str, Any]:
    return {"event": "end", "step": step, "concurrency": 8, "phase": "ramp", "t_unix_s": t_unix_s,
            "duration_s": 4.0, "reason": "hold_done", "started": 10, "ended": 10}  # fmt: skip


def _scrape(t_unix_s: float, kv: float) -> dict[str, Any]:
    return {"t_unix_s": t_unix_s, "ok": True, "kv_cache_usage": kv, "num_preemptions_total": 0}


def test_the_boundary_scrape_that_opened_a_step_is_not_its_kv_max() -> None:
    """Step 9 ended at 92 %; its end scrape is still the poller's latest when step 10 begins."""
    view, poller, driver, console = _view()
    driver.step_started_unix_s = T0 + 10.0
    view.step(SimpleNamespace(index=10))
    poller.latest = _scrape(T0 + 9.98, 0.92)  # read as step 9 ended, before step 10's start time
    view.sample()
    poller.latest = _scrape(T0 + 11.0, 0.60)
    view.sample()
    view.step_ended(_end(10, T0 + 14.0))
    assert "KV max 60%" in console.export_text()


def test_a_scrape_after_the_steps_end_line_is_the_next_steps() -> None:
    view, poller, driver, console = _view()
    driver.step_started_unix_s = T0
    view.step(SimpleNamespace(index=0))
    for t, kv in ((T0 + 1.0, 0.30), (T0 + 4.0, 0.50), (T0 + 4.2, 0.95)):  # the last: after the end
        poller.latest = _scrape(t, kv)
        view.sample()
    view.step_ended(_end(0, T0 + 4.1))
    assert "KV max 50%" in console.export_text()


def test_the_live_kv_max_of_each_step_is_the_reports() -> None:
    """The same scrapes, seen live by the monitor (each one sampled, the boundary scrapes too) and read
    back by the report: every step's KV max agrees, boundaries at and around the step starts included."""
    starts = [T0, T0 + 4.0, T0 + 8.0, T0 + 12.0]  # each step up starts as the one before ends
    ends = [T0 + 4.0, T0 + 8.0, T0 + 12.0, T0 + 16.0]
    kvs = [0.10, 0.95, 0.40, 0.70, 0.20, 0.99, 0.55, 0.30]
    scrapes = []  # two per step: one inside, and the boundary read as it ends (at or before its end)
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        scrapes += [_scrape(start + 1.5, kvs[2 * i]), _scrape(end - 0.02 * (i % 2), kvs[2 * i + 1])]
    baseline = _scrape(T0 - 0.01, 0.99)  # read before the first step: no step's
    lines = []
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        lines += [{"event": "start", "step": i, "concurrency": 8, "phase": "ramp", "t_unix_s": start},
                  _end(i, end)]  # fmt: skip
    run = assemble_run(path=Path("run"), config={}, status=None, cache_config=None,
                       boundaries=parse_step_lines(lines), requests=[],
                       metrics=[MetricsRow.from_json(s) for s in [baseline, *scrapes]], gpu=[],
                       events=[])  # fmt: skip
    report = [summarize_step(step, []).kv_usage_max for step in run.steps]

    view, poller, driver, console = _view()
    timeline = sorted([baseline, *scrapes], key=lambda s: s["t_unix_s"])
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        driver.step_started_unix_s = start
        view.step(SimpleNamespace(index=i))
        latest = [s for s in timeline if s["t_unix_s"] <= start][-1:]  # the poller's latest at the start
        for scrape in latest + [s for s in timeline if start < s["t_unix_s"] <= end]:
            poller.latest = scrape
            view.sample()
            view.sample()  # the monitor samples more often than the poller scrapes
        view.step_ended(_end(i, end))
    live = [line.split("KV max ")[1].split(" ")[0] for line in console.export_text().splitlines()]
    assert report == [0.95, 0.70, 0.99, 0.55]
    assert live == [kv_percent(kv) for kv in report]
