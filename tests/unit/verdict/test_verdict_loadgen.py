"""A step the client could not send is called the load generator's, in the verdict and every renderer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oomload.report.findings import describe
from oomload.verdict import build_verdict
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, StepSpec, write_run


def _loadgen(wait_share: float, lag_ms: float) -> dict[str, Any]:
    return {
        "loadgen": [
            {
                "duration_s": 10.0,
                "cpu_s": 0.4,
                "cpu_wait_s": 10.0 * wait_share,
                "cpu_wait_share": wait_share,
                "loop_lag_max_ms": lag_ms,
                "loop_lag_p99_ms": lag_ms / 2,
            }
        ]
    }


def _verdict(tmp_path: Path, steps: list[StepSpec]) -> Any:
    return build_verdict(load_run(write_run(tmp_path / "run", steps, cache_config=CPU_CACHE)))


def test_a_starved_step_is_named_with_what_to_do(tmp_path: Path) -> None:
    steps = [
        StepSpec(2, requests=24, end_extra=_loadgen(0.04, 3.0)),
        StepSpec(8, requests=24, in_flight=3, end_extra=_loadgen(0.93, 210.0)),
    ]
    verdict = _verdict(tmp_path, steps)
    s8 = verdict.steps[1]
    assert s8.concurrency_held is False and len(s8.loadgen) == 1
    line = (
        "the load generator was starved in step 1 (waited 93 % of the step for a CPU; loop lag up to "
        "210 ms): more --processes, a separate load host, --workers, or a server here at nice -n 10"
    )
    findings = {f.key: f for f in describe(verdict, recommend(verdict))}
    assert findings["load_generator"].text == line and findings["load_generator"].severity == "warn"
    notes = [n for n in verdict.notes if n.kind == "loadgen_starved"]
    assert [(n.step, n.message) for n in notes] == [(1, line)]
    steps_json = verdict.to_json()["steps"]
    assert steps_json[1]["starved"] == {"wait_share": 0.93, "loop_lag_max_ms": 210.0, "worker": None}
    assert steps_json[1]["loadgen"][0]["cpu_wait_share"] == 0.93
    assert steps_json[0]["starved"] is None and steps_json[0]["loadgen"][0]["cpu_wait_share"] == 0.04


def test_a_step_the_client_sent_but_did_not_hold_is_not_called_starved(tmp_path: Path) -> None:
    """Not held, but the client had its CPU: the server's (or the trace's) doing, no starvation claim."""
    steps = [StepSpec(2, requests=24), StepSpec(8, requests=24, in_flight=3, end_extra=_loadgen(0.05, 4.0))]
    verdict = _verdict(tmp_path, steps)
    assert verdict.steps[1].concurrency_held is False
    assert "load_generator" not in {f.key for f in describe(verdict, recommend(verdict))}
    assert not [n for n in verdict.notes if n.kind == "loadgen_starved"]


def test_a_held_step_is_not_called_starved_whatever_the_client_waited(tmp_path: Path) -> None:
    steps = [StepSpec(2, requests=24, end_extra=_loadgen(0.67, 16.0))]
    verdict = _verdict(tmp_path, steps)
    assert verdict.steps[0].concurrency_held is True
    assert "load_generator" not in {f.key for f in describe(verdict, recommend(verdict))}
    assert verdict.to_json()["steps"][0]["starved"] is None


def test_an_old_run_directory_without_the_figures_still_loads(tmp_path: Path) -> None:
    verdict = _verdict(tmp_path, [StepSpec(2, requests=24), StepSpec(8, requests=24, in_flight=3)])
    assert [s.loadgen for s in verdict.steps] == [(), ()]
    assert list(verdict.to_json()["steps"][1]["loadgen"]) == []
    assert "load_generator" not in {f.key for f in describe(verdict, recommend(verdict))}


def test_a_starved_clients_queue_in_vllm_is_named_but_still_holds_its_level(tmp_path: Path) -> None:
    """Requests waited in vLLM through the step, but the client was starved: its scrapes may have seen
    its own burst of late sends. The step says so (``starvation``); whether the level is held stays the
    saturation rule's (the tuner reads it; changing it is issue 32's tuner work)."""

    def saturated(wait_share: float, lag_ms: float) -> StepSpec:
        extra = _loadgen(wait_share, lag_ms)
        return StepSpec(8, requests=64, server_share=0.5, waiting_max=3, peak_scrapes=3, end_extra=extra)

    steps = [StepSpec(2, requests=24, server_share=0.95), saturated(0.96, 148.0), saturated(0.04, 3.0)]
    verdict = _verdict(tmp_path, steps)
    starved, fed = verdict.steps[1], verdict.steps[2]
    assert starved.server_saturated and fed.server_saturated
    assert starved.client_starved and starved.held_by_saturation
    assert starved.concurrency_held is True and starved.starvation is not None
    assert fed.concurrency_held is True and fed.held_by_saturation and fed.starvation is None
