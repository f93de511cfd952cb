"""Where a run was cut short is timed on the clock ``--max-duration-s`` counts: from the first step's
start, not from the run directory's (the server's start-up, the preflight and the odds before the load
are not on it).

Seen on the simulator: ``--open-loop --max-duration-s 120`` read "--max-duration-s was reached in step 0
(concurrency 16) at 122.0 s" — 1.9 s of set-up before the first step, on a clock the sentence did not name.
"""

from __future__ import annotations

from pathlib import Path

from oomload.verdict import build_verdict
from oomload.verdict.runview import load_run
from runbuilder import T0, StepSpec, write_run


def test_the_limit_is_timed_from_the_first_step_and_says_so(tmp_path: Path) -> None:
    steps = [StepSpec(16, duration_s=120.1, end_reason="max_duration")]
    status = {"finished": True, "end_reason": "max_duration", "ended_unix_s": T0 + 120.1}
    config = {"started_unix_s": T0 - 1.9}  # the run directory, 1.9 s before the first step
    verdict = build_verdict(load_run(write_run(tmp_path / "run", steps, status=status, config=config)))
    assert verdict.run.cut_short_detail == (
        "--max-duration-s was reached in step 0 (concurrency 16) at 120.1 s from the first step's start"
    )
