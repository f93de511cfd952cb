"""Memory deaths on the simulated vLLM, whose host memory is real (``--host-*`` flags, docs/sim.md):
oomload finds the death's level, names its kind from the server's own words and exit status, samples
the server's memory, and advises what fits the kind. The replays run in subprocesses (Locust patches
the process with gevent); every load is bounded by its levels and ``--hold-s``.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from clirun import oomload
from oomload.errors import ExitCode

LEVELS = "1,2,4,8,16,32"
# a modelled process limit: requests' host memory (16 KiB a token of prompt + output) past 400 MiB is
# refused with the CPU allocator's words (vLLM's CPU build under `prlimit --data`). sample-chat's
# requests (mean 1,283 tokens) need about 300 MiB at 16 in flight (median), beside ~100 MiB of
# interpreter: a busy client that holds 12 of 16 may stay under it, 32 in flight (~600 MiB) never do.
PROCESS_LIMIT = "--host-memory-limit-mib 400 --host-limit-kind process --host-bytes-per-token 16384"
# a prefill budget above the L4's default (2048, the advice's floor), with the device memory its activations
# take: the death is then bounded by a smaller budget (the default's death is answered by a max_num_seqs cap)
BUDGET = 8192
BOUNDED = f"{PROCESS_LIMIT} --gpu-memory-utilization 0.9 --max-num-batched-tokens {BUDGET}"
# a container's limit (lower: a kill needs no allocation to fail): SIGKILLed, as the kernel's OOM killer does
CONTAINER_LIMIT = "--host-memory-limit-mib 250 --host-limit-kind container --host-bytes-per-token 16384"
SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "sample-chat.jsonl"


def _summary(run: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return doc


def test_an_allocation_that_fails_is_named_sized_and_bounded(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = oomload(
        *("replay", str(SAMPLE), "--sim", BOUNDED, "--concurrency", LEVELS, "--hold-s", "2"),
        *("--no-live", "--no-html", "--run-dir", str(run), "--gate", "no-oom-up-to:32"),
    )
    assert proc.returncode == ExitCode.GATE_FAILED, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = _summary(run)
    death = doc["verdict"]["onsets"]["engine_death"]
    assert death is not None and (death["kind"], death["memory"]) == ("cpu_oom", True)
    log = (run / "server.log").read_text()
    said = [int(n) for n in re.findall(r"you tried to allocate (\d+) bytes", log)]
    assert said and death["cause"]["tried_bytes"] == said[0]  # the size is the server's own word
    assert json.loads((run / "server_exit.json").read_text())["exit_status"] == 1
    memory = doc["verdict"]["server_memory"]
    assert memory["samples"] >= 10 and memory["peak_bytes"] > memory["first_bytes"]
    settings = {s["flag"]: s for s in doc["recommendation"]["settings"]}
    bound = settings["--max-num-batched-tokens"]
    assert bound["current"] == BUDGET  # the simulator's start-up log says it, as vLLM's does
    assert isinstance(bound["value"], int) and 2048 <= bound["value"] <= BUDGET // 4, bound
    assert "activation peak" in settings["--max-num-batched-tokens"]["reason"]
    gate = doc["gates"][0]
    assert gate["status"] == "fail" and "an OOM (an activation peak" in gate["reason"]


def test_a_container_kill_is_a_sigkill_with_no_words_and_says_what_is_missing(tmp_path: Path) -> None:
    """No cgroup limit is watched here (none is the simulator's own): the SIGKILL is evidence of a kill
    from outside, not yet of memory; the verdict says so instead of guessing. 16 requests in flight
    need more than its 250 MiB (sample-chat's prompts hold tens of MiB each at 16 KiB a token); the
    8 s hold leaves a busy client time to send them."""
    run = tmp_path / "run"
    serve = shlex.join(["oomload", "sim", "serve", "--time-scale", "0.025", *shlex.split(CONTAINER_LIMIT)])
    proc = oomload(
        *("replay", str(SAMPLE), "--serve", serve, "--concurrency", "4,16", "--hold-s", "8"),
        *("--no-live", "--no-html", "--gpu", "none", "--run-dir", str(run)),
    )
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((run / "server_exit.json").read_text())["exit_status"] == -9
    death = _summary(run)["verdict"]["onsets"]["engine_death"]
    assert death is not None and death["kind"] == "killed" and not death["memory"]
    assert death["cause"]["sentence"].startswith("killed from outside by SIGKILL")
    assert "Traceback" not in (run / "server.log").read_text()


@pytest.mark.slow
def test_a_soak_finds_a_leak_and_projects_it(tmp_path: Path) -> None:
    """150 s at concurrency 4 against a simulator whose memory grows 30 MiB a minute (1.8 GiB/h)."""
    run = tmp_path / "run"
    proc = oomload(
        *("replay", str(SAMPLE), "--sim", "--host-leak-mib-per-min 30", "--soak", "150s"),
        *("--concurrency", "4", "--no-live", "--no-html", "--run-dir", str(run)),
        timeout_s=600,
    )
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    trends = _summary(run)["verdict"]["memory_trends"]
    host = trends[0]
    assert host["verdict"] == "growing", host
    slope_mib_per_h = host["slope_bytes_per_h"] / 2**20
    assert 1200 < slope_mib_per_h < 2400, host  # 1,800 MiB/h configured; the interpreter's own noise
    assert "Memory trend (soak)" in proc.stdout and "grew" in proc.stdout


def test_bad_server_evidence_is_one_sentence_each_and_the_run_goes_on(tmp_path: Path) -> None:
    """A --server-pid that is not running, a --server-log that does not exist: said once each, the run
    is judged on what it has (exit 0), and a log created later is followed from its first byte."""
    run = tmp_path / "run"
    missing_log = tmp_path / "later" / "vllm.log"
    proc = oomload(
        *("replay", str(SAMPLE), "--concurrency", "1,2", "--hold-s", "1", "--no-live", "--no-html"),
        *("--server-pid", "4000000", "--server-log", str(missing_log), "--run-dir", str(run)),
    )
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    memory = [e for e in events if e["kind"] == "server_memory_unavailable"]
    logs = [e for e in events if e["kind"] == "server_log_problem"]
    assert len(memory) == 1 and "4000000" in memory[0]["detail"], memory
    assert len(logs) == 1 and str(missing_log) in logs[0]["detail"], logs
    assert proc.stdout.count("the server's memory is not sampled") == 1
    assert _summary(run)["verdict"]["server_memory"] is None  # nothing measured, nothing said
