"""An open loop's recommendation names where things happened as its onset line does: by its cap and what
was in flight, never as a concurrency level it did not run.

Seen on the simulator (``--open-loop --concurrency 16``): the onset line read "in the open loop (cap 16,
0.9 in flight on average)" while the recommendation said "KV-cache preemption began at concurrency 16".
"""

from __future__ import annotations

from pathlib import Path

from oomload.verdict import build_verdict
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, StepSpec, write_run


def _reasoning(tmp: Path, preemptions: int, *, open_loop: bool = True) -> str:
    steps = [StepSpec(16, requests=64, in_flight=4, preemptions=preemptions)]
    config = {"open_loop": open_loop}
    run = write_run(tmp / f"run-{preemptions}-{open_loop}", steps, cache_config=CPU_CACHE, config=config)
    return recommend(build_verdict(load_run(run))).reasoning


def test_an_open_loops_onset_is_named_by_its_cap_and_what_was_in_flight(tmp_path: Path) -> None:
    text = _reasoning(tmp_path, preemptions=2)
    assert "KV-cache preemption began in the open loop (cap 16, 4.0 in flight on average; KV usage" in text
    assert "at concurrency 16" not in text


def test_an_open_loop_without_preemption_names_no_level_either(tmp_path: Path) -> None:
    text = _reasoning(tmp_path, preemptions=0)
    assert "No preemption or failure in the open loop (cap 16, 4.0 in flight on average)." in text
    assert "concurrency 16" not in text


def test_a_closed_loop_still_names_its_level(tmp_path: Path) -> None:
    text = _reasoning(tmp_path, preemptions=2, open_loop=False)
    assert "KV-cache preemption began at concurrency 16" in text
