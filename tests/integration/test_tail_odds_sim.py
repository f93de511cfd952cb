"""A ``--tail-percentile`` replay's odds are the tail's: the run draws them from the requests it sends
(``trace.model.replayed``), so ``odds.jsonl`` holds what the trace's longest requests do on the pool,
not what the whole trace does, and the verdict judges the run against them. The replay runs in a
subprocess (Locust patches the process with gevent) against the simulator it starts; its load is bounded
by its two levels, ``--hold-s`` and ``--max-duration-s``."""

from __future__ import annotations

import json
from pathlib import Path

from clirun import oomload
from oomload.capacity.odds import LevelOdds, Pool, TraceOdds
from oomload.errors import ExitCode
from oomload.load.payload import RequestOrder
from oomload.trace.model import read_trace, read_trace_header
from oomload.verdict.runinfo import config_limits
from oomload.verdict.runview import SERVER_LOG, read_log_tail

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "sample-chat.jsonl"
SIM = "--model llama-3.1-8b --gpu l4 --max-model-len 8192 --num-gpu-blocks 800 --time-scale 0.02"
FLAGS = ("--concurrency", "2,6", "--hold-s", "2", "--no-live", "--no-html", "--gpu", "none", "--no-evidence")


def test_a_tail_replay_records_the_tails_odds(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = oomload(
        *("replay", str(SAMPLE), f"--sim={SIM}", "--tail-percentile", "90", *FLAGS),
        *("--run-dir", str(run), "--max-duration-s", "120"),
    )
    assert proc.returncode in (ExitCode.OK, ExitCode.GATE_FAILED), proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "odds.jsonl").read_text().splitlines()]
    recorded = {o.concurrency: o for o in filter(None, map(LevelOdds.from_json, lines))}
    pool = Pool.from_cache_config(json.loads((run / "cache_config.json").read_text()), 8192)
    assert pool is not None
    trace = run / "trace.jsonl"
    prefix = read_trace_header(trace).prefix_or_default()
    records = read_trace(trace)
    tail = RequestOrder(records, tail_percentile=90.0).records
    assert 0 < len(tail) < len(records) / 5
    limits = config_limits(json.loads((run / "config.json").read_text()), read_log_tail(run / SERVER_LOG))
    pool = pool.with_limits(limits.max_num_seqs, limits.max_num_batched_tokens)  # as the run reads them
    tail_odds = TraceOdds.of_records(tail, prefix, pool)
    whole_odds = TraceOdds.of_records(records, prefix, pool)
    assert recorded[6] == tail_odds.at(6)
    assert recorded[6] != whole_odds.at(6)
    summary = json.loads((run / "summary.json").read_text())
    judged = {lv["concurrency"]: lv["odds"]["preemptions"] for lv in summary["verdict"]["level_summaries"]}
    assert {2, 6} <= set(judged)  # and the levels the refinement added between them, when it did
    assert judged == {c: tail_odds.at(c).preemptions for c in judged}
