"""A gateway's limit in front of the real vLLM: a loopback proxy that lets 2 requests at a time through to
the engine and answers HTTP 429 to the rest, as a gateway's concurrency limit does.

The run names the 429s ``rate_limited``, stops its ramp after the first level the gateway limited, sends
a turned-away request about once a second per user (not hundreds), and the engine's own counters show
what the verdict says: the limit's 2 running at the level of 4, not 4.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import FIGURES, Run, ServerPool, replay, write_trace_file

from stubserver import limiting_gateway

pytestmark = pytest.mark.e2e

LIMIT = 2  # requests the gateway lets through at once
HOLD_S = 6.0


@pytest.fixture
def gateway(vllm_servers: ServerPool) -> Iterator[str]:
    with limiting_gateway(vllm_servers.get().url, LIMIT) as url:
        yield url


def test_a_gateways_limit_is_named_and_stops_the_ramp_on_the_real_vllm(gateway: str, tmp_path: Path) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", [(64, 48)] * 30)
    run_dir = tmp_path / "run"
    proc = replay(
        gateway,
        trace,
        run_dir,
        *("--concurrency", "1,2,4,8", "--hold-s", str(HOLD_S), "--warmup-s", "0", "--no-evidence"),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr  # 1 and 2 measured: a verdict, no gate
    assert json.loads((run_dir / "status.json").read_text())["end_reason"] == "rate_limited"
    run = Run.read(run_dir)
    assert [s["concurrency"] for s in run.steps if s["event"] == "end"] == [1, 2, 4], proc.stdout
    limited = [r for r in run.requests if r["outcome"] == "rate_limited"]
    assert limited and {r["concurrency"] for r in limited} == {4}, proc.stdout
    assert {r["error"] for r in limited} == {"http 429: rate_limit_error"}
    # two turned-away users, each waiting a second between tries, over a 6 s hold (and its drain)
    assert len(limited) <= 2 * LIMIT * (HOLD_S + 4), len(limited)
    assert run.summary is not None
    verdict = run.summary["verdict"]
    assert verdict["requests"]["rate_limited"] == len(limited) and verdict["requests"]["failed_run"] is None
    assert verdict["first_unsafe_concurrency"] is None  # the engine failed nothing
    step = verdict["steps"][2]
    assert step["rate_limited"] and not step["trusted"]
    assert step["running_max"] is not None and step["running_max"] <= LIMIT  # the engine saw the limit's 2
    screen = " ".join(proc.stdout.replace("│", " ").split())
    assert "the run stopped at concurrency 4 (step 2): a limit in front of the engine" in screen
    assert "point --url at the vLLM server itself" in screen
    FIGURES.append(
        f"a gateway admitting {LIMIT}: {len(limited)} × 429 at 4 in {HOLD_S:g} s, the ramp stopped there, "
        f"vLLM ran at most {step['running_max']}"
    )
