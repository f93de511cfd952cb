"""Gate rules: parsing with clear errors, pass / fail / not evaluated, and never a pass without evidence."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.errors import ConfigError, ExitCode
from oomload.outcome import Outcome
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.gate import (
    AbsenceRule,
    GateStatus,
    LevelThreshold,
    RunThreshold,
    evaluate_gate,
    evaluate_gates,
    gate_exit_code,
    load_gate_file,
    parse_gate,
    parse_gate_toml,
)
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, StepSpec, cpu_knee_steps, write_run


@pytest.fixture(scope="module")
def knee(tmp_path_factory: pytest.TempPathFactory) -> Verdict:
    run = write_run(tmp_path_factory.mktemp("knee") / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    return build_verdict(load_run(run))


def status(rule: str, verdict: Verdict) -> GateStatus:
    return evaluate_gate(parse_gate(rule), verdict).status


def test_parse_absence_and_threshold_rules() -> None:
    g = parse_gate("no-preemption-below:64")
    assert isinstance(g, AbsenceRule)
    assert (g.event.name, g.bound, g.concurrency, g.highest_covered) == ("preemption", "below", 64, 63)
    g = parse_gate("No-OOM-up-to: 128")
    assert isinstance(g, AbsenceRule)
    assert (g.event.name, g.bound, g.highest_covered) == ("engine_death", "up-to", 128)
    g = parse_gate("p99-ttft-s@64 <= 2")
    assert isinstance(g, LevelThreshold)
    assert (g.metric.name, g.concurrency, g.op, g.threshold, g.unit) == ("p99-ttft-s", 64, "<=", 2.0, "s")
    g = parse_gate("error-rate<=0.1%")
    assert isinstance(g, RunThreshold)
    assert g.threshold == pytest.approx(0.001) and g.concurrency is None and g.show(0.0054) == "0.54 %"
    g = parse_gate("max-kv-usage@32<0.95")
    assert isinstance(g, LevelThreshold) and g.op == "<"
    g = parse_gate("last-safe-concurrency>=64")
    assert isinstance(g, RunThreshold) and g.metric.name == "last-safe-concurrency"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty gate rule"),
        ("no-preemption-below:abc", "'abc' is not a whole number"),
        ("no-preemption-below:0", "must be in 1..100,000, got 0"),
        ("no-preemption-below:99999999999999999999999", "must be in 1..100,000"),  # no run reaches it: a FAIL
        ("error-rate<=-1%", "error-rate is never below 0"),  # a rule no run could pass
        ("p99-ttft-s@8<=-2", "p99-ttft-s is never below 0"),
        ("error-rate<=200%", "error-rate is a share, at most 100 %"),  # a rule every run passed
        ("max-kv-usage<1.5", "max-kv-usage is a share, at most 100 %"),
        ("no-preemption-below:1", "covers no concurrency"),
        ("no-swap-below:8", "unknown event 'swap'"),
        ("no-preemption-above:8", "no-EVENT-below:N"),
        ("p95-ttft-s@64<=2", "unknown metric 'p95-ttft-s'"),
        ("p99-ttft-s<=2", "name the level, e.g. 'p99-ttft-s@64'"),
        ("p99-ttft-s@64<=fast", "'fast' is not a number"),
        ("p99-ttft-s@64<=2%", "'%' is allowed only for"),
        ("last-safe-concurrency@8>=4", "one number per run"),
        ("ttft under 2s", "is not a rule"),
    ],
)
def test_bad_rules_raise_config_error_naming_the_text(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_gate(text)
    assert says in str(err.value)
    if text:
        assert text.strip() in str(err.value)


def test_absence_rules_on_the_cpu_knee(knee: Verdict) -> None:
    assert status("no-preemption-below:6", knee) is GateStatus.PASS  # 5 measured clean
    assert status("no-preemption-below:7", knee) is GateStatus.FAIL
    assert status("no-preemption-up-to:5", knee) is GateStatus.PASS
    assert status("no-oom-up-to:16", knee) is GateStatus.PASS
    result = evaluate_gate(parse_gate("no-oom-up-to:64"), knee)
    assert result.status is GateStatus.NOT_EVALUATED
    assert "did not reach concurrency 64" in result.reason
    assert status("no-queueing-below:6", knee) is GateStatus.PASS
    assert status("no-kv-saturation-up-to:6", knee) is GateStatus.FAIL


def test_gap_between_clean_and_preempting_levels_is_not_evaluated(tmp_path: Path) -> None:
    steps = [StepSpec(c, preemptions=int(c == 64), requests=c) for c in (8, 16, 32, 64)]
    v = build_verdict(load_run(write_run(tmp_path / "r", steps)))
    result = evaluate_gate(parse_gate("no-preemption-below:48"), v)
    assert result.status is GateStatus.NOT_EVALUATED
    assert "add a step at 47" in result.reason
    assert status("no-preemption-below:34", v) is GateStatus.NOT_EVALUATED
    assert status("no-preemption-below:33", v) is GateStatus.PASS  # 32 measured clean


def test_threshold_rules(knee: Verdict) -> None:
    assert status("p99-ttft-s@4<=2", knee) is GateStatus.PASS
    assert status("p99-ttft-ms@4<100", knee) is GateStatus.FAIL
    assert status("error-rate<=0.1%", knee) is GateStatus.PASS
    assert status("max-kv-usage@4<0.95", knee) is GateStatus.PASS
    assert status("max-kv-usage@6<0.95", knee) is GateStatus.FAIL
    assert status("max-kv-usage<=1", knee) is GateStatus.PASS
    assert status("preemptions@5==0", knee) is GateStatus.PASS
    assert status("last-safe-concurrency>=5", knee) is GateStatus.PASS
    assert status("last-safe-concurrency>=8", knee) is GateStatus.FAIL
    result = evaluate_gate(parse_gate("max-kv-usage@32<0.95"), knee)
    assert result.status is GateStatus.NOT_EVALUATED
    assert "no step at concurrency 32" in result.reason


def test_missing_metrics_are_not_evaluated(tmp_path: Path) -> None:
    steps = [StepSpec(1, scrapes=0), StepSpec(8, scrapes=0, requests=16, failures={Outcome.SERVER_ERROR: 1})]
    v = build_verdict(load_run(write_run(tmp_path / "r", steps)))
    assert status("no-preemption-below:8", v) is GateStatus.NOT_EVALUATED
    assert status("max-kv-usage@8<0.9", v) is GateStatus.NOT_EVALUATED
    assert status("max-kv-usage<0.9", v) is GateStatus.NOT_EVALUATED
    assert status("no-oom-up-to:8", v) is GateStatus.PASS  # request outcomes are evidence enough
    assert status("error-rate@8<=0.01", v) is GateStatus.FAIL


def test_cut_short_step_is_not_evidence(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(8, cut_short=True, requests=16)]
    v = build_verdict(load_run(write_run(tmp_path / "r", steps, no_status=True)))
    assert status("p99-ttft-s@8<=10", v) is GateStatus.NOT_EVALUATED
    assert status("no-preemption-up-to:8", v) is GateStatus.NOT_EVALUATED


def test_exit_code_fail_beats_not_evaluated(knee: Verdict) -> None:
    gates = [parse_gate(r) for r in ("no-preemption-below:6", "max-kv-usage@32<0.95")]
    assert gate_exit_code(evaluate_gates(gates, knee)) is ExitCode.GATE_NOT_EVALUATED
    gates.append(parse_gate("no-preemption-below:8"))
    assert gate_exit_code(evaluate_gates(gates, knee)) is ExitCode.GATE_FAILED
    assert gate_exit_code(evaluate_gates(gates[:1], knee)) is ExitCode.OK


def test_gate_file_toml(tmp_path: Path) -> None:
    path = tmp_path / "scenario.toml"
    path.write_text('[gate]\nrules = ["no-preemption-below:64", "p99-ttft-s@64<=2"]\n')
    assert [g.text for g in load_gate_file(path)] == ["no-preemption-below:64", "p99-ttft-s@64<=2"]
    with pytest.raises(ConfigError, match="no \\[gate\\] table"):
        parse_gate_toml("[other]\n", source="s.toml")
    with pytest.raises(ConfigError, match=r"s\.toml: gate 'bogus'"):
        parse_gate_toml('[gate]\nrules = ["bogus"]\n', source="s.toml")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_gate_toml("[gate]\nrules = []\nthreshold = 1\n", source="s.toml")
    with pytest.raises(ConfigError, match="cannot read gate file"):
        load_gate_file(tmp_path / "missing.toml")


def test_a_mistyped_baseline_says_the_rule_is_relative() -> None:
    """``onset>=baselin`` read "unknown metric 'onset'; allowed: p50-ttft-ms, …" (no onset in the list)."""
    with pytest.raises(ConfigError, match=r"gate 'onset>=baselin': onset is compared with a baseline run; "):
        parse_gate("onset>=baselin")


def test_a_gate_table_without_rules_names_what_it_has() -> None:
    """``rule = [...]`` (one letter short) read "rules must be a list of strings, got None"."""
    with pytest.raises(ConfigError) as info:
        parse_gate_toml('[gate]\nrule = ["no-oom-up-to:8"]\n', source="s.toml")
    assert str(info.value) == (
        "s.toml: [gate] has no rules (it has 'rule'); expected rules = [\"no-preemption-below:64\", …]"
    )


def test_gate_file_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    """A gate file saved as UTF-16 (or a binary file) is one sentence (exit 2), not an internal error."""
    path = tmp_path / "scenario.toml"
    path.write_bytes('[gate]\nrules = ["no-oom-up-to:8"]\n'.encode("utf-16"))
    with pytest.raises(ConfigError, match=r"scenario\.toml: not a TOML file \(byte 0 is not UTF-8"):
        load_gate_file(path)


rules = st.sampled_from(
    [
        "no-preemption-below:{n}",
        "no-preemption-up-to:{n}",
        "no-oom-up-to:{n}",
        "no-queueing-below:{n}",
        "p99-ttft-s@{n}<=1000",
        "max-kv-usage@{n}<=1",
        "error-rate@{n}<=1",
        "preemptions@{n}>=0",
    ]
)


@settings(max_examples=30, deadline=None)
@given(
    rule=rules,
    levels=st.lists(st.integers(min_value=1, max_value=32), min_size=1, max_size=5, unique=True),
    scraped=st.booleans(),
)
def test_gate_never_passes_without_evidence(rule: str, levels: list[int], scraped: bool) -> None:
    """Rules aimed above everything the run measured, or at unscraped metrics, never pass."""
    n = max(levels) + 2
    specs = [StepSpec(c, scrapes=3 if scraped else 0, requests=3) for c in sorted(levels)]
    with tempfile.TemporaryDirectory() as tmp:
        v = build_verdict(load_run(write_run(Path(tmp) / "r", specs)))
    result = evaluate_gate(parse_gate(rule.format(n=n)), v)
    assert result.status is GateStatus.NOT_EVALUATED, result.reason  # a clean run cannot fail it
    assert gate_exit_code([result]) is ExitCode.GATE_NOT_EVALUATED


weak_steps = st.sampled_from(["cut_short", "cancelled_only", "unscraped", "warmup", "after_death"])


@settings(max_examples=30, deadline=None)
@given(rule=rules, weakness=weak_steps, below=st.lists(st.integers(3, 14), max_size=3, unique=True))
def test_weak_evidence_at_the_gate_level_never_passes(rule: str, weakness: str, below: list[int]) -> None:
    """The only step at or above the rule's level carries no usable evidence: never a pass.

    ``below`` stops at 14, so no clean step at 15 vouches for ``no-EVENT-below:16``.
    """
    n = 16
    specs = [StepSpec(c, requests=3) for c in sorted(below)]
    weak = StepSpec(n, requests=8)
    if weakness == "cut_short":
        weak.cut_short = True
    elif weakness == "cancelled_only":
        weak.failures = {Outcome.CANCELLED: 8}
    elif weakness == "unscraped":
        weak.scrapes, weak.ttft_ms = 0, 50.0
    elif weakness == "warmup":
        weak.phase = "warmup"
    else:  # the engine died (at 2) before this step started
        specs.append(StepSpec(2, requests=4, failures={Outcome.ENGINE_DEAD: 4}))
    specs.append(weak)
    with tempfile.TemporaryDirectory() as tmp:
        v = build_verdict(load_run(write_run(Path(tmp) / "r", specs, no_status=weakness == "cut_short")))
    result = evaluate_gate(parse_gate(rule.format(n=n)), v)
    if weakness == "unscraped" and not any(k in rule for k in ("preemption", "queueing", "kv-usage")):
        return  # request outcomes and latencies are still evidence without /metrics
    assert result.status is not GateStatus.PASS, (weakness, result.reason)
    assert gate_exit_code([result]) is not ExitCode.OK


def documented_rules(text: str) -> list[str]:
    """Every gate rule a document shows: ``--gate '…'`` / ``--gate X``, TOML ``rules = [...]`` and
    rule-shaped code spans (``N`` placeholders become 8; ``{a,b}`` patterns are left out)."""
    found = re.findall(r"--gate\s+'([^']+)'", text)
    found += re.findall(r'--gate\s+"([^"]+)"', text)
    found += [r for r in re.findall(r"--gate\s+([^\s'\"`\\]+)", text) if r != "EXPR"]
    for line in re.findall(r"^rules\s*=\s*\[(.*)\]", text, flags=re.M):
        found += re.findall(r'"([^"]+)"', line)
    spans = re.findall(r"`([^`\n]+)`", text)
    rule = re.compile(r"^(no-[a-z-]+-(below|up-to):\S+|[a-z0-9-]+(@\S+)?\s*(<=|>=|==|<|>)\s*\S+)$")
    for span in spans:
        for part in span.split(", "):
            if rule.match(part) and "{" not in part:
                found.append(part)
    return [r.replace(":N", ":8") for r in found]


def test_every_gate_example_in_the_docs_parses() -> None:
    root = Path(__file__).resolve().parents[3]
    examples = [
        r
        for doc in ("docs/report.md", "docs/replay.md", "README.md")
        for r in documented_rules((root / doc).read_text())
    ]
    assert len(set(examples)) >= 15, examples  # the extraction itself still finds the examples
    for rule in examples:
        parse_gate(rule)  # ConfigError names the rule that is documented but not accepted


def test_a_level_the_server_did_not_hold_gives_no_evidence(tmp_path: Path) -> None:
    """The client held 4, vLLM's counters say the server saw 40 % of it: rules at 4 are not evaluated."""
    steps = [StepSpec(2, requests=24, server_share=0.95), StepSpec(4, requests=24, server_share=0.4)]
    verdict = build_verdict(load_run(write_run(tmp_path / "run", steps, cache_config=CPU_CACHE)))
    assert status("p99-ttft-s@4<=10", verdict) is GateStatus.NOT_EVALUATED
    assert status("no-preemption-below:5", verdict) is GateStatus.NOT_EVALUATED
    assert status("p99-ttft-s@2<=10", verdict) is GateStatus.PASS
    held = build_verdict(
        load_run(
            write_run(
                tmp_path / "held",
                [StepSpec(2, requests=24, server_share=0.95), StepSpec(4, requests=24, server_share=0.9)],
            )
        )
    )
    assert status("p99-ttft-s@4<=10", held) is GateStatus.PASS


def test_a_reason_shows_values_in_their_unit(knee: Verdict) -> None:
    """A latency reads as the compare page shows it, a share in %, a rate with its unit — whatever
    unit the rule wrote its bound in."""
    reasons = {
        rule: evaluate_gate(parse_gate(rule), knee).reason
        for rule in ("p99-ttft-s@4<=0.01", "p99-ttft-ms@4<100", "max-kv-usage@6<0.95", "req-per-s@4>=1000")
    }
    assert reasons["p99-ttft-s@4<=0.01"] == "p99-ttft-s = 250 ms at concurrency 4, not <= 10 ms"
    assert reasons["p99-ttft-ms@4<100"] == "p99-ttft-ms = 250 ms at concurrency 4, not < 100 ms"
    assert reasons["max-kv-usage@6<0.95"] == "max-kv-usage = 100 % at concurrency 6, not < 95 %"
    assert reasons["req-per-s@4>=1000"].endswith("req/s at concurrency 4, not >= 1000 req/s")


def test_a_failing_value_never_reads_the_same_as_its_bound(knee: Verdict) -> None:
    """250 ms against a bound of 249.9 ms: both read "250 ms" in the unit, so both get more digits."""
    result = evaluate_gate(parse_gate("p99-ttft-ms@4<=249.9"), knee)
    assert result.status is GateStatus.FAIL
    assert result.reason == "p99-ttft-ms = 250 ms at concurrency 4, not <= 249.9 ms"
