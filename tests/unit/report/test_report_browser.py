"""report.html in a real headless Chromium (Playwright driving the OS's chromium): its three plots
decode, no console error, the Run block is there, and the numbers it shows are those of
``summary.json`` — the per-step table (requests, req/s, KV max, preemptions, TTFT P99), the onset
finding and the ``vllm serve`` line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from oomload.report import finalize_run
from oomload.report.steptable import fmt_ms
from runbuilder import CPU_CACHE, StepSpec, cpu_knee_steps, write_run


def test_report_html_in_chromium_shows_the_numbers_of_summary_json(tmp_path: Path, browser_page: Any) -> None:
    page = browser_page
    steps = cpu_knee_steps()
    # one step carries its end line's throughput counts (what the live line printed): 30 in 10 s
    steps[3] = StepSpec(5, kv_max=0.9887, requests=15, end_extra={"ended": 30, "duration_s": 10.0})
    config = {"vllm_version": "0.11.0", "seed": 7, "order": "trace"}
    run = write_run(tmp_path / "run", steps, cache_config=CPU_CACHE, config=config)
    finalize_run(run, formats=("json", "html"), terminal=False)
    summary = json.loads((run / "summary.json").read_text())
    page.goto((run / "report.html").resolve().as_uri())
    page.wait_for_selector("body[data-plots-checked='1']", timeout=30_000)

    script = "imgs => imgs.map(i => [i.id, i.complete, i.naturalWidth])"
    widths = page.eval_on_selector_all("img.plot", script)
    assert {w[0] for w in widths} == {"plot-timeline", "plot-by-concurrency", "plot-lengths"}
    assert all(complete and width == 1056 for _, complete, width in widths), widths  # 11 in at 96 dpi

    meta = page.inner_text("#run-metadata")
    assert "vLLM 0.11.0" in meta and "order trace · seed 7" in meta and "block_size 32" in meta, meta

    headers = page.eval_on_selector_all("#per-step tr:first-child th", "ths => ths.map(t => t.textContent)")
    rows = page.eval_on_selector_all(
        "#per-step tr:not(:first-child)", "trs => trs.map(tr => [...tr.cells].map(c => c.textContent))"
    )
    shown = [dict(zip(headers, row, strict=True)) for row in rows]
    expected = summary["verdict"]["steps"]
    assert len(shown) == len(expected)
    for cells, step in zip(shown, expected, strict=True):
        assert cells["req"] == str(step["requests"])
        assert cells["req/s"] == f"{step['req_per_s']:.2f}"
        assert cells["KV max"] == f"{math.floor(step['kv_usage_max_share'] * 100 + 1e-9)}%"
        assert cells["preempt"] == str(step["preemptions"])
        assert cells["TTFT p99"] == fmt_ms(step["ttft"]["p99_ms"])
    assert shown[3]["req/s"] == "3.00" and shown[3]["KV max"] == "98%"

    onset = summary["verdict"]["onsets"]["preemption"]["concurrency"]
    assert page.inner_text("td[data-key=preemption_onset]").startswith(f"concurrency {onset} ")
    assert page.inner_text("#flag-line") == summary["recommendation"]["flag_line"]
    assert page.oomload_errors == []
