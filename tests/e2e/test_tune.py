"""``oomload tune`` on the real vLLM (CPU build, tiny model): a real failed start, then a search over the
KV cache size (the CPU build's stand-in for utilization: ``--kv-cache-memory-bytes``) and
``max_num_seqs`` whose winner the server's own preemption counter vouches for.

Trace: fixed 256 + 256 tokens, so a request holds 2 blocks of 256 tokens. The user's line asks
``--max-model-len 4096``; a KV cache of 3 MiB (12 blocks of 256 tokens × 1 KiB per token) cannot hold
one such request, and vLLM refuses to start ("… the estimated maximum model length is …"). The tuner
cuts ``max_model_len`` to the trace's recommended value and starts; 12 blocks (11 usable) preempt at
concurrency 6 and above, so at the target 8 ``max_num_seqs`` 8 preempts, 5 carries (10 blocks), and 6,
the next larger setting, preempts again — the search stops for a reason. The server runs at ``nice
-n 10``, which keeps the load client fed on a host it shares (``oomload.realvllm.server``). When vLLM
still starves the load client on these 2 cores, the step with 5 proves nothing even when measured
again, and the tune must stop there saying the load host limits (exit 4), never fall back to a
smaller setting.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ServerPool, write_trace_file

from oomload.errors import ExitCode
from oomload.realvllm.server import LAUNCHER

pytestmark = pytest.mark.e2e


def test_tune_over_kv_cache_size_and_max_num_seqs(
    vllm_servers: ServerPool, vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    vllm_servers.stop()  # one vLLM at a time on this machine: the tuner starts its own
    trace = write_trace_file(tmp_path / "fixed.jsonl", [(256, 256)] * 400)
    serve = shlex.join(
        ["nice", "-n", "10", str(vllm_python), str(LAUNCHER), "serve", str(tiny_model),
         "--served-model-name", "tiny-model",
         "--enforce-eager", "--block-size", "256", "--max-model-len", "4096", "--max-num-seqs", "64"]
    )  # fmt: skip
    out = tmp_path / "tune"
    result = subprocess.run(
        [sys.executable, "-m", "oomload", "tune", str(trace), "--serve", serve, "--target-concurrency", "8",
         "--kv-cache-memory-bytes", str(3 * 1024 * 1024), "--max-num-seqs", "4,5,6,8",
         "--startup-timeout-s", "180", "--replay-max-duration-s", "150", "--max-duration-s", "1400",
         "--hold-s", "5", "--run-dir", str(out)],
        capture_output=True, text=True, timeout=1700, check=False,
    )  # fmt: skip
    record = json.loads((out / "tune.json").read_text())
    cands = {c["index"]: c for c in record["candidates"]}
    first = cands[1]
    assert first["started"] is False and first["failure"]["cause"] == "context_too_long"
    assert "estimated maximum model length" in first["failure"]["message"]
    five = [c for c in cands.values() if c["started"] and c["settings"].get("max_num_seqs") == 5]
    assert five and five[0]["proof"]["preempted_at_target"] is False  # 10 blocks of 11: never preempts
    if five[0]["proof"]["no_evidence"]:
        # On this 2-core box vLLM's CPU build can starve the load client beside it (seen: it waited
        # 79–98 % of the step for a CPU, loop lag up to 10.8 s; the server ran its cap of 5 at moments
        # but 1.9 on average): 5 has no evidence even when measured again. The tuner must say the load
        # host limits and stop — never name a smaller setting for want of evidence (issue 32).
        assert result.returncode == ExitCode.GATE_NOT_EVALUATED, result.stdout[-4000:] + result.stderr[-2000:]
        assert record["status"] == "no_evidence" and record["winner_index"] is None
        assert five[0]["proof"]["remeasured"] and "the load host limits" in record["notes"][-1]
        later = [c for c in cands.values() if c["index"] > five[0]["index"]]
        assert later == [], later  # nothing smaller tried after it
        return
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    winner = cands[record["winner_index"]]
    expected = 5
    assert winner["settings"]["max_num_seqs"] == expected, five[0]["proof"]["evidence"]
    assert winner["settings"]["max_model_len"] < 4096
    # zero preemptions at the target by the server's own counter, in the winner's replay
    summary = json.loads(Path(winner["proof"]["run_dir"], "summary.json").read_text())
    at_target = [s for s in summary["verdict"]["steps"] if s["concurrency"] == 8 and not s["warmup"]]
    assert at_target and all(s["preemptions_counter"] == 0 for s in at_target)
    assert sum(s["requests"] for s in at_target) >= 16
    # the next larger setting on the ladder does preempt: the search stopped for a reason
    larger = [c for c in cands.values() if c["started"] and c["settings"].get("max_num_seqs") == 6]
    assert larger and larger[0]["proof"]["preempted_at_target"] is True
    assert record["winner_line"].endswith(f"--max-num-seqs {expected}")
