"""Fail closed: requests that failed are never evidence, and a run of failures is nothing to judge.

Issue 24, finding 1: a server that closed every stream mid-response made 100 % of the requests fail,
yet ``no-preemption-below`` and ``no-oom-up-to`` said PASS "(measured)" and the run exited 0 (also
with timeouts, 429s, 503s and malformed SSE). Here every failure kind a fault server produces (as the
outcome the client classifies it as) meets every kind of gate rule, on hand-built run directories:
no rule passes on a step whose requests mostly failed, and the run exits 3 whatever the rules say.
"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from oomload.errors import ExitCode
from oomload.outcome import Outcome
from oomload.report import finalize_run
from oomload.report.findings import NOT_JUDGED, describe
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import GateStatus, evaluate_gate, parse_gate
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from oomload.verdict.stepfacts import MIN_ANSWERED_SHARE
from runbuilder import T0, StepSpec, request, write_run

# how a fault server fails → the outcome the client names it (tests/integration/test_fail_closed.py
# checks the same mapping on the wire)
FAILURE_KINDS = {
    "stream-closed-mid-response": Outcome.TRANSPORT_ERROR,
    "connection-reset": Outcome.TRANSPORT_ERROR,
    "timeout": Outcome.TIMEOUT,
    "http-429": Outcome.RATE_LIMITED,
    "http-503": Outcome.RATE_LIMITED,  # not vLLM's own answer: a limit in front of it
    "vllm-busy": Outcome.ADMISSION_REJECTED,  # vLLM's queue limit
    "http-500-with-text": Outcome.SERVER_ERROR,
    "malformed-sse": Outcome.SERVER_ERROR,
    "context-overflow": Outcome.CONTEXT_OVERFLOW,
}
# turned away before they ran: a run of them is nothing to judge only when none ran (``stepfacts.ran_tally``)
TURNED_AWAY = {"http-429", "http-503", "vllm-busy"}
RULES = (
    # absence rules: every event
    "no-preemption-below:4",
    "no-preemption-below:2",
    "no-oom-up-to:4",
    "no-oom-up-to:2",
    "no-kv-saturation-up-to:4",
    "no-queueing-up-to:4",
    "no-errors-up-to:4",
    # thresholds at a level: latency, counts and peaks, rates, the error rate
    "p99-ttft-s@4<=2",
    "p50-e2e-ms@4<=100000",
    "max-kv-usage@4<0.95",
    "preemptions@4==0",
    "max-waiting@4<=0",
    "req-per-s@4>=0.01",
    "output-tokens-per-s@4>=0",
    "achieved-concurrency@4>=1",
    "error-rate@4<=0.5",
    # run-wide thresholds
    "error-rate<=60%",
    "max-kv-usage<0.95",
    "preemptions==0",
    "last-safe-concurrency>=2",
)
REQUESTS = 12
SHARES = {"all": REQUESTS, "mostly": 7}  # failed requests per step (7 of 12: just over half)


def _run(tmp: Path, outcome: Outcome, failed: int) -> Path:
    """Steps at 2 and 4, both completed and held, with clean /metrics (no preemption, KV 50 %), of
    which ``failed`` requests per step ended in ``outcome``."""
    steps = [StepSpec(c, requests=REQUESTS, failures={outcome: failed}) for c in (2, 4)]
    return write_run(tmp / f"{outcome.value}-{failed}", steps)


_VERDICTS: dict[tuple[str, int], tuple[Path, Verdict]] = {}


def _verdict(tmp_factory: pytest.TempPathFactory, kind: str, failed: int) -> tuple[Path, Verdict]:
    key = (kind, failed)
    if key not in _VERDICTS:
        run = _run(tmp_factory.mktemp(kind), FAILURE_KINDS[kind], failed)
        _VERDICTS[key] = (run, build_verdict(load_run(run)))
    return _VERDICTS[key]


@pytest.mark.parametrize("share", sorted(SHARES))
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("kind", sorted(FAILURE_KINDS))
def test_no_rule_passes_on_steps_whose_requests_mostly_failed(
    tmp_path_factory: pytest.TempPathFactory, kind: str, rule: str, share: str
) -> None:
    _, verdict = _verdict(tmp_path_factory, kind, SHARES[share])
    result = evaluate_gate(parse_gate(rule), verdict)
    assert result.status is not GateStatus.PASS, (kind, rule, result.reason)


@pytest.mark.parametrize("share", sorted(SHARES))
@pytest.mark.parametrize("kind", sorted(set(FAILURE_KINDS) - TURNED_AWAY))
def test_a_run_whose_requests_mostly_failed_exits_3_whatever_the_gates_say(
    tmp_path_factory: pytest.TempPathFactory, kind: str, share: str
) -> None:
    run, verdict = _verdict(tmp_path_factory, kind, SHARES[share])
    outcome = FAILURE_KINDS[kind].value
    failed = SHARES[share] * 2
    for rules in ((), RULES, ("no-preemption-below:2",), ("no-errors-up-to:4",), ("error-rate<=100%",)):
        out = io.StringIO()
        code = finalize_run(run, gates=rules, console=Console(file=out, width=200), formats=("json",))
        assert code is ExitCode.UNREACHABLE, (rules, out.getvalue())
    # the verdict says why in one line, naming the failures; confidence is low, never high
    reason = f"{failed} of {2 * REQUESTS} requests failed ({outcome} {failed})"
    assert verdict.failed_run is not None and verdict.failed_run.startswith(reason)
    findings = {f.key: f for f in describe(verdict, recommend(verdict))}
    assert findings["run_status"].text.startswith(f"NOTHING TO JUDGE: {reason}")
    assert findings["run_status"].severity == "bad"
    # no event it could not see reads "none" in green (seen on the real vLLM: 5,495 of 5,525 rejected)
    for key in ("preemption_onset", "kv_saturation", "queueing"):
        assert (findings[key].text, findings[key].severity) == (NOT_JUDGED, "warn"), key
    assert verdict.confidence == "low"
    assert "run_failed" in {n.kind for n in verdict.notes}
    assert f"NOTHING TO JUDGE: {reason}" in out.getvalue()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_code"] == 3
    assert summary["verdict"]["requests"]["failed_run"] == verdict.failed_run
    assert all(g["status"] != "pass" for g in summary["gates"])


@pytest.mark.parametrize("kind", sorted(TURNED_AWAY))
def test_a_run_turned_away_before_it_ran_is_nothing_to_judge_only_when_none_ran(
    tmp_path_factory: pytest.TempPathFactory, kind: str
) -> None:
    """Requests turned away before they ran — by a limit in front of the engine, or by vLLM's own queue
    limit, whose engine was full — say nothing of whether the server was loaded: seen on the real vLLM
    (``--max-num-seqs 2 --max-num-queued-reqs 2``, levels 4 and 12), 120 rejections beside 78 answers read
    "NOTHING TO JUDGE … the server was not loaded". A run of nothing else is still nothing to judge."""
    outcome = FAILURE_KINDS[kind].value
    run, verdict = _verdict(tmp_path_factory, kind, SHARES["all"])
    assert verdict.failed_run is not None
    assert verdict.failed_run.startswith("all 24 requests were turned away ")
    assert f"({outcome} 24" in verdict.failed_run and "run_failed" in {n.kind for n in verdict.notes}
    code = finalize_run(run, gates=RULES, console=Console(file=io.StringIO(), width=200), formats=())
    assert code is ExitCode.UNREACHABLE
    run, verdict = _verdict(tmp_path_factory, kind, SHARES["mostly"])  # 14 turned away, 10 answered
    assert verdict.failed_run is None and "run_failed" not in {n.kind for n in verdict.notes}
    assert not any(s.trusted for s in verdict.measured_steps)  # no rule passes on them (above)
    last_safe = {f.key: f for f in describe(verdict, recommend(verdict))}["last_safe"]
    if kind == "vllm-busy":  # rejected at the lowest level: a failure in an untrusted step is still one
        assert verdict.first_unsafe_concurrency == 2  # it read "unknown (no completed step with requests)"
        assert (last_safe.text, last_safe.severity) == ("none (the lowest level already broke, at 2)", "bad")
    else:  # the limit in front of the engine failed nothing: no level is unsafe, none vouched for
        assert verdict.first_unsafe_concurrency is None and last_safe.text.startswith("unknown: ")
    code = finalize_run(run, gates=(), console=Console(file=io.StringIO(), width=200), formats=())
    assert code is ExitCode.OK


def test_the_threshold_is_more_than_half(tmp_path: Path) -> None:
    """Half the requests failing (6 of 12) is still evidence: the steps are trusted, the rules judge."""
    assert MIN_ANSWERED_SHARE == 0.5
    run = _run(tmp_path, Outcome.TRANSPORT_ERROR, REQUESTS // 2)
    verdict = build_verdict(load_run(run))
    assert verdict.failed_run is None
    assert all(s.trusted and not s.mostly_failed for s in verdict.measured_steps)
    assert evaluate_gate(parse_gate("no-preemption-below:4"), verdict).status is GateStatus.PASS
    assert evaluate_gate(parse_gate("no-oom-up-to:4"), verdict).status is GateStatus.PASS
    code = finalize_run(run, gates=["no-preemption-below:4"], console=Console(file=io.StringIO()), formats=())
    assert code is ExitCode.OK


def test_one_failed_step_is_no_evidence_though_the_run_is(tmp_path: Path) -> None:
    """Level 2 answered everything, level 4 nothing: the run is judged (half its requests were
    answered), but nothing vouches for level 4, and its error rate fails a rule there."""
    steps = [
        StepSpec(2, requests=REQUESTS),
        StepSpec(4, requests=REQUESTS, failures={Outcome.TIMEOUT: REQUESTS}),
    ]
    run = write_run(tmp_path / "run", steps)
    verdict = build_verdict(load_run(run))
    assert verdict.failed_run is None
    step4 = verdict.steps[1]
    assert step4.mostly_failed and not step4.trusted
    assert step4.distrust == "step 1 (concurrency 4): 12 of 12 requests failed (timeout 12) — no evidence"
    results = {r: evaluate_gate(parse_gate(r), verdict) for r in ("no-preemption-below:4", "no-oom-up-to:4")}
    assert {r: x.status for r, x in results.items()} == {
        "no-preemption-below:4": GateStatus.NOT_EVALUATED,
        "no-oom-up-to:4": GateStatus.NOT_EVALUATED,
    }
    assert "12 of 12 requests failed (timeout 12)" in results["no-oom-up-to:4"].reason
    assert evaluate_gate(parse_gate("no-preemption-below:3"), verdict).status is GateStatus.PASS
    assert evaluate_gate(parse_gate("error-rate@4<=0.5"), verdict).status is GateStatus.FAIL
    assert evaluate_gate(parse_gate("max-kv-usage<0.95"), verdict).status is GateStatus.NOT_EVALUATED
    assert verdict.last_safe_concurrency == 2
    assert "requests_failed" in {n.kind for n in verdict.notes} and verdict.confidence != "high"
    out = io.StringIO()
    code = finalize_run(run, gates=["no-oom-up-to:4"], console=Console(file=out, width=200), formats=())
    assert code is ExitCode.GATE_NOT_EVALUATED


def test_a_step_a_limit_turned_away_leaves_rules_over_it_and_the_run_unjudged(tmp_path: Path) -> None:
    """Level 4 behind a gateway that turned most of its requests away (HTTP 429): its requests are not
    "mostly failed" — the engine failed none — so a run-wide rule read the levels below as the run's
    and passed ("max-kv-usage<0.95", PASS) on a run whose ramp the gateway had stopped. Now a rule over
    that level or the whole run is not evaluated, naming the limit; the levels below still pass."""
    steps = [
        StepSpec(2, requests=REQUESTS),
        StepSpec(4, requests=REQUESTS, failures={Outcome.RATE_LIMITED: 9}, error_text="http 429"),
    ]
    run = write_run(tmp_path / "run", steps, status={"finished": True, "end_reason": "rate_limited"})
    verdict = build_verdict(load_run(run))
    step4 = verdict.steps[1]
    assert step4.rate_limited and not step4.mostly_failed and not step4.trusted
    run_wide = evaluate_gate(parse_gate("max-kv-usage<0.95"), verdict)
    assert run_wide.status is GateStatus.NOT_EVALUATED
    assert "9 of 12 requests were turned away by a limit in front of the engine" in run_wide.reason
    assert evaluate_gate(parse_gate("no-oom-up-to:4"), verdict).status is GateStatus.NOT_EVALUATED
    assert evaluate_gate(parse_gate("no-preemption-below:3"), verdict).status is GateStatus.PASS


def test_failures_an_engine_death_explains_are_judged_by_the_gates(tmp_path: Path) -> None:
    """Every request of the death's step failed with the engine: that is the finding, not "nothing
    to judge" — the no-oom rule fails (1), as the README's precedence says."""
    steps = [
        StepSpec(2, requests=REQUESTS),
        StepSpec(4, requests=REQUESTS, failures={Outcome.ENGINE_DEAD: REQUESTS}),
    ]
    run = write_run(tmp_path / "run", steps)
    verdict = build_verdict(load_run(run))
    assert verdict.engine_death is not None and verdict.failed_run is None
    code = finalize_run(run, gates=["no-oom-up-to:4"], console=Console(file=io.StringIO()), formats=())
    assert code is ExitCode.GATE_FAILED


@pytest.mark.parametrize("gated", [False, True])
def test_junit_never_shows_a_run_of_failures_green(tmp_path: Path, gated: bool) -> None:
    """Level 2 clean (its rule passes), level 4 and 8 all timeouts: the run is nothing to judge (3),
    and junit.xml says so as an error, beside the rules or in place of the run finding."""
    steps = [StepSpec(2, requests=REQUESTS)] + [
        StepSpec(c, requests=REQUESTS, failures={Outcome.TIMEOUT: REQUESTS}) for c in (4, 8)
    ]
    run = write_run(tmp_path / "run", steps)
    rules = ["no-preemption-below:3"] if gated else []
    code = finalize_run(run, gates=rules, console=Console(file=io.StringIO()), formats=("junit",))
    assert code is ExitCode.UNREACHABLE
    root = ET.parse(run / "junit.xml").getroot()
    errors = {c.get("name"): c.find("error") for c in root.iter("testcase") if c.find("error") is not None}
    assert list(errors) == (["run"] if gated else ["run_status"])
    error = errors["run" if gated else "run_status"]
    assert error is not None and error.get("type") == "nothing_to_judge"
    assert (error.get("message") or "").startswith("24 of 36 requests failed (timeout 24)")
    assert root.get("errors") == "1"


def test_requests_refused_by_a_dead_server_are_the_death_not_nothing_to_judge(tmp_path: Path) -> None:
    """A kill -9 (seen in a --processes 2 drill): a few answers, the server dies at 4 s, then 20
    requests are refused after it had answered (engine_dead), at most one of them in flight at the
    death (a casualty). The death is the finding: the no-oom rule fails (1), not "nothing to judge" (3)."""
    refused = [
        request(f"refused-{i}", 0, 8, 4.2 + 0.2 * i, 4.25 + 0.2 * i, Outcome.ENGINE_DEAD) for i in range(20)
    ]
    events = [{"kind": "server_dead", "t_unix_s": T0 + 9.0, "evidence": "/health connection refused (2x)"}]
    steps = [StepSpec(8, requests=8, duration_s=10.0, in_flight=8)]
    run = write_run(tmp_path / "run", steps, extra_requests=refused, events=events)
    verdict = build_verdict(load_run(run))
    step = verdict.steps[0]
    assert verdict.engine_death is not None
    assert step.count(Outcome.ENGINE_DEAD) == 20 and step.casualties_of(Outcome.ENGINE_DEAD) <= 1
    assert not step.mostly_failed and verdict.failed_run is None
    code = finalize_run(run, gates=["no-oom-up-to:8"], console=Console(file=io.StringIO()), formats=())
    assert code is ExitCode.GATE_FAILED


def test_an_interrupted_replay_is_130_before_anything_else(tmp_path: Path) -> None:
    steps = [StepSpec(2, requests=REQUESTS, failures={Outcome.TRANSPORT_ERROR: REQUESTS})]
    run = write_run(tmp_path / "run", steps, status={"finished": False, "end_reason": "interrupted"})
    console = Console(file=io.StringIO())
    assert finalize_run(run, gates=["no-oom-up-to:2"], console=console, formats=()) is ExitCode.INTERRUPTED
    again = finalize_run(run, gates=["no-oom-up-to:2"], console=console, formats=(), reporting_only=True)
    assert again is ExitCode.UNREACHABLE


def test_a_run_refused_as_too_long_names_the_way_out(tmp_path: Path) -> None:
    """Seen on the simulator: a Mooncake trace at max_model_len 8192, 237 of 418 requests refused as
    too long. The trace, not the server, left nothing to judge: the sentence says how to replay what
    fits. Other failures get no such hint."""
    refused = build_verdict(load_run(_run(tmp_path, Outcome.CONTEXT_OVERFLOW, 7)))
    assert refused.failed_run is not None
    assert refused.failed_run.endswith(
        "nothing about its memory can be judged; --only-fitting replays only the requests within its "
        "max_model_len"
    )
    other = build_verdict(load_run(_run(tmp_path, Outcome.TRANSPORT_ERROR, 7)))
    assert other.failed_run is not None and "--only-fitting" not in other.failed_run


def test_answers_whose_usage_contradicts_the_request_are_named_and_judge_nothing(tmp_path: Path) -> None:
    """The hostile drill: 200s claiming 10¹² prompt tokens counted ok. They are server errors now
    (``oomload.load.classify``), and the verdict says what they were: a run of them is nothing to
    judge, its sentence says the usage disagreed, and a few of them are a finding of their own."""
    lie = "usage disagrees: prompt_tokens 1000000000000, 256 sent"
    spec = {"requests": REQUESTS, "error_text": lie}
    all_run = write_run(
        tmp_path / "all", [StepSpec(c, failures={Outcome.SERVER_ERROR: REQUESTS}, **spec) for c in (2, 4)]
    )
    verdict = build_verdict(load_run(all_run))
    assert verdict.usage_disagrees == 2 * REQUESTS
    assert verdict.failed_run == (
        f"24 of 24 requests failed (server_error 24 [{lie}]): 24 answers' usage contradicted the lengths "
        "sent (the "
        "server ran other lengths than the trace's or miscounts them — a proxy that rewrites prompts, "
        "max_tokens or usage (point --url at the vLLM server itself), or a server that is not vLLM), so "
        "the load was not the trace's and nothing about the server's memory under it can be judged"
    )
    findings = {f.key: f for f in describe(verdict, recommend(verdict))}
    assert findings["usage_disagrees"].severity == "bad"
    assert findings["usage_disagrees"].text.startswith(
        "24 of 24 answers reported other lengths than were sent, e.g. prompt_tokens 1000000000000, 256 "
        "sent; counted as server errors"
    )
    code = finalize_run(
        all_run, gates=["no-errors-up-to:4"], console=Console(file=io.StringIO()), formats=("json",)
    )
    assert code is ExitCode.UNREACHABLE
    summary = json.loads((all_run / "summary.json").read_text())
    assert summary["verdict"]["requests"]["usage_disagrees"] == 24

    few_run = write_run(
        tmp_path / "few", [StepSpec(c, failures={Outcome.SERVER_ERROR: 2}, **spec) for c in (2, 4)]
    )
    few = build_verdict(load_run(few_run))
    assert few.failed_run is None and few.usage_disagrees == 4
    assert "usage_disagrees" in {f.key for f in describe(few, recommend(few))}
    # other server errors are not called a disagreement
    other = build_verdict(load_run(_run(tmp_path, Outcome.SERVER_ERROR, 7)))
    assert other.usage_disagrees == 0 and other.failed_run is not None
    assert "usage contradicted" not in other.failed_run


def test_a_run_the_server_refused_with_http_400_points_at_the_token_ids(tmp_path: Path) -> None:
    """Token ids outside the model's vocabulary (``--token-id-range 130000:140000`` on a 128k vocabulary)
    make every prompt a 400: the sentence says what to check, not just that nothing was loaded."""
    refused = {Outcome.SERVER_ERROR: 4}
    steps = [
        StepSpec(c, requests=4, failures=refused, error_text="http 400: BadRequestError") for c in (1, 2)
    ]
    verdict = build_verdict(load_run(write_run(tmp_path / "r", steps)))
    assert verdict.failed_run is not None
    assert "8 were refused with a 400 (the request itself): every token id sent (--token-id-range" in (
        verdict.failed_run
    )
    # streamed, as oomload sends by default, the real vLLM refuses inside a 200: an event with code 400
    streamed = [
        StepSpec(c, requests=4, failures=refused, error_text="400 inside a 200 stream: BadRequestError")
        for c in (1, 2)
    ]
    failed_run = build_verdict(load_run(write_run(tmp_path / "s", streamed))).failed_run
    assert failed_run is not None and "8 were refused with a 400 (the request itself)" in failed_run
    other = [StepSpec(c, requests=4, failures=refused, error_text="http 500: Internal") for c in (1, 2)]
    failed = build_verdict(load_run(write_run(tmp_path / "o", other))).failed_run
    assert failed is not None and "--token-id-range" not in failed  # a 500 is the server's own failure
