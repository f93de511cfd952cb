"""The oomload tab's words: the plan line (running, draining, over) and TTFT as its own metric."""

from __future__ import annotations

from oomload.run.webui import plan_text, telemetry_rows, ttft_text

PLAN = {"levels": [1, 2, 4, 8, 16], "planned_steps": 5, "refine": True}
STEP = {"index": 3, "concurrency": 8, "phase": "ramp"}


def test_the_plan_line_says_where_the_run_is() -> None:
    running = {**PLAN, "state": "running", "step_number": 4, "step_left_s": 2.06}
    assert plan_text(running, STEP) == (
        "step 3 (ramp, concurrency 8) · 4 of 5 planned · levels 1,2,4,8,16 + refinement · 2.1 s left"
    )
    refine = {"index": 6, "concurrency": 12, "phase": "refine"}
    draining = {**PLAN, "state": "draining", "step_number": 7, "draining_to": 12}
    assert plan_text(draining, refine) == (
        "step 6 (refine, concurrency 12) · levels 1,2,4,8,16 + refinement · draining to concurrency 12"
    )
    assert plan_text({**PLAN, "state": "over"}, STEP) == "over · levels 1,2,4,8,16"


def test_rows_once_the_run_is_over_show_no_stale_now() -> None:
    snap = {
        "plan": {**PLAN, "state": "over"},
        "step": STEP,
        "achieved_concurrency": 2.1,
        "ttft": {"step": {"n": 0}, "run": {"n": 3, "p50_ms": 120.0, "p99_ms": 1250.0}},
        "final": {"flag_line": "vllm serve m --max-num-seqs 7"},
    }
    rows = {r["what"]: r["value"] for r in telemetry_rows(snap)}
    assert "concurrency" not in rows and rows["last step"] == "3 (ramp, concurrency 8)"
    assert rows["TTFT (run)"] == "p50 120 ms · p99 1.25 s · n=3"
    assert rows["recommendation"] == "vllm serve m --max-num-seqs 7"
    assert ttft_text(None) == "no ok request yet"


def test_while_draining_the_rows_do_not_show_the_old_step_as_running() -> None:
    plan = {**PLAN, "state": "draining", "draining_to": 5}
    snap = {"plan": plan, "step": STEP, "achieved_concurrency": 6.4}
    rows = {r["what"]: r["value"] for r in telemetry_rows(snap)}
    assert rows["step"] == "3 (ramp) ended · draining"
    assert rows["concurrency"] == "next target 5 · achieved 6.4"
