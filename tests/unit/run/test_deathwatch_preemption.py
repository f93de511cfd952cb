"""DeathWatch.check_preemption: the first_preemption event names the scrape that first showed the
counter rise — its time, and the step whose window (``steps.jsonl``) holds it — even when the watch
looks only after a later boundary scrape and the next step's start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from oomload.run.deathwatch import DeathWatch
from oomload.rundir import RunWriter
from oomload.telemetry.poller import MetricsPoller


def _metrics_text(preemptions: int) -> str:
    labels = 'engine="0",model_name="m"'
    return (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.5\n"
        "# TYPE vllm:num_preemptions counter\n"
        f"vllm:num_preemptions_total{{{labels}}} {preemptions}.0\n"
    )


class Scripted:
    """The poller's transport and clock: each scrape answers the next (time, preemptions) pair."""

    def __init__(self, scrapes: list[tuple[float, int]]) -> None:
        self._answers: Iterator[tuple[float, int]] = iter(scrapes)
        self.t_unix_s = 0.0

    def fetch(self, url: str, timeout_s: float) -> str:
        self.t_unix_s, preemptions = next(self._answers)
        return _metrics_text(preemptions)

    def clock(self) -> float:
        return self.t_unix_s


def _step_line(event: str, step: int, concurrency: int, t_unix_s: float) -> dict[str, Any]:
    return {"event": event, "step": step, "concurrency": concurrency, "phase": "ramp", "t_unix_s": t_unix_s}


def test_first_preemption_names_the_scrape_that_saw_it_and_its_step(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path)
    script = Scripted([(30.0, 0), (35.9, 0), (36.9875, 4), (37.0441723, 6)])
    poller = MetricsPoller("http://srv:8000", writer, fetch=script.fetch, clock=script.clock)
    step_3, step_4 = SimpleNamespace(index=3, concurrency=8), SimpleNamespace(index=4, concurrency=16)
    driver = SimpleNamespace(current=None)
    session = SimpleNamespace(writer=writer, poller=poller, driver=driver)
    watch = DeathWatch(session)
    watch.baseline_preemptions = poller.poll_once()["num_preemptions_total"]  # as the session does

    # step 3 runs; the watch looks before the counter rises
    writer.append("steps", _step_line("start", 3, 8, 30.5))
    driver.current = step_3
    poller.poll_once()  # 35.9: no preemption yet
    watch.check_preemption()
    # before the watch looks again: the scrape that sees the rise, step 3's boundary scrape and end,
    # and step 4's start
    poller.poll_once()  # 36.9875: the counter rose during step 3
    poller.poll_once()  # 37.0441723: step 3's boundary scrape
    writer.append("steps", _step_line("end", 3, 8, 37.046))
    writer.append("steps", _step_line("start", 4, 16, 37.046))
    driver.current = step_4
    watch.check_preemption()
    watch.check_preemption()  # the event is written once
    writer.close()

    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e["kind"] == "first_preemption"] == [
        {"t_unix_s": 36.9875, "kind": "first_preemption", "step": 3, "concurrency": 8}
    ]


def test_a_rise_before_any_step_names_no_step(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path)
    script = Scripted([(10.0, 2), (11.0, 3)])
    poller = MetricsPoller("http://srv:8000", writer, fetch=script.fetch, clock=script.clock)
    session = SimpleNamespace(writer=writer, poller=poller, driver=SimpleNamespace(current=None))
    watch = DeathWatch(session)
    poller.poll_once()
    poller.poll_once()
    watch.check_preemption()  # no baseline given: the first scrape is it
    writer.close()

    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events == [{"t_unix_s": 11.0, "kind": "first_preemption", "step": None, "concurrency": None}]
