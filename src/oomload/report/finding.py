"""``Finding``: one labelled line of the verdict in words (``oomload.report.findings``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    key: str  # stable id (JUnit test name): run_status, preemption_onset, …
    label: str
    text: str
    severity: str  # "ok" | "info" | "warn" | "bad"
