"""A run with nothing to judge claims nothing it could not see, and says what happened to its requests.

Seen on a new user's pass: a ``python3 -m http.server`` that answered every request with a 501 read
"OOM / engine death: none" (✅ in report.md) and "Last safe concurrency: none (the lowest level already
broke, at 1)" beside "not judged" everywhere else; a run whose requests timed out at the client
(``--request-timeout-s 0.3``) while the server held 16 of them at 99 % KV usage read "the server was not
loaded" — as did a run of server errors while ``/metrics`` showed requests held.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from oomload.outcome import Outcome
from oomload.report.findings import NOT_JUDGED, describe
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.death import EngineDeath
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run


def _verdict(tmp: Path, outcome: Outcome, *, failed: int = 12, scrapes: int = 5) -> Verdict:
    steps = [
        StepSpec(c, requests=12, failures={outcome: failed}, scrapes=scrapes, kv_max=0.41) for c in (1, 2, 4)
    ]
    return build_verdict(load_run(write_run(tmp / "run", steps)))


def _findings(verdict: Verdict) -> dict[str, tuple[str, str]]:
    return {f.key: (f.text, f.severity) for f in describe(verdict, recommend(verdict))}


def test_a_run_of_server_errors_claims_no_death_no_last_safe_and_no_overflow(tmp_path: Path) -> None:
    verdict = _verdict(tmp_path, Outcome.SERVER_ERROR)
    assert verdict.failed_run is not None and verdict.engine_death is None
    found = _findings(verdict)
    for key in ("engine_death", "last_safe", "context_overflow"):
        assert found[key] == (NOT_JUDGED, "warn"), key


def test_a_death_in_a_run_of_failures_is_still_told(tmp_path: Path) -> None:
    """Only an event the run did not see is "not judged": a death it saw keeps its finding."""
    verdict = _verdict(tmp_path, Outcome.SERVER_ERROR)
    death = EngineDeath(step=0, concurrency=1, t_unix_s=None, evidence=("EngineDeadError",), real_oom=False)
    found = _findings(replace(verdict, engine_death=death))
    assert found["engine_death"][1] == "bad"
    assert found["last_safe"] == ("none (the lowest level already broke, at 1)", "bad")


def test_requests_that_timed_out_at_the_client_say_the_server_was_loaded(tmp_path: Path) -> None:
    verdict = _verdict(tmp_path, Outcome.TIMEOUT, failed=10)
    assert verdict.failed_run == (
        "30 of 36 requests failed (timeout 30): they timed out at the client (--request-timeout-s) while "
        "the server was loaded (it held up to 4 requests, KV usage up to 41%): their answers never came, "
        "so nothing about its memory can be judged"
    )
    assert "was not loaded" not in _findings(verdict)["run_status"][0]


def test_timeouts_with_no_scrape_name_the_client_timeout_alone(tmp_path: Path) -> None:
    verdict = _verdict(tmp_path, Outcome.TIMEOUT, scrapes=0)
    assert verdict.failed_run == (
        "36 of 36 requests failed (timeout 36): they timed out at the client (--request-timeout-s), so "
        "nothing about the server's memory can be judged"
    )


def test_failures_with_no_sign_of_load_say_the_server_was_not_loaded(tmp_path: Path) -> None:
    verdict = _verdict(tmp_path, Outcome.TRANSPORT_ERROR, scrapes=0)
    assert verdict.failed_run is not None
    assert verdict.failed_run.endswith("the server was not loaded, so nothing about its memory can be judged")


def test_server_errors_while_the_metrics_show_load_do_not_say_the_server_was_not_loaded(
    tmp_path: Path,
) -> None:
    """A run of 500s while ``/metrics`` showed requests held and KV in use: the server was loaded, and the
    sentence says so with what it held, as the timeouts' does."""
    verdict = _verdict(tmp_path, Outcome.SERVER_ERROR, failed=10)
    assert verdict.failed_run == (
        "30 of 36 requests failed (server_error 30): most failed while the server was loaded (it held up "
        "to 4 requests, KV usage up to 41%): too few answers came, so nothing about its memory can be judged"
    )


def test_the_load_told_is_the_failed_steps_and_an_idle_pool_is_no_load(tmp_path: Path) -> None:
    """A review found both: a ramp healthy at 1 and 2 (KV 90 %) that then failed quoted the healthy steps'
    KV usage beside the failures; and an idle pool's KV usage (vLLM counts its null block: 0.04 %)
    read "KV usage up to 0%" as load."""
    healthy = [StepSpec(c, requests=12, kv_max=0.9) for c in (1, 2)]
    failing = [StepSpec(c, requests=12, failures={Outcome.SERVER_ERROR: 12}, kv_max=0.2) for c in (4, 8, 16)]
    verdict = build_verdict(load_run(write_run(tmp_path / "ramp", healthy + failing)))
    assert verdict.failed_run is not None
    assert "KV usage up to 20%" in verdict.failed_run and "90%" not in verdict.failed_run

    idle = [StepSpec(c, requests=12, failures={Outcome.SERVER_ERROR: 12}, kv_max=0.0004) for c in (1, 2)]
    idle_verdict = build_verdict(load_run(write_run(tmp_path / "idle", idle)))
    assert idle_verdict.failed_run is not None
    assert "KV usage" not in idle_verdict.failed_run, idle_verdict.failed_run
