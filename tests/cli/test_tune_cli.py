"""``oomload tune`` against the simulator: bad input is one sentence and a documented exit code with
no server left running, and a whole tune finds, proves and reports a winner after a failed start."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from clirun import default_sigint, oomload, run

FIXED = Path(__file__).resolve().parents[2] / "traces" / "sample-fixed.jsonl"  # 256 + 256 tokens each
SIM = "oomload sim serve --model llama-3.1-8b --gpu l4 --max-model-len 2048 --time-scale 0.05"


def _name(role: str) -> str:
    """A served-model name no other test process uses: two suites running side by side (two clones,
    or CI beside a developer) must not see each other's servers."""
    return f"{role}-{uuid.uuid4().hex[:12]}"


def _sim_servers(name: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "sim serve" in line and name in line]


def test_a_serve_line_that_is_not_vllm_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(["tune", str(FIXED), "--serve", "python app.py", "--target-concurrency", "4"], capsys)
    assert code == 2
    assert "is not a vLLM server command" in err and len(err.strip().splitlines()) == 1


def test_a_port_in_use_is_a_usage_error_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        argv = ["tune", str(FIXED), "--serve", SIM, "--target-concurrency", "4", "--port", str(port)]
        code, _, err = run([*argv, "--run-dir", str(tmp_path / "t")], capsys)
    assert code == 2
    assert f"--port {port} on 127.0.0.1 is in use" in err
    assert not (tmp_path / "t" / "candidates").exists()


def test_a_target_past_any_concurrency_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--target-concurrency 99999999999999999999`` printed its candidate, then crashed building the
    ladder (exit 70)."""
    argv = ["tune", str(FIXED), "--serve", SIM, "--target-concurrency", str(10**20)]
    code, _, err = run([*argv, "--run-dir", str(tmp_path / "t")], capsys)
    assert code == 2 and f"--target-concurrency must be in 1..100,000, got {10**20}" in err
    assert not (tmp_path / "t").exists()


def test_a_run_dir_that_holds_an_earlier_run_is_refused_as_replay_refuses_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The tune wrote tune.json, tune.md and candidates/ beside an earlier replay's files."""
    old = tmp_path / "r1"
    old.mkdir()
    (old / "summary.json").write_text("{}")
    argv = ["tune", str(FIXED), "--serve", SIM, "--target-concurrency", "4", "--run-dir", str(old)]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert f"--run-dir {old} already holds files (an earlier run?); name a new or empty directory" in err
    assert sorted(p.name for p in old.iterdir()) == ["summary.json"]


def test_a_serve_line_that_exits_at_once_is_exit_3_with_its_own_words(tmp_path: Path) -> None:
    name = _name("exits-at-once")
    marker = f"--served-model-name {name}"
    result = oomload(
        "tune", str(FIXED), "--serve", f"oomload sim serve --model no-such-model {marker}",
        "--target-concurrency", "4", "--run-dir", str(tmp_path / "t"),
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "the --serve command did not start (exit status 2)" in result.stderr
    assert "unknown model 'no-such-model'" in result.stderr
    assert "Traceback" not in result.stderr
    assert _sim_servers(name) == []


def test_weights_that_do_not_fit_the_first_start_are_exit_3_as_documented(tmp_path: Path) -> None:
    """docs/tune.md: "weights do not fit / other error — stop (on the first start: exit 3)". The first
    candidate has the ladder's most memory, so no candidate can hold the weights; before, the tune
    printed "No candidate carried", exit 1, as if a candidate had been measured."""
    name = _name("weights-too-big")
    marker = f"--served-model-name {name}"
    result = oomload(
        "tune", str(FIXED), "--serve", f"oomload sim serve --model llama-3.1-70b --gpu l4 {marker}",
        "--target-concurrency", "4", "--run-dir", str(tmp_path / "t"),
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert "the --serve command did not start (exit status 2)" in result.stderr
    assert "Failed to load model - not enough GPU memory" in result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads((tmp_path / "t" / "tune.json").read_text())["status"] == "stopped"
    assert _sim_servers(name) == []


@pytest.mark.slow  # 20 s: two starts, one replay
def test_max_starts_before_the_search_is_done_says_so(tmp_path: Path) -> None:
    """--max-starts 2: 0.9 cannot start, 0.8 preempts at the target; the search's next candidate (the
    odds' first guess) never runs. Before, tune.json said "finished" with no note; now "bounded", and
    the note names the bound and the candidate it left out."""
    out = tmp_path / "t"
    name = _name("tune-max-starts")
    marker = f"--served-model-name {name}"
    result = oomload(
        "tune", str(FIXED), "--serve", f"{SIM} --other-process-gib 4 {marker}",
        "--target-concurrency", "32", "--utilization", "0.9,0.8", "--max-starts", "2", "--run-dir", str(out),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    record = json.loads((out / "tune.json").read_text())
    assert len(record["candidates"]) == 2 and record["status"] == "bounded", record["notes"]
    assert record["notes"][-1].startswith("stopped at --max-starts 2 before the search was done: the next ")
    assert "raise --max-starts to go on" in " ".join(result.stdout.split())
    assert _sim_servers(name) == []


@pytest.mark.slow
def test_tune_finds_proves_and_reports_the_winner_after_a_failed_start(tmp_path: Path) -> None:
    """4 GiB used by other processes: 0.9 cannot start; at 0.8 the pool (≈ 826 blocks of 16) holds 25
    requests of 512 tokens (32 blocks each), so 32 in flight preempt; the odds' first guess (25) carries
    them, and the bisection on the server ends with a carrier next to a setting that preempts. 26 or 27
    running (832 or 864 blocks at their peak) overflow only while their requests grow in step, as when
    all start at once; staggered, they hold about 624, so a carrier of 26 or 27 is the server's answer
    too, and the boundary is checked on the proofs (every larger setting preempted, the nearest one
    apart)."""
    out = tmp_path / "t"
    name = _name("tune-e2e-sim")
    marker = f"--served-model-name {name}"
    result = oomload(
        "tune", str(FIXED), "--serve", f"{SIM} --other-process-gib 4 {marker}",
        "--target-concurrency", "32", "--utilization", "0.9,0.8", "--max-num-seqs", "16,24,32",
        "--run-dir", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads((out / "tune.json").read_text())
    cands = record["candidates"]
    assert cands[0]["started"] is False and cands[0]["failure"]["cause"] == "free_memory"
    assert cands[1]["settings"] == {"gpu_memory_utilization": 0.8, "max_num_seqs": 32}
    assert cands[1]["proof"]["preempted_at_target"] is True
    guess = cands[1]["proof"]["odds_safe_max_num_seqs"]
    assert cands[2]["settings"] == {"gpu_memory_utilization": 0.8, "max_num_seqs": guess}
    assert "first guess" in cands[2]["rule"]
    winner = next(c for c in cands if c["index"] == record["winner_index"])
    seqs = winner["settings"]["max_num_seqs"]
    assert winner["proof"]["preempted_at_target"] is False and winner["proof"]["requests_at_target"] > 0
    assert 24 <= seqs <= 27, [(c["settings"], c["proof"] and c["proof"]["outcome"]) for c in cands]
    # the boundary, on the server: every larger setting preempted, the nearest one apart
    larger = [c for c in cands if c["started"] and c["settings"]["max_num_seqs"] > seqs]
    assert larger and all(c["proof"]["preempted_at_target"] for c in larger)
    assert min(c["settings"]["max_num_seqs"] for c in larger) == seqs + 1
    assert record["winner_line"].endswith(f"--gpu-memory-utilization 0.8 --max-num-seqs {seqs}")
    assert record["gate_rules"] == ["no-preemption-below:33", "no-oom-up-to:32"]
    for name in ("tune.md", "tune.html", "candidates/01/server.log", "candidates/03/run/summary.json"):
        assert (out / name).is_file(), name
    assert "Free memory on device cuda:0" in (out / "candidates/01/server.log").read_text()
    # each candidate's replay is told the line its server runs: its odds use that max_num_seqs
    replayed = json.loads((out / "candidates/03/run/config.json").read_text())
    assert replayed["served_with"].endswith(f"--gpu-memory-utilization 0.8 --max-num-seqs {guess}")
    assert _sim_servers(name) == []
    again = oomload("report", str(out))
    assert again.returncode == 0 and f"Winner (candidate {winner['index']})" in again.stdout


@pytest.mark.slow
def test_ctrl_c_leaves_the_server_stopped_and_a_partial_table(tmp_path: Path) -> None:
    out = tmp_path / "t"
    name = _name("tune-ctrl-c")
    marker = f"--served-model-name {name}"
    argv = ["tune", str(FIXED), "--serve", f"{SIM} --other-process-gib 4 {marker}"]
    argv += ["--target-concurrency", "32", "--utilization", "0.9,0.8", "--run-dir", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "oomload", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
    )
    deadline = time.monotonic() + 120
    while not (out / "candidates" / "02" / "run").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # wait until the second candidate's server runs and its replay began
    assert _sim_servers(name), "the second candidate's server should be running"
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    record = json.loads((out / "tune.json").read_text())
    assert record["status"] == "interrupted"
    assert record["candidates"][0]["failure"]["cause"] == "free_memory"
    # the second, interrupted in its replay, is counted and listed: started, not proved
    assert [(c["started"], c["proof"]) for c in record["candidates"][1:]] == [(True, None)]
    assert "2 of at most 8 starts" in output and "candidate 2 was interrupted" in output
    assert _sim_servers(name) == []
    assert (out / "tune.md").is_file()
    assert oomload("report", str(out)).returncode == 4  # not done: no finding that nothing carries


def test_a_target_above_anything_that_starts_is_exit_1_with_the_reason(tmp_path: Path) -> None:
    name = _name("nothing-starts")
    marker = f"--served-model-name {name}"
    result = oomload(
        "tune", str(FIXED), "--serve", f"{SIM} --other-process-gib 20 {marker}",
        "--target-concurrency", "8", "--utilization", "0.9,0.8", "--run-dir", str(tmp_path / "t"),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no candidate started (the last: not enough free device memory" in result.stdout
    record = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert [c["started"] for c in record["candidates"]] == [False] and record["winner_line"] is None
    assert _sim_servers(name) == []


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--target-rate", "0"], "--target-rate must be a number of requests per second > 0, got 0.0"),
        (["--target-rate", "-2"], "--target-rate must be a number of requests per second > 0, got -2.0"),
        (["--target-rate", "nan"], "--target-rate must be a number of requests per second > 0, got nan"),
    ],
)
def test_a_bad_rate_target_is_one_sentence_and_exit_2(
    flags: list[str], words: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "t"
    code, _, err = run(["tune", str(FIXED), "--serve", SIM, *flags, "--run-dir", str(out)], capsys)
    assert code == 2
    assert words in err
    assert not out.exists()  # nothing started


def test_a_rate_and_a_concurrency_target_together_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["tune", str(FIXED), "--serve", SIM, "--target-rate", "4", "--target-concurrency", "8"]
    with pytest.raises(SystemExit) as exit_info:
        run([*argv, "--run-dir", str(tmp_path / "t")], capsys)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --target-concurrency: not allowed with argument --target-rate" in err
    assert "Traceback" not in err and not (tmp_path / "t").exists()


@pytest.mark.slow  # 26 s of wall, the default suite's longest test: two servers, three replays
def test_a_rate_target_is_measured_as_a_concurrency_and_proved_there(tmp_path: Path) -> None:
    """8 req/s of 256 + 256-token requests: the open-loop replay on the first candidate (max_num_seqs at
    the ladder's top) measures the mean requests in flight, and the proof replays its ceiling."""
    out = tmp_path / "t"
    name = _name("tune-rate-sim")
    marker = f"--served-model-name {name}"
    result = oomload(
        "tune", str(FIXED), "--serve", f"{SIM} --time-scale 0.02 {marker}", "--target-rate", "8",
        "--utilization", "0.8", "--max-starts", "2", "--hold-s", "1", "--max-requests", "32",
        "--run-dir", str(out),
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stdout + result.stderr
    record = json.loads((out / "tune.json").read_text())
    rate = record["rate"]
    assert record["target_rate_rps"] == 8.0 and rate["rate_rps"] == 8.0
    assert rate["concurrency"] == math.ceil(rate["in_flight_mean"]) >= 1
    assert 0 < rate["requests"] <= 32  # the open loop sends at most --max-requests
    assert record["target_concurrency"] == rate["concurrency"]
    first = record["candidates"][0]
    assert first["settings"]["max_num_seqs"] == 256 and first["rate"] == rate
    assert "measures the concurrency 8 req/s needs" in first["rule"]
    opened = json.loads((out / "candidates/01/rate/run/config.json").read_text())
    assert opened["open_loop"] is True
    summary = json.loads((out / "candidates/01/run/summary.json").read_text())
    levels = [s["concurrency"] for s in summary["verdict"]["steps"] if not s["warmup"]]
    assert levels[0] == rate["concurrency"]
    said = " ".join(result.stdout.split())  # rich wraps the console at 80 columns
    assert f"8 req/s → concurrency {rate['concurrency']} (Little's law, measured" in said
    assert _sim_servers(name) == []


@pytest.mark.parametrize(("target", "words"), [("--target-concurrency", "two"), ("--target-rate", "three")])
def test_bounds_without_room_for_one_candidate_are_a_usage_error(
    target: str, words: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A candidate may take its start-up and two replays (its proof measured again; a rate target adds
    its open-loop replay): 30 + 2 × 40 s does not fit 100 s. Before, nothing started and the tune said
    "No candidate carried", exit 1, as if candidates had been measured; now one sentence, exit 2."""
    out = tmp_path / "t"
    argv = ["tune", str(FIXED), "--serve", SIM, target, "4", "--run-dir", str(out)]
    bounds = ["--max-duration-s", "100", "--startup-timeout-s", "30", "--replay-max-duration-s", "40"]
    code, _, err = run([*argv, *bounds], capsys)
    assert code == 2, err
    assert "--max-duration-s 100 leaves no room for one candidate, which may take" in err
    assert f"{words} replays of --replay-max-duration-s 40" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # nothing started


def _write_tune(directory: Path, *, candidates: tuple[Any, ...], status: str) -> None:
    """A tune directory holding only its ``tune.json``: a tune of the simulator for concurrency 4."""
    from oomload.tune.record import TuneRecord

    record = TuneRecord(
        serve_line=SIM,
        kind="sim",
        model="llama-3.1-8b",
        target_concurrency=4,
        trace_path=str(FIXED),
        max_starts=8,
        max_duration_s=1800.0,
        slo_ttft_p99_s=None,
        candidates=candidates,
        status=status,
    )
    directory.mkdir()
    (directory / "tune.json").write_text(json.dumps(record.to_json()))


def test_report_on_a_tune_directory_refuses_a_replays_flags(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`report TUNE_DIR --json | jq` got the table, and a --gate was dropped, exit 0: now one sentence."""
    _write_tune(tmp_path / "t", candidates=(), status="bounded")
    for flags in (["--json"], ["--gate", "error-rate<=1%"], ["--format", "md"], ["--baseline", "r"]):
        code, _, err = run(["report", str(tmp_path / "t"), *flags], capsys)
        assert code == 2 and f"is an `oomload tune` directory: {flags[0]} goes with a replay's" in err, err
        assert len(err.strip().splitlines()) == 1
    code, _, err = run(["report", str(tmp_path / "t"), "--json", "--gate", "error-rate<=1%"], capsys)
    assert code == 2 and "directory: --json, --gate go with a replay's run directory" in err, err
    assert run(["report", str(tmp_path / "t")], capsys)[0] == 1  # its table, and the tune's exit: no winner


@pytest.mark.parametrize(
    ("status", "code"), [("interrupted", 4), ("stopped", 4), ("running", 4), ("finished", 1)]
)
def test_report_on_an_unfinished_tune_is_not_evaluated_not_a_negative(
    status: str, code: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A tune stopped by SIGINT or SIGTERM exited 130, and `oomload report` on its directory exited 1,
    "no candidate carried the target": a gate read the search it cut short as a negative result."""
    from oomload.tune.search import Candidate, Settings

    started = Candidate(1, Settings(gpu_memory_utilization=0.8, max_num_seqs=4), "first", started=True)
    _write_tune(tmp_path / "t", candidates=(started,), status=status)
    got, out, _ = run(["report", str(tmp_path / "t")], capsys)
    assert got == code, out
    assert f"status {status}" in out and (tmp_path / "t" / "tune.md").is_file()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"schema": "oomload.tune/1"}', "tune.json is a damaged tune record: it has no serve_line"),
        (
            '{"schema": "oomload.tune/1", "serve_line": "x", "candidates": [{"index": 1, "settings": "x"}]}',
            'tune.json is a damaged tune record: candidates[0].settings is "x", not an object',
        ),
        (
            '{"schema": "oomload.tune/1", "serve_line": "x", "candidates": [{"settings": {}}]}',
            "tune.json is a damaged tune record: candidates[0] has no index",
        ),
        (
            '{"schema": "oomload.tune/1", "serve_line": "x", "candidates": [{"index": 1, "proof": '
            '{"num_gpu_blocks": "many"}}]}',
            'candidates[0].proof.num_gpu_blocks is "many", not a whole number',
        ),
        ("[]", "tune.json is a damaged tune record: the document is [], not an object"),  # was exit 70
        ('{"schema": "x"}', "tune.json is a damaged tune record: its schema is \"x\", not 'oomload.tune/1'"),
        (
            "{",
            "tune.json is not JSON (Expecting property name enclosed in double quotes at line 1, column 2)",
        ),
    ],
)
def test_a_damaged_tune_json_is_one_sentence_that_says_what_is_wrong(
    text: str, words: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """It read "not a readable tune record: 'serve_line'" (a bare key name), or "dictionary update
    sequence element #0 has length 1; 2 is required" for a damaged candidate."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "tune.json").write_text(text)
    code, _, err = run(["report", str(tmp_path / "t")], capsys)
    assert code == 2 and words in err, err
    assert len(err.strip().splitlines()) == 1 and str(tmp_path / "t" / "tune.json") in err


def test_a_tune_directory_without_its_tune_json_is_named_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """It read "is not a run directory (no config.json)"."""
    (tmp_path / "t" / "candidates" / "01").mkdir(parents=True)
    code, _, err = run(["report", str(tmp_path / "t")], capsys)
    assert code == 2
    assert "looks like an `oomload tune` directory (it has candidates/) without its tune.json" in err
    assert f"oomload report {tmp_path / 't' / 'candidates' / 'NN' / 'run'}" in err
