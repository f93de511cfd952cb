"""Engine death: the moment, the casualties in flight, and what they must not be charged to."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from oomload.outcome import Outcome
from oomload.report.findings import describe
from oomload.report.steptable import step_row
from oomload.report.terminal import step_table
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import GateStatus, evaluate_gate, parse_gate
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import T0, StepSpec, request, write_run

DEAD = Outcome.ENGINE_DEAD
RESET = Outcome.TRANSPORT_ERROR


def _died(path: Path, server_share: float | None = None) -> Verdict:
    """Steps 1, 2, 4 (0–10 s, 10–20 s, 20–30 s), a refine step at 3 (30–40 s); the server dies at 27 s.

    In flight at the death: one request from step 1 (started 19 s), two from step 2. A new request
    at 27.5 s is refused. An earlier, unrelated reset at 3 s is a real client transport error.
    """
    steps = [
        StepSpec(1, server_share=server_share),
        StepSpec(2, server_share=server_share),
        StepSpec(4, requests=0, server_share=server_share),
        StepSpec(3, requests=0, phase="refine", server_share=server_share),
    ]
    extra = [
        request("early-reset", 0, 1, 3.0, 3.5, RESET),
        request("from-step-1", 1, 2, 19.0, 27.0, RESET),
        request("ok-a", 2, 4, 20.0, 24.0),
        request("ok-b", 2, 4, 20.5, 24.5),
        request("stream-cut", 2, 4, 22.0, 27.0, Outcome.TRUNCATED),
        request("reset-4", 2, 4, 23.0, 27.05, RESET),
        request("refused", 2, 4, 27.5, 27.6, DEAD),
        request("after", 3, 3, 31.0, 31.1, DEAD),
    ]
    events = [{"kind": "server_dead", "t_unix_s": T0 + 28.0, "evidence": "/health connection refused (2x)"}]
    return build_verdict(load_run(write_run(path, steps, extra_requests=extra, events=events)))


@pytest.fixture(scope="module")
def died(tmp_path_factory: pytest.TempPathFactory) -> Verdict:
    return _died(tmp_path_factory.mktemp("died") / "run")


def test_death_moment_is_the_first_break_and_lands_in_its_step(died: Verdict) -> None:
    death = died.engine_death
    assert death is not None
    assert death.t_unix_s == T0 + 27.0  # the streams broke before the refused request and /health
    assert (death.step, death.concurrency) == (2, 4)
    assert not death.real_oom


def test_requests_in_flight_at_the_death_are_its_casualties(died: Verdict) -> None:
    death = died.engine_death
    assert death is not None
    assert death.casualty_ids == {"from-step-1", "stream-cut", "reset-4", "refused"}
    assert death.casualties == 4
    assert dict(death.casualty_outcomes) == {"transport_error": 2, "truncated": 1, "engine_dead": 1}
    assert death.evidence[-1] == (
        "4 request(s) in flight failed with it (engine_dead 1, transport_error 2, truncated 1)"
    )
    text = next(f.text for f in describe(died, recommend(died)) if f.key == "engine_death")
    assert "4 request(s) in flight failed with it" in text


def test_the_terminal_wraps_a_casualty_cell_rather_than_cut_the_last_column(tmp_path: Path) -> None:
    # with vLLM's own running count (srv) beside device memory, "0 (+1 at death)" took the table past 80
    verdict = _died(tmp_path / "run", server_share=0.9)
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(step_table(verdict))
    text = out.getvalue()
    assert "srv" in text and "dev GiB" in text and "…" not in text
    assert max(map(len, text.splitlines())) <= 80


def test_a_casualty_is_not_charged_to_the_step_it_started_in(died: Verdict) -> None:
    step1 = died.steps[1]
    assert step1.count(RESET) == 1 and dict(step1.casualties) == {"transport_error": 1}
    assert (step1.error_requests, step1.unsafe_requests, step1.error_rate) == (0, 0, 0.0)
    assert step_row(step1)[5] == "0 (+1 at death)"
    assert evaluate_gate(parse_gate("error-rate@2<=0"), died).status is GateStatus.PASS
    assert died.last_safe_concurrency == 2
    # the death step is charged: its error rate fails a gate at its level
    step2 = died.steps[2]
    assert step2.died_here and step2.error_requests == 3
    assert evaluate_gate(parse_gate("error-rate@4<=0.5"), died).status is GateStatus.FAIL
    assert evaluate_gate(parse_gate("no-oom-up-to:4"), died).status is GateStatus.FAIL
    assert evaluate_gate(parse_gate("no-oom-up-to:2"), died).status is GateStatus.PASS


def test_a_stream_the_death_broke_is_neither_clamped_nor_short(died: Verdict) -> None:
    ctx = died.context_overflow
    assert (ctx.clamped, ctx.short_responses) == (0, 0)
    assert "context_overflow" in {f.key for f in describe(died, recommend(died))}
    assert "short_responses" not in {f.key for f in describe(died, recommend(died))}


def test_only_independent_transport_errors_are_noted(died: Verdict) -> None:
    noted = {n.step for n in died.notes if n.kind == "transport_errors"}
    assert noted == {0}


def test_a_step_after_the_death_is_left_out(died: Verdict) -> None:
    refine = died.steps[3]
    assert refine.after_death and refine.count(DEAD) == 1
    assert died.levels == (1, 2, 4)
    assert all(s.index != 3 for s in died.measured_steps)
    assert ("after_death", 3) in {(n.kind, n.step) for n in died.notes}
    assert step_row(refine)[0] == "3†"


def test_a_reset_long_before_the_death_is_not_a_casualty(tmp_path: Path) -> None:
    """Ok answers after the reset show the server lived on: the reset is the client's."""
    steps = [StepSpec(1), StepSpec(2, failures={RESET: 1}), StepSpec(4, failures={DEAD: 2})]
    v = build_verdict(load_run(write_run(tmp_path / "run", steps)))
    assert v.engine_death is not None and v.engine_death.concurrency == 4
    assert v.steps[1].casualties == {} and v.steps[1].error_requests == 1
    assert "s1-r0" not in v.engine_death.casualty_ids
    assert v.engine_death.casualty_ids == {"s2-r0", "s2-r1"}
    assert v.last_safe_concurrency == 2  # a client transport error does not make a level unsafe


def test_health_failures_alone_are_no_death(tmp_path: Path) -> None:
    events = [{"kind": "health_failed", "t_unix_s": T0 + 5.0, "detail": "HTTP 500"}]
    v = build_verdict(load_run(write_run(tmp_path / "run", [StepSpec(1), StepSpec(2)], events=events)))
    assert v.engine_death is None
    assert v.last_safe_concurrency == 2


def _gpu_lines(run: Path, samples: list[tuple[float, int, list[int] | None]]) -> None:
    """Replace the run's GPU samples: (seconds after T0, device, pids listed or None: cannot tell)."""
    lines = [
        {
            "t_unix_s": T0 + t,
            "source": "nvml",
            "device": device,
            "total_bytes": 80 << 30,
            "used_bytes": 40 << 30,
            "free_bytes": 40 << 30,
            "util_pct": None,
            "processes": None if pids is None else [{"pid": pid, "used_bytes": 30 << 30} for pid in pids],
        }
        for t, device, pids in samples
    ]
    (run / "gpu.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize(
    ("samples", "dead"),
    [
        ([(1, 0, [4242]), (5, 0, [4242]), (12, 0, [])], True),  # gone from the device it was on
        ([(1, 0, [4242]), (5, 0, None), (12, 0, [4242])], False),  # NVML could not tell once
        ([(1, 0, [4242]), (1, 1, []), (12, 0, [4242]), (12, 1, [])], False),  # a GPU it never used
        ([(1, 0, [4242]), (1, 1, [4242]), (12, 0, [4242]), (12, 1, [])], True),  # one of its two GPUs
    ],
    ids=["vanished", "null-is-no-evidence", "other-device", "tensor-parallel-half"],
)
def test_the_server_vanishes_only_from_a_device_it_was_on_that_listed_its_processes(
    tmp_path: Path, samples: list[tuple[float, int, list[int] | None]], dead: bool
) -> None:
    run = write_run(tmp_path / "run", [StepSpec(1), StepSpec(2)])
    _gpu_lines(run, samples)
    death = build_verdict(load_run(run)).engine_death
    assert (death is not None) is dead, death
    if dead:
        assert death is not None and any("vanished from the GPU samples (device" in e for e in death.evidence)


def test_a_larger_process_of_another_job_leaving_the_gpu_is_no_death(tmp_path: Path) -> None:
    """A shared GPU: the server (pid 4242, 36 GiB) beside another job's process (777, 40 GiB) that
    exits 12 s in. The largest process is not known to be the server's, so its going is no death;
    once the server is seen dead (a server_dead event) it is listed, named as what it is."""
    run = write_run(tmp_path / "run", [StepSpec(1), StepSpec(2), StepSpec(4)])
    lines = []
    for t in range(0, 30, 2):
        procs = [{"pid": 4242, "used_bytes": 36 << 30}] + (
            [{"pid": 777, "used_bytes": 40 << 30}] if t < 12 else []
        )
        lines.append(
            {"t_unix_s": T0 + t, "source": "nvml", "device": 0, "total_bytes": 80 << 30,
             "used_bytes": 76 << 30, "free_bytes": 4 << 30, "util_pct": None, "processes": procs}
        )  # fmt: skip
    (run / "gpu.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert build_verdict(load_run(run)).engine_death is None
    with (run / "events.jsonl").open("a") as events:
        events.write(
            json.dumps({"t_unix_s": T0 + 25, "kind": "server_dead", "text": ["health failed 3x"]}) + "\n"
        )
    death = build_verdict(load_run(run)).engine_death
    assert death is not None and death.step == 2
    assert "the largest GPU process, 777 vanished from the GPU samples (device 0)" in death.evidence
