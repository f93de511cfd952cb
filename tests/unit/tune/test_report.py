"""A tune's table shows both predicted onsets (production / worst case) and a rate target's translation,
in tune.json, tune.md and tune.html alike (report.tune, tune.record)."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from rich.console import Console

from oomload.report.tune import COLUMNS, print_tune, render_html, render_markdown
from oomload.tune.rate import RateTarget
from oomload.tune.record import TuneRecord
from oomload.tune.search import Candidate, Proof, Settings


def _proof(onset: int | None, worst: int | None, prompts: str) -> Proof:
    return Proof(
        num_gpu_blocks=80,
        block_size=32,
        predicted_onset=onset,
        odds_safe_max_num_seqs=6,
        requests_for_evidence=40,
        observed_onset=None,
        preempted_at_target=False,
        died=False,
        overflow_at_target=False,
        slo_met=None,
        requests_at_target=40,
        throughput_tokens_per_s=100.0,
        ttft_p99_ms=900.0,
        run_dir="candidates/01/run",
        evidence="40 requests at 6: 0 preemptions",
        predicted_onset_worst_case=worst,
        prompts=prompts,
    )


def _record() -> TuneRecord:
    rate = RateTarget(4.0, 6, 5.2, 4.0, 80, 0, "candidates/01/rate/run")
    shared = Candidate(
        1, Settings(max_num_seqs=256), "first", started=True, proof=_proof(11, 4, "production")
    )
    distinct = Candidate(2, Settings(max_num_seqs=8), "next", started=True, proof=_proof(7, 7, "worst-case"))
    return TuneRecord(
        serve_line="oomload sim serve",
        kind="sim",
        model="m",
        target_concurrency=6,
        trace_path="t.jsonl",
        max_starts=8,
        max_duration_s=600.0,
        slo_ttft_p99_s=None,
        candidates=(replace(shared, rate=rate), distinct),
        status="finished",
        winner_index=1,
        winner_line="oomload sim serve --max-num-seqs 256",
        target_rate_rps=4.0,
    )


def test_both_predicted_onsets_are_columns_of_every_page() -> None:
    record = _record()
    assert "predicted onset (production)" in COLUMNS and "predicted onset (worst case)" in COLUMNS
    md = render_markdown(record)
    rows = [line for line in md.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    prod, worst = COLUMNS.index("predicted onset (production)"), COLUMNS.index("predicted onset (worst case)")
    assert (cells[0][prod], cells[0][worst]) == ("11", "4")
    assert (cells[1][prod], cells[1][worst]) == ("7 (no shared prefixes)", "7")
    html = render_html(record)
    assert "<td>11</td><td>4</td>" in html


def test_a_rate_target_is_reported_with_its_measured_concurrency() -> None:
    record = _record()
    md = render_markdown(record)
    assert "Target rate 4 req/s (concurrency 6)" in md
    assert "4 req/s → concurrency 6 (Little's law, measured: 5.20 requests in flight" in md
    obj = json.loads(json.dumps(record.to_json()))
    assert obj["target_rate_rps"] == 4.0 and obj["rate"]["concurrency"] == 6
    assert obj["candidates"][0]["proof"]["predicted_onset_worst_case"] == 4
    back = TuneRecord.from_json(obj)
    assert back.rate == record.rate and back.candidates[0].proof == record.candidates[0].proof


def test_a_tune_stopped_for_the_load_host_says_so_on_every_page_and_in_tune_json() -> None:
    starved = "waited 93 % of the step for a CPU; loop lag up to 210 ms"
    proof = replace(
        _proof(12, 4, "production"), requests_at_target=0, no_evidence=True, starved=starved, remeasured=True
    )
    note = (
        f"the load host limits: candidate 1 (max_num_seqs 12) had no evidence — the load generator {starved}"
    )
    record = replace(
        _record(),
        candidates=(Candidate(1, Settings(max_num_seqs=12), "first", started=True, proof=proof),),
        status="no_evidence",
        winner_index=None,
        winner_line=None,
        notes=(note,),
    )
    assert record.exit_code() == 4
    for page in (render_markdown(record), render_html(record)):
        assert (
            "no evidence (the load host limits)" in page
            and "No winner: the tune stopped without evidence" in page
        )
        assert "the load host limits: candidate 1" in page
    out = io.StringIO()  # the terminal marks it and says what the mark means: one line a candidate
    print_tune(record, Console(file=out, width=80, color_system=None))
    lines = out.getvalue().splitlines()
    row = next(line for line in lines if line.startswith("1 "))
    table = lines[: lines.index(next(line for line in lines if line.startswith("  #1 ")))]
    assert row.endswith("ms no evidence*") and max(map(len, table)) <= 80
    assert any(line.startswith("  *: the load host limits, not the server") for line in table)
    obj = json.loads(json.dumps(record.to_json()))
    assert obj["status"] == "no_evidence" and obj["candidates"][0]["proof"]["outcome"] == "no evidence"
    assert obj["candidates"][0]["proof"]["load_host_starved"] == starved
    assert TuneRecord.from_json(obj).candidates[0].proof == proof


def test_the_terminal_table_fits_80_columns_with_whole_headers_and_cells() -> None:
    record = _record()
    out = io.StringIO()
    print_tune(record, Console(file=out, width=80, color_system=None))
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if line.lstrip().startswith("#"))
    assert header.split() == [
        "#",
        "flags",
        "started",
        "KV",
        "blocks",
        "prod.",
        "worst",
        "seen",
        "tok/s",
        "TTFT",
        "p99",
        "verdict",
    ]
    table = lines[: lines.index(next(line for line in lines if line.startswith("  #1 ")))]
    assert max(map(len, table)) <= 80
    rows = [line.split() for line in table if line.lstrip()[:2] in ("1 ", "2 ")]
    assert rows[0] == [
        "1",
        "seqs",
        "256",
        "yes",
        "80",
        "×",
        "32",
        "11",
        "4",
        "none",
        "100",
        "900",
        "ms",
        "carries",
    ]
    assert rows[1][-1] == "carries" and rows[1][1:3] == ["seqs", "8"]


def test_no_carrier_reads_as_one_sentence() -> None:
    """It read "No candidate carried Target concurrency 6." (the headline's words pasted in)."""
    record = replace(_record(), winner_index=None, winner_line=None, target_rate_rps=None)
    page = render_markdown(record)
    assert "No candidate carried the target concurrency 6." in page and "carried Target" not in page


def test_no_carrier_without_a_target_reads_as_one_sentence() -> None:
    """It read "No candidate carried the no target: each candidate proved at its own max_num_seqs."."""
    record = replace(
        _record(), winner_index=None, winner_line=None, target_rate_rps=None, target_concurrency=None
    )
    page = render_markdown(record)
    assert "No candidate carried its own max_num_seqs (no target)." in page
    assert "carried the no target" not in page


def test_a_started_candidate_without_a_proof_is_not_proved_in_the_terminal_table() -> None:
    """An interrupted (or rate-less) started candidate read "no start" in the terminal's verdict."""
    unproved = Candidate(1, Settings(max_num_seqs=4), "first", started=True)
    record = replace(_record(), candidates=(unproved,), winner_index=None, winner_line=None)
    out = io.StringIO()
    print_tune(record, Console(file=out, width=80))
    assert "not proved" in out.getvalue() and "no start" not in out.getvalue()


def test_an_interrupted_tune_without_a_winner_says_it_did_not_finish() -> None:
    """It read "No candidate carried the target concurrency 6." for a tune stopped by Ctrl-C."""
    record = replace(_record(), winner_index=None, winner_line=None, target_rate_rps=None)
    page = render_markdown(replace(record, status="interrupted"))
    said = "No winner yet: the tune was interrupted before a candidate carried the target concurrency 6."
    assert said in page


@pytest.mark.parametrize(
    ("status", "winner", "tune_exit", "report_exit"),
    [
        ("finished", 1, 0, 0),
        ("finished", None, 1, 1),  # the search ended: nothing it tried carried the target
        ("bounded", None, 1, 1),
        ("bounded", 1, 0, 0),  # the best so far
        ("interrupted", None, 130, 4),  # not done: no finding that nothing carries
        ("interrupted", 1, 130, 0),
        ("stopped", None, 1, 4),  # an error ended it (the tune raised: exit 2 or 3)
        ("running", None, 1, 4),  # its process was killed before it wrote an end
        ("no_evidence", None, 4, 4),
    ],
)
def test_report_exits_as_the_record_proves_and_an_unfinished_search_is_not_evaluated(
    status: str, winner: int | None, tune_exit: int, report_exit: int
) -> None:
    """``oomload report`` on a tune interrupted by SIGINT or SIGTERM exited 1, "no candidate carried the
    target": CI read an unfinished search as a negative result."""
    record = replace(_record(), status=status, winner_index=winner)
    assert record.verdict_exit_code() == report_exit
    if status != "stopped" and status != "running":  # the tune itself raised, or never returned
        assert record.exit_code() == tune_exit
