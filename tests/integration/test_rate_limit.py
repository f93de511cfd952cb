"""A limit in front of the engine, through the real Locust replay path: a gateway that admits 2 requests
at a time to a simulated vLLM and answers the rest HTTP 429, or a bare 503 as nginx's ``limit_req`` does.

Found by hand (a loopback gateway admitting 4 in front of the simulator, levels 1,2,4,8,16, 5 s holds):
every 429 read "server_error" like an engine's failure; each turned-away user re-sent at once, so the
step at 8 sent 2,490 requests (2,485 of them 429s) and the one at 16 as many; the ramp climbed on, though
vLLM's own counters saw 4 running at both; the run read "NOTHING TO JUDGE: 4948 of 4954 requests
failed", and the advice was ``--max-num-seqs 4`` — the gateway's limit, taken for the engine's.
A bare 503 was read as vLLM's own queue limit (``admission_rejected``): the level unsafe, the same cut.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clirun import oomload
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace
from stubserver import NGINX_503, TOO_MANY, limiting_gateway

LIMIT = 2  # requests the gateway lets through at once
HOLD_S = 3.0


# each refusal, and the error ``requests.jsonl`` gives its requests
REFUSALS = {"429": (TOO_MANY, "http 429: rate_limit_error"), "nginx-503": (NGINX_503, "http 503")}


@pytest.fixture(scope="module", params=sorted(REFUSALS))
def gateway(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The gateway's URL, and the error its refusals are recorded with."""
    refusal, error = REFUSALS[request.param]
    args = ("--num-gpu-blocks", "400", "--block-size", "16", "--max-model-len", "2048", "--time-scale", ".3")
    with SimServer(args) as sim, limiting_gateway(sim.url, LIMIT, refusal) as url:
        yield url, error


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_a_gateways_refusals_stop_the_ramp_and_are_named_not_taken_for_the_engine(
    gateway: tuple[str, str], tmp_path: Path
) -> None:
    url, error = gateway
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRecord(f"r{i}", 0.0, 64, 32) for i in range(20)], TraceHeader(format="test"))
    run_dir = tmp_path / "run"
    proc = oomload(
        *("replay", str(trace), "--url", url, "--run-dir", str(run_dir), "--gpu", "none", "--no-html"),
        *(
            "--concurrency",
            "1,2,4,8",
            "--hold-s",
            str(HOLD_S),
            "--no-evidence",
            "--metrics-interval-s",
            "0.5",
        ),
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert proc.returncode == 0, out  # levels 1 and 2 were measured: a verdict, no gate
    assert json.loads((run_dir / "status.json").read_text())["end_reason"] == "rate_limited"
    ends = [line for line in _lines(run_dir / "steps.jsonl") if line["event"] == "end"]
    assert [e["concurrency"] for e in ends] == [1, 2, 4], ends  # the ramp stopped after the step at 4
    requests = [r for f in sorted(run_dir.glob("requests*.jsonl")) for r in _lines(f)]
    limited = [r for r in requests if r["outcome"] == "rate_limited"]
    assert limited and {r["error"] for r in limited} == {error}
    assert {r["concurrency"] for r in limited} == {4}
    # a turned-away user waits a second before it sends again: two of them over a 3 s hold send a
    # handful, not the thousands a second they sent before
    assert len(limited) <= 4 * (LIMIT * (HOLD_S + 2)), len(limited)
    verdict = json.loads((run_dir / "summary.json").read_text())["verdict"]
    assert verdict["requests"]["rate_limited"] == len(limited)
    assert verdict["requests"]["failed_run"] is None
    assert not verdict["steps"][2]["trusted"]  # the level the gateway limited is no evidence
    assert verdict["first_unsafe_concurrency"] is None  # nor a failure of the engine's
    assert [s["rate_limited"] for s in verdict["steps"]] == [False, False, True]
    screen = " ".join(proc.stdout.replace("│", " ").split())
    assert (
        "the run stopped at concurrency 4 (step 2): a limit in front of the engine turned requests away"
        in screen
    )
    assert "point --url at the vLLM server itself" in screen
    assert "--max-num-seqs" not in screen
