"""Real Locust (in the ``oomload replay`` process, and with ``--processes 2``) against the simulated vLLM.

Each replay runs as a subprocess (Locust monkey-patches the process it runs in); the simulated server
is a ``SimServer`` owned by the test. Assertions are on counts, lengths and files, never on timing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from clirun import default_sigint, oomload
from oomload.load.backoff import failing_backoff_s
from oomload.rundir import RunReader
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-oomload-test-secret-4711"
SIM_FAST = (
    "--num-gpu-blocks",
    "400",
    "--block-size",
    "16",
    "--max-model-len",
    "2048",
    "--time-scale",
    "0.05",
)


def _trace(path: Path, lengths: list[tuple[int, int]]) -> Path:
    records = [TraceRecord(f"r{i}", i * 0.05, p, o) for i, (p, o) in enumerate(lengths)]
    write_trace(path, records, TraceHeader(format="test"))
    return path


def _replay(args: list[str], *, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return oomload(
        "replay",
        *args,
        "--no-live",
        "--gpu",
        "none",
        env={"OPENAI_API_KEY": SECRET},
        cwd=REPO,
        timeout_s=timeout_s,
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(SIM_FAST) as server:
        yield server


def _assert_exact(run_dir: Path) -> list[object]:
    """Every request that ended on its own is ok with exact lengths; only the last step's may be cancelled."""
    everything = RunReader(run_dir).requests()
    last_step = max(r.step for r in everything)
    cancelled = [r for r in everything if r.outcome.value == "cancelled"]
    assert all(r.step in (last_step, -1) for r in cancelled), cancelled
    results = [r for r in everything if r.outcome.value != "cancelled"]
    assert results, "no request was recorded"
    for r in results:
        assert r.outcome.value == "ok", r
        assert r.usage_prompt_tokens == r.prompt_tokens_asked
        assert r.usage_completion_tokens == r.output_tokens_asked
    return list(results)


def test_replay_in_process_follows_the_schedule_with_exact_lengths(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(40 + 7 * i, 5 + i % 9) for i in range(30)])
    run_dir = tmp_path / "run"
    proc = _replay(
        [
            str(trace),
            "--url",
            sim.url,
            "--concurrency",
            "1,2,4",
            "--hold-s",
            "1",
            "--min-requests",
            "3",
            "--stop-on",
            "never",
            "--no-refine",
            "--run-dir",
            str(run_dir),
        ]
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    reader = RunReader(run_dir)
    config = reader.config()
    assert config["schedule"]["levels"] == [1, 2, 4] and config["url"] == sim.url
    assert config["api_key_env"] == "OPENAI_API_KEY" and config["simulated"] is False
    steps = list(reader.stream("steps"))
    assert [s["concurrency"] for s in steps if s["event"] == "start"] == [1, 2, 4]
    ends = [s for s in steps if s["event"] == "end"]
    assert [s["reason"] for s in ends] == ["hold_done"] * 3
    assert all(s["ended"] >= 3 for s in ends)
    assert all(s["achieved_concurrency_max"] <= s["concurrency"] for s in ends)
    results = _assert_exact(run_dir)
    # "started" is the step's own request lines (how the verdict counts a step), whatever they became
    by_step = Counter(r.step for r in RunReader(run_dir).requests())
    assert [s["started"] for s in ends] == [by_step[0], by_step[1], by_step[2]]
    assert all(s["ended"] == s["ended_ok"] + s["ended_errors"] for s in ends)
    assert all(sum(s["ended_outcomes"].values()) == s["ended"] + s["ended_cancelled"] for s in ends)
    # --no-live: one line per step, printed when it ends, with that step's own counts
    step_lines = [line for line in proc.stdout.splitlines() if " · ended: " in line]
    assert len(step_lines) == 3, proc.stdout
    for line, end in zip(step_lines, ends, strict=True):
        assert f"step {end['step']} " in line and f"sent {end['started']} " in line
        assert f"ended: ok {end['ended_outcomes']['ok']} " in line
    assert {r.step for r in results} == {0, 1, 2}  # type: ignore[attr-defined]
    assert reader.status() is not None and reader.status()["finished"] is True  # type: ignore[index]
    assert reader.status()["end_reason"] == "completed"  # type: ignore[index]
    assert sum(1 for _ in reader.stream("metrics")) >= 2
    copied = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines()[1:]]
    assert len(copied) == 30
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


@pytest.mark.slow
def test_replay_with_two_worker_processes(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(30 + 11 * i, 4 + i % 5) for i in range(20)])
    run_dir = tmp_path / "run"
    proc = _replay(
        [
            str(trace),
            "--url",
            sim.url,
            "--concurrency",
            "2,4",
            "--hold-s",
            "1",
            "--min-requests",
            "4",
            "--stop-on",
            "never",
            "--processes",
            "2",
            "--run-dir",
            str(run_dir),
        ]
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    # the workers stream their results to the master: one requests.jsonl, as in a single-process run
    files = sorted(p.name for p in run_dir.glob("requests*.jsonl"))
    assert files == ["requests.jsonl"]
    assert sorted(p.name for p in run_dir.glob("worker.*.log")) == ["worker.0.log", "worker.1.log"]
    results = _assert_exact(run_dir)
    assert len({r.request_id for r in results}) == len(results)  # type: ignore[attr-defined]
    assert {r.step for r in results} <= {-1, 0, 1}  # type: ignore[attr-defined]
    steps = [s for s in RunReader(run_dir).stream("steps") if s["event"] == "start"]
    assert [s["concurrency"] for s in steps] == [2, 4]


@pytest.mark.slow
def test_production_shape_across_two_worker_processes_hits_what_the_trace_shares(
    sim: SimServer, tmp_path: Path
) -> None:
    """Every request shares a 128-token system prompt (8 ids of 16 tokens): by default both worker
    processes send it as the same tokens, so the simulated vLLM (prefix caching on, as V1) hits it,
    and the verdict shows its hit rate beside the trace's expected one."""
    from oomload.trace.model import PrefixInfo, read_trace_header

    records = [TraceRecord(f"r{i}", 0.0, 160, 4, hash_ids=tuple(range(1, 9))) for i in range(40)]
    trace = tmp_path / "t.jsonl"
    write_trace(trace, records, TraceHeader(format="test", prefix=PrefixInfo(block_tokens=16)))
    run_dir = tmp_path / "run"
    shape = ["--concurrency", "2,4", "--hold-s", "1", "--min-requests", "8", "--stop-on", "never"]
    proc = _replay([str(trace), "--url", sim.url, *shape, "--processes", "2", "--run-dir", str(run_dir)])
    assert proc.returncode == 0, proc.stderr + proc.stdout
    _assert_exact(run_dir)
    assert json.loads((run_dir / "config.json").read_text())["prefix"]["mode"] == "shared"
    assert read_trace_header(run_dir / "trace.jsonl").prefix == PrefixInfo(block_tokens=16)
    prefix = json.loads((run_dir / "summary.json").read_text())["verdict"]["prefix"]
    assert prefix["measured"] == "production shape: shared prefixes" and prefix["problem"] is None
    assert prefix["server_prefix_caching"] is True
    assert prefix["expected_hit_rate"] > 0.7  # 128 of 160 tokens, less the first request of each pass
    assert abs(prefix["server_hit_rate"] - prefix["expected_hit_rate"]) <= 0.1 * prefix["expected_hit_rate"]
    assert "Prompt shape" in proc.stdout and "production shape: shared prefixes" in proc.stdout


def test_outcome_classes_from_the_simulator(tmp_path: Path) -> None:
    # max_model_len 256: prompt 300 → 400 overflow; 200 + 100 → clamped (truncated); tiny queue → 503s
    lengths = [(300, 5), (200, 100)] + [(60, 30)] * 30
    trace = _trace(tmp_path / "t.jsonl", lengths)
    run_dir = tmp_path / "run"
    sim_args = (
        "--num-gpu-blocks",
        "24",
        "--block-size",
        "16",
        "--max-model-len",
        "256",
        "--time-scale",
        "0.5",
        "--max-num-queued-reqs",
        "1",
        "--stream-reject-every",
        "2",
    )
    with SimServer(sim_args) as server:
        proc = _replay(
            [
                str(trace),
                "--url",
                server.url,
                "--concurrency",
                "8",
                "--hold-s",
                "2",
                "--min-requests",
                "30",
                "--stop-on",
                "never",
                "--run-dir",
                str(run_dir),
                "--max-duration-s",
                "30",
            ]
        )
    results = RunReader(run_dir).requests()
    outcomes = Counter(r.outcome.value for r in results)
    # the one-slot queue turned requests away: its engine was full, so the run loaded it and is judged
    # (a rejected user waits a second before it sends again: before, each re-sent at once and the
    # rejections outnumbered the answers, "nothing to judge")
    assert outcomes["admission_rejected"] < outcomes["ok"], outcomes
    assert proc.returncode == 0, proc.stderr + proc.stdout
    verdict = json.loads((run_dir / "summary.json").read_text())["verdict"]
    assert verdict["requests"]["failed_run"] is None and verdict["first_unsafe_concurrency"] == 8
    assert outcomes["context_overflow"] >= 1 and outcomes["truncated"] >= 1 and outcomes["ok"] >= 1, outcomes
    rejected = [r for r in results if r.outcome.value == "admission_rejected"]
    assert any(r.http_status == 503 for r in rejected), outcomes
    assert any(r.http_status == 200 for r in rejected), outcomes  # 503 inside a 200 stream
    overflow = [r for r in results if r.outcome.value == "context_overflow"]
    assert all(r.prompt_tokens_asked == 300 and r.http_status == 400 for r in overflow)
    clamped = [r for r in results if r.outcome.value == "truncated"]
    assert all(r.usage_completion_tokens is not None and r.usage_completion_tokens < 100 for r in clamped)


def _wait_lines(path: Path, count: int, timeout_s: float, proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the replay exited ({proc.returncode}) before {path} had {count} lines")
        time.sleep(0.02)
    raise AssertionError(f"{path} did not reach {count} lines")


def test_server_death_is_detected_and_recorded(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(100, 200)] * 10)
    run_dir = tmp_path / "run"
    server = SimServer(
        ("--num-gpu-blocks", "400", "--block-size", "16", "--max-model-len", "2048", "--time-scale", "0.2")
    ).start()
    env = {**os.environ}
    cmd = [
        sys.executable,
        "-m",
        "oomload",
        "replay",
        str(trace),
        "--url",
        server.url,
        "--concurrency",
        "4",
        "--hold-s",
        "60",
        "--stop-on",
        "never",
        "--run-dir",
        str(run_dir),
        "--no-live",
        "--gpu",
        "none",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        _wait_lines(run_dir / "requests.jsonl", 2, 30)
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGKILL)
        _out, err = proc.communicate(timeout=40)
    finally:
        server.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader = RunReader(run_dir)
    assert reader.status()["end_reason"] == "server_dead", err  # type: ignore[index]
    kinds = [e["kind"] for e in reader.stream("events")]
    assert "server_dead" in kinds
    results = reader.requests()
    outcomes = Counter(r.outcome.value for r in results)
    # the streams the kill cut are transport errors (not "truncated"); the next requests are refused
    assert outcomes["transport_error"] >= 1 and outcomes["truncated"] == 0, outcomes
    # a dead server is not hammered: between the first failure and the death's declaration each of the 4
    # users waits its failing backoff between sends (a slow declaration on a busy host allows more), and
    # may have one request more in flight
    first_failure = min(r.end_unix_s for r in results if r.outcome.value != "ok")
    dead_s = next(e["t_unix_s"] for e in reader.stream("events") if e["kind"] == "server_dead")
    sends, paused_s = 1, 0.0
    while paused_s + failing_backoff_s(sends) <= dead_s - first_failure:
        paused_s += failing_backoff_s(sends)
        sends += 1
    assert sum(1 for r in results if r.start_unix_s > first_failure) <= 4 * (sends + 1), (outcomes, sends)
    ends = [s for s in reader.stream("steps") if s["event"] == "end"]
    assert ends[-1]["reason"] == "server_dead"
    assert (run_dir / "repro" / "server_death.jsonl").exists()


@pytest.mark.parametrize(
    ("moment", "lines"),
    [("requests.jsonl", 2), pytest.param("config.json", 0, marks=pytest.mark.slow)],
    ids=["mid-step", "during-set-up"],
)
def test_ctrl_c_stops_cleanly_with_a_partial_report(tmp_path: Path, moment: str, lines: int) -> None:
    """Ctrl-C mid-step, and as soon as the run directory exists (before the session's own signal
    handlers are installed: that window once lost status.json and the report)."""
    trace = _trace(tmp_path / "t.jsonl", [(50, 20)] * 10)
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "oomload",
        "replay",
        str(trace),
        "--concurrency",
        "2",
        "--hold-s",
        "60",
        "--run-dir",
        str(run_dir),
        "--no-live",
        "--gpu",
        "none",
        "--sim",
        "--time-scale 0.2",
    ]
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            cmd, stdout=out_file, stderr=err_file, text=True, cwd=REPO, preexec_fn=default_sigint
        )
        try:
            _wait_lines(run_dir / moment, lines, 90, proc)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=90)  # a liveness bound for a loaded machine, not a timing assertion
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out, err = out_path.read_text(), err_path.read_text()
    assert proc.returncode == 130, f"rc {proc.returncode}\n{out}\n{err}"
    assert "SIMULATED" in out
    reader = RunReader(run_dir)
    status = reader.status()
    assert status is not None and (status["finished"], status["end_reason"]) == (False, "interrupted"), (
        out + err
    )
    assert any(e["kind"] == "interrupted" for e in reader.stream("events")), out + err
    assert (run_dir / "summary.json").exists(), out + err
    port = int(reader.config()["url"].rsplit(":", 1)[1])
    with socket.socket() as sock:  # the simulated server is gone: no orphan
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_plain_locust_runs_the_scenario_file(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(20 + i, 3 + i % 4) for i in range(12)])
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "OOMLOAD_TRACE": str(trace),
        "OOMLOAD_RUN_DIR": str(run_dir),
        "OOMLOAD_ORDER": "sample",
    }
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        "scenarios/oomload_replay.py",
        "--host",
        sim.url,
        "--headless",
        "-u",
        "3",
        "-r",
        "3",
        "-t",
        "3s",
        "--loglevel",
        "WARNING",
        "--only-summary",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    # one Locust entry per request: TTFT is not a second request type (it doubled the RPS)
    assert "POST     /v1/completions" in proc.stdout + proc.stderr
    assert "TTFT" not in proc.stdout + proc.stderr
    assert len(_assert_exact(run_dir)) >= 3
    # Locust's own end (-t) is an end, not a crash: the report must not call the run cut short
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["finished"], status["end_reason"]) == (True, "locust_quit")


_MAX_RSS = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=240, check=False)
sys.stdout.write(done.stdout + done.stderr)
print(f"\\nexit={done.returncode} maxrss_kib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}")
"""


def test_a_trace_row_far_over_max_model_len_replays_in_bounded_memory(sim: SimServer, tmp_path: Path) -> None:
    """Issue #24: a 10⁹-token row made the replay build a billion-id list (killed at 24 GB) although the
    server's max_model_len (2048 here) was known. The row the trace allows at most, 10M tokens, is sent
    as 2049 tokens: the server refuses it as a context overflow, and the replay's memory stays small."""
    from oomload.trace.model import MAX_TOKENS

    trace = _trace(tmp_path / "t.jsonl", [(40, 5)] * 5 + [(MAX_TOKENS, 5)])
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "oomload", "replay", str(trace), "--url", sim.url, "--concurrency", "1",
            "--hold-s", "0.5", "--min-requests", "8", "--stop-on", "never", "--no-refine", "--no-live",
            "--gpu", "none", "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", _MAX_RSS, *argv], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "OPENAI_API_KEY": SECRET}, cwd=REPO,
    )  # fmt: skip
    tail = done.stdout.strip().splitlines()[-1]
    assert tail.startswith("exit=0 "), done.stdout[-3000:]
    maxrss_mib = int(tail.split("maxrss_kib=")[1]) / 1024
    huge = [r for r in RunReader(run_dir).requests() if r.prompt_tokens_asked == MAX_TOKENS]
    assert huge and all(r.outcome.value == "context_overflow" for r in huge), huge
    # a 10M-id body alone is ~1 GiB of Python objects; the whole replay stays well under that
    assert maxrss_mib < 400, f"the replay peaked at {maxrss_mib:.0f} MiB"


def test_proxy_variables_do_not_reroute_the_checks_the_load_does_not_take(
    sim: SimServer, tmp_path: Path
) -> None:
    """The load (raw sockets) ignores http_proxy; the preflight, /health and /metrics went through
    urllib, which honours it: with a dead proxy the replay called the server unreachable. Now every
    request goes direct, and the run scrapes and judges as without the variables."""
    trace = _trace(tmp_path / "t.jsonl", [(32, 16)] * 8)
    run_dir = tmp_path / "run"
    dead_proxy = "http://127.0.0.1:9"
    proc = oomload(
        *("replay", str(trace), "--url", sim.url, "--concurrency", "1", "--hold-s", "2", "--no-refine"),
        *("--no-live", "--no-html", "--gpu", "none", "--run-dir", str(run_dir)),
        env={
            "http_proxy": dead_proxy,
            "HTTP_PROXY": dead_proxy,
            "https_proxy": dead_proxy,
            "no_proxy": "",
            "NO_PROXY": "",
        },
        cwd=REPO,
        timeout_s=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reader = RunReader(run_dir)
    scrapes = list(reader.stream("metrics"))
    assert scrapes and all(s["ok"] for s in scrapes), scrapes[:3]
    assert not [e for e in reader.stream("events") if e["kind"] in ("health_failed", "server_dead")]
    assert [r["outcome"] for r in reader.stream("requests")].count("ok") > 0
