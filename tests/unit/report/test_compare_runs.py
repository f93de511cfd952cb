"""``oomload compare``, the typed summary reader and the relative gate rules, on hand-built run
directories (``runbuilder``: the real ``RunWriter``, the real verdict)."""

from __future__ import annotations

import io
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from oomload.cli import main
from oomload.errors import ConfigError, ExitCode
from oomload.report.compare import compare_runs
from oomload.report.comparepage import render_compare_terminal
from oomload.report.compareside import load_side
from oomload.report.summary import build_summary, dump_summary
from oomload.rundir.provenance import Provenance, file_sha256, read_provenance
from oomload.rundir.summary import SUMMARY_SCHEMA, read_summary
from oomload.verdict import build_verdict
from oomload.verdict.gate import GateStatus, evaluate_gates, parse_gate
from oomload.verdict.recommend import recommend
from oomload.verdict.relative import RelativeRule
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run

POOL = {"block_size": 16, "gpu_memory_utilization": 0.9}


def _steps(onset: int, repeats: int) -> list[StepSpec]:
    """Levels 2, 4, 6, 8: clean below ``onset``, preempting from it; the level below the onset and the
    onset measured ``repeats`` times (as the refinement does)."""
    steps = []
    for c in (2, 4, 6, 8):
        times = repeats if c in (onset - 2, onset) else 1
        steps += [StepSpec(c, preemptions=3 if c >= onset else 0) for _ in range(times)]
    return steps


def _run(path: Path, onset: int, blocks: int, repeats: int = 3, **kw: object) -> Path:
    return write_run(path, _steps(onset, repeats), cache_config={**POOL, "num_gpu_blocks": blocks}, **kw)  # type: ignore[arg-type]


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return _run(tmp_path / "base", onset=8, blocks=100), _run(tmp_path / "new", onset=6, blocks=80)


def _compare(*args: str | Path) -> int:
    return main(["compare", *map(str, args)])


# ---------------------------------------------------------------------------------------------------
# The summary reader


def test_read_summary_gives_back_what_build_summary_wrote(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", onset=6, blocks=80)
    verdict = build_verdict(load_run(run))
    results = evaluate_gates([parse_gate("no-preemption-below:4")], verdict)
    doc = build_summary(verdict, recommend(verdict), results, exit_code=0, generated_unix_s=1.0)
    (run / "summary.json").write_text(dump_summary(doc))
    summary = read_summary(run)
    assert summary.schema == SUMMARY_SCHEMA and summary.exit_code == 0
    assert summary.levels == verdict.levels == (2, 4, 6, 8)
    assert summary.preemption_onset is not None and verdict.preemption_onset is not None
    assert (summary.preemption_onset.concurrency, summary.preemption_onset.seen_in) == (6, 3)
    assert summary.preemption_onset.measurements == 3
    assert summary.last_safe_concurrency == verdict.last_safe_concurrency == 4
    assert summary.pool is not None and summary.pool.num_gpu_blocks == 80 and summary.pool.block_size == 16
    assert summary.death is None and summary.max_model_len == 4096
    assert len(summary.steps) == len(verdict.steps)
    for mine, theirs in zip(summary.steps, verdict.steps, strict=True):
        assert (mine.concurrency, mine.preemptions, mine.trusted) == (
            theirs.concurrency,
            theirs.preemptions,
            theirs.trusted,
        )
        assert (mine.ttft.p50_ms, mine.ttft.p99_ms, mine.e2e.count) == (
            theirs.ttft.p50_ms,
            theirs.ttft.p99_ms,
            theirs.e2e.count,
        )
        assert mine.output_tokens_per_s == theirs.output_tokens_per_s
    assert summary.device_used_peak_bytes == max(s.device_used_max_bytes or 0 for s in verdict.steps)
    assert [(g.rule, g.status) for g in summary.gates] == [("no-preemption-below:4", "pass")]


def test_read_summary_refuses_what_is_not_one_in_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*summary.json \(No such file"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text('{"schema": "oomload.tune/1"}')
    with pytest.raises(ConfigError, match="is not an oomload summary"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text('{"schema": "oomload.summary/2"}')
    with pytest.raises(ConfigError, match=r"has schema oomload\.summary/2; this oomload reads"):
        read_summary(tmp_path)


def test_provenance_round_trip_and_older_runs(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("x\n")
    record = Provenance("0.1.0", str(trace), file_sha256(trace), 1, (2, 4), 3, "0.32.0", "vllm serve m")
    (tmp_path / "provenance.json").write_text(json.dumps(record.to_json()))
    assert read_provenance(tmp_path) == record
    assert record.trace_sha256 == __import__("hashlib").sha256(b"x\n").hexdigest()
    assert read_provenance(tmp_path / "older") is None  # a run from before provenance.json


def test_the_setup_reads_oomloads_version_from_provenance(runs: tuple[Path, Path]) -> None:
    """The version row reads ``provenance.json`` (what ran), as the vLLM version row does; an older run
    without one falls back to ``config.json``."""
    base, new = runs
    trace = new / "source.jsonl"
    trace.write_text("x\n")
    record = Provenance("0.9.1", str(trace), file_sha256(trace), 1, (2, 4), 3, None, None)
    (new / "provenance.json").write_text(json.dumps(record.to_json()))
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "oomload_version": "0.8.0"}))
    cmp = compare_runs(load_side(base), load_side(new), allow_different_trace=True)
    rows = {r.label: r for r in cmp.setup}
    assert (rows["oomload version"].base, rows["oomload version"].new) == ("0.8.0", "0.9.1")


# ---------------------------------------------------------------------------------------------------
# Relative rules


def test_relative_rules_parse_and_bad_ones_are_one_sentence() -> None:
    rule = parse_gate("kv-blocks >= baseline*0.95")
    assert isinstance(rule, RelativeRule) and rule.scale == 0.95 and rule.quantity == "kv-blocks"
    assert isinstance(parse_gate("last-safe>=baseline-1"), RelativeRule)
    assert isinstance(parse_gate("p99-ttft-s@8<=baseline*1.10"), RelativeRule)
    assert isinstance(parse_gate("no-new-death"), RelativeRule)
    for bad, said in (
        ("onset<=baseline", "bounded from below"),
        ("onset@4>=baseline", "one number per run"),
        ("p99-ttft-s<=baseline", "measured per step"),
        ("speed>=baseline", "unknown quantity"),
        ("kv-blocks>=baseline*x", "is not a number"),
    ):
        with pytest.raises(ConfigError, match=said):
            parse_gate(bad)


def test_relative_rules_on_a_release_that_shrank_the_pool(runs: tuple[Path, Path]) -> None:
    base, new = (build_verdict(load_run(r)) for r in runs)
    rules = [
        parse_gate(r)
        for r in (
            "onset>=baseline",
            "onset>=baseline-2",
            "kv-blocks>=baseline*0.95",
            "last-safe>=baseline-1",
            "no-new-death",
            "p50-ttft-ms@4<=baseline*1.10",
        )
    ]
    results = {r.gate.text: r for r in evaluate_gates(rules, new, base)}
    onset = results["onset>=baseline"]
    assert onset.status is GateStatus.FAIL
    assert "fell from concurrency 8 to concurrency 6, separated by the repeats" in onset.reason
    assert results["onset>=baseline-2"].status is GateStatus.PASS
    assert results["kv-blocks>=baseline*0.95"].status is GateStatus.FAIL
    assert "KV blocks 80 against the baseline's 100, not >= 95" in results["kv-blocks>=baseline*0.95"].reason
    # last safe 4 (5 never run, 6 broke) against the baseline's proven 6: a true 5 would meet 6 - 1, 4
    # would not, and the run did not measure which it is
    last_safe = results["last-safe>=baseline-1"]
    assert last_safe.status is GateStatus.NOT_EVALUATED
    assert last_safe.reason == (
        "last safe concurrency 4, but 5 not judged (6 broke or queued) against the baseline's 6: judge the "
        "levels that could meet >= 5"
    )
    assert results["last-safe>=baseline-1"].observed == 4.0
    assert results["no-new-death"].status is GateStatus.PASS
    assert results["p50-ttft-ms@4<=baseline*1.10"].status is GateStatus.PASS
    # the same run against itself passes every rule
    same = evaluate_gates(rules, base, base)
    assert [r.status for r in same] == [GateStatus.PASS] * len(rules)


def test_a_relative_reason_reads_its_values_in_their_unit(tmp_path: Path) -> None:
    """A latency in the compare page's units, a share in %, a rate with its unit (they printed six
    significant digits of the base unit: "p99-ttft-s at concurrency 4 0.0657 against the baseline's
    0.340675")."""
    base_side = load_side(write_run(tmp_path / "b", [StepSpec(4, ttft_ms=340.675, kv_max=0.3)]))
    new_side = load_side(write_run(tmp_path / "n", [StepSpec(4, ttft_ms=1065.745, kv_max=0.65745)]))
    base, new = base_side.verdict, new_side.verdict
    latencies = compare_runs(base_side, new_side).latencies
    rules = ("p99-ttft-s@4<=baseline*1.1", "max-kv-usage@4<=baseline*1.1", "req-per-s@4>=baseline*1.1")
    gates = [parse_gate(r) for r in rules]
    results = {r.gate.text: r.reason for r in evaluate_gates(gates, new, base, latencies)}
    assert results[rules[0]] == (  # 12 requests a side: a P99 that missed its bound on noise
        "p99-ttft-s at concurrency 4 5.33 s against the baseline's 1.70 s, not <= 1.87 s, but too few "
        "requests to tell (bootstrap needs 100 a side; the baseline has 12, this run 12)"
    )
    assert (
        results[rules[1]] == "max-kv-usage at concurrency 4 65.7 % against the baseline's 30 %, not <= 33 %"
    )
    assert re.fullmatch(
        r"req-per-s at concurrency 4 [\d.]+ req/s against the baseline's [\d.]+ req/s, not >= [\d.]+ req/s",
        results[rules[2]],
    ), results[rules[2]]


def test_a_relative_bound_that_reads_like_the_value_gets_more_digits(tmp_path: Path) -> None:
    """2.02 s against a bound of 2.0196 s (the baseline's 1.836 s × 1.1): both read "2.02 s". 120
    requests a side, a fifth of them at the P99: the bootstrap separates the two."""
    base = load_side(write_run(tmp_path / "b", [StepSpec(4, ttft_ms=367.2, requests=120)]))  # P99 5×
    new = load_side(write_run(tmp_path / "n", [StepSpec(4, ttft_ms=404.0, requests=120)]))
    latencies = compare_runs(base, new).latencies
    [result] = evaluate_gates(
        [parse_gate("p99-ttft-s@4<=baseline*1.1")], new.verdict, base.verdict, latencies
    )
    assert result.status is GateStatus.FAIL
    assert "1.84 s, not <= 2.0196 s; the requests at that level separate the runs (" in result.reason


def test_an_onset_rule_on_one_draw_each_is_not_evaluated(tmp_path: Path) -> None:
    base = build_verdict(load_run(_run(tmp_path / "b", onset=8, blocks=100, repeats=1)))
    new = build_verdict(load_run(_run(tmp_path / "n", onset=6, blocks=100, repeats=1)))
    [result] = evaluate_gates([parse_gate("onset>=baseline")], new, base)
    assert result.status is GateStatus.NOT_EVALUATED
    assert "not separated by the repeats" in result.reason


def test_a_baseline_that_sent_other_traffic_judges_only_the_pool(tmp_path: Path) -> None:
    """The same server preempts earlier under distinct prompts than under the trace's shared
    prefixes: against such a baseline an onset, last-safe or latency rule is not evaluated (never a
    pass, never a fail); the pool, the server's own, is still compared."""
    base = build_verdict(
        load_run(_run(tmp_path / "b", onset=8, blocks=100, config={"prefix": {"mode": "distinct"}}))
    )
    shared = {"prefix": {"mode": "shared", "block_tokens": 16}}
    new = build_verdict(load_run(_run(tmp_path / "n", onset=6, blocks=80, config=shared)))
    rules = [parse_gate(r) for r in ("onset>=baseline", "last-safe>=baseline-1", "kv-blocks>=baseline*0.95")]
    results = {r.gate.text: r for r in evaluate_gates(rules, new, base)}
    for text in ("onset>=baseline", "last-safe>=baseline-1"):
        assert results[text].status is GateStatus.NOT_EVALUATED, results[text]
        assert results[text].reason == (
            "the baseline sent different traffic from its trace (distinct prompts against shared prefixes)"
        )
    assert results["kv-blocks>=baseline*0.95"].status is GateStatus.FAIL


def test_a_baseline_of_another_trace_judges_only_the_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``compare`` refuses two runs of different traces (exit 2); ``report --baseline`` (and ``replay
    --baseline``) judged its relative rules anyway — an onset rule passed, a latency rule failed, on two
    runs of different traffic. Now they are not evaluated, as against a baseline that sent other traffic;
    the pool, the server's own, is still compared."""
    base = _run(tmp_path / "b", onset=6, blocks=100)
    new = _run(tmp_path / "n", onset=8, blocks=100)
    for run, text in ((base, b"last month's trace\n"), (new, b"this month's trace\n")):
        trace = run / "source.jsonl"
        trace.write_bytes(text)
        record = Provenance("0.1.0", str(trace), file_sha256(trace), 20, (2, 4, 6, 8), 3, None, None)
        (run / "provenance.json").write_text(json.dumps(record.to_json()))
    rules = ["--gate", "onset>=baseline", "--gate", "kv-blocks>=baseline"]
    code = main(["report", str(new), "--baseline", str(base), *rules, "--format", "json"])
    assert code == ExitCode.GATE_NOT_EVALUATED, capsys.readouterr()
    gates = {g["rule"]: g for g in json.loads((new / "summary.json").read_text())["gates"]}
    assert gates["onset>=baseline"]["status"] == "not_evaluated"
    assert gates["onset>=baseline"]["reason"].startswith("the baseline replayed another trace (sha256 ")
    assert gates["kv-blocks>=baseline"]["status"] == "pass"


def test_a_relative_rule_without_a_baseline_is_exit_2(
    runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(runs[1]), "--gate", "onset>=baseline", "--format", "json"]) == ExitCode.USAGE
    assert "give --baseline RUN_DIR" in capsys.readouterr().err
    code = main(
        ["report", str(runs[1]), "--gate", "onset>=baseline", "--baseline", str(runs[0]), "--format", "json"]
    )
    assert code == ExitCode.GATE_FAILED


# ---------------------------------------------------------------------------------------------------
# compare


def test_compare_reports_the_pool_shrink_and_the_onset_with_evidence(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, new = runs
    out = tmp_path / "out"
    code = _compare(
        base, new, "--out", out, "--format", "terminal,json,md,html,junit", "--gate", "onset>=baseline"
    )
    assert code == ExitCode.GATE_FAILED
    doc = json.loads((out / "compare.json").read_text())
    rows = {r["key"]: r for r in doc["results"]}
    assert (
        rows["kv_blocks"]["status"] == "regression" and "shrank: -20 blocks" in rows["kv_blocks"]["evidence"]
    )
    assert rows["preemption_onset"]["status"] == "regression"
    assert (rows["preemption_onset"]["base"], rows["preemption_onset"]["new"]) == ("8", "6")
    assert doc["onset"]["p_value"] == pytest.approx(0.05)
    assert doc["gates"][0]["status"] == "fail" and doc["exit_code"] == 1
    changed = {r["label"] for r in doc["setup"] if r["changed"]}
    assert "num_gpu_blocks" in changed and "trace" not in changed
    assert "regression" in (out / "compare.md").read_text()
    html = (out / "compare.html").read_text()
    assert html.count('class="plot"') == 2 and "data:image/png;base64," in html
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("failures") == "1"
    printed = capsys.readouterr().out
    assert "regression" in printed and "onset>=baseline" in printed


def test_a_run_against_itself_finds_no_regression(runs: tuple[Path, Path], tmp_path: Path) -> None:
    copy = tmp_path / "again"
    shutil.copytree(runs[0], copy)
    out = tmp_path / "out"
    code = _compare(
        runs[0], copy, "--out", out, "--format", "json", "--gate", "onset>=baseline", "--gate", "no-new-death"
    )
    assert code == ExitCode.OK
    doc = json.loads((out / "compare.json").read_text())
    assert doc["regressions"] == 0 and doc["headline"].startswith("no regression found")
    assert {r["status"] for r in doc["results"]} <= {"unchanged", "not measured"}


def test_runs_of_different_traces_are_exit_2_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _run(tmp_path / "b", onset=8, blocks=100)
    other = _run(tmp_path / "o", onset=8, blocks=100, lengths=((512, 128),) * 20)
    assert _compare(base, other, "--out", tmp_path / "x", "--format", "json") == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "replayed different traces" in err and "--allow-different-trace" in err
    assert "Traceback" not in err
    out = tmp_path / "allowed"
    assert _compare(base, other, "--out", out, "--format", "json", "--allow-different-trace") == ExitCode.OK
    assert "compared anyway" in json.loads((out / "compare.json").read_text())["caveats"][0]


def test_runs_that_sent_different_traffic_from_one_trace_are_exit_2_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One trace sent two ways is two workloads: distinct prompts preempt levels earlier than shared
    prefixes, and --only-fitting or --tail-percentile sends another selection of it. Seen on the
    simulator: a Mooncake trace sent whole and with --only-fitting compared as "the same trace"."""
    shared = {"prefix": {"mode": "shared", "block_tokens": 16}}
    base = _run(tmp_path / "b", onset=8, blocks=100, config=shared)
    fitting = _run(tmp_path / "f", onset=8, blocks=100, config={**shared, "only_fitting": True})
    assert _compare(base, fitting, "--out", tmp_path / "x", "--format", "json") == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--allow-different-trace" in err
    assert (
        "sent different traffic from the trace (shared prefixes against shared prefixes, only requests "
        "within max_model_len (--only-fitting))"
    ) in err
    distinct = _run(tmp_path / "d", onset=8, blocks=100, config={"prefix": {"mode": "distinct"}})
    out = tmp_path / "allowed"
    assert (
        _compare(base, distinct, "--out", out, "--format", "json", "--allow-different-trace") == ExitCode.OK
    )
    doc = json.loads((out / "compare.json").read_text())
    assert any("shared prefixes against distinct prompts" in c for c in doc["caveats"])
    setup = {r["label"]: r for r in doc["setup"]}
    assert setup["traffic"]["changed"]
    again = _run(tmp_path / "again", onset=8, blocks=100, config=shared)
    assert _compare(base, again, "--out", tmp_path / "same", "--format", "json") == ExitCode.OK


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"api": "chat"}, "distinct prompts, calibrated chat text (--api chat)"),
        ({"exact_output": False}, "distinct prompts, outputs the model ended (--no-exact-output)"),
    ],
)
def test_a_chat_or_loose_output_run_is_other_traffic_than_a_completions_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, object], words: str
) -> None:
    """Chat text goes through the template and the server's tokenizer; outputs the model ends are
    shorter than the trace's. Both were "distinct prompts" beside a --distinct-prompts completions run."""
    distinct = {"prefix": {"mode": "distinct"}}
    base = _run(tmp_path / "b", onset=8, blocks=100, config=distinct)
    other = _run(tmp_path / "o", onset=8, blocks=100, config={**distinct, **config})
    assert _compare(base, other, "--out", tmp_path / "x", "--format", "json") == ExitCode.USAGE
    assert f"(distinct prompts against {words})" in capsys.readouterr().err


def test_runs_without_a_common_level_are_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "b", [StepSpec(2), StepSpec(4)])
    new = write_run(tmp_path / "n", [StepSpec(8), StepSpec(16)])
    assert _compare(base, new, "--format", "json") == ExitCode.USAGE
    assert "measured no level in common (2,4 against 8,16)" in capsys.readouterr().err


def test_bad_run_directories_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _run(tmp_path / "b", onset=8, blocks=100)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _compare(base, empty, "--format", "json") == ExitCode.USAGE
    assert f"{empty} is not a run directory (no config.json)" in capsys.readouterr().err
    assert _compare(base, tmp_path / "nowhere", "--format", "json") == ExitCode.USAGE
    assert "no such directory" in capsys.readouterr().err


def test_out_into_a_run_it_compares_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--out`` naming either run directory would replace that run's own junit.xml with compare's, and
    a folder in the base run breaks "compare writes nothing into the base run": exit 2, nothing written."""
    base = _run(tmp_path / "b", onset=8, blocks=100)
    new = _run(tmp_path / "n", onset=8, blocks=100)
    for run in (base, new):
        (run / "junit.xml").write_text("<the run's own/>")
    for out in (base, new, base / "compare"):
        assert _compare(base, new, "--out", out) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert err.startswith("oomload: error: --out ") and err.count("\n") == 1, err
    assert [(run / "junit.xml").read_text() for run in (base, new)] == ["<the run's own/>"] * 2
    assert not (base / "compare").exists() and not (base / "compare.json").exists()
    assert _compare(base, new, "--format", "json") == ExitCode.OK  # the default, NEW_RUN/compare
    assert (new / "compare" / "compare.json").is_file()


def test_a_run_cut_short_and_one_without_summary_are_compared(tmp_path: Path) -> None:
    """A run whose summary.json is missing is judged afresh (as ``report`` does); a run cut short is
    compared on what it measured, and the page says so in one sentence."""
    base = _run(tmp_path / "b", onset=8, blocks=100)
    assert not (base / "summary.json").exists()
    steps = _steps(8, 3)
    steps[-1] = StepSpec(8, preemptions=3, cut_short=True)
    cut = write_run(tmp_path / "cut", steps, cache_config={**POOL, "num_gpu_blocks": 100}, no_status=True)
    out = tmp_path / "out"
    assert _compare(base, cut, "--out", out, "--format", "json") == ExitCode.OK
    caveats = json.loads((out / "compare.json").read_text())["caveats"]
    assert any(c.startswith("the new run cut was cut short") for c in caveats), caveats
    assert not (base / "summary.json").exists()  # compare writes nothing into the runs it reads


def test_a_level_a_limit_turned_requests_away_in_is_a_caveat(tmp_path: Path) -> None:
    """Two runs behind one gateway, stopped at 8 by its 429s: compare read "no regression found" with
    nothing to say that neither run measured the engine at 8."""
    from oomload.outcome import Outcome

    base = _run(tmp_path / "b", onset=8, blocks=100)
    steps = _steps(8, 3)
    steps[-1] = StepSpec(8, failures={Outcome.RATE_LIMITED: 9}, error_text="http 429")
    limited = write_run(tmp_path / "l", steps, cache_config={**POOL, "num_gpu_blocks": 100})
    out = tmp_path / "out"
    _compare(base, limited, "--out", out, "--format", "json")
    caveats = json.loads((out / "compare.json").read_text())["caveats"]
    assert any(
        c.startswith(
            "in the new run l, step 7 (concurrency 8): 9 of 12 requests were turned away by a limit in front"
        )
        and c.endswith("no evidence at that level")
        for c in caveats
    ), caveats


def test_a_run_with_nothing_to_judge_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oomload.outcome import Outcome

    base = _run(tmp_path / "b", onset=8, blocks=100)
    failed = write_run(
        tmp_path / "f",
        [StepSpec(c, failures={Outcome.SERVER_ERROR: 12}) for c in (2, 4)],
        cache_config={**POOL, "num_gpu_blocks": 100},
    )
    assert _compare(base, failed, "--format", "json") == ExitCode.UNREACHABLE
    assert "has nothing to judge" in capsys.readouterr().err


def test_the_terminal_puts_each_rows_evidence_in_one_readable_line_at_80_columns(
    runs: tuple[Path, Path],
) -> None:
    cmp = compare_runs(load_side(runs[0]), load_side(runs[1]))
    out = io.StringIO()
    render_compare_terminal(Console(file=out, width=80, color_system=None), cmp)
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    pool = next(r for r in cmp.results if r.label == "KV pool (blocks)")
    assert pool.status == "regression"
    # the result table: a row's label, values and status on one line
    assert any(line.split() == ["KV", "pool", "(blocks)", "100", "80", "regression"] for line in lines)
    # its evidence beside its label, whole on the line (it was folded to a word or two a line)
    assert any(line.split()[:3] == ["KV", "pool", "(blocks)"] and pool.evidence in line for line in lines)


def test_the_terminal_setup_folds_a_long_model_name_rather_than_cut_it(tmp_path: Path) -> None:
    model = "meta-llama/Llama-3.1-8B-Instruct-with-a-long-fine-tune-suffix"
    base, new = (
        _run(tmp_path / name, onset=8, blocks=100, config={"model": model}) for name in ("base", "new")
    )
    out = io.StringIO()
    cmp = compare_runs(load_side(base), load_side(new))
    render_compare_terminal(Console(file=out, width=80, color_system=None), cmp)
    setup = out.getvalue().split("Result")[0].splitlines()
    assert not [line for line in setup if "…" in line and "sha256" not in line]  # only the digest is short
    first = next(i for i, line in enumerate(setup) if line.split()[:1] == ["model"])
    rows = [setup[first].split()[1:]]  # the label's line, then the folded lines: two pieces each
    for line in setup[first + 1 :]:
        if len(line.split()) != 2:
            break
        rows.append(line.split())
    assert ["".join(column) for column in zip(*rows, strict=True)] == [model, model]  # folded, whole


def test_latencies_that_moved_one_way_say_a_host_moves_them_alike(tmp_path: Path) -> None:
    """Two runs of one configuration on this host moved P50 TPOT and E2E +10…+37 % at three levels, all
    slower, and the page read "7 regression(s)" with nothing more: a caveat now says what else moves
    latency that way. Moves both ways are the host's noise already (``across_levels``); none, nothing."""
    from oomload.report.compare import host_caveat
    from oomload.verdict.shift import across_levels, latency_shift

    def shifts(factors: dict[int, float]) -> list[Any]:
        base = [100.0 + i for i in range(40)]
        return list(
            across_levels(
                latency_shift("tpot", "p50", c, base, [v * f for v in base]) for c, f in factors.items()
            )
        )

    slower = host_caveat(shifts({7: 1.24, 8: 1.13, 9: 1.0}))
    assert slower is not None and slower.startswith(
        "every latency that moved was slower (+13…+24 % at 7, 8): "
    )
    assert "'Latency needs a quiet host'" in slower
    faster = host_caveat(shifts({7: 0.8}))
    assert faster is not None and faster.startswith("every latency that moved was faster (-20 % at 7)")
    assert host_caveat(shifts({7: 1.24, 8: 0.8})) is None  # both ways: mixed, the host's noise already
    assert host_caveat(shifts({7: 1.0, 8: 1.02})) is None  # nothing moved
    runs = [write_run(tmp_path / n, [StepSpec(4, ttft_ms=ms)]) for n, ms in (("b2", 340.0), ("n", 1065.0))]
    cmp = compare_runs(load_side(runs[0]), load_side(runs[1]))
    assert any(c.startswith("every latency that moved was slower") for c in cmp.caveats), cmp.caveats


def test_a_latency_that_moved_without_evidence_is_not_separated_not_unchanged(tmp_path: Path) -> None:
    """P50 TTFT 13.1 ms → 17.5 ms (+34 %, Mann–Whitney p = 0.023) read "unchanged"; the docs' word for a
    value that moved without the evidence to carry it is "not separated". A change under the 10 % floor
    stays unchanged; so does a memory peak that moved by less than the MiB its row shows (it read
    "-0 MiB (-0.3%) changed")."""
    gib = 2**30
    base = write_run(tmp_path / "b", [StepSpec(4, ttft_ms=50.0, used_bytes=70 * gib)])
    new = write_run(tmp_path / "n", [StepSpec(4, ttft_ms=60.0, used_bytes=70 * gib + 300 * 2**10)])
    same = write_run(tmp_path / "s", [StepSpec(4, ttft_ms=52.0, used_bytes=70 * gib + 300 * 2**20)])
    cmp = compare_runs(load_side(base), load_side(new))
    rows = {r.key: r for r in cmp.results}
    assert [s.judgement for s in cmp.latencies if (s.metric, s.stat) == ("ttft", "p50")] == ["not separated"]
    ttft = rows["p50_ttft@4"]
    assert ttft.status == "not separated", ttft
    assert (
        "(+20%, not separated: Mann–Whitney U p = " in ttft.evidence
        and "≥ 0.01, n = 12, 12)" in ttft.evidence
    )
    device = rows["device_peak"]
    assert (device.base, device.new, device.status) == ("70.00 GiB", "70.00 GiB", "unchanged")
    assert device.evidence == "the same peak to the MiB (+0.0%)"
    rows = {r.key: r for r in compare_runs(load_side(base), load_side(same)).results}
    assert rows["p50_ttft@4"].status == "unchanged"  # +4 %: under the floor
    assert rows["device_peak"].status == "changed" and rows["device_peak"].evidence.startswith("+300 MiB")


def test_a_run_compared_with_itself_is_refused_and_a_copy_is_named(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`compare runA runA --gate onset>=baseline` and `report runB --baseline runB --gate ...` passed
    (exit 0): a CI step that points the baseline at the new run passed every relative rule, silently.
    One directory as both runs is exit 2, one sentence; a copy of one replay (the same provenance.json
    start) is compared, with a caveat that names it."""
    base = runs[0]
    gate = ("--gate", "onset>=baseline")
    assert _compare(base, base, "--out", tmp_path / "o1", "--format", "json", *gate) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "BASE_RUN and NEW_RUN are one run directory" in err, err
    assert main(["report", str(base), "--baseline", f"{base}/.", *gate, "--format", "json"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is the run being judged" in err, err
    record = Provenance("0.1.0", "t.jsonl", "ab" * 32, 20, (2, 4, 6, 8), 3, started_unix_s=1_790_000_000.0)
    (base / "provenance.json").write_text(json.dumps(record.to_json()))
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    out = tmp_path / "o2"
    assert _compare(base, copy, "--out", out, "--format", "json", *gate) == ExitCode.OK
    assert json.loads((out / "compare.json").read_text())["caveats"] == [
        "base and copy are one replay (both started at 2026-09-21 14:13:20 UTC, provenance.json): a copy "
        "of a run compared with itself proves nothing about a release"
    ]
