"""The verdict on load delivered: a level the server did not see is not held, and the report says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oomload.outcome import Outcome
from oomload.report.findings import describe, load_delivered
from oomload.report.steptable import STEP_COLUMNS, step_row
from oomload.verdict import build_verdict
from oomload.verdict.gate import evaluate_gate, parse_gate
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, T0, StepSpec, request, write_run


def _verdict(tmp_path: Path, steps: list[StepSpec]) -> Any:
    view = load_run(write_run(tmp_path / "run", steps, cache_config=CPU_CACHE))
    return build_verdict(view)


def test_a_step_the_server_did_not_see_is_not_held(tmp_path: Path) -> None:
    """The client held 4 but vLLM saw 40 % of the time: the level is a label, not evidence."""
    steps = [
        StepSpec(2, requests=24, server_share=0.95),
        StepSpec(4, requests=24, server_share=0.4),
        StepSpec(8, preemptions=3),
    ]
    verdict = _verdict(tmp_path, steps)
    s2, s4 = verdict.steps[0], verdict.steps[1]
    assert s2.concurrency_held is True and s2.server_share == pytest.approx(0.95, abs=0.01)
    assert s4.achieved_concurrency == pytest.approx(4.0, abs=0.1)
    assert s4.server_share == pytest.approx(0.4, abs=0.03)
    assert s4.delivered_concurrency == pytest.approx(1.6, abs=0.1)
    assert s4.concurrency_held is False and not s4.trusted
    assert s4.server is not None and s4.server.in_server > 0
    assert verdict.last_safe_concurrency == 2  # not 4: that level was never put on the server
    finding = load_delivered(verdict)
    assert finding.severity == "warn"
    assert "concurrency 4 (step 1): client 4.0, server 1.6" in finding.text
    assert "bottleneck" in finding.text
    row = dict(zip(STEP_COLUMNS, step_row(s4), strict=True))
    assert (row["achieved"], row["server"]) == ("4.0", "1.6")
    assert verdict.to_json()["steps"][1]["delivered_concurrency"] == pytest.approx(1.6, abs=0.1)


def test_the_onset_line_says_what_its_step_held(tmp_path: Path) -> None:
    """The client held 2 of 4 in the step that preempted: the onset line says so."""
    steps = [
        StepSpec(2, requests=24, server_share=0.95),
        StepSpec(4, preemptions=2, requests=24, in_flight=2),
    ]
    verdict = _verdict(tmp_path, steps)
    text = {f.key: f.text for f in describe(verdict, recommend(verdict))}
    step = verdict.steps[1]
    assert step.delivered_concurrency is not None and step.delivered_concurrency == pytest.approx(
        2.0, abs=0.15
    )
    assert text["preemption_onset"].startswith(
        f"concurrency 4, the load generator held {step.delivered_concurrency:.1f} — step 1"
    )


def test_a_preempting_step_is_not_judged_by_the_share(tmp_path: Path) -> None:
    """vLLM counts less of a preempted request's time: the share is left out where the step preempted."""
    steps = [
        StepSpec(2, requests=24, server_share=0.95),
        StepSpec(4, preemptions=2, requests=24, server_share=0.7),
    ]
    verdict = _verdict(tmp_path, steps)
    step = verdict.steps[1]
    assert step.server is not None and step.server_share is None and step.concurrency_held is True
    text = {f.key: f.text for f in describe(verdict, recommend(verdict))}
    assert text["preemption_onset"].startswith("concurrency 4 — step 1")


def test_held_levels_say_so_and_unknown_without_sums(tmp_path: Path) -> None:
    held = _verdict(
        tmp_path / "a",
        [StepSpec(2, requests=24, server_share=0.97), StepSpec(4, requests=24, server_share=0.9)],
    )
    finding = load_delivered(held)
    assert finding.severity == "ok" and "every level held" in finding.text
    text = {f.key: f.text for f in describe(held, recommend(held))}
    assert ", held" not in text["preemption_onset"]
    unknown = _verdict(tmp_path / "b", [StepSpec(2), StepSpec(4)])
    assert all(s.server is None and s.server_share is None for s in unknown.steps)
    assert "unknown" in load_delivered(unknown).text
    assert unknown.steps[1].concurrency_held is True  # the client's figure alone, as before


def test_too_few_rounds_in_the_window_are_not_judged(tmp_path: Path) -> None:
    """One round of answers: a batch on either side of a boundary would swing the share, so no judgement."""
    verdict = _verdict(
        tmp_path, [StepSpec(2, requests=24, server_share=0.95), StepSpec(4, requests=4, server_share=0.4)]
    )
    short = verdict.steps[1]
    assert short.server is not None and short.server_share is None
    assert short.delivered_concurrency == short.achieved_concurrency and short.concurrency_held is True
    row = dict(zip(STEP_COLUMNS, step_row(short), strict=True))
    assert row["server"] == "–"


def test_a_saturated_server_holds_its_level_whatever_the_share(tmp_path: Path) -> None:
    """Requests waited in vLLM through the step: the engine ran all it admitted, so a low share (the
    API server's own time on a busy host) does not make the level a label; waiting once does not."""
    steps = [
        StepSpec(2, requests=24, server_share=0.95),
        StepSpec(8, requests=64, server_share=0.7, waiting_max=3, peak_scrapes=3),
        StepSpec(10, requests=80, server_share=0.7, waiting_max=3, peak_scrapes=2),
    ]
    verdict = _verdict(tmp_path, steps)
    saturated, brief = verdict.steps[1], verdict.steps[2]
    assert saturated.delivered_concurrency == pytest.approx(8 * 0.7, abs=0.3)
    assert saturated.server_saturated and saturated.concurrency_held is True and saturated.trusted
    assert not brief.server_saturated and brief.concurrency_held is False and not brief.trusted


def test_every_caveat_names_the_figure_that_decided(tmp_path: Path) -> None:
    """A step at 10 where the load generator held 9.0 (above 80 %) and the server 7.9 (below): the
    server's 7.9 decided, so the caveat and the gate's reason name 7.9 as the
    server's, never 9.0 as the load generator's "below 80 %" (issue #25)."""
    steps = [
        StepSpec(2, requests=24, server_share=0.95),
        StepSpec(10, requests=90, in_flight=9, server_share=7.9 / 9),
    ]
    verdict = _verdict(tmp_path, steps)
    step = verdict.steps[1]
    assert step.achieved_concurrency == pytest.approx(9.0, abs=0.05)
    assert step.delivered_concurrency == pytest.approx(7.9, abs=0.05)
    decided = f"the server held {step.delivered_concurrency:.1f} requests on average by its own counters"
    note = next(n.message for n in verdict.notes if n.kind == "concurrency_not_held")
    assert decided in note and "below 80% of the target 10" in note
    assert step.concurrency_held is False and step.held_by == "server"
    assert not note.startswith(
        f"step 1 (concurrency 10): the load generator held {step.achieved_concurrency:.1f}"
    )
    assert step.distrust is not None and decided in step.distrust
    reason = evaluate_gate(parse_gate("no-preemption-up-to:10"), verdict).reason
    assert decided in reason and "(the load generator 9.0), below 80% of 10" in reason


def test_the_load_generators_figure_is_named_when_it_decided(tmp_path: Path) -> None:
    """No server share (no latency sums): the load generator's 2.0 decided and is named as its own."""
    steps = [StepSpec(2, requests=24), StepSpec(8, requests=16, in_flight=2)]
    verdict = _verdict(tmp_path, steps)
    step = verdict.steps[1]
    assert step.held_by == "load generator" and step.concurrency_held is False
    note = next(n.message for n in verdict.notes if n.kind == "concurrency_not_held")
    assert note == (
        "step 1 (concurrency 8): the load generator held 2.0 requests in flight on average, below 80% of "
        "the target 8: not trusted"
    )


def test_a_level_held_only_by_the_servers_queue_says_so(tmp_path: Path) -> None:
    """Delivered 5.6 of 8 (below the line) but the server queued through the step: the level holds,
    and the load-delivered line says the queue decided, not the figures."""
    steps = [
        StepSpec(2, requests=24, server_share=0.95),
        StepSpec(8, requests=64, server_share=0.7, waiting_max=3, peak_scrapes=3),
    ]
    verdict = _verdict(tmp_path, steps)
    step = verdict.steps[1]
    assert step.concurrency_held is True and step.held_by_saturation
    assert not [n for n in verdict.notes if n.kind == "concurrency_not_held"]
    assert "held: requests waited in vLLM in" in load_delivered(verdict).text


def _death_at_8(tmp_path: Path, in_flight: int) -> Any:
    """Steps 2, 4, 8 of 10 s each; at 8 the engine dies 1 s in with ``in_flight`` requests under it, so
    the step's mean in flight is a tenth of that, whatever the load generator could do."""
    extra = [request(f"dead{i}", 2, 8, 20.0, 21.0, Outcome.ENGINE_DEAD) for i in range(in_flight)]
    events = [{"kind": "server_dead", "t_unix_s": T0 + 21.5, "evidence": "/health HTTP 503"}]
    steps = [StepSpec(2, requests=24), StepSpec(4, requests=24), StepSpec(8, requests=0)]
    run = write_run(tmp_path / "run", steps, extra_requests=extra, events=events, cache_config=CPU_CACHE)
    return build_verdict(load_run(run))


def test_the_step_the_engine_died_in_with_its_level_in_flight_is_not_a_load_caveat(tmp_path: Path) -> None:
    """Seen on the real vLLM: a death at 16 with 16 requests in flight, a mean of 6.0 over the step. The
    mean is the death's: an informational note, no "not trusted" warning, no "not held" level."""
    verdict = _death_at_8(tmp_path, in_flight=8)
    step = verdict.steps[2]
    assert verdict.engine_death is not None and verdict.engine_death.concurrency == 8
    assert step.died_here and step.in_flight_at_death == 8 and step.reached_at_death
    assert step.concurrency_held is False  # the figure itself stays what it was
    assert not [n for n in verdict.notes if n.kind == "concurrency_not_held"]
    note = next(n for n in verdict.notes if n.kind == "held_until_death")
    assert note.severity == "info" and note.message.startswith(
        "step 2 (concurrency 8): the engine died with 8 requests in flight, so the level was reached; the "
        "load generator held 0.8 requests in flight on average because the death ended the step"
    )
    assert "not held" not in load_delivered(verdict).text


def test_a_death_before_its_level_was_reached_keeps_the_warning(tmp_path: Path) -> None:
    verdict = _death_at_8(tmp_path, in_flight=3)  # 3 of 8 in flight when it died: the level never stood
    step = verdict.steps[2]
    assert step.in_flight_at_death == 3 and not step.reached_at_death
    assert [n.step for n in verdict.notes if n.kind == "concurrency_not_held"] == [2]
    assert "1 of 3 level(s) not held: concurrency 8 (step 2)" in load_delivered(verdict).text


def test_an_open_loop_has_no_level_to_hold_and_no_last_safe(tmp_path: Path) -> None:
    """Seen on the real vLLM: an --open-loop replay capped at 20 users whose arrivals kept 0.7 in flight
    read "1 of 1 level(s) not held", "last safe unknown … below 80% of 20" and medium confidence. The
    arrivals set an open loop's load; its level only caps it."""
    steps = [StepSpec(20, requests=40, in_flight=1)]
    run = write_run(tmp_path / "run", steps, cache_config=CPU_CACHE, config={"open_loop": True})
    verdict = build_verdict(load_run(run))
    step = verdict.steps[0]
    assert step.open_loop and step.concurrency_held is None and step.trusted
    assert not [n for n in verdict.notes if n.kind == "concurrency_not_held"]
    assert verdict.last_safe_concurrency is None and verdict.confidence == "high"
    texts = {f.key: f.text for f in describe(verdict, recommend(verdict))}
    assert texts["load_delivered"] == (
        "an open loop: the trace's arrival times set the load — 1.0 in flight on average in step 0 (cap 20)"
    )
    assert texts["last_safe"].startswith("not measured: an open loop replays the trace's arrival times")
    gate = evaluate_gate(parse_gate("last-safe-concurrency>=1"), verdict)
    assert gate.status.name == "NOT_EVALUATED"
    # the same step in a closed loop did not hold its level
    closed = build_verdict(load_run(write_run(tmp_path / "closed", steps, cache_config=CPU_CACHE)))
    assert closed.steps[0].concurrency_held is False


def test_an_open_loops_onset_is_named_by_its_cap_and_not_compared_with_levels(tmp_path: Path) -> None:
    """The simulator's open loop at a cap of 16 preempted with 4.3 in flight: "concurrency 16 … observed
    16: agrees" beside the odds (23.7 per 100 at 16 against 1.2 seen) compared levels it never ran."""
    steps = [StepSpec(16, requests=64, in_flight=4, preemptions=2)]
    odds = [{"concurrency": 16, "requests": 1000, "preemptions": 237, "episodes": 237}]
    config = {"open_loop": True}
    run = write_run(tmp_path / "run", steps, cache_config=CPU_CACHE, config=config, odds=odds)
    verdict = build_verdict(load_run(run))
    assert verdict.preemption_onset is not None
    assert not [n for n in verdict.notes if n.kind in ("odds_disagree", "odds_disagree_level")]
    assert not [n for n in verdict.notes if n.kind == "prediction_disagrees"]
    texts = {f.key: f.text for f in describe(verdict, recommend(verdict))}
    assert texts["preemption_onset"].startswith(
        "in the open loop (cap 16, 4.0 in flight on average) — step 0"
    )
    assert texts["trace_odds"].endswith(
        "not compared: an open loop's requests in flight followed the arrivals, not levels"
    )
    assert texts["prediction"].endswith(
        "not compared: an open loop's requests in flight followed the arrivals, not levels"
    )
