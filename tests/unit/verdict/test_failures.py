"""Failed requests named by their reason, and the Run line of a run stopped by a step with no answer."""

from __future__ import annotations

from pathlib import Path

from oomload.outcome import Outcome, RequestResult, unanswered
from oomload.report.findings import describe
from oomload.verdict import build_verdict
from oomload.verdict.failures import failure_texts, outcome_count
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run


def _request(outcome: Outcome, error: str | None) -> RequestResult:
    return RequestResult("r", 0, 1, 0.0, 1.0, outcome, 32, 16, error=error)


def test_each_failed_outcome_is_named_by_its_most_common_reason() -> None:
    requests = [
        *[_request(Outcome.SERVER_ERROR, "http 500: InternalServerError")] * 5,
        _request(Outcome.SERVER_ERROR, "not json or an event stream"),
        # counts in the detail differ from request to request: the reason alone
        _request(Outcome.SERVER_ERROR, "usage disagrees: prompt_tokens 9, 8 sent"),
        *[_request(Outcome.TRANSPORT_ERROR, f"stream broke: EOF after {n}") for n in (1, 2, 3)],
        _request(Outcome.OK, None),
        _request(Outcome.CANCELLED, "cancelled"),  # not a failure
        _request(Outcome.TIMEOUT, None),  # no reason kept: left out
    ]
    texts = failure_texts(requests)
    assert texts == {
        "server_error": ("http 500: InternalServerError", 5),
        "transport_error": ("stream broke", 3),
    }
    assert outcome_count("server_error", 7, texts) == "server_error 7 [5 × http 500: InternalServerError]"
    assert outcome_count("transport_error", 3, texts) == "transport_error 3 [stream broke]"
    assert outcome_count("timeout", 2, texts) == "timeout 2"
    # a reason that is only the outcome's name again adds nothing
    assert outcome_count("timeout", 2, {"timeout": ("timeout", 2)}) == "timeout 2"


def test_unanswered_counts_failures_without_an_answer() -> None:
    outcomes = {"ok": 2, "truncated": 3, "engine_dead": 1, "cancelled": 4, "server_error": 5, "timeout": 6}
    assert unanswered(outcomes) == (11, 17)  # cancelled requests did not end


def test_a_run_stopped_by_a_step_with_no_answer_says_where(tmp_path: Path) -> None:
    http_500 = {"failures": {Outcome.SERVER_ERROR: 12}, "error_text": "http 500: ServiceError"}
    run = write_run(
        tmp_path / "run",
        [StepSpec(1), StepSpec(2), StepSpec(4, end_reason="no_answer", **http_500)],  # type: ignore[arg-type]
        status={"finished": True, "end_reason": "no_answer", "ended_unix_s": 2e9},
    )
    verdict = build_verdict(load_run(run))
    findings = {f.key: f for f in describe(verdict, recommend(verdict))}
    assert findings["run_status"].text == (
        "complete: the run stopped at concurrency 4 (step 2): no request that ended there was answered, "
        "so more load would only send more of the same (Failed requests)"
    )
    assert findings["run_status"].severity == "warn"
    assert findings["failed_requests"].text.startswith(
        "12 of 36: server_error 12 [http 500: ServiceError]; first at concurrency 4"
    )
    assert verdict.to_json()["requests"]["top_errors"] == {
        "server_error": {"error": "http 500: ServiceError", "requests": 12}
    }


def test_a_step_whose_requests_mostly_failed_is_not_also_called_not_held(tmp_path: Path) -> None:
    """Requests that fail at once leave few in flight: 0.5 of 1 read as "the load generator held 0.5 …:
    not trusted" beside "1875 of 1875 failed", as if the client were the trouble. The failures say it."""
    failing = {"failures": {Outcome.SERVER_ERROR: 12}, "error_text": "http 503", "in_flight": 1}
    run = write_run(tmp_path / "run", [StepSpec(1), StepSpec(2), StepSpec(8, **failing)])  # type: ignore[arg-type]
    verdict = build_verdict(load_run(run))
    step = verdict.steps[2]
    assert step.mostly_failed and step.concurrency_held is False
    assert [n.kind for n in verdict.notes if n.step == 2] == ["requests_failed"]
    findings = {f.key: f for f in describe(verdict, recommend(verdict))}
    assert "not held" not in findings["load_delivered"].text
    # nothing to judge at all: not judged, never "every level held"
    nothing = write_run(tmp_path / "nothing", [StepSpec(1, **failing)])  # type: ignore[arg-type]
    verdict = build_verdict(load_run(nothing))
    findings = {f.key: f for f in describe(verdict, recommend(verdict))}
    assert findings["load_delivered"].text.startswith("not judged")


def test_a_limit_in_front_of_the_engine_is_named_and_its_level_is_no_evidence(tmp_path: Path) -> None:
    """A gateway that admits 4 at a time, at level 8: its 429s read "server_error" like the engine's
    own failures, the ramp went on, and the advice capped max_num_seqs at the level below the gateway's
    limit. Now the level is untrusted (not unsafe: the engine did not fail), the Run line says where the
    ramp stopped, and the Rate limit finding says what the 429s were."""
    limited = {
        "failures": {Outcome.RATE_LIMITED: 20},
        "requests": 24,
        "error_text": "http 429: rate_limit_error",
        "in_flight": 4,
    }
    run = write_run(
        tmp_path / "run",
        [StepSpec(1), StepSpec(2), StepSpec(4), StepSpec(8, **limited)],  # type: ignore[arg-type]
        status={"finished": True, "end_reason": "rate_limited", "ended_unix_s": 2e9},
    )
    verdict = build_verdict(load_run(run))
    step = verdict.steps[3]
    assert step.rate_limited and not step.trusted and not step.mostly_failed
    assert verdict.failed_run is None  # levels 1 to 4 were measured: the run is judged on them
    assert verdict.first_unsafe_concurrency is None and verdict.last_safe_concurrency == 4
    assert [n.kind for n in verdict.notes if n.step == 3] == ["rate_limited"]
    findings = {f.key: f for f in describe(verdict, recommend(verdict))}
    assert findings["run_status"].text == (
        "complete: the run stopped at concurrency 8 (step 3): a limit in front of the engine turned requests "
        "away there, so the levels above would measure it (Rate limit)"
    )
    assert findings["rate_limited"].text.startswith(
        "20 of 60 requests turned away (rate_limited 20 [http 429: rate_limit_error]) from concurrency 8, "
        "so the load there did not reach the engine"
    )
    assert "point --url at the vLLM server itself" in findings["rate_limited"].text
    assert "failed_requests" not in findings and "not held" not in findings["load_delivered"].text
    assert "--max-num-seqs" not in recommend(verdict).flag_line  # no failure of the engine to cap
    assert verdict.to_json()["requests"]["rate_limited"] == 20


def test_a_run_whose_every_request_was_turned_away_has_nothing_to_judge(tmp_path: Path) -> None:
    limited = {"failures": {Outcome.RATE_LIMITED: 12}, "error_text": "http 429: rate_limit_error"}
    run = write_run(
        tmp_path / "run",
        [StepSpec(1, end_reason="no_answer", **limited)],  # type: ignore[arg-type]
        status={"finished": True, "end_reason": "no_answer", "ended_unix_s": 2e9},
    )
    verdict = build_verdict(load_run(run))
    assert verdict.failed_run is not None
    assert verdict.failed_run.startswith(
        "all 12 requests were turned away (rate_limited 12 [http 429: rate_limit_error]), "
        "so none reached the engine"
    )
    findings = {f.key: f for f in describe(verdict, recommend(verdict))}
    assert findings["run_status"].text.startswith("NOTHING TO JUDGE: all 12 requests were turned away")
    assert findings["run_status"].text.endswith("so more load would only send more of the same (Rate limit)")
