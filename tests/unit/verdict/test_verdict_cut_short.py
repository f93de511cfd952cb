"""Cut-short and under-held steps never vouch for safety or a gate pass; a failure seen in them counts.

Scenarios from the QA review: a step interrupted after 0.6 s, a run stopped by --max-duration-s, a
server death, a load generator far below its target concurrency.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.errors import ExitCode
from oomload.outcome import Outcome
from oomload.report.findings import describe
from oomload.report.markdown import render_markdown
from oomload.report.steptable import step_row
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import GateStatus, evaluate_gate, evaluate_gates, gate_exit_code, parse_gate
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import T0, StepSpec, request, write_run


def verdict_of(path: Path) -> Verdict:
    return build_verdict(load_run(path))


def status(rule: str, v: Verdict) -> GateStatus:
    return evaluate_gate(parse_gate(rule), v).status


def finding(v: Verdict, key: str) -> str:
    return next(f.text for f in describe(v, recommend(v)) if f.key == key)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Verdict:
    """Step 0 at 1 (10 s), step 1 at 2 ended ``interrupted`` 0.6 s in with 9 requests answered."""
    steps = [StepSpec(1), StepSpec(2, requests=9, duration_s=0.6, end_reason="interrupted")]
    status_json = {"finished": False, "end_reason": "interrupted", "ended_unix_s": T0 + 10.6}
    return verdict_of(write_run(tmp_path_factory.mktemp("int") / "run", steps, status=status_json))


def test_a_step_ended_by_ctrl_c_is_cut_short_and_not_trusted(interrupted: Verdict) -> None:
    step = interrupted.steps[1]
    assert step.cut_short and not step.trusted and step.end_reason == "interrupted"
    assert step.ok_requests == 9  # answered, but the step measured 0.6 s of a 10 s hold
    assert step_row(step)[0] == "1*"
    assert interrupted.last_safe_concurrency == 1
    assert interrupted.max_tested_concurrency == 1
    assert interrupted.run.cut_short
    assert interrupted.run.cut_short_detail == (
        "interrupted (Ctrl-C or SIGTERM) in step 1 (concurrency 2) at 10.6 s from the first step's start"
    )
    assert finding(interrupted, "last_safe") == "1"
    assert [n.severity for n in interrupted.notes if n.kind == "cut_short"] == ["warning"]


def test_gates_on_an_interrupted_step_are_not_evaluated(interrupted: Verdict) -> None:
    results = evaluate_gates(
        [parse_gate("p99-ttft-s@2<=2"), parse_gate("no-preemption-up-to:2")], interrupted
    )
    assert [r.status for r in results] == [GateStatus.NOT_EVALUATED] * 2
    assert all(
        "step 1 (concurrency 2) was cut short (interrupted (Ctrl-C or SIGTERM) after 0.6 s" in r.reason
        for r in results
    )
    assert gate_exit_code(results) is ExitCode.GATE_NOT_EVALUATED
    assert status("no-preemption-up-to:1", interrupted) is GateStatus.PASS  # step 0 completed
    assert status("last-safe-concurrency>=1", interrupted) is GateStatus.PASS


def test_max_duration_cuts_the_run_short(tmp_path: Path) -> None:
    steps = [StepSpec(1, duration_s=5.0, end_reason="max_duration")]
    status_json = {"finished": True, "end_reason": "max_duration", "ended_unix_s": T0 + 5.0}
    v = verdict_of(write_run(tmp_path / "run", steps, status=status_json))
    assert v.run.cut_short and v.steps[0].cut_short
    assert finding(v, "run_status") == (
        "CUT SHORT: --max-duration-s was reached in step 0 (concurrency 1) at 5.0 s from the first step's "
        "start"
    )
    assert status("p99-ttft-s@1<=2", v) is GateStatus.NOT_EVALUATED
    assert v.last_safe_concurrency is None
    assert finding(v, "last_safe").startswith("unknown: step 0 (concurrency 1) was cut short")
    assert v.confidence != "high"


def test_a_failure_seen_in_a_cut_short_step_still_fails(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(2), StepSpec(4, preemptions=3, duration_s=2.0, end_reason="interrupted")]
    v = verdict_of(
        write_run(tmp_path / "run", steps, status={"finished": False, "end_reason": "interrupted"})
    )
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 4
    assert v.last_safe_concurrency == 2
    assert status("no-preemption-below:5", v) is GateStatus.FAIL
    assert status("preemptions@4==0", v) is GateStatus.FAIL
    assert status("p99-ttft-s@4<=100", v) is GateStatus.NOT_EVALUATED  # a latency of 2 s is no evidence
    assert status("no-preemption-below:4", v) is GateStatus.NOT_EVALUATED  # 3 measured, not 4: unvouched
    assert status("no-preemption-below:3", v) is GateStatus.PASS


def test_a_step_far_below_its_target_concurrency_is_not_trusted(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(8, requests=16, in_flight=2)]
    v = verdict_of(write_run(tmp_path / "run", steps))
    held = v.steps[1]
    assert held.achieved_concurrency is not None and held.achieved_concurrency < 2.1
    assert held.concurrency_held is False and not held.trusted and not held.cut_short
    assert v.last_safe_concurrency == 1 and v.max_tested_concurrency == 1
    result = evaluate_gate(parse_gate("no-preemption-up-to:8"), v)
    assert result.status is GateStatus.NOT_EVALUATED
    assert "the load generator held 2.0 requests in flight on average, below 80% of 8" in result.reason
    assert status("p99-ttft-s@8<=100", v) is GateStatus.NOT_EVALUATED
    alone = verdict_of(write_run(tmp_path / "alone", [StepSpec(8, requests=16, in_flight=2)]))
    assert alone.last_safe_concurrency is None
    assert finding(alone, "last_safe").startswith(
        "unknown: step 0 (concurrency 8): the load generator held 2.0"
    )


def test_run_wide_thresholds_on_a_cut_short_run_pass_only_on_nothing(tmp_path: Path) -> None:
    steps = [
        StepSpec(1),
        StepSpec(
            2, requests=12, failures={Outcome.SERVER_ERROR: 1}, duration_s=3.0, end_reason="interrupted"
        ),
    ]
    v = verdict_of(
        write_run(tmp_path / "run", steps, status={"finished": False, "end_reason": "interrupted"})
    )
    assert v.error_rate == 1 / 24
    ok_part = evaluate_gate(parse_gate("error-rate<=5%"), v)
    assert ok_part.status is GateStatus.NOT_EVALUATED
    assert "error-rate = 4.17 % over the part measured, but the run was cut short" in ok_part.reason
    failed = evaluate_gate(parse_gate("error-rate<=1%"), v)
    assert failed.status is GateStatus.FAIL
    assert failed.reason == "error-rate = 4.17 % over the run, not <= 1 %"  # a share reads in %
    assert failed.to_json()["observed"] == 1 / 24 and failed.to_json()["unit"] == "share"
    assert evaluate_gate(parse_gate("error-rate<=0.01"), v).reason == failed.reason  # however it is written


def test_a_server_death_is_a_cut_short_run_with_its_place(tmp_path: Path) -> None:
    oom = "EngineDeadError: CUDA out of memory"
    dead = StepSpec(4, failures={Outcome.ENGINE_DEAD: 4}, end_reason="server_dead", error_text=oom)
    steps = [StepSpec(1), StepSpec(2), dead]
    extra = [request("cut", 2, 4, 21.0, 29.995, Outcome.TRUNCATED)]  # a stream the death broke
    run = write_run(tmp_path / "run", steps, status={"finished": True, "end_reason": "server_dead"},
                    extra_requests=extra)  # fmt: skip
    v = verdict_of(run)
    assert v.engine_death is not None and "cut" in v.engine_death.casualty_ids
    assert v.run.cut_short and v.steps[2].cut_short
    assert finding(v, "run_status").startswith("CUT SHORT: the server died in step 2 (concurrency 4) at 2")
    ctx = v.context_overflow
    assert (ctx.clamped, ctx.short_responses) == (0, 0)  # a casualty is neither clamped nor short
    md = render_markdown(v, recommend(v))
    assert "This run was cut short:** the server died in step 2 (concurrency 4)" in md
    assert "| ✅ | **Run** |" not in md and "| 2\\* | 4 |" in md
    assert "engine death" in finding(v, "engine_death")  # still a finding of its own
    # the death is the answer, not missing evidence: the note informs, the steps before it stand
    assert [n.severity for n in v.notes if n.kind == "cut_short"] == ["info"]
    assert v.last_safe_concurrency == 2


def test_prediction_uses_the_requests_sent_and_tail_runs_advise_no_max_num_seqs(tmp_path: Path) -> None:
    """A --tail-percentile run sends 1024 + 512 tokens (48 blocks of 32; 96 blocks hold 2)."""
    cache = {"num_gpu_blocks": 96, "block_size": 32}
    steps = [StepSpec(c, preemptions=int(c >= 2), requests=3 * c, prompt_tokens=1024, output_tokens=512)
             for c in (1, 2, 4)]  # fmt: skip
    run = write_run(tmp_path / "run", steps, cache_config=cache, config={"tail_percentile": 90.0})
    v = verdict_of(run)
    assert v.prediction is not None and v.prediction.basis == "requests"
    assert v.prediction.arithmetic.onset_mean == 2  # the trace's 512-token mix would say 6
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 2
    assert not v.prediction.disagrees
    rec = recommend(v)
    assert v.last_safe_concurrency == 1 and rec.max_num_seqs.value is None
    assert "--tail-percentile 90" in rec.max_num_seqs.reason
    assert "--max-num-seqs" not in rec.flag_line
    assert "No max_num_seqs advice: the run replayed only the trace's longest requests" in rec.reasoning
    open_loop = recommend(verdict_of(write_run(tmp_path / "open", steps, config={"open_loop": True})))
    assert open_loop.max_num_seqs.value is None and "--open-loop" in open_loop.max_num_seqs.reason


def test_prediction_not_reached_says_so(tmp_path: Path) -> None:
    cache = {"num_gpu_blocks": 500, "block_size": 16}  # 512-token requests: onset 16
    v = verdict_of(write_run(tmp_path / "run", [StepSpec(1), StepSpec(2)], cache_config=cache))
    p = v.prediction
    assert p is not None and not p.reached and p.levels_apart is None and not p.disagrees
    assert p.highest_clean == 2
    text = finding(v, "prediction")
    assert (
        f"not reached: the run completed levels up to concurrency 2, below the predicted onset band "
        f"{p.band_low}–{p.band_high} (no comparison possible)"
    ) in text
    assert "agrees" not in text


def test_the_onset_kv_figure_is_one_number_everywhere(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [StepSpec(1), StepSpec(2, preemptions=2)])
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step2 = [m for m in lines if m["t_unix_s"] > T0 + 10]
    for m in step2:  # preemption frees blocks: the scrape that shows it reads lower than the peak
        m["kv_cache_usage"] = 0.41 if m["preemptions_delta"] else 0.6
    step2[0]["kv_cache_usage"] = 0.85
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    v = verdict_of(run)
    assert v.preemption_onset is not None
    assert (v.preemption_onset.kv_usage_at_onset, v.preemption_onset.kv_usage_max) == (0.41, 0.85)
    rec = recommend(v)
    assert "KV usage peaked at 85% in that step" in finding(v, "preemption_onset")
    assert "KV usage peaked at 85% in that step" in rec.reasoning
    assert "41" not in finding(v, "preemption_onset") + rec.reasoning
