"""The server's own evidence in the verdict: its memory per step, its log and exit status naming the
death's kind, and a soak's trend — run directories laid out as a replay writes them."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oomload.outcome import Outcome
from oomload.report.findings import describe
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import GateStatus, evaluate_gate, parse_gate
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import T0, StepSpec, request, write_run

GIB = 2**30
LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "server-logs"


def _memory(
    path: Path, samples: Sequence[tuple[float, int, bool]], limit: int | None = None, **extra: Any
) -> None:
    with open(path / "server_memory.jsonl", "w") as fh:
        for t, used, alive in samples:
            line = {
                "t_unix_s": T0 + t,
                "source": "local",
                "pid": 4242,
                "processes": 3 if alive else 0,
                "rss_bytes": used if alive else 0,
                "pss_bytes": None,
                "cgroup": None if limit is None else "v2:/pod/vllm",
                "cgroup_current_bytes": None if limit is None else used,
                "cgroup_limit_bytes": limit,
                "cgroup_peak_bytes": None,
                "cgroup_oom_kill": extra.get("oom_kill", {}).get(t, 0) if limit is not None else None,
                "cgroup_events_max": None,
                "alive": alive,
            }
            if "data_limit" in extra:  # the worker, nearest its data limit, holds 0.7 of the tree
                line["data_bytes"] = int(used * 0.7) if alive else 0
                line["data_limit_bytes"] = extra["data_limit"]
            fh.write(json.dumps(line) + "\n")


def _died(
    tmp_path: Path, *, log: str | None, exit_status: int | None, limit: int | None = None, **extra: Any
) -> Verdict:
    """Steps 1, 2, 4 of 10 s each; the server dies at 27 s in the step at 4."""
    steps = [StepSpec(1), StepSpec(2), StepSpec(4, requests=0)]
    extra_requests = [
        request("in-flight", 2, 4, 22.0, 27.0, Outcome.ENGINE_DEAD),
        request("ok", 2, 4, 20.0, 24.0),
    ]
    events = [{"kind": "server_dead", "t_unix_s": T0 + 27.5, "evidence": "/health HTTP 503"}]
    run = write_run(tmp_path / "run", steps, extra_requests=extra_requests, events=events, gpu=False)
    used = [(t * 0.5, int((1.7 + 0.01 * t * 0.5) * GIB), t * 0.5 < 27.2) for t in range(60)]
    _memory(run, used, limit, **extra)
    if log is not None:
        (run / "server.log").write_text(log)
    if exit_status is not None:
        (run / "server_exit.json").write_text(json.dumps({"pid": 4242, "exit_status": exit_status}))
    return build_verdict(load_run(run))


def test_a_cpu_allocation_in_the_log_names_the_kind_the_size_and_the_memory_of_the_step(
    tmp_path: Path,
) -> None:
    v = _died(tmp_path, log=(LOGS / "cpu-oom-0.32.txt").read_text(), exit_status=0)
    death = v.engine_death
    assert death is not None and death.cause is not None
    assert (death.concurrency, death.kind, death.memory) == (4, "cpu_oom", True)
    assert death.cause.tried_bytes == 57346048
    assert v.server_memory is not None and v.server_memory.samples == 60
    text = next(f.text for f in describe(v, recommend(v)) if f.key == "engine_death")
    assert text.startswith(
        "engine death (OOM) at concurrency 4 — an activation peak: the CPU allocator could"
    )
    assert "the server's memory rose from 1.9 to 2.0 GiB over step 2" in text
    rule = parse_gate("no-oom-up-to:4")
    result = evaluate_gate(rule, v)
    assert result.status is GateStatus.FAIL and "an OOM (an activation peak" in result.reason


def test_a_cpu_allocation_under_a_data_limit_names_the_limit_not_no_limit(tmp_path: Path) -> None:
    """``prlimit --data`` as the memory-death harness runs it: no cgroup limit, a per-process one. The
    finding states it beside the tree's peak, and the advice names it instead of "check the limit"."""
    limit = int(1.45 * GIB)
    v = _died(tmp_path, log=(LOGS / "cpu-oom-0.32.txt").read_text(), exit_status=0, data_limit=limit)
    memory = next(f for f in describe(v, recommend(v)) if f.key == "server_memory")
    said = "(no cgroup limit, each process's data limit 1.4 GiB, the fullest at 1.4 GiB (95%); 60 samples)"
    assert said in memory.text
    assert "no limit;" not in memory.text
    assert memory.severity == "warn"  # the fullest process within NEAR_LIMIT_SHARE of its limit
    reasoning = recommend(v).reasoning
    assert "ran out under a per-process data limit (each process's data limit 1.4 GiB" in reasoning
    assert "check the process or container limit" not in reasoning
    assert v.server_memory is not None and v.server_memory.to_json()["data_limit_bytes"] == limit


def test_a_silent_sigkill_at_the_containers_limit_is_the_kernels_oom_kill(tmp_path: Path) -> None:
    limit = int(1.95 * GIB)
    v = _died(tmp_path, log="INFO: serving\n", exit_status=-9, limit=limit, oom_kill={27.0: 1})
    death = v.engine_death
    assert death is not None and death.kind == "oom_killed" and death.memory
    rec = recommend(v)
    assert "raise its container's memory limit" in rec.reasoning
    assert rec.max_num_batched_tokens.value is None  # not an activation peak
    memory = next(f for f in describe(v, rec) if f.key == "server_memory")
    assert memory.severity == "bad" and "OOM killer fired 1×" in memory.text


def test_a_crash_that_is_not_memory_fails_the_oom_gate_with_its_own_sentence(tmp_path: Path) -> None:
    v = _died(tmp_path, log=(LOGS / "nccl-error.txt").read_text(), exit_status=1)
    death = v.engine_death
    assert death is not None and death.kind == "crash" and not death.memory
    result = evaluate_gate(parse_gate("no-oom-up-to:8"), v)
    assert result.status is GateStatus.FAIL
    assert "an engine death that was not of memory (a crash:" in result.reason
    assert recommend(v).gpu_memory_utilization.value is None


def test_a_death_with_no_log_says_where_the_cause_would_come_from(tmp_path: Path) -> None:
    v = _died(tmp_path, log=None, exit_status=None)
    death = v.engine_death
    assert death is not None and death.kind == "no_cause"
    result = evaluate_gate(parse_gate("no-oom-up-to:8"), v)
    assert result.status is GateStatus.FAIL and "--serve or --server-log" in result.reason


def _soak(tmp_path: Path, slope_bytes_per_s: float, limit: int | None, *, fill_bytes: float = 0.0) -> Verdict:
    """10 minutes at one sample each 2 s: 1.5 GiB, a slope, ``fill_bytes`` approached with a time constant
    of 70 s (a cache filling up), and a 0–6 MiB sawtooth."""
    steps = [StepSpec(4, duration_s=600.0)]
    run = write_run(tmp_path / "soak", steps, gpu=False, config={"soak_s": 600.0})

    def used(i: int) -> int:
        s = 2.0 * i
        return int(
            1.5 * GIB + slope_bytes_per_s * s + fill_bytes * (1 - math.exp(-s / 70.0)) + (i % 7) * 2**20
        )

    samples = [(2.0 * i, used(i), True) for i in range(300)]
    _memory(run, samples, limit)
    return build_verdict(load_run(run))


def test_a_soak_with_a_steady_server_raises_no_alarm(tmp_path: Path) -> None:
    v = _soak(tmp_path, 0.0, limit=4 * GIB)
    (trend,) = v.memory_trends
    assert trend.verdict == "flat", trend.sentence
    finding = next(f for f in describe(v, recommend(v)) if f.key == "memory_trend_0")
    assert finding.severity == "ok" and "flat within" in finding.text


def test_a_soak_with_a_leak_finds_it_and_projects_the_limit(tmp_path: Path) -> None:
    leak = 200 * 2**20 / 3600  # 200 MiB/h
    v = _soak(tmp_path, leak, limit=4 * GIB)
    (trend,) = v.memory_trends
    assert trend.verdict == "growing", trend.sentence
    assert trend.ci_low_bytes_per_h is not None and trend.ci_high_bytes_per_h is not None
    assert trend.ci_low_bytes_per_h <= 200 * 2**20 <= trend.ci_high_bytes_per_h
    assert trend.projected_s_to_limit is not None
    # 4 GiB − (1.5 GiB + 600 s of growth) at 200 MiB/h ≈ 12.6 h
    assert abs(trend.projected_s_to_limit / 3600 - 12.6) < 1.5
    finding = next(f for f in describe(v, recommend(v)) if f.key == "memory_trend_0")
    assert finding.severity == "bad"


def test_a_soak_whose_memory_levels_off_says_so_and_is_no_leak(tmp_path: Path) -> None:
    v = _soak(tmp_path, 0.0, limit=4 * GIB, fill_bytes=150 * 2**20)
    (trend,) = v.memory_trends
    assert trend.verdict == "levelled", trend.sentence
    assert trend.rise is not None and trend.rise.slope_bytes_per_h > trend.material_bytes_per_h
    finding = next(f for f in describe(v, recommend(v)) if f.key == "memory_trend_0")
    assert finding.severity == "info" and finding.text == trend.sentence
    assert re.search(r" then (levelled off:|slowed to) .* below the material 41 MiB/h$", finding.text), (
        finding.text
    )
    (data,) = v.to_json()["memory_trends"]
    assert data["verdict"] == "levelled" and data["rise"]["slope_bytes_per_h"] == trend.rise.slope_bytes_per_h


def test_a_run_that_is_no_soak_has_no_trend(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", [StepSpec(1), StepSpec(2)], gpu=False)
    _memory(run, [(t, GIB + t * 2**20, True) for t in range(20)])
    assert build_verdict(load_run(run)).memory_trends == ()


def test_a_death_that_was_not_memory_caps_nothing_and_a_kill_from_outside_lowers_confidence(
    tmp_path: Path,
) -> None:
    """README: a kill from outside, a crash or no known cause get no memory advice — no ``max_num_seqs``
    cut either (a kill says nothing about how many sequences fit). A kill is not the load's finding: the
    levels it cut off were not measured, so the run reads cut short and the verdict is not "high"."""
    said = {
        "killed": "killed from outside by SIGKILL",
        "crash": "a crash:",
        "no_cause": "of no known cause (give oomload the server's log",
    }
    for kind, log, exit_status in (
        ("killed", "INFO: serving\n", -9),
        ("crash", (LOGS / "nccl-error.txt").read_text(), 1),
        ("no_cause", None, None),
    ):
        v = _died(tmp_path / kind, log=log, exit_status=exit_status)
        assert v.engine_death is not None and v.engine_death.kind == kind and not v.engine_death.memory
        rec = recommend(v)
        assert rec.max_num_seqs.value is None, kind
        assert rec.max_num_seqs.reason.startswith("nothing broke below the engine's death at 4, and it was")
        assert said[kind] in rec.max_num_seqs.reason
        assert "--max-num-seqs" not in rec.flag_line
        cut = [n.severity for n in v.notes if n.kind == "cut_short"]
        assert cut == (["warning"] if kind == "killed" else ["info"]), kind
        if kind == "killed":
            assert v.confidence != "high"


def test_a_memory_death_still_caps_at_the_last_safe_level(tmp_path: Path) -> None:
    limit = int(1.95 * GIB)
    v = _died(tmp_path, log="INFO: serving\n", exit_status=-9, limit=limit, oom_kill={27.0: 1})
    rec = recommend(v)
    assert rec.max_num_seqs.value == 2 and "--max-num-seqs 2" in rec.flag_line
