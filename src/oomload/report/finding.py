"""``Finding``: one labelled line of the verdict in words (``oomload.report.findings``), and the one
finding of an event a run with nothing to judge could not see (``not_judged``)."""

from __future__ import annotations

from dataclasses import dataclass

from oomload.verdict import Verdict

NOT_JUDGED = "not judged: the run is nothing to judge, so it is no evidence (Run)"


@dataclass(frozen=True, slots=True)
class Finding:
    key: str  # stable id (JUnit test name): run_status, preemption_onset, …
    label: str
    text: str
    severity: str  # "ok" | "info" | "warn" | "bad"


def not_judged(verdict: Verdict, key: str, label: str) -> Finding | None:
    """For a run with nothing to judge (``Verdict.failed_run``), the finding of an event it did not see:
    a warning that says so, never "none" in green."""
    return None if verdict.failed_run is None else Finding(key, label, NOT_JUDGED, "warn")
