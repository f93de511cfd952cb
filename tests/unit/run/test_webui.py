"""The oomload tab's words: the plan line (running, draining, over) and TTFT as its own metric."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from oomload.capacity.schedule import StepPlan
from oomload.errors import ConfigError
from oomload.run.snapshot import FinalState, LatencyFigures, PlanState, TelemetrySnapshot, TtftFigures
from oomload.run.webui import check_web_port, cross_origin, plan_text, telemetry_rows, ttft_text

PLAN = PlanState(levels=(1, 2, 4, 8, 16), planned_steps=5, refine=True)
STEP = StepPlan(3, 8, "ramp")


def test_the_plan_line_says_where_the_run_is() -> None:
    running = replace(PLAN, state="running", step_number=4, step_left_s=2.06)
    assert plan_text(running, STEP) == (
        "step 3 (ramp, concurrency 8) · 4 of 5 planned · levels 1,2,4,8,16 + refinement · 2.1 s left"
    )
    refine = StepPlan(6, 12, "refine")
    draining = replace(PLAN, state="draining", step_number=7, draining_to=12)
    assert plan_text(draining, refine) == (
        "step 6 (refine, concurrency 12) · levels 1,2,4,8,16 + refinement · draining to concurrency 12"
    )
    assert plan_text(replace(PLAN, state="over"), STEP) == "over · levels 1,2,4,8,16"


def test_rows_once_the_run_is_over_show_no_stale_now() -> None:
    snap = TelemetrySnapshot(
        t_unix_s=0.0,
        plan=replace(PLAN, state="over"),
        step=STEP,
        achieved_concurrency=2.1,
        ttft=TtftFigures(LatencyFigures(0), LatencyFigures(3, 120.0, 1250.0)),
        final=FinalState(0, "runs/x", False, flag_line="vllm serve m --max-num-seqs 7"),
    )
    rows = {r["what"]: r["value"] for r in telemetry_rows(snap)}
    assert "concurrency" not in rows and rows["last step"] == "3 (ramp, concurrency 8)"
    assert rows["TTFT (run)"] == "p50 120 ms · p99 1.25 s · n=3"
    assert rows["recommendation"] == "vllm serve m --max-num-seqs 7"
    assert ttft_text(None) == "no ok request yet"


def test_while_draining_the_rows_do_not_show_the_old_step_as_running() -> None:
    plan = replace(PLAN, state="draining", draining_to=5)
    snap = TelemetrySnapshot(t_unix_s=0.0, plan=plan, step=STEP, achieved_concurrency=6.4)
    rows = {r["what"]: r["value"] for r in telemetry_rows(snap)}
    assert rows["step"] == "3 (ramp) ended · draining"
    assert rows["concurrency"] == "next target 5 · achieved 6.4"


def test_the_snapshot_json_is_what_the_page_reads() -> None:
    """The HTTP edge: the typed snapshot becomes the JSON the cockpit page and scripts read."""
    metrics = {"t_unix_s": 5.0, "ok": True, "kv_cache_usage": 0.42, "num_requests_running": 3}
    gpu = {"t_unix_s": 5.0, "source": "nvml", "used_bytes": 2**30, "total_bytes": 4 * 2**30}
    snap = TelemetrySnapshot(
        t_unix_s=6.0, url="http://127.0.0.1:8000", plan=replace(PLAN, state="running", step_number=4),
        step=STEP, metrics=metrics, gpu=gpu, outcomes={"ok": 4}, preemptions_since_start=0,
    )  # fmt: skip
    body = snap.to_json()
    assert body["plan"]["state"] == "running" and body["plan"]["levels"] == [1, 2, 4, 8, 16]
    assert body["step"] == {"index": 3, "concurrency": 8, "phase": "ramp"}
    assert body["metrics"] == metrics and body["gpu"] == gpu and body["final"] is None
    assert "ttft" not in body
    rows = {r["what"]: r["value"] for r in telemetry_rows(snap)}
    assert rows["KV cache usage"] == "42%" and rows["running requests"] == "3"
    assert rows["GPU memory"] == "1.00 / 4.00 GiB (nvml)" and rows["outcomes"] == "ok 4"
    json.dumps(body)  # plain JSON all the way down


def test_the_servers_memory_is_a_row_with_its_limit_and_oom_kills() -> None:
    from oomload.rundir.servermemory import ServerMemoryRow

    host = ServerMemoryRow(
        t_unix_s=5.0,
        rss_bytes=2**30,
        cgroup_current_bytes=3 * 2**29,
        cgroup_limit_bytes=2 * 2**30,
        cgroup_oom_kill=1,
    )
    snap = TelemetrySnapshot(t_unix_s=6.0, plan=PLAN, server_memory=host)
    rows = {r["what"]: r["value"] for r in telemetry_rows(snap)}
    assert rows["server memory"] == "1.50 / 2.00 GiB · OOM kills 1"
    assert snap.to_json()["server_memory"]["used_bytes"] == 3 * 2**29
    json.dumps(snap.to_json())


def test_state_changing_requests_from_another_page_are_refused() -> None:
    evil = cross_origin("POST", "127.0.0.1:8089", "http://evil.example", None)
    assert evil is not None and "evil.example" in evil
    assert cross_origin("POST", "127.0.0.1:8089", None, "http://evil.example/page") is not None
    assert cross_origin("POST", "127.0.0.1:8089", "null", None) is not None  # a sandboxed page
    assert cross_origin("POST", "127.0.0.1:8089", "http://127.0.0.1:9999", None) is not None
    assert cross_origin("POST", "127.0.0.1:8089", "http://127.0.0.1:8089", None) is None  # its own page
    assert cross_origin("POST", "127.0.0.1:8089", None, "http://127.0.0.1:8089/?tab=oomload") is None
    assert cross_origin("POST", "127.0.0.1:8089", None, None) is None  # a script, not a web page
    assert cross_origin("GET", "127.0.0.1:8089", "http://evil.example", None) is None  # reads change nothing


def test_a_loopback_web_ui_refuses_a_rebound_name_that_is_its_own_origin() -> None:
    """DNS rebinding: evil.example re-pointed at 127.0.0.1 sends Origin and Host that match."""
    rebound = cross_origin("POST", "evil.example:8089", "http://evil.example:8089", None, loopback=True)
    assert rebound is not None and "not a loopback name" in rebound
    for host in ("localhost:8089", "127.0.0.1:8089", "[::1]:8089"):
        assert cross_origin("POST", host, f"http://{host}", None, loopback=True) is None
    # bound to all interfaces: the machine's own name is its page
    assert cross_origin("POST", "gpu-box:8089", "http://gpu-box:8089", None) is None


def test_a_loopback_web_ui_answers_no_read_under_a_rebound_name() -> None:
    """The rebound page is its own origin, so the browser lets it read: the telemetry and report pages
    show the target URL, the model, the plan and the verdict."""
    for method in ("GET", "HEAD"):
        rebound = cross_origin(method, "evil.example:8089", None, None, loopback=True)
        assert rebound is not None and "not a loopback name" in rebound
        assert cross_origin(method, "127.0.0.1:8089", None, None, loopback=True) is None
        assert cross_origin(method, "gpu-box:8089", None, None) is None  # bound to all interfaces: asked for


# Locust's own web UI with oomload's extension, driven through Flask's test client in a child process
# (importing locust patches the whole process with gevent): a cross-origin POST /stop and /swarm are
# refused and the run keeps running; the same POST from the UI's own page still stops it.
_LOCUST_WEB = """
import json
import gevent
from locust import User, constant, task
from locust.env import Environment
from oomload.run.snapshot import TelemetrySnapshot
from oomload.run.webui import extend_web_ui

class Idle(User):
    wait_time = constant(0.05)
    @task
    def nothing(self):
        pass

env = Environment(user_classes=[Idle], events=None)
runner = env.create_local_runner()
web_ui = env.create_web_ui("127.0.0.1", 0, delayed_start=True)
extend_web_ui(web_ui, lambda: TelemetrySnapshot(t_unix_s=0.0))
client = web_ui.app.test_client()
runner.start(2, spawn_rate=100)
for _ in range(200):  # bounded: until both users run
    if runner.user_count == 2 and runner.state == "running":
        break
    gevent.sleep(0.05)
out = {"state_before": runner.state}
evil = {"Origin": "http://evil.example"}
out["stop_evil"] = client.post("/stop", headers=evil).status_code
out["swarm_evil"] = client.post("/swarm", data={"user_count": 50, "spawn_rate": 50}, headers=evil).status_code
out["state_after_evil"] = runner.state
out["users_after_evil"] = runner.user_count
out["stop_own"] = client.post("/stop", headers={"Origin": "http://localhost"}).status_code
out["state_after_own"] = runner.state
runner.quit()
print(json.dumps(out))
"""


def test_a_cross_origin_stop_or_swarm_leaves_the_run_running() -> None:
    """Issue #24: a cross-origin ``POST /stop`` stalled a ``--web`` run at zero load; ``/swarm`` was taken."""
    done = subprocess.run(
        [sys.executable, "-c", _LOCUST_WEB], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["state_before"] == "running"
    assert out["stop_evil"] == 403 and out["swarm_evil"] == 403
    assert out["state_after_evil"] in ("running", "spawning") and out["users_after_evil"] == 2
    assert out["stop_own"] == 200 and out["state_after_own"] in ("stopped", "stopping")


def test_a_web_host_that_is_not_this_machines_is_named_not_taken_for_a_busy_port() -> None:
    with pytest.raises(ConfigError) as info:
        check_web_port("8.8.8.8", 18089)
    assert str(info.value) == (
        "the web UI cannot listen on 8.8.8.8:18089 (Cannot assign requested address); 8.8.8.8 is not an "
        "address of this machine; choose one with --web-host (default 127.0.0.1)"
    )


def test_a_web_ui_bound_beyond_loopback_is_said_to_have_no_login() -> None:
    from oomload.run.webui import web_ui_banner

    line = "Locust web UI: http://{}:8089 (telemetry: the oomload tab)"
    assert web_ui_banner("127.0.0.1", 8089) == line.format("127.0.0.1")
    shown, warning = web_ui_banner("0.0.0.0", 8089).split("\n")
    assert shown == line.format("0.0.0.0")
    assert warning.startswith("[yellow]warning:[/] the web UI has no login: whoever reaches port 8089")
