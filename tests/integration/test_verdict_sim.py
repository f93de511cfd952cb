"""End to end: a replay against the simulated vLLM whose KV pool is known gives the arithmetic onset.

The pool and the requests are tests/onsetload.py's: 3 requests fit, the first preemption is expected
at 4 concurrent requests. The simulator runs at ``--time-scale 0.02`` (a request takes about 0.4 s) and each
level holds 2 s, so every level sends 12–22 requests and a level preempts on its own load, not on where
one wave of requests happened to start: at 0.1 with 1.2 s holds each level sent 2–4 requests, level 4
preempted only while its four requests grew in step, and a clean level 4 fell short of the 11 requests
its odds ask for. The replay runs in a subprocess (it imports Locust, which monkey-patches the process
with gevent).
"""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from clirun import oomload
from onsetload import ARITHMETIC_ONSET, SIM, fixed_trace
from oomload.cli import main

LEVELS = (2, 3, 4, 5)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("verdict-sim")
    trace = fixed_trace(tmp / "fixed.jsonl")
    run = tmp / "run"
    proc = oomload(
        "replay", str(trace),
        "--sim", f"{SIM} --time-scale 0.02",
        "--concurrency", ",".join(map(str, LEVELS)),
        "--hold-s", "2",
        "--stop-on", "never",
        "--no-refine",
        "--gpu", "none",
        "--no-live",
        "--run-dir", str(run),
        "--gate", "no-oom-up-to:5",
    )  # fmt: skip
    return run, proc


def summary(run: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return doc


def test_replay_onset_matches_the_arithmetic(replayed: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run, proc = replayed
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = summary(run)["verdict"]
    assert verdict["run"]["finished"] is True and verdict["run"]["cut_short"] is False
    assert verdict["prediction"]["onset_mean"] == ARITHMETIC_ONSET
    onset = verdict["onsets"]["preemption"]
    assert onset is not None, "no preemption observed against a pool that holds only 3 requests"
    levels = list(LEVELS)
    assert abs(levels.index(onset["concurrency"]) - levels.index(ARITHMETIC_ONSET)) <= 1
    assert onset["requests_in_step"] > 0 and onset["preemptions_in_step"] > 0
    assert verdict["last_safe_concurrency"] == levels[levels.index(onset["concurrency"]) - 1]
    assert verdict["onsets"]["engine_death"] is None
    assert verdict["prediction"]["disagrees"] is False
    assert summary(run)["gates"][0]["status"] == "pass"
    rec = summary(run)["recommendation"]
    assert rec["flag_line"].endswith(f"--max-num-seqs {verdict['last_safe_concurrency']}")
    # the simulator states its prefill budget at start-up, as vLLM V1 does; the advice's current is it
    said = re.findall(
        r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)\.", (run / "server.log").read_text()
    )
    settings = {s["flag"]: s for s in rec["settings"]}
    assert len(said) == 1 and settings["--max-num-batched-tokens"]["current"] == int(said[0])
    # 512 tokens P99 + 10 % → 768 (a multiple of 256 and of the 16-token block), below the 1024 limit
    assert rec["max_model_len"]["max_model_len"] == 768


def test_every_report_renders(replayed: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run, _ = replayed
    assert summary(run)["schema"] == "oomload.summary/1"
    assert "| step | conc |" in (run / "report.md").read_text()
    assert (run / "report.html").read_text().count("data:image/png;base64,") == 3
    assert ET.parse(run / "junit.xml").getroot().find(".//testcase[@name='no-oom-up-to:5']") is not None


def test_gates_pass_and_fail_where_they_should(
    replayed: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    run, _ = replayed
    onset = summary(run)["verdict"]["onsets"]["preemption"]["concurrency"]
    assert main(["report", str(run), "--format", "json", "--gate", f"no-preemption-below:{onset}"]) == 0
    assert main(["report", str(run), "--format", "json", "--gate", f"no-preemption-below:{onset + 1}"]) == 1
    assert summary(run)["gates"][0]["reason"] == f"preemption at concurrency {onset}"
    assert main(["report", str(run), "--format", "json", "--gate", "no-oom-up-to:64"]) == 4
    assert "did not reach concurrency 64" in summary(run)["gates"][0]["reason"]
