""" "No preemption" is claimed only where preemption was judged.

A review found the verdict, its findings, the advice and the gate rules vouching for levels where
preemption could not have been seen: a level whose ``/metrics`` scrapes all failed counted as the last
safe level and as "no preemption up to" it; a level that preempted in one of three repeats (too few
for an onset) read "none up to" it and "nothing broke"; and ``no-preemption-up-to`` passed on a clean
step that sent a third of the requests the trace's odds ask for. Each case here is a hand-built run
directory; each assertion failed before the fix.
"""

from __future__ import annotations

from pathlib import Path

from oomload.errors import ExitCode
from oomload.outcome import Outcome
from oomload.report import run_exit_code
from oomload.report.findings import NOT_JUDGED, describe
from oomload.report.junit import render_junit
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import GateStatus, evaluate_gate, parse_gate
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run

POOL = {"num_gpu_blocks": 1000, "block_size": 16}


def _step(concurrency: int, **kwargs: object) -> StepSpec:
    """A step that held its level (four requests a slot)."""
    return StepSpec(concurrency, requests=4 * concurrency, **kwargs)  # type: ignore[arg-type]


def _verdict(path: Path, steps: list[StepSpec], **kwargs: object) -> Verdict:
    return build_verdict(load_run(write_run(path, steps, cache_config=POOL, **kwargs)))  # type: ignore[arg-type]


def _finding(verdict: Verdict, key: str) -> str:
    return next(f.text for f in describe(verdict, recommend(verdict)) if f.key == key)


def _gate(rule: str, verdict: Verdict, baseline: Verdict | None = None) -> tuple[GateStatus, str]:
    result = evaluate_gate(parse_gate(rule), verdict, baseline)
    return result.status, result.reason


def test_a_level_without_a_scrape_is_neither_safe_nor_clean(tmp_path: Path) -> None:
    v = _verdict(tmp_path / "r", [_step(2), _step(4), _step(8), _step(16, scrapes=0)])
    assert v.last_safe_concurrency == 8 and v.max_tested_concurrency == 16
    assert v.preemption_judged_up_to == 8 and v.unobserved_levels == (16,)
    assert _finding(v, "preemption_onset") == "none up to concurrency 8"
    assert "preemption not observable at 16" in _finding(v, "last_safe")
    rec = recommend(v)
    assert "up to the highest level judged (8)" in rec.max_num_seqs.reason
    assert (
        "No preemption up to 8 (not judged above it), and no failure up to concurrency 16." in rec.reasoning
    )
    # 16 was measured but not judged (no scrape): the true last safe level is 8 or above, so a bound of 16
    # is missing evidence, not a failure; a bound of 8 passes
    status, reason = _gate("last-safe-concurrency>=16", v)
    assert status is GateStatus.NOT_EVALUATED
    assert reason.startswith("last-safe-concurrency = 8, and no level above it broke or queued")
    assert _gate("last-safe-concurrency>=8", v)[0] is GateStatus.PASS


def test_a_run_without_metrics_vouches_for_no_level(tmp_path: Path) -> None:
    levels = (2, 4, 8, 16)
    base = _verdict(tmp_path / "base", [_step(c, preemptions=5 if c >= 8 else 0) for c in levels])
    v = _verdict(tmp_path / "new", [_step(c, scrapes=0) for c in levels])
    assert v.last_safe_concurrency is None and v.preemption_judged_up_to is None
    assert _finding(v, "last_safe").startswith("unknown: preemption was not observable at 2, 4, 8, 16")
    assert _finding(v, "preemption_onset") == "unobserved (no /metrics scrape)"
    for rule in ("onset>=baseline", "last-safe>=baseline", "last-safe-concurrency>=4"):
        assert _gate(rule, v, base)[0] is GateStatus.NOT_EVALUATED, rule


def test_preemption_in_a_minority_of_repeats_is_sporadic_not_clean(tmp_path: Path) -> None:
    steps = [_step(2), _step(4), _step(8, preemptions=40), _step(8), _step(8)]
    v = _verdict(tmp_path / "r", steps)
    base = _verdict(tmp_path / "base", [_step(c) for c in (2, 4, 8, 16)])
    assert v.preemption_onset is None and v.last_safe_concurrency == 4
    onset = _finding(v, "preemption_onset")
    assert onset.startswith(
        "none in most repeats up to concurrency 8, but preempted at concurrency 8 in 1 of 3"
    )
    assert [n.kind for n in v.notes].count("sporadic_preemption") == 1
    rec = recommend(v)
    assert rec.max_num_seqs.value == 4
    assert "Preemption was sporadic (at concurrency 8 in 1 of 3 step(s))" in rec.reasoning
    assert "requests failed" not in rec.reasoning
    status, reason = _gate("onset>=baseline", v, base)  # the baseline is clean up to 16: bound 17
    assert status is GateStatus.NOT_EVALUATED and "sporadic preemption at concurrency 8" in reason
    assert _gate("onset>=baseline-10", v, base)[0] is GateStatus.PASS  # bound 7: the sporadic 8 meets it


def test_a_clean_step_short_of_the_odds_evidence_passes_no_absence_rule(tmp_path: Path) -> None:
    odds = [
        {"concurrency": c, "requests": 1000, "preemptions": p, "episodes": p}
        for c, p in ((2, 0), (4, 0), (8, 50))
    ]
    steps = [_step(2), _step(4), _step(8)]
    v = _verdict(tmp_path / "r", steps, odds=odds)
    level = v.level(8)
    assert level is not None and level.evidence_thin and level.evidence_needed is not None
    for rule in ("no-preemption-up-to:8", "no-preemption-below:9"):
        status, reason = _gate(rule, v)
        assert status is GateStatus.NOT_EVALUATED, rule
        assert reason.startswith(
            "not enough evidence at concurrency 8: 32 request(s) without a preemption, and the trace's "
            f"odds ask for {level.evidence_needed}"
        )
    assert _gate("no-preemption-up-to:4", v)[0] is GateStatus.PASS
    assert v.preemption_judged_up_to == 4


def test_a_run_whose_requests_were_all_cancelled_judges_nothing_and_exits_3(tmp_path: Path) -> None:
    cancelled = [_step(c, failures={Outcome.CANCELLED: 4 * c}) for c in (2, 4)]
    v = _verdict(tmp_path / "r", cancelled)
    assert v.preemption_judged_up_to is None and v.last_safe_concurrency is None
    assert _finding(v, "preemption_onset") == NOT_JUDGED
    assert run_exit_code(v, []) is ExitCode.UNREACHABLE
    assert v.failed_run is not None and v.failed_run.startswith(
        "no measured step decided a request (all 24 cancelled)"
    )
    assert _finding(v, "run_status").startswith("NOTHING TO JUDGE: no measured step decided a request")
    junit = render_junit(v, recommend(v))
    assert 'type="nothing_to_judge"' in junit and 'errors="1"' in junit
