"""The load generator's own figures: schedstat and stat text parsed, a step's differences, the lag probe."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomload.load.selfcheck import MAX_LAG_SAMPLES, LoopLagProbe, ProcessMark, SelfCheck, read_mark
from oomload.telemetry.procfs import Schedstat, parse_proc_stat, parse_schedstat

# this machine's `cat /proc/self/task/$$/schedstat` and a `/proc/self/stat` of a Python process
SCHEDSTAT = "67071265 32694567 205\n"
STAT = (
    "8484 (python) S 8470 8484 8470 0 -1 4194304 5079 0 0 0 731 45 0 0 20 0 3 0 498411 "
    "412893184 21713 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
)


def test_schedstat_text_parses_to_run_wait_and_slices() -> None:
    assert parse_schedstat(SCHEDSTAT) == Schedstat(run_ns=67071265, wait_ns=32694567, slices=205)


@pytest.mark.parametrize("text", ["", "1 2\n", "1 2 x\n", "1 -2 3\n", "1 2 3 4\n"])
def test_anything_but_three_counts_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_schedstat(text)


def test_stat_gives_user_and_system_ticks() -> None:
    stat = parse_proc_stat(STAT)
    assert (stat.pid, stat.comm, stat.utime_ticks, stat.stime_ticks) == (8484, "python", 731, 45)


def test_read_mark_reads_the_threads_schedstat(tmp_path: Path) -> None:
    (tmp_path / "task" / "77").mkdir(parents=True)
    (tmp_path / "stat").write_text(STAT)
    (tmp_path / "task" / "77" / "schedstat").write_text(SCHEDSTAT)
    mark = read_mark(77, tmp_path, clock=lambda: 5.0)
    assert mark.t_s == 5.0 and mark.wait_s == pytest.approx(0.032694567)
    assert mark.cpu_s > 0
    assert read_mark(78, tmp_path, clock=lambda: 5.0).wait_s is None  # no such thread: no claim


class FakeMarks:
    def __init__(self, marks: list[ProcessMark]) -> None:
        self.marks = marks

    def __call__(self, tid: int) -> ProcessMark:
        assert tid == 9
        return self.marks.pop(0)


def test_a_step_report_is_the_difference_since_its_begin() -> None:
    marks = [ProcessMark(0.0, 1.0, 0.5), ProcessMark(10.0, 2.0, 1.0), ProcessMark(14.0, 2.4, 4.8)]
    probe = LoopLagProbe()
    check = SelfCheck(probe, read=FakeMarks(marks), tid=9)
    probe.record(0.9)  # before the step: forgotten at its begin
    check.begin()
    for late_s in (0.001, 0.21, 0.002):
        probe.record(late_s)
    check.worker = 1
    assert check.report() == {
        "duration_s": 4.0,
        "cpu_s": 0.4,
        "cpu_wait_s": 3.8,
        "cpu_wait_share": 0.95,
        "loop_lag_max_ms": 210.0,
        "loop_lag_p99_ms": 210.0,
        "worker": 1,
    }


def test_no_schedstat_means_no_wait_and_no_tick_means_no_lag() -> None:
    marks = [ProcessMark(0.0, 1.0, None), ProcessMark(2.0, 1.5, None)]
    report = SelfCheck(LoopLagProbe(), read=FakeMarks(marks), tid=9).report()
    assert (report["cpu_wait_s"], report["cpu_wait_share"], report["loop_lag_max_ms"]) == (0.0, 0.0, None)
    assert "worker" not in report


def test_the_probe_keeps_its_maximum_and_a_bounded_sample() -> None:
    probe = LoopLagProbe()
    for i in range(3 * MAX_LAG_SAMPLES):
        probe.record(0.001 if i != 1234 else 0.5)
    probe.record(-0.01)  # woke early (clock granularity): no lag
    assert probe.max_s == 0.5
    assert len(probe.samples) < MAX_LAG_SAMPLES
    assert set(probe.samples) <= {0.0, 0.001, 0.5}


def test_the_probe_measures_how_late_it_woke() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds + 0.3  # every wake 300 ms late
        if now[0] > 1.0:
            probe.stopped = True

    probe = LoopLagProbe(tick_s=0.05, clock=lambda: now[0])
    probe.run(sleep)
    assert probe.max_s == pytest.approx(0.3)
    assert len(probe.samples) == 3
