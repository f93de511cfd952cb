"""``oomload tune`` on the real vLLM (CPU build, tiny model): a real failed start, then a search over the
KV cache size (the CPU build's stand-in for utilization: ``--kv-cache-memory-bytes``) and
``max_num_seqs`` whose winner the server's own preemption counter vouches for.

Trace: fixed 256 + 256 tokens, so a request holds 2 blocks of 256 tokens. The user's line asks
``--max-model-len 4096``; a KV cache of 3 MiB (12 blocks of 256 tokens × 1 KiB per token) cannot hold
one such request, and vLLM refuses to start ("… the estimated maximum model length is …"). The tuner
cuts ``max_model_len`` to the trace's recommended value and starts; 12 blocks (11 usable) preempt at
concurrency 6 and above, so at the target 8 ``max_num_seqs`` 8 preempts, 5 carries (10 blocks), and 6,
the next larger setting, preempts again — the search stops for a reason. (When the API server starves
on 2 busy cores, the step with 5 does not hold concurrency 8 and proves nothing: the winner is then 4.)
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
        [str(vllm_python), str(LAUNCHER), "serve", str(tiny_model), "--served-model-name", "tiny-model",
         "--enforce-eager", "--block-size", "256", "--max-model-len", "4096", "--max-num-seqs", "64"]
    )  # fmt: skip
    out = tmp_path / "tune"
    result = subprocess.run(
        [sys.executable, "-m", "oomload", "tune", str(trace), "--serve", serve, "--target-concurrency", "8",
         "--kv-cache-memory-bytes", str(3 * 1024 * 1024), "--max-num-seqs", "4,5,6,8",
         "--startup-timeout-s", "180", "--replay-max-duration-s", "150", "--max-duration-s", "1200",
         "--hold-s", "5", "--run-dir", str(out)],
        capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    record = json.loads((out / "tune.json").read_text())
    cands = {c["index"]: c for c in record["candidates"]}
    first = cands[1]
    assert first["started"] is False and first["failure"]["cause"] == "context_too_long"
    assert "estimated maximum model length" in first["failure"]["message"]
    five = [c for c in cands.values() if c["started"] and c["settings"].get("max_num_seqs") == 5]
    assert five and five[0]["proof"]["preempted_at_target"] is False  # 10 blocks of 11: never preempts
    four = [c for c in cands.values() if c["started"] and c["settings"].get("max_num_seqs") == 4]
    if four and all("did not hold" in c["proof"]["evidence"] for c in (five[0], four[0])):
        # The starved load client of the comment below, at both 5 and 4 (seen once in CI, 2026-12-02):
        # no setting has evidence, and the tuner must say so and fail, never name one.
        assert result.returncode == ExitCode.GATE_FAILED, result.stdout[-4000:] + result.stderr[-2000:]
        assert record["winner_index"] is None and "No candidate carried" in result.stdout
        return
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    winner = cands[record["winner_index"]]
    # On 2 busy cores vLLM's API server can starve: the step at 8 then does not hold with 5 sequences
    # (seen once in three CI runs on 2026-12-02: the server held 4.3 of the client's 7.9), the tuner has
    # no evidence for 5 and must fall back to 4, the largest setting proven, never to one that preempts.
    expected = 4 if "did not hold" in five[0]["proof"]["evidence"] else 5
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
