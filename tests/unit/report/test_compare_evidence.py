"""Release against release: no difference is called on what one run did not measure.

A review of ``compare``, the relative gate rules and ``report --history`` found claims without evidence:
run-wide totals passed on a new run cut short at its second level; "the new run's engine survived"
(an improvement) where it never reached the base's death level; a death above every level the base
ran called a regression; the worst last-safe fall (the new run broke at its lowest level) "not
measured"; +700 % P99 TTFT at one level hidden as noise beside −15 % at another; and a history that
read a move across a run of another trace, or of other traffic. Each case is a hand-built run
directory; each assertion failed before the fix.
"""

from __future__ import annotations

from pathlib import Path

from oomload.outcome import Outcome
from oomload.report.compare import compare_runs
from oomload.report.compareside import load_side
from oomload.report.history import history_of, render_markdown
from oomload.verdict.gate import GateStatus, evaluate_gate, parse_gate
from oomload.verdict.verdict import Verdict
from runbuilder import StepSpec, write_run

POOL = {"num_gpu_blocks": 1000, "block_size": 16}
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


def _step(concurrency: int, **kwargs: object) -> StepSpec:
    """A step that held its level (four requests a slot)."""
    return StepSpec(concurrency, requests=4 * concurrency, **kwargs)  # type: ignore[arg-type]


def _died_at(concurrency: int) -> StepSpec:
    return StepSpec(
        concurrency, requests=concurrency, failures={Outcome.ENGINE_DEAD: concurrency}, error_text=OOM
    )


def _run(path: Path, steps: list[StepSpec], **kwargs: object) -> Path:
    return write_run(path, steps, cache_config=POOL, **kwargs)  # type: ignore[arg-type]


def _gate(rule: str, new: Verdict, base: Verdict) -> tuple[GateStatus, str]:
    result = evaluate_gate(parse_gate(rule), new, base)
    return result.status, result.reason


def _row(base: Path, new: Path, key: str) -> tuple[str, str, str]:
    row = next(r for r in compare_runs(load_side(base), load_side(new)).results if r.key == key)
    return row.new, row.status, row.evidence


DEAD = {"finished": False, "end_reason": "server_dead", "ended_unix_s": 1_700_000_050.0}
INTERRUPTED = {"finished": False, "end_reason": "interrupted", "ended_unix_s": 1_700_000_020.0}


def test_run_wide_totals_of_a_new_run_cut_short_are_not_evaluated(tmp_path: Path) -> None:
    base = _run(
        tmp_path / "base", [_step(c, preemptions=5 if c >= 8 else 0, kv_max=0.9) for c in (2, 4, 8, 16)]
    )
    new = _run(tmp_path / "new", [_step(2), _step(4, cut_short=True)], status=INTERRUPTED)
    b, n = load_side(base).verdict, load_side(new).verdict
    for rule in ("preemptions<=baseline", "max-kv-usage<=baseline", "error-rate<=baseline"):
        status, reason = _gate(rule, n, b)
        assert status is GateStatus.NOT_EVALUATED and "this run was cut short" in reason, rule


def test_run_wide_totals_over_other_levels_are_not_evaluated(tmp_path: Path) -> None:
    base = _run(tmp_path / "base", [_step(c) for c in (2, 4, 8)])
    new = _run(tmp_path / "new", [_step(c) for c in (2, 4, 8, 16)])
    status, reason = _gate("error-rate<=baseline", load_side(new).verdict, load_side(base).verdict)
    assert status is GateStatus.NOT_EVALUATED
    assert reason.endswith("the runs measured different levels (2, 4, 8 against 2, 4, 8, 16)")


def test_a_new_run_that_stopped_below_the_base_death_is_no_improvement(tmp_path: Path) -> None:
    base = _run(tmp_path / "base", [_step(2), _step(4), _step(8), _died_at(16)], status=DEAD)
    new = _run(tmp_path / "new", [_step(2), _step(4, cut_short=True)], status=INTERRUPTED)
    _, status, evidence = _row(base, new, "engine_death")
    assert status == "not measured" and "only up to 2, below the base's death" in evidence


def test_a_death_above_every_level_the_base_ran_is_not_a_regression(tmp_path: Path) -> None:
    base = _run(tmp_path / "base", [_step(c) for c in (2, 4, 8)])
    new = _run(tmp_path / "new", [*(_step(c) for c in (2, 4, 8, 16)), _died_at(32)], status=DEAD)
    _, status, evidence = _row(base, new, "engine_death")
    assert status == "not measured" and "above the base's highest level tested (8)" in evidence
    status_gate, reason = _gate("no-new-death", load_side(new).verdict, load_side(base).verdict)
    assert status_gate is GateStatus.NOT_EVALUATED and "the baseline never ran it" in reason


def test_a_new_run_that_broke_at_its_lowest_level_lost_its_last_safe_level(tmp_path: Path) -> None:
    base = _run(tmp_path / "base", [_step(c) for c in (2, 4, 8)])
    new = _run(tmp_path / "new", [_step(c, preemptions=9) for c in (2, 2, 2, 4, 8)])
    shown, status, evidence = _row(base, new, "last_safe")
    assert (shown, status) == ("none (broke at 2)", "regression")
    assert evidence.startswith("fell from 8 to none (broke at 2)")
    gate, reason = _gate("last-safe>=baseline-1", load_side(new).verdict, load_side(base).verdict)
    assert gate is GateStatus.FAIL and reason.startswith("last safe concurrency none (2 broke or queued)")


def test_history_reads_a_move_against_the_last_run_of_the_same_trace_and_traffic(tmp_path: Path) -> None:
    def steps(onset: int) -> list[StepSpec]:
        return [_step(c, preemptions=3 if c >= onset else 0) for c in (2, 4, 4, 4, 6, 8, 8, 8)]

    _run(tmp_path / "r1", steps(8))
    _run(tmp_path / "r2", steps(8), lengths=((512, 128),) * 20)  # another trace, in between
    _run(tmp_path / "r3", steps(4))
    rows = history_of([tmp_path]).rows  # no provenance: the same start, ordered by label
    assert [r.label for r in rows] == ["r1", "r2", "r3"]
    assert rows[1].moves == ("r2 replayed another trace: nothing is read across it",)
    assert rows[2].moves[0].startswith("onset 8 → 4 at r3")


def test_history_reads_a_death_as_compare_does_never_gone_where_not_reached(tmp_path: Path) -> None:
    """A run that died of OOM at 16, then one interrupted at 4: history read "no engine death at r2 (was
    at 16 …)" — a death gone — where ``compare`` says "not measured" (r2 never ran 16). It reads the
    death by compare's rule; so is a death above every level the run before it ran."""
    _run(tmp_path / "r1", [_step(2), _step(4), _step(8), _died_at(16)], status=DEAD)
    _run(tmp_path / "r2", [_step(2), _step(4, cut_short=True)], status=INTERRUPTED)
    _run(tmp_path / "r3", [*(_step(c) for c in (2, 4, 8, 16)), _died_at(32)], status=DEAD)
    rows = history_of([tmp_path]).rows  # no provenance: the same start, ordered by label
    assert [r.label for r in rows] == ["r1", "r2", "r3"]
    gone = [m for m in rows[1].moves if m.startswith("engine death")]
    assert gone == [
        "engine death at 16 (cuda_oom) → none at r2 (simulated), not measured: the new run's engine "
        "survived, but only up to 2, below the base's death"
    ]
    assert not any(m.startswith("no engine death") for m in rows[1].moves)
    _, status, evidence = _row(tmp_path / "r1", tmp_path / "r2", "engine_death")
    assert status == "not measured" and evidence in gone[0]
    above = [m for m in rows[2].moves if m.startswith("engine death")]
    assert len(above) == 1 and above[0].endswith(
        "not measured: the new run's engine died above the base's highest level tested (2)"
    ), above


def _onset_steps(
    onset: int, levels: tuple[int, ...] = (2, 4, 4, 4, 6, 8, 8, 8), **kwargs: object
) -> list[StepSpec]:
    return [_step(c, preemptions=3 if c >= onset else 0, kv_max=0.9, **kwargs) for c in levels]


def test_an_onset_a_run_could_not_observe_is_not_measured_never_none(tmp_path: Path) -> None:
    """Against a base onset of 8, compare read "8 → none" ("preemption onset rose from concurrency 8 to
    none", not separated) for a new run without a /metrics scrape, one interrupted at 4, and one whose
    levels stopped at 4 — none of them looked where the base preempted. Their onset is not measured:
    "—" with no level judged, "none up to N" below the base's onset; a run clean up to 16 is still
    compared. The new run's own caveat (no /metrics scrape) is carried into compare's."""
    base = _run(tmp_path / "base", _onset_steps(8))
    blind = _run(tmp_path / "blind", _onset_steps(8, scrapes=0))
    cut = _run(tmp_path / "cut", [_step(2), _step(4, cut_short=True)], status=INTERRUPTED)
    low = _run(tmp_path / "low", [_step(2), _step(4)])
    high = _run(tmp_path / "high", [_step(c) for c in (2, 4, 8, 16)])
    assert _row(base, blind, "preemption_onset")[:2] == ("—", "not measured")
    assert _row(base, cut, "preemption_onset")[:2] == ("none up to 2", "not measured")
    shown, status, evidence = _row(base, low, "preemption_onset")
    assert (shown, status) == ("none up to 4", "not measured")
    assert evidence == (
        "preemption onset not measured: the new run judged preemption only up to concurrency 4, below the "
        "base run's onset at 8 (measure higher)"
    )
    shown, status, evidence = _row(base, high, "preemption_onset")
    assert (shown, status) == (
        "none up to 16",
        "not separated",
    ) and "rose from concurrency 8 to none" in evidence
    # the other way round: the base saw nothing, the new run's onset is not read as a fall
    assert _row(blind, base, "preemption_onset")[1] == "not measured"
    cmp = compare_runs(load_side(base), load_side(blind))
    assert cmp.onset.direction == "not measured" and not cmp.onset.regression
    assert (
        "the new run blind: no /metrics scrape reported preemptions: preemption and KV usage are unobserved"
        in cmp.caveats
    )
    status_gate, _ = _gate("onset>=baseline", load_side(blind).verdict, load_side(base).verdict)
    assert status_gate is GateStatus.NOT_EVALUATED


def test_a_run_that_lost_request_records_says_so_in_compare(tmp_path: Path) -> None:
    """report flags a run whose requests*.jsonl holds fewer requests than its steps started (a file cut
    short); compare's caveats were empty for it."""
    base = _run(tmp_path / "base", _onset_steps(8))
    steps = _onset_steps(8)
    steps[1] = _step(4, end_extra={"started": 40})  # 16 written of 40 started
    lost = _run(tmp_path / "lost", steps)
    caveats = compare_runs(load_side(base), load_side(lost)).caveats
    assert any(
        c.startswith("the new run lost: steps.jsonl counts") and "the rest were lost" in c for c in caveats
    ), caveats


def test_history_reads_an_onset_a_run_did_not_reach_as_not_measured(tmp_path: Path) -> None:
    """History read "onset 8 → none at r2" across a run interrupted at 4, and showed "none" in its row."""
    _run(tmp_path / "r1", _onset_steps(8))
    _run(tmp_path / "r2", [_step(2), _step(4, cut_short=True)], status=INTERRUPTED)
    _run(tmp_path / "r3", _onset_steps(8, scrapes=0))
    rows = history_of([tmp_path]).rows
    assert [r.label for r in rows] == ["r1", "r2", "r3"]
    assert rows[1].moves == (
        "onset 8 → none up to 2 at r2 (simulated), not measured: r2 judged preemption only up to "
        "concurrency 2, below r1's onset at 8 (measure higher)",
    )
    lines = render_markdown(history_of([tmp_path])).splitlines()
    onsets = {
        line.split(" | ")[0][2:]: line.split(" | ")[4]
        for line in lines
        if line.startswith("| r") and "onset" not in line
    }
    assert onsets == {"r1": "8", "r2 (cut short)": "none up to 2", "r3": "—"}  # r3: no /metrics scrape
