"""Every renderer writes valid output: summary.json loads, junit.xml parses, report.md holds the table."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from oomload.capacity.blocks import OnsetPrediction
from oomload.errors import ConfigError, ExitCode
from oomload.outcome import Outcome
from oomload.report import SUMMARY_SCHEMA, finalize_run
from oomload.report.findings import NOT_JUDGED, band_figures, describe, prefix_cache
from oomload.report.plots import figure_by_concurrency
from oomload.report.steptable import fmt_bytes, fmt_ms
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.prefixrate import PrefixCheck, StepPrefixRate
from oomload.verdict.recommend import Recommendation, recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, StepSpec, cpu_knee_steps, write_run

FILES = ("json", "md", "junit")


def run_report(run: Path, **kwargs: object) -> tuple[ExitCode, str]:
    out = io.StringIO()
    console = Console(file=out, width=100, color_system=None)
    code = finalize_run(run, console=console, **kwargs)  # type: ignore[arg-type]
    return code, out.getvalue()


def _verdict_and_advice(run: Path) -> tuple[Verdict, Recommendation]:
    verdict = build_verdict(load_run(run))
    return verdict, recommend(verdict)


def test_finalize_writes_summary_md_junit_and_prints_one_screen(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    code, screen = run_report(run, formats=FILES)
    assert code is ExitCode.OK
    doc = json.loads((run / "summary.json").read_text())
    assert doc["schema"] == SUMMARY_SCHEMA == "oomload.summary/1"
    assert doc["verdict"]["onsets"]["preemption"]["concurrency"] == 6
    assert doc["verdict"]["last_safe_concurrency"] == 5
    assert doc["recommendation"]["flag_line"].startswith("vllm serve tiny-model --max-model-len 768")
    assert doc["gates"] == [] and doc["exit_code"] == 0
    md = (run / "report.md").read_text()
    assert "| step | conc | phase | req |" in md
    assert md.count("\n| 4 | 6 | ramp | 18 |") == 1
    assert "```sh\nvllm serve tiny-model" in md
    cases = ET.parse(run / "junit.xml").getroot().findall(".//testcase")
    assert {c.get("name") for c in cases} >= {
        "preemption_onset",
        "engine_death",
        "last_safe",
        "context_overflow",
    }
    assert not (run / "report.html").exists()
    assert "Preemption onset" in screen and "concurrency 6" in screen
    assert "Last safe concurrency" in screen
    assert "vllm serve tiny-model" in screen
    assert next(f.text for f in describe(*_verdict_and_advice(run)) if f.key == "run_status") == "complete"
    head = screen.split("Per step")[0]
    assert head.count("\n") <= 40  # the summary fits one screen


def test_gates_go_to_junit_summary_and_exit_code(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    rules = ["no-preemption-below:6", "no-preemption-below:8", "max-kv-usage@32<0.95"]
    code, screen = run_report(run, gates=rules, formats=FILES)
    assert code is ExitCode.GATE_FAILED
    root = ET.parse(run / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    by_name = {c.get("name"): c for c in root.iter("testcase")}
    assert by_name["no-preemption-below:8"].find("failure") is not None
    assert by_name["max-kv-usage@32<0.95"].find("error") is not None
    doc = json.loads((run / "summary.json").read_text())
    assert [g["status"] for g in doc["gates"]] == ["pass", "fail", "not_evaluated"]
    assert doc["exit_code"] == 1
    assert "FAIL  no-preemption-below:8" in screen
    assert "| `no-preemption-below:8` | ❌ fail |" in (run / "report.md").read_text()


def test_not_evaluated_gate_gives_exit_four(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [StepSpec(1), StepSpec(2)])
    code, _ = run_report(run, gates=["no-oom-up-to:64"], formats=("json",))
    assert code is ExitCode.GATE_NOT_EVALUATED


def test_partial_run_renders_and_says_where_it_was_cut(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(2, preemptions=1), StepSpec(4, cut_short=True, requests=16)]
    run = write_run(tmp_path / "run", steps, no_status=True)
    code, screen = run_report(run, formats=FILES)
    assert code is ExitCode.OK
    assert "CUT SHORT" in screen
    assert "step 2 (concurrency 4) started but never ended" in screen
    md = (run / "report.md").read_text()
    assert "This run was cut short" in md and "never ended" in md
    assert "| 2\\* | 4 |" in md  # the cut-short star, escaped so it is no emphasis
    doc = json.loads((run / "summary.json").read_text())
    assert doc["verdict"]["run"]["cut_short"] is True
    assert doc["verdict"]["steps"][2]["cut_short"] is True


def test_interrupted_run_exit_code_unless_only_reporting(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [StepSpec(1)], status={"finished": False, "end_reason": "interrupted"})
    assert run_report(run, formats=())[0] is ExitCode.INTERRUPTED
    assert run_report(run, formats=(), reporting_only=True)[0] is ExitCode.OK


def test_run_without_any_step_is_unreachable(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [], status={"finished": False, "end_reason": "error"})
    code, screen = run_report(run, formats=(*FILES, "html"))
    assert code is ExitCode.UNREACHABLE
    last_safe = next(f for f in describe(*_verdict_and_rec(run)) if f.key == "last_safe")
    assert (last_safe.text, last_safe.severity) == (NOT_JUDGED, "warn")  # nothing to judge: no claim
    assert "Last safe concurrency   not judged" in screen
    assert (run / "report.html").read_text().count("data:image/png;base64,") == 3
    assert json.loads((run / "summary.json").read_text())["verdict"]["steps"] == []
    assert "no measured" in (run / "report.md").read_text()


def test_a_run_where_every_request_failed_says_so_and_is_nothing_to_judge(tmp_path: Path) -> None:
    """The QA case: a server answering 401 to everything once ended "complete", exit 0, "No preemption or
    failure up to concurrency 2", and no finding named the failures."""
    steps = [StepSpec(c, requests=12, failures={Outcome.SERVER_ERROR: 12}) for c in (1, 2)]
    run = write_run(tmp_path / "run", steps)
    code, screen = run_report(run, formats=("md",))
    assert code is ExitCode.UNREACHABLE
    findings = {f.key: f.text for f in describe(*_verdict_and_rec(run))}
    assert findings["failed_requests"].startswith("24 of 24: server_error 24; first at concurrency 1")
    assert "no request succeeded" in findings["failed_requests"]
    assert "No request succeeded, so nothing about KV memory was measured." in screen
    assert "No preemption or failure" not in screen
    assert "Failed requests" in (run / "report.md").read_text()


def test_failures_without_preemption_are_not_called_no_failure(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(2), StepSpec(4, failures={Outcome.ADMISSION_REJECTED: 3})]
    run = write_run(tmp_path / "run", steps)
    verdict, rec = _verdict_and_rec(run)
    findings = {f.key: f.text for f in describe(verdict, rec)}
    assert findings["failed_requests"].startswith("3 of 36: admission_rejected 3; first at concurrency 4")
    assert "No preemption, but requests failed from concurrency 4." in rec.reasoning
    clean = write_run(tmp_path / "clean", [StepSpec(1), StepSpec(2)])
    verdict, rec = _verdict_and_rec(clean)
    assert "failed_requests" not in {f.key for f in describe(verdict, rec)}
    assert "No preemption or failure up to concurrency 2." in rec.reasoning
    assert run_report(clean, formats=())[0] is ExitCode.OK


def _verdict_and_rec(run: Path) -> tuple[Verdict, Recommendation]:
    verdict = build_verdict(load_run(run))
    return verdict, recommend(verdict)


def test_bad_gate_or_format_is_a_config_error_before_writing(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [StepSpec(1)])
    with pytest.raises(ConfigError, match="'p99-ttft@1<=2'"):
        finalize_run(run, gates=["p99-ttft@1<=2"], terminal=False)
    with pytest.raises(ConfigError, match="unknown report format"):
        finalize_run(run, formats=("pdf",), terminal=False)
    assert not (run / "summary.json").exists()


def test_html_is_self_contained_with_three_plots(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE, no_status=True)
    finalize_run(run, formats=("html",), terminal=False)
    page = (run / "report.html").read_text()
    assert page.count('<img class="plot"') == 3
    assert page.count("data:image/png;base64,") == 3
    assert "http://" not in page.replace("http://127.0.0.1:8000", "")  # nothing fetched from the network
    assert "This run was cut short" in page


@pytest.mark.parametrize(
    ("ms", "shown"),
    [(None, "–"), (1250.0, "1.25s"), (250.4, "250ms"), (10.0, "10ms"), (4.24, "4.2ms"), (0.35, "0.35ms"),
     (0.004, "4µs"), (0.0, "0µs")],
)  # fmt: skip
def test_latency_cells_never_round_small_values_to_zero_ms(ms: float | None, shown: str) -> None:
    assert fmt_ms(ms) == shown


def test_concurrency_axes_are_labelled_with_the_measured_levels(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    fig = figure_by_concurrency(build_verdict(load_run(run)))
    for ax in fig.axes[:2]:
        assert ax.get_xscale() == "log"
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["1", "2", "4", "5", "6", "7", "8", "12", "16"]
        assert len(ax.xaxis.get_minor_locator().tick_values(1, 16)) == 0


def test_units_and_single_values_in_words(tmp_path: Path) -> None:
    assert fmt_bytes(int(1.25 * 2**30)) == "1.25 GiB"
    steps = [StepSpec(2, failures={Outcome.CONTEXT_OVERFLOW: 2})]
    v = build_verdict(load_run(write_run(tmp_path / "run", steps)))
    text = next(f.text for f in describe(v, recommend(v)) if f.key == "context_overflow")
    assert text == "2 refused at 512 total tokens (prompt + output)"


def test_summary_json_quantities_carry_units(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    run_report(run, gates=["error-rate<=0.1%"], formats=("json",))
    doc = json.loads((run / "summary.json").read_text())
    verdict = doc["verdict"]
    assert verdict["onsets"]["preemption"]["kv_usage_max_share"] == 1.0
    assert verdict["onsets"]["kv_saturation"]["kv_usage_share"] == 1.0
    assert verdict["onsets"]["queueing"]["waiting_requests"] == 1
    assert verdict["steps"][0]["kv_usage_max_share"] == 0.17 and verdict["steps"][0]["trusted"] is True
    assert verdict["context_overflow"]["model_limit_tokens"] == 4096
    assert verdict["prediction"]["block_size_tokens"] == 32
    advice = doc["recommendation"]["max_model_len"]
    assert (advice["round_to_tokens"], advice["margin_share"]) == (256, 0.1)
    assert doc["gates"][0]["unit"] == "share"


def test_report_md_escapes_what_came_from_the_server_so_no_html_or_markdown_survives(tmp_path: Path) -> None:
    """Issue #24: report.md kept raw HTML from the model name and error texts (rendered as HTML by the
    places that show Markdown)."""
    model = "<img src=x onerror=alert(1)> | [x](http://evil.example) `m`"
    oom = "CUDA out of memory <script>alert(2)</script> | **bold** ```"
    steps = [StepSpec(1), StepSpec(2), StepSpec(4, failures={Outcome.ENGINE_DEAD: 4}, error_text=oom)]
    run = write_run(tmp_path / "run", steps, cache_config=CPU_CACHE, config={"model": model})
    run_report(run, formats=("md",))
    md = (run / "report.md").read_text()
    # the recommendation block holds the model name as one shell word, and the ``` cannot close it
    fence = next(line for line in md.splitlines() if line.startswith("```") and line.endswith("sh"))
    before, rest = md.split(fence + "\n", 1)
    block, after = rest.split("\n" + fence.removesuffix("sh") + "\n", 1)
    assert block.startswith("vllm serve '<img src=x") and "\n" not in block
    text = before + after  # Markdown, outside the code block: nothing raw
    assert "<img" not in text and "<script" not in text and "[x](" not in text and "**bold**" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "&lt;script&gt;" in text
    death = next(line for line in text.splitlines() if "OOM / engine death" in line)
    assert death.replace("\\|", "").count("|") == 4  # the error's pipe does not split the row


def test_the_arithmetic_names_what_sets_each_end_of_its_band() -> None:
    # the demo's distinct-prompts case: P90-length requests preempt first (6), P50-length ones last (15)
    wide = OnsetPrediction(799, 16, 12_784, onset_mean=11, onset_p50=15, onset_p90=6, onset_spread=12)
    assert wide.band == (6, 15)
    assert band_figures(wide) == "P90-length 6, mean-length 11, P50-length 15, decode phases spread 12"
    # where every figure is the mean request's, the mean alone
    alike = OnsetPrediction(80, 32, 2_560, onset_mean=4, onset_p50=4, onset_p90=4)
    assert band_figures(alike) == "mean-length 4"


def test_the_prefix_cache_finding_lists_steps_only_where_they_differ(tmp_path: Path) -> None:
    def check(*rates: tuple[float, float]) -> PrefixCheck:
        steps = tuple(
            StepPrefixRate(i, 2**i, server, 100, expected) for i, (server, expected) in enumerate(rates)
        )
        return PrefixCheck("distinct", "no hash_ids", None, True, steps, 0.0, 0.0, None)

    verdict = build_verdict(load_run(write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)))
    flat = replace(verdict, prefix=check((0.0, 0.0), (0.0, 0.0), (0.001, 0.0)))
    assert prefix_cache(flat).text == "server 0%, trace expects 0% at every step"  # type: ignore[union-attr]
    one = replace(verdict, prefix=check((0.0, 0.0)))  # one step: its figures are the head's
    assert prefix_cache(one).text == "server 0%, trace expects 0%"  # type: ignore[union-attr]
    moved = replace(verdict, prefix=check((0.0, 0.0), (0.3, 0.0)))
    assert prefix_cache(moved).text.endswith("(per step, server/expected: c1 0%/0%, c2 30%/0%)")  # type: ignore[union-attr]
