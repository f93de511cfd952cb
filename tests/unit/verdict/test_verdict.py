"""Onsets, last safe concurrency and confidence on hand-built run directories (clean, noisy, partial)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.outcome import Outcome
from oomload.report.findings import describe
from oomload.verdict import Verdict, build_verdict, kv_peak_text, kv_percent
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, GIB, StepSpec, cpu_knee_steps, request, write_run


def verdict_of(path: Path) -> Verdict:
    return build_verdict(load_run(path))


def kinds(v: Verdict) -> set[str]:
    return {n.kind for n in v.notes}


def test_cpu_knee_gives_onset_six_as_measured_on_real_vllm(tmp_path: Path) -> None:
    v = verdict_of(write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE))
    assert v.preemption_onset is not None
    assert v.preemption_onset.concurrency == 6
    assert v.preemption_onset.requests_in_step == 18
    assert v.preemption_onset.preemptions_in_step == 2
    assert v.preemption_onset.kv_usage_at_onset == 1.0
    assert v.kv_saturation is not None and v.kv_saturation.concurrency == 6
    assert v.queueing is not None and v.queueing.concurrency == 6
    assert v.last_safe_concurrency == 5
    assert v.max_tested_concurrency == 16
    assert v.engine_death is None
    assert [s.preemptions for s in v.steps] == [0, 0, 0, 0, 2, 4, 3, 25, 32]
    # 96 blocks x 32 tokens, 512-token requests need 16 blocks: 95 // 16 + 1 = 6
    assert v.prediction is not None
    assert (v.prediction.arithmetic.onset_mean, v.prediction.levels_apart, v.prediction.disagrees) == (
        6,
        0,
        False,
    )
    assert v.confidence == "high"
    assert not v.run.cut_short


def test_step_facts_count_outcomes_rates_and_device_memory(tmp_path: Path) -> None:
    spec = StepSpec(4, requests=12, failures={Outcome.SERVER_ERROR: 2, Outcome.TRANSPORT_ERROR: 1})
    v = verdict_of(write_run(tmp_path / "run", [spec], cache_config=CPU_CACHE))
    s = v.steps[0]
    assert s.requests == 12
    assert dict(s.outcomes) == {"server_error": 2, "transport_error": 1, "ok": 9}
    assert s.error_requests == 3
    assert s.req_per_s == 12 / 10.0
    assert s.output_tokens_per_s == 9 * 256 / 10.0
    assert s.ttft.count == 9 and s.ttft.p50_ms == 150.0 and s.ttft.p99_ms == 250.0
    assert s.device_used_max_bytes == 70 * GIB
    assert s.device_free_min_bytes == 10 * GIB
    assert s.server_process_used_max_bytes == 70 * GIB
    assert s.achieved_concurrency is not None and 3.5 < s.achieved_concurrency <= 4.0
    # server errors make the level unsafe; transport errors are the client's, noted but not counted
    assert v.last_safe_concurrency is None
    assert "transport_errors" in kinds(v)


def test_requests_without_step_are_placed_by_start_time(tmp_path: Path) -> None:
    steps = [StepSpec(1, requests=3, unknown_step=True), StepSpec(2, requests=6, unknown_step=True)]
    view = load_run(write_run(tmp_path / "run", steps))
    assert [len(s.requests) for s in view.steps] == [3, 6]
    assert view.unassigned_requests == 0


def test_noisy_knee_is_called_out_and_onset_is_the_lowest_preempting_level(tmp_path: Path) -> None:
    steps = [StepSpec(c, preemptions=p, requests=3 * c) for c, p in [(2, 0), (4, 0), (6, 3), (7, 0), (8, 5)]]
    v = verdict_of(write_run(tmp_path / "run", steps, cache_config=CPU_CACHE))
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 6
    assert v.last_safe_concurrency == 4
    assert "non_monotone" in kinds(v)
    assert v.confidence == "low"


def test_refinement_step_below_the_ramp_onset_moves_the_onset_down(tmp_path: Path) -> None:
    steps = [StepSpec(c, preemptions=p, requests=3 * c) for c, p in [(2, 0), (4, 0), (8, 9)]]
    steps.append(StepSpec(6, preemptions=1, requests=18, phase="refine"))
    steps.append(StepSpec(5, preemptions=0, requests=15, phase="refine"))
    v = verdict_of(write_run(tmp_path / "run", steps))
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 6
    assert v.last_safe_concurrency == 5
    assert v.levels == (2, 4, 5, 6, 8)


def test_warmup_preemption_is_not_an_onset(tmp_path: Path) -> None:
    steps = [StepSpec(8, preemptions=4, phase="warmup"), StepSpec(1), StepSpec(2)]
    v = verdict_of(write_run(tmp_path / "run", steps))
    assert v.preemption_onset is None
    assert v.last_safe_concurrency == 2
    assert [s.warmup for s in v.steps] == [True, False, False]


def test_partial_run_without_status_names_the_open_step(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(2), StepSpec(4, cut_short=True, requests=16)]
    v = verdict_of(write_run(tmp_path / "run", steps, no_status=True))
    assert v.run.cut_short and not v.run.finished
    assert v.run.cut_short_detail is not None
    assert "no status.json" in v.run.cut_short_detail
    assert "step 2 (concurrency 4) started but never ended" in v.run.cut_short_detail
    assert v.steps[-1].cut_short
    assert v.last_safe_concurrency == 2  # the open step vouches for nothing
    assert v.max_tested_concurrency == 2
    assert "cut_short" in kinds(v)


def test_interrupted_run_is_cut_short_with_its_reason(tmp_path: Path) -> None:
    status = {"finished": False, "end_reason": "interrupted"}
    v = verdict_of(
        write_run(tmp_path / "run", [StepSpec(1), StepSpec(2, end_reason="interrupted")], status=status)
    )
    assert v.run.cut_short and v.run.end_reason == "interrupted"
    assert "interrupted" in (v.run.cut_short_detail or "")


def test_cuda_oom_engine_death_with_evidence(tmp_path: Path) -> None:
    oom = "EngineDeadError: CUDA out of memory. Tried to allocate 2.00 GiB"
    steps = [
        StepSpec(1),
        StepSpec(2),
        StepSpec(4, failures={Outcome.ENGINE_DEAD: 5}, end_reason="server_dead", error_text=oom),
    ]
    status = {"finished": True, "end_reason": "server_dead"}
    events = [{"kind": "server_dead", "step": 2, "evidence": "connection refused"}]
    run = write_run(tmp_path / "run", steps, status=status, events=events, server_pid_vanishes_after=1)
    v = verdict_of(run)
    death = v.engine_death
    assert death is not None
    assert death.concurrency == 4 and death.step == 2
    assert death.real_oom
    assert any("CUDA out of memory" in e for e in death.evidence)
    assert any("vanished from the GPU samples" in e for e in death.evidence)
    assert v.last_safe_concurrency == 2


def test_engine_death_without_oom_text_is_not_a_real_oom(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(2, failures={Outcome.ENGINE_DEAD: 2}, error_text="connection refused")]
    v = verdict_of(write_run(tmp_path / "run", steps))
    assert v.engine_death is not None and not v.engine_death.real_oom
    assert v.engine_death.concurrency == 2


def test_missing_metrics_leave_preemption_unobserved(tmp_path: Path) -> None:
    v = verdict_of(write_run(tmp_path / "run", [StepSpec(1, scrapes=0), StepSpec(2, scrapes=0)]))
    assert all(s.preemptions is None for s in v.steps)
    assert v.preemption_onset is None
    assert "metrics_missing" in kinds(v)
    assert v.confidence == "low"


def test_few_requests_and_unheld_concurrency_are_called_out(tmp_path: Path) -> None:
    steps = [StepSpec(2, requests=2), StepSpec(16, requests=32, in_flight=4)]
    v = verdict_of(write_run(tmp_path / "run", steps))
    notes = {(n.kind, n.step) for n in v.notes}
    assert ("few_requests", 0) in notes
    assert ("concurrency_not_held", 1) in notes
    assert v.steps[1].achieved_concurrency is not None and v.steps[1].achieved_concurrency < 5


def test_context_overflow_counts_and_lengths(tmp_path: Path) -> None:
    steps = [StepSpec(2, failures={Outcome.CONTEXT_OVERFLOW: 3, Outcome.TRUNCATED: 1})]
    lengths = [(256, 256)] * 18 + [(4000, 512), (5000, 100)]
    # asked 4000 + 512 > max_model_len 4096: the server clamped the output
    clamped = request("clamp", 0, 2, 1.0, 2.0, Outcome.TRUNCATED, prompt_tokens=4000, output_tokens=512)
    v = verdict_of(write_run(tmp_path / "run", steps, lengths=lengths, extra_requests=[clamped]))
    ctx = v.context_overflow
    # the truncated 256 + 256 answer fits max_model_len: a short response, not a clamp
    assert (ctx.refused, ctx.clamped, ctx.short_responses) == (3, 1, 1)
    assert ctx.clamped_total_tokens_min == ctx.clamped_total_tokens_max == 4512
    assert ctx.refused_total_tokens_min == 512
    assert ctx.model_limit == 4096
    assert (ctx.trace_over_limit, ctx.trace_count) == (2, 20)
    assert v.last_safe_concurrency == 2  # overflow is a length problem, not a concurrency one


def test_prediction_far_from_observation_is_flagged(tmp_path: Path) -> None:
    big_pool = {"num_gpu_blocks": 10_000, "block_size": 16}
    steps = [StepSpec(c, preemptions=int(c >= 4), requests=3 * c) for c in (1, 2, 4, 8, 16)]
    v = verdict_of(write_run(tmp_path / "run", steps, cache_config=big_pool))
    assert v.prediction is not None
    assert v.prediction.arithmetic.onset_mean == 313  # 9999 // 32 + 1
    assert v.prediction.disagrees and v.prediction.levels_apart == 3
    assert "prediction_disagrees" in kinds(v)


def test_prediction_ignores_refused_requests_and_clamps_at_the_model_limit(tmp_path: Path) -> None:
    """The QA case: four refused 10k–16k-token requests dragged the band down to 1–2 and a run clean at
    1 and 2 read "agrees". Refused requests never hold a block; clamped ones hold max_model_len."""
    pool = {"num_gpu_blocks": 97, "block_size": 16}  # 96 usable; 256 + 256 = 32 blocks → onset 4
    refused = [
        request(f"big{i}", 0, 1, 1.0, 1.1, Outcome.CONTEXT_OVERFLOW, prompt_tokens=16_000, output_tokens=500)
        for i in range(4)
    ]
    clamped = request("clamp", 0, 1, 1.0, 2.0, Outcome.TRUNCATED, prompt_tokens=4000, output_tokens=512)
    steps = [StepSpec(1), StepSpec(2)]
    v = verdict_of(write_run(tmp_path / "run", steps, cache_config=pool, extra_requests=[*refused, clamped]))
    assert v.prediction is not None and v.run.max_model_len == 4096
    # 24 requests of 32 blocks and the clamped one at 4096 tokens (256 blocks): mean 41 blocks → 3, P50 → 4;
    # counted with the refused 16,500-token ones (1032 blocks each) the band was 1–4
    assert (v.prediction.band_low, v.prediction.band_high) == (3, 4)
    assert not v.prediction.reached and v.prediction.levels_apart is None  # clean up to 2: below the band


def test_clean_at_the_top_of_the_band_counts_one_level_apart(tmp_path: Path) -> None:
    pool = {"num_gpu_blocks": 97, "block_size": 16}  # onset 4 for 256 + 256
    v = verdict_of(write_run(tmp_path / "run", [StepSpec(c) for c in (2, 4)], cache_config=pool))
    assert v.prediction is not None and v.prediction.reached
    assert (v.prediction.levels_apart, v.prediction.disagrees) == (1, False)
    steps = [StepSpec(c, requests=3 * c) for c in (2, 4, 8, 16)]
    v = verdict_of(write_run(tmp_path / "run8", steps, cache_config=pool))
    assert v.prediction is not None and (v.prediction.levels_apart, v.prediction.disagrees) == (3, True)


def test_counter_and_delta_disagreement_uses_the_larger(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [StepSpec(1), StepSpec(2, preemptions=3)])
    # a lost scrape: the counter jumps by 5 more than the deltas say
    lines = (run / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["num_preemptions_total"] += 5
    lines[-1] = json.dumps(last)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    v = verdict_of(run)
    assert v.steps[1].preemptions == 8
    assert "preemption_counter_mismatch" in kinds(v)


def test_steps_rebuilt_from_requests_when_steps_file_is_missing(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [StepSpec(1), StepSpec(2, preemptions=1)])
    (run / "steps.jsonl").unlink()
    v = verdict_of(run)
    assert [s.concurrency for s in v.steps] == [1, 2]
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 2


def test_verdict_json_round_trips(tmp_path: Path) -> None:
    v = verdict_of(write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE))
    doc = json.loads(json.dumps(v.to_json(), allow_nan=False))
    assert doc["onsets"]["preemption"]["concurrency"] == 6
    assert doc["last_safe_concurrency"] == 5
    assert doc["steps"][4]["outcomes"] == {"ok": 18}


def test_cancelled_requests_are_counted_but_are_neither_ok_nor_errors(tmp_path: Path) -> None:
    """Requests oomload abandoned at the end of the run (or on Ctrl-C)."""
    steps = [
        StepSpec(2, requests=12),
        StepSpec(4, requests=12, failures={Outcome.CANCELLED: 4, Outcome.SERVER_ERROR: 1}),
    ]
    v = verdict_of(write_run(tmp_path / "run", steps))
    s = v.steps[1]
    assert dict(s.outcomes) == {"cancelled": 4, "server_error": 1, "ok": 7}
    assert (s.requests, s.ok_requests, s.cancelled_requests, s.decided_requests) == (12, 7, 4, 8)
    assert s.error_requests == 1 and s.error_rate == 1 / 8
    assert s.req_per_s == 8 / 10.0
    assert (v.requests_total, v.requests_ok, v.requests_cancelled, v.requests_failed) == (24, 19, 4, 1)
    assert v.error_rate == 1 / 20
    assert v.last_safe_concurrency == 2  # the server error makes 4 unsafe, the cancellations do not
    assert ("cancelled", 1) in {(n.kind, n.step) for n in v.notes}
    doc = json.loads(json.dumps(v.to_json(), allow_nan=False))
    assert doc["requests"]["cancelled"] == 4 and doc["steps"][1]["outcomes"]["cancelled"] == 4


def test_only_cancelled_requests_make_no_safe_level(tmp_path: Path) -> None:
    steps = [StepSpec(2, requests=6, failures={Outcome.CANCELLED: 6})]
    v = verdict_of(write_run(tmp_path / "run", steps))
    assert v.steps[0].error_rate is None and v.error_rate is None
    assert v.last_safe_concurrency is None  # nothing was answered: no evidence of safety


def test_run_through_preemption_to_death_then_bisected(tmp_path: Path) -> None:
    """Default ``--stop-on oom``: ramp on past the first preemption until the server dies, then refine."""
    oom = "EngineDeadError: CUDA out of memory. Tried to allocate 1.00 GiB"
    steps = [
        StepSpec(1, kv_max=0.1, requests=6),
        StepSpec(2, kv_max=0.2, requests=6),
        StepSpec(4, kv_max=0.5, requests=12),
        StepSpec(8, preemptions=3, kv_max=1.0, waiting_max=0, requests=24),
        StepSpec(16, preemptions=20, kv_max=1.0, waiting_max=6, requests=48),
        StepSpec(32, preemptions=9, kv_max=1.0, waiting_max=20, requests=32,
                 failures={Outcome.ENGINE_DEAD: 32}, error_text=oom, end_reason="server_dead"),
    ]  # fmt: skip
    status = {"finished": True, "end_reason": "server_dead"}
    v = verdict_of(write_run(tmp_path / "run", steps, cache_config=CPU_CACHE, status=status))
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 8
    assert v.kv_saturation is not None and v.kv_saturation.concurrency == 8
    assert v.queueing is not None and v.queueing.concurrency == 16
    assert v.engine_death is not None and v.engine_death.concurrency == 32 and v.engine_death.real_oom
    assert v.last_safe_concurrency == 4
    # the death ends the run: cut short, and the report says where
    assert v.run.cut_short and v.steps[5].cut_short
    assert (
        v.run.cut_short_detail
        == "the server died in step 5 (concurrency 32) at 60.0 s from the first step's start"
    )
    # the server survives the last level instead: the refinement bisects 4..8, 6 preempts, 5 does not
    steps[5] = StepSpec(32, preemptions=40, kv_max=1.0, waiting_max=20, requests=64)
    steps += [
        StepSpec(6, preemptions=1, kv_max=1.0, requests=18, phase="refine"),
        StepSpec(5, kv_max=0.9, requests=15, phase="refine"),
    ]
    v = verdict_of(write_run(tmp_path / "run2", steps, cache_config=CPU_CACHE))
    assert v.preemption_onset is not None and v.preemption_onset.concurrency == 6
    assert v.preemption_onset.step == 6  # the refine step, run after the ramp
    assert v.kv_saturation is not None and v.kv_saturation.concurrency == 6
    assert v.queueing is not None and v.queueing.concurrency == 16
    assert v.last_safe_concurrency == 5
    assert v.levels == (1, 2, 4, 5, 6, 8, 16, 32)
    assert v.engine_death is None and v.max_tested_concurrency == 32


@pytest.mark.parametrize(
    ("share", "shown"), [(0.986, "98%"), (0.99, "99%"), (0.5, "50%"), (1.0, "100%"), (0.0, "0%")]
)
def test_kv_usage_is_shown_rounded_down_so_it_never_claims_the_saturation_threshold(
    share: float, shown: str
) -> None:
    assert kv_percent(share) == shown
    assert kv_peak_text(share) == f"KV usage peaked at {shown} in that step"


@pytest.mark.parametrize(("level", "confidence"), [(2, "medium"), (5, "low")])
def test_a_lost_locust_worker_is_a_warning_on_its_step(tmp_path: Path, level: int, confidence: str) -> None:
    """The load changed under that step (the others took over its users): a warning on it, so the
    verdict drops to medium — to low when the step is at a level the verdict rests on (5: last safe)."""
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    start = next(d.boundary.start_unix_s for d in load_run(run).steps if d.boundary.concurrency == level)
    lost = {
        "t_unix_s": start + 2.0,
        "kind": "worker_lost",
        "worker": 1,
        "host": "10.0.0.7",
        "pid": 4711,
        "local": False,
        "detail": "Locust worker-1 sent no heartbeat for 3 s (missing)",
        "rows_received": 12,
        "workers_left": 1,
    }
    with open(run / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(lost) + "\n")
    v = verdict_of(run)
    notes = [n for n in v.notes if n.kind == "worker_lost"]
    assert len(notes) == 1 and notes[0].severity == "warning"
    step = next(s for s in v.steps if s.index == notes[0].step)
    assert step.concurrency == level
    assert notes[0].message.startswith(
        f"Locust worker 1 (10.0.0.7, pid 4711) was lost during step {step.index}"
    )
    assert "12 of its results were received; 1 worker(s) left took over its users" in notes[0].message
    assert v.confidence == confidence
    assert v.last_safe_concurrency == 5  # the verdict itself stands; how far to trust it changed


def test_a_server_that_exposed_an_impossible_value_is_a_warning(tmp_path: Path) -> None:
    """A ``metrics_invalid`` event (a KV usage of 7.5 left out by the poller) lowers the confidence:
    a server or proxy that reports one impossible value may report the others wrongly too."""
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    assert verdict_of(run).confidence == "high"
    start = load_run(run).steps[0].boundary.start_unix_s
    event = {
        "t_unix_s": start + 1.0,
        "kind": "metrics_invalid",
        "field": "kv_cache_usage",
        "detail": "vllm:kv_cache_usage_perc = 7.5, not a fraction in 0–1",
    }
    with open(run / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event) + "\n")
    v = verdict_of(run)
    [note] = [n for n in v.notes if n.kind == "metrics_invalid"]
    assert note.severity == "warning"
    assert note.message.startswith("/metrics exposed vllm:kv_cache_usage_perc = 7.5, not a fraction in 0–1:")
    assert v.confidence == "medium"


def test_one_token_outputs_that_never_grow_are_not_a_disagreement(tmp_path: Path) -> None:
    """Seen on the simulator: 1000 + 1 tokens on 799 blocks of 16 ran clean up to 24, and the verdict read
    "observed no onset is 3 levels from the arithmetic band 13–13", confidence low. Such requests never
    take a block after their prefill, so a full pool queues them: no onset is what the arithmetic says."""
    pool = {"num_gpu_blocks": 799, "block_size": 16}
    steps = [StepSpec(c, requests=3 * c, prompt_tokens=1000, output_tokens=1) for c in (8, 13, 16, 24)]
    v = verdict_of(write_run(tmp_path / "run", steps, cache_config=pool))
    assert v.prediction is not None and not v.prediction.arithmetic.grows
    assert (v.prediction.band_low, v.prediction.levels_apart, v.prediction.disagrees) == (13, 0, False)
    assert "prediction_disagrees" not in kinds(v)
    text = {f.key: f.text for f in describe(v, recommend(v))}["prediction"]
    assert "no onset: the prompts a full pool admits leave room for their output" in text
    assert "(from 13)" in text
    assert "none observed up to 24: agrees" in text
    steps[2] = StepSpec(16, requests=48, preemptions=2, prompt_tokens=1000, output_tokens=1)
    v = verdict_of(write_run(tmp_path / "preempted", steps, cache_config=pool))
    assert v.prediction is not None and v.prediction.disagrees and "prediction_disagrees" in kinds(v)
    note = next(n.message for n in v.notes if n.kind == "prediction_disagrees")
    assert "observed onset 16 where the arithmetic (799 blocks × 16 tokens) expects none" in note


def test_long_prompts_with_short_outputs_are_not_a_disagreement(tmp_path: Path) -> None:
    """Seen on the simulator: 4000–7000 + 1–20 tokens on 799 blocks of 16 ran clean up to 16, and the
    verdict read "onset 2–3 … disagrees, 3 level(s) apart", confidence low. Here 2000 + 20 tokens take 125
    prompt and 127 peak blocks: a full pool admits 6 prompts, their growth fits its slack (762 ≤ 798), and
    the 7th queues."""
    pool = {"num_gpu_blocks": 799, "block_size": 16}
    steps = [StepSpec(c, requests=3 * c, prompt_tokens=2000, output_tokens=20) for c in (4, 8, 16, 24)]
    v = verdict_of(write_run(tmp_path / "run", steps, cache_config=pool))
    assert v.prediction is not None and not v.prediction.arithmetic.grows
    assert (v.prediction.band_low, v.prediction.levels_apart, v.prediction.disagrees) == (7, 0, False)
    assert "prediction_disagrees" not in kinds(v)
    text = {f.key: f.text for f in describe(v, recommend(v))}["prediction"]
    assert "no onset: the prompts a full pool admits leave room for their output" in text
    assert "(from 7)" in text and "none observed up to 24: agrees" in text
    # 755 usable blocks also admit 6 prompts, but their peaks need 762: the onset stands, none seen disagrees
    tight = {"num_gpu_blocks": 756, "block_size": 16}
    v = verdict_of(write_run(tmp_path / "tight", steps, cache_config=tight))
    assert v.prediction is not None and v.prediction.arithmetic.grows and v.prediction.disagrees


def test_a_server_capped_below_the_band_expects_no_onset(tmp_path: Path) -> None:
    """Seen on the simulator with --max-num-seqs 3: 200 + 3000 tokens on 829 blocks of 16 ran 3 at a time
    and clean up to 16, and the verdict read "onset 5–8 … no onset up to 16: disagrees, 2 level(s) apart",
    confidence low. vLLM runs at most max_num_seqs requests and queues the rest; 3 × 200 blocks fit 828."""
    pool = {"num_gpu_blocks": 829, "block_size": 16}
    steps = [StepSpec(c, requests=3 * c, prompt_tokens=200, output_tokens=3000) for c in (2, 4, 8, 16)]
    capped = {"served_with": "vllm serve m --max-num-seqs 3"}
    v = verdict_of(write_run(tmp_path / "run", steps, cache_config=pool, config=capped))
    assert v.prediction is not None and v.prediction.capped == 3 and not v.prediction.disagrees
    assert "prediction_disagrees" not in kinds(v)
    text = {f.key: f.text for f in describe(v, recommend(v))}["prediction"]
    assert "no onset: the server runs at most 3 requests at once (max_num_seqs) and 3 fit the pool" in text
    assert "(onset 5–8 without the cap)" in text and "none observed up to 16: agrees" in text
    # an onset seen all the same is a disagreement, with the cap as the reason the arithmetic gives
    steps[3] = StepSpec(16, requests=48, preemptions=2, prompt_tokens=200, output_tokens=3000)
    v = verdict_of(write_run(tmp_path / "preempted", steps, cache_config=pool, config=capped))
    assert v.prediction is not None and v.prediction.disagrees
    note = next(n.message for n in v.notes if n.kind == "prediction_disagrees")
    assert "expects none, since the server runs at most 3 requests at once" in note
    # a cap at or above the band's low end leaves the band as it was
    loose = {"served_with": "vllm serve m --max-num-seqs 5"}
    v = verdict_of(write_run(tmp_path / "loose", steps[:3], cache_config=pool, config=loose))
    assert v.prediction is not None and v.prediction.capped is None and v.prediction.band_low == 5
