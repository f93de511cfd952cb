"""One number, one rounding: the live line, the web UI, the per-step table and the findings state one
KV reading and one step's req/s the same way (issue 14: 99 % / 98 % / "not seen" for one 0.9887, and
0.50 vs 0.75 req/s for one step)."""

from __future__ import annotations

from pathlib import Path

from oomload.report.findings import describe
from oomload.report.steptable import STEP_COLUMNS, step_row
from oomload.run.progress import step_line
from oomload.run.snapshot import TelemetrySnapshot
from oomload.run.webui import telemetry_rows
from oomload.rundir import RunReader
from oomload.verdict import build_verdict
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, StepSpec, write_run

KV = 0.9887


def test_one_kv_reading_and_one_rate_read_the_same_everywhere(tmp_path: Path) -> None:
    # 4 requests sent by the step, 3 ended (not cancelled) while it held for 4 s: 0.75 req/s
    spec = StepSpec(2, kv_max=KV, requests=4, duration_s=4.0,
                    end_extra={"ended": 3, "duration_s": 4.0, "completion_tokens": 600})  # fmt: skip
    run = write_run(tmp_path / "run", [spec], cache_config=CPU_CACHE)
    end = next(line for line in RunReader(run).stream("steps") if line["event"] == "end")
    live = step_line(end, 4.0, KV)
    assert "0.75 req/s" in live and "KV max 98%" in live, live

    web = {
        r["what"]: r["value"] for r in telemetry_rows(TelemetrySnapshot(0.0, metrics={"kv_cache_usage": KV}))
    }
    assert web["KV cache usage"] == "98%"

    verdict = build_verdict(load_run(run))
    row = dict(zip(STEP_COLUMNS, step_row(verdict.steps[0]), strict=True))
    assert (row["req/s"], row["out tok/s"], row["KV max"]) == ("0.75", "150", "98%")
    findings = {f.key: f.text for f in describe(verdict, recommend(verdict))}
    assert findings["kv_saturation"] == "not seen (never ≥ 99 % in two scrapes in a row)"


def test_a_step_without_an_end_line_falls_back_to_its_own_requests(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [StepSpec(2, requests=4, duration_s=4.0, cut_short=True)])
    verdict = build_verdict(load_run(run))
    assert verdict.steps[0].req_per_s is not None and verdict.steps[0].req_per_s > 0
