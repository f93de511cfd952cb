"""The replay's odds run under the server's own ``max_num_seqs`` (``oomload.realvllm.limits``): a
simulated vLLM started with ``--serve … --max-num-seqs 2``, or started by someone else and described by
``--url … --served-with …`` (what ``oomload tune`` tells each candidate's replay), or the one a replay
without --url starts with ``--sim="… --max-num-seqs 2"``, gets odds computed
for two running at a time, not vLLM's default 256. The replay runs in a subprocess (Locust patches the
process with gevent); its load is bounded by its two levels and ``--hold-s``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from clirun import oomload
from oomload.capacity.odds import LevelOdds, Pool, TraceOdds
from oomload.errors import ExitCode
from oomload.sim.process import SimServer
from oomload.trace.model import read_trace, read_trace_header

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "sample-chat.jsonl"
SIM = "--model llama-3.1-8b --gpu l4 --max-model-len 4096 --num-gpu-blocks 300 --time-scale 0.02"


SERVE = shlex.join(["oomload", "sim", "serve", *shlex.split(SIM), "--max-num-seqs", "2"])
FLAGS = ("--concurrency", "2,8", "--hold-s", "2", "--no-live", "--no-html", "--gpu", "none", "--no-evidence")


def test_the_odds_take_the_serve_lines_max_num_seqs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = oomload("replay", str(SAMPLE), "--serve", SERVE, *FLAGS, "--run-dir", str(run))
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    _odds_are_for_two_running(run)


def test_the_odds_take_the_served_with_lines_max_num_seqs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # the key is scrubbed from everything the run writes; the line still gives the limits
    served_with = f"{SERVE} --api-key sk-served-with-secret"
    with SimServer([*shlex.split(SIM), "--max-num-seqs", "2"]) as sim:
        proc = oomload(
            *("replay", str(SAMPLE), "--url", sim.url, "--served-with", served_with, *FLAGS),
            *("--run-dir", str(run)),
        )
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    _odds_are_for_two_running(run)
    config = json.loads((run / "config.json").read_text())
    assert config["served_with"] == f"{SERVE} --api-key ***"
    # what `compare` shows as the server's line
    assert json.loads((run / "provenance.json").read_text())["serve"] == config["served_with"]
    assert not [p for p in run.rglob("*") if p.is_file() and b"sk-served-with-secret" in p.read_bytes()]


def test_the_odds_take_the_simulators_own_max_num_seqs(tmp_path: Path) -> None:
    """Without --url the simulator oomload starts has its flags (``--sim``) as its line, as the verdict
    reads them (``runinfo.served_scheduler``): seen with --max-num-seqs 3 and 200 + 3000 tokens, the odds
    ran 256 at a time ("onset 5–8 … DISAGREES", 108 preemptions per 100 expected at 8) where 3 ran."""
    run = tmp_path / "run"
    proc = oomload("replay", str(SAMPLE), f"--sim={SIM} --max-num-seqs 2", *FLAGS, "--run-dir", str(run))
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    _odds_are_for_two_running(run)


def _odds_are_for_two_running(run: Path) -> None:
    lines = [json.loads(x) for x in (run / "odds.jsonl").read_text().splitlines()]
    recorded = {(o.shape, o.concurrency): o for o in filter(None, map(LevelOdds.from_json, lines))}
    cache = json.loads((run / "cache_config.json").read_text())
    pool = Pool.from_cache_config(cache, 4096)
    assert pool is not None and pool.max_num_seqs == 256  # what /metrics alone would have given
    trace = run / "trace.jsonl"
    prefix = read_trace_header(trace).prefix_or_default()
    served = TraceOdds.of_records(read_trace(trace), prefix, pool.with_limits(2, None))
    default = TraceOdds.of_records(read_trace(trace), prefix, pool)
    (shape, level), odds = next((k, v) for k, v in recorded.items() if k[1] == 8)
    assert odds == served.at(level, shape=shape)
    assert odds != default.at(level, shape=shape)  # 8 running at once on 300 blocks preempt more than 2
