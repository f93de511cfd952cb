"""The KV saturation finding says its rule, so it never contradicts the onset's peak.

Seen on a new user's pass: one report read "KV usage peaked at 99% in that step" on the preemption onset
and "KV saturation (≥99 %): not seen", because saturation needs two scrapes in a row (``gauges``) and
only one scrape reached it.
"""

from __future__ import annotations

from pathlib import Path

from oomload.report.findings import describe
from oomload.verdict import build_verdict
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, StepSpec, write_run


def _findings(tmp: Path, peak_scrapes: int) -> dict[str, tuple[str, str]]:
    steps = [StepSpec(4, kv_max=0.6), StepSpec(8, kv_max=0.995, preemptions=2, peak_scrapes=peak_scrapes)]
    verdict = build_verdict(load_run(write_run(tmp / f"run-{peak_scrapes}", steps, cache_config=CPU_CACHE)))
    return {f.key: (f.text, f.severity) for f in describe(verdict, recommend(verdict))}


def test_a_peak_in_one_scrape_is_named_as_not_sustained(tmp_path: Path) -> None:
    found = _findings(tmp_path, peak_scrapes=1)
    assert "KV usage peaked at 99% in that step" in found["preemption_onset"][0]
    assert found["kv_saturation"] == (
        "not sustained: KV usage reached 99% at concurrency 8 (step 1) in single scrapes, never ≥ 99 % in "
        "two scrapes in a row",
        "info",
    )


def test_a_sustained_peak_is_saturation_and_no_peak_is_not_seen(tmp_path: Path) -> None:
    assert _findings(tmp_path, peak_scrapes=2)["kv_saturation"] == ("concurrency 8 (99%)", "warn")
    steps = [StepSpec(4, kv_max=0.6)]
    verdict = build_verdict(load_run(write_run(tmp_path / "low", steps, cache_config=CPU_CACHE)))
    kv = next(f for f in describe(verdict, recommend(verdict)) if f.key == "kv_saturation")
    assert (kv.text, kv.severity) == ("not seen (never ≥ 99 % in two scrapes in a row)", "ok")
