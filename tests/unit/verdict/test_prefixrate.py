"""The prompt shape a run measured, the trace's expected prefix-cache hit rate beside the server's, and
the verdict's sentence and the gate when they disagree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oomload.load.payload import RequestOrder
from oomload.outcome import Outcome, RequestResult
from oomload.report.findings import describe
from oomload.rundir.records import CacheConfig, MetricsRow, RunConfig
from oomload.trace.model import TraceRecord
from oomload.verdict.gate import GateStatus, evaluate_gate, parse_gate
from oomload.verdict.prefixrate import StepWindow, expected_hits, prefix_check
from oomload.verdict.recommend import recommend
from oomload.verdict.replayed import replayed_records
from oomload.verdict.runview import load_run
from oomload.verdict.verdict import build_verdict
from runbuilder import StepSpec, write_run

SHARED = {"mode": "shared", "block_tokens": 256, "why_distinct": None}
_SHARED_RUN = RunConfig.from_json({"prefix": SHARED})
_POOL_32 = CacheConfig.from_json({"block_size": 32})


def _sent(record: str, seq: int, step: int, t: float, prompt: int = 640) -> RequestResult:
    return RequestResult(f"{record}#{seq}", step, 2, t, t + 1.0, Outcome.OK, prompt, 10)


def _metrics(t: float, queries: int, hits: int) -> MetricsRow:
    return MetricsRow(t, True, prefix_cache_queries_total=queries, prefix_cache_hits_total=hits)


def _records(n: int = 4) -> list[TraceRecord]:
    # every request: the same 512-token system prompt (ids 1, 2), then its own block
    return [TraceRecord(f"r{i}", 0.0, 640, 10, hash_ids=(1, 2, 100 + i)) for i in range(n)]


def test_expected_hits_count_leading_blocks_already_sent_per_pass() -> None:
    records = _records(4)
    sent = [_sent(f"r{i % 4}", i, 0 if i < 3 else 1, float(i)) for i in range(6)]
    step0 = StepWindow(0, 2, sent[:3], (), None)
    step1 = StepWindow(1, 2, sent[3:], (), None)
    got = expected_hits([step0, step1], records, 256, 32)
    # step 0: the first request misses, the next two hit the 512 shared tokens
    assert got[0] == (2 * 512, 3 * 640)
    # step 1: r3 (seq 3) hits; r0/r1 again (seq 4, 5) are the trace's second pass: fresh ids,
    # so seq 4 misses and seq 5 hits what seq 4 sent
    assert got[1] == (2 * 512, 3 * 640)


def test_hits_are_whole_server_blocks_and_never_the_last_token() -> None:
    records = [TraceRecord("a", 0.0, 512, 1, hash_ids=(1, 2)), TraceRecord("b", 0.0, 512, 1, hash_ids=(1, 2))]
    sent = [_sent("a", 0, 0, 0.0, 512), _sent("b", 1, 0, 1.0, 512)]
    got = expected_hits([StepWindow(0, 2, sent, (), None)], records, 256, 96)
    assert got[0] == (5 * 96, 1024)  # 512 shared, capped at (512 - 1) // 96 * 96 = 480


def _check(server_hits: int, caching: Any = True, config: dict[str, Any] | None = None) -> Any:
    sent = [_sent(f"r{i}", i, 0, float(i)) for i in range(4)]
    metrics = (_metrics(10.0, 4 * 640, server_hits),)
    step = StepWindow(0, 2, sent, metrics, _metrics(-1.0, 0, 0))
    return prefix_check(
        RunConfig.from_json(config if config is not None else {"prefix": SHARED}),
        CacheConfig.from_json({"enable_prefix_caching": caching, "block_size": 32}),
        _records(4),
        [step],
    )


def test_a_server_that_hits_what_the_trace_shares_agrees() -> None:
    check = _check(3 * 512)
    assert check.mode == "shared" and check.problem is None
    assert check.expected_rate == check.server_rate == 1536 / 2560
    assert "production shape: shared prefixes" in check.line


def test_a_server_without_prefix_caching_is_named_in_one_sentence() -> None:
    check = _check(0, caching=False)
    assert check.problem is not None and "without prefix caching" in check.problem
    assert "--distinct-prompts" in check.problem
    assert _check(0, caching=None).problem is not None  # rate 0 where 60 % was expected
    assert "did not measure production" in str(_check(0, caching=None).problem)


def test_a_distinct_run_served_from_a_cache_is_named() -> None:
    distinct = {"prefix": {"mode": "distinct", "block_tokens": 256, "why_distinct": "--distinct-prompts"}}
    assert _check(0, config=distinct).problem is None
    assert _check(0, config=distinct).expected_rate == 0.0
    problem = _check(3 * 512, config=distinct).problem
    assert problem is not None and "did not see the prompts oomload sent" in problem


def _write_prefix_run(path: Path, *, hits: int, caching: bool) -> Path:
    run = write_run(
        path,
        [StepSpec(1), StepSpec(2)],
        cache_config={"num_gpu_blocks": 12, "block_size": 256, "enable_prefix_caching": caching},
        config={"prefix": {"mode": "shared", "block_tokens": 256, "why_distinct": None}},
    )
    # the runbuilder's scrapes carry no prefix counters: add a rising pair to each metrics line
    lines = (run / "metrics.jsonl").read_text().splitlines()
    out = []
    for k, line in enumerate(lines):
        obj = json.loads(line)
        if obj.get("ok"):
            obj["prefix_cache_queries_total"] = 1000 * k
            obj["prefix_cache_hits_total"] = hits * k
        out.append(json.dumps(obj))
    (run / "metrics.jsonl").write_text("\n".join(out) + "\n")
    return run


def test_the_gate_does_not_pass_a_run_whose_prefix_behaviour_was_not_what_it_claims(tmp_path: Path) -> None:
    """Regression: a production-shape replay against a server without prefix caching passed the gate."""
    bad = build_verdict(load_run(_write_prefix_run(tmp_path / "bad", hits=0, caching=False)))
    assert bad.prefix is not None and bad.prefix.problem is not None
    rule = parse_gate("no-preemption-below:2")
    result = evaluate_gate(rule, bad)
    assert result.status is GateStatus.NOT_EVALUATED and "without prefix caching" in result.reason
    assert bad.confidence == "low"
    shape = next(f for f in describe(bad, recommend(bad)) if f.key == "prompt_shape")
    assert shape.severity == "bad" and "without prefix caching" in shape.text
    from rich.console import Console

    from oomload.report.html import render_html
    from oomload.report.junit import render_junit
    from oomload.report.markdown import render_markdown
    from oomload.report.terminal import render_terminal

    rec = recommend(bad)
    console = Console(record=True, width=200)
    render_terminal(console, bad, rec)
    view = load_run(tmp_path / "bad")
    for text in (
        render_markdown(bad, rec),
        render_html(view, bad, rec),
        render_junit(bad, rec),
        console.export_text(),
    ):
        assert "production shape: shared prefixes" in text and "without prefix caching" in text
    summary = bad.to_json()["prefix"]
    assert summary["mode"] == "shared" and summary["server_prefix_caching"] is False
    assert summary["problem"] == bad.prefix.problem

    good = build_verdict(load_run(_write_prefix_run(tmp_path / "good", hits=0, caching=True)))
    assert good.prefix is not None and good.prefix.problem is None  # the trace's records share nothing
    assert evaluate_gate(rule, good).status is GateStatus.PASS


def test_evictions_in_a_preempting_step_are_not_a_setup_problem() -> None:
    """A level that preempts evicts cached blocks and hits less than the trace's infinite cache: the
    judgement uses the steps that did not preempt, unless every step preempted."""
    records = _records(8)
    clean_sent = [_sent(f"r{i}", i, 0, float(i)) for i in range(4)]
    busy_sent = [_sent(f"r{i}", i, 1, 10.0 + i) for i in range(4, 8)]
    clean = StepWindow(0, 2, clean_sent, (_metrics(5.0, 2560, 1536),), _metrics(-1.0, 0, 0))
    busy = StepWindow(
        1, 8, busy_sent, (_metrics(15.0, 5120, 1536),), _metrics(5.0, 2560, 1536), preempted=True
    )
    check = prefix_check(_SHARED_RUN, _POOL_32, records, [clean, busy])
    assert check.steps[1].server_rate == 0.0 and check.problem is None
    assert check.server_rate is not None and check.server_rate < 0.5 * (check.expected_rate or 0)  # run-wide
    only_busy = prefix_check(_SHARED_RUN, _POOL_32, records, [busy])
    assert only_busy.problem is not None and "did not measure production" in only_busy.problem


def test_the_verdict_counts_the_records_the_order_replayed() -> None:
    """The expected hits cycle through the records ``RequestOrder`` chose: fitting, then the tail."""
    records = [TraceRecord(f"r{i}", 0.0, 100 * i + 1, 50) for i in range(40)]
    for only_fitting in (False, True):
        for tail in (None, 0.0, 50.0):
            settings = RunConfig(max_model_len=2048, only_fitting=only_fitting, tail_percentile=tail)
            order = RequestOrder(records, tail_percentile=tail, fit_within=2048 if only_fitting else None)
            assert replayed_records(records, settings) == order.records, (only_fitting, tail)
