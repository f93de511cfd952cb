"""End to end: a replay of a shared-prefix trace against the simulator predicts for both prompt shapes.

The hand case of reference prefix-caching.md (80 blocks of 32 tokens, 600-token prompts whose first
512 tokens are one trace id, 100 output tokens): the arithmetic gives onset 11 with the shared prefix
and 4 with distinct prompts. The replay sends the shared prefixes (``--prefix-sharing``), so the run's
own odds are the production shape's and its arithmetic is judged with the shared prefix; the worst case
stands beside it. The replay runs in a subprocess (Locust monkey-patches the process with gevent).
"""

from __future__ import annotations

import json
from pathlib import Path

from clirun import oomload
from oomload.trace.model import PrefixInfo, TraceHeader, TraceRecord, write_trace

SIM = "--num-gpu-blocks 80 --block-size 32 --max-model-len 2048 --time-scale 0.1 --enable-prefix-caching"


def test_a_shared_prefix_replay_is_predicted_for_both_shapes(tmp_path: Path) -> None:
    trace = tmp_path / "shared.jsonl"
    records = [TraceRecord(f"r{i}", 0.1 * i, 600, 100, hash_ids=(7, 100 + i)) for i in range(40)]
    write_trace(trace, records, TraceHeader(source=("shared-512",), prefix=PrefixInfo(block_tokens=512)))
    run = tmp_path / "run"
    proc = oomload(
        "replay", str(trace), "--sim", SIM, "--prefix-sharing",
        "--concurrency", "2,3", "--hold-s", "1.2", "--stop-on", "never", "--no-refine",
        "--gpu", "none", "--no-live", "--run-dir", str(run),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    odds = [json.loads(line) for line in (run / "odds.jsonl").read_text().splitlines()]
    assert {(o["prompts"], o["concurrency"]) for o in odds} >= {("production", 2), ("production", 3)}
    verdict = json.loads((run / "summary.json").read_text())["verdict"]
    assert verdict["prompt_shape"] == "production"
    prediction = verdict["prediction"]
    assert (prediction["shape"], prediction["band_low"], prediction["band_high"]) == ("production", 11, 14)
    assert prediction["basis"] == "trace"
    assert prediction["other"]["shape"] == "worst-case" and prediction["other"]["band"] == [4, 4]
    report = (run / "report.md").read_text()
    assert "with shared prefixes" in report and "worst case, nothing shared: 4" in report
