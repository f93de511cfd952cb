"""A run directory without ``steps.jsonl`` is judged on steps rebuilt from its requests, and says so.

Seen on a new user's pass: ``oomload report`` on a run whose ``steps.jsonl`` was deleted read "complete",
confidence high, no caveat, and its refinement steps were shown as "ramp".
"""

from __future__ import annotations

from pathlib import Path

from oomload.verdict import build_verdict
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run


def test_steps_rebuilt_from_the_requests_are_a_caveat(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(2), StepSpec(4, preemptions=2), StepSpec(3, phase="refine")]
    run = write_run(tmp_path / "run", steps)
    assert build_verdict(load_run(run)).confidence == "high"
    assert not [n for n in build_verdict(load_run(run)).notes if n.kind == "steps_missing"]
    (run / "steps.jsonl").unlink()
    verdict = build_verdict(load_run(run))
    notes = [n for n in verdict.notes if n.kind == "steps_missing"]
    assert [(n.severity, n.message.split(" — ")[0]) for n in notes] == [
        (
            "warning",
            "steps.jsonl is missing or empty: its 4 step(s) were rebuilt from the requests' step and "
            "concurrency, each read as a ramp step that spanned its requests and ended on its own",
        )
    ]
    assert "a warm-up or refinement step is not told apart" in notes[0].message
    assert verdict.confidence != "high"
