"""The ``--api-key`` of a ``--serve`` line never reaches the run directory, at any moment of the run.

vLLM logs its non-default arguments at start-up, the key among them. The server oomload starts is a
stand-in for ``vllm serve`` (``fakevllm``: a ``vllm`` on a path of its own that says its arguments as
vLLM does, then serves the simulator and names the key again every 0.4 s, split between two writes).
Each test runs oomload as a user would and reads every file of the run directory and of oomload's
``TMPDIR`` (where the server's raw log is made, then unnamed) every ``POLL_S`` while it runs — a run
killed at any of those moments (SIGKILL, a CI job's timeout) would leave what was read — and again at
the end; the error a failed start prints is checked too. The
replays run in subprocesses (Locust patches the process with gevent) and are bounded by ``--hold-s``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clirun import HANG_S, default_sigint
from fakevllm import install_fake_vllm, kill_fake_vllms
from oomload.errors import ExitCode

TRACES = Path(__file__).resolve().parents[2] / "traces"
FIXED = TRACES / "sample-fixed.jsonl"  # 256 + 256 tokens each
CHAT = TRACES / "sample-chat.jsonl"  # mean 1,283 tokens: 32 in flight pass a 400 MiB limit
KEY = "sk-serve-scrub-never-on-disk-0815"
POLL_S = 0.05
REPLAY = ("--concurrency", "2", "--hold-s", "2", "--no-live", "--no-html", "--gpu", "none", "--no-evidence")


def _files_holding(directory: Path, secret: bytes) -> list[Path]:
    found = []
    for root, _, names in os.walk(directory):  # a directory removed mid-walk is passed over, not an error
        for path in (Path(root) / name for name in names):
            try:
                if path.is_file() and secret in path.read_bytes():
                    found.append(path)
            except OSError:  # removed between the listing and the read
                continue
    return found


def _watch(argv: list[str], watched: Path, tmp_path: Path) -> tuple[int, str, str, int]:
    """Run ``oomload ARGV``, reading every file under ``watched`` every ``POLL_S`` while it runs; fail at
    the first read that finds the key. (exit code, stdout, stderr, reads of a server log with ``***``)."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    temp = tmp_path / "temp"  # oomload's TMPDIR: the server's raw log lives there while it runs
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    scrubbed_reads = 0
    with out.open("wb") as out_fh, err.open("wb") as err_fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "oomload", *argv],
            stdout=out_fh, stderr=err_fh, env=env, preexec_fn=default_sigint,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + HANG_S
            while proc.poll() is None and time.monotonic() < deadline:
                assert _files_holding(watched, KEY.encode()) == [], "the key is in the run directory mid-run"
                assert _files_holding(temp, KEY.encode()) == [], "the key is in a file of TMPDIR mid-run"
                logs = [p for p in watched.rglob("server.log") if p.is_file()]
                scrubbed_reads += any(b"***" in p.read_bytes() for p in logs)
                time.sleep(POLL_S)
        finally:
            if proc.poll() is None:  # a failed assertion: Ctrl-C, as a user would; it stops its server
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            kill_fake_vllms(tmp_path / "bin")
    assert _files_holding(watched, KEY.encode()) == []
    assert _files_holding(temp, KEY.encode()) == []
    assert list(temp.glob("oomload-log-*")) == []  # the raw log had no name, nor a directory, after start
    return proc.returncode, out.read_text(), err.read_text(), scrubbed_reads


def test_a_running_served_servers_key_is_never_in_the_run_directory(tmp_path: Path) -> None:
    vllm = install_fake_vllm(tmp_path / "bin")
    run = tmp_path / "run"
    serve = shlex.join([str(vllm), "serve", "fake-model", "--api-key", KEY])
    argv = ["replay", str(FIXED), "--serve", serve, *REPLAY, "--run-dir", str(run)]
    code, out, err, scrubbed_reads = _watch(argv, run, tmp_path)
    assert code == ExitCode.OK, out[-3000:] + err[-3000:]
    assert KEY not in out + err
    assert scrubbed_reads >= 10  # the log was read, scrubbed, many times while the run went on
    log = (run / "server.log").read_text()
    assert "'api_key': ['***']" in log  # the key's place in vLLM's start-up line
    # the key split between two writes, too (the last may be cut short by the stop: a part of it stays)
    said = [line for line in log.splitlines() if line.endswith(" as its key")]
    assert len(said) >= 5 and all(line.endswith("still serving with *** as its key") for line in said)
    assert "Uvicorn running" in log or "Application startup complete" in log  # the simulator's own words


def test_a_served_server_that_fails_to_start_leaves_no_key_anywhere(tmp_path: Path) -> None:
    vllm = install_fake_vllm(tmp_path / "bin")
    run = tmp_path / "run"
    serve = shlex.join([str(vllm), "serve", "fake-model", "--api-key", KEY, "--fake-fail"])
    argv = ["replay", str(FIXED), "--serve", serve, *REPLAY, "--run-dir", str(run)]
    code, out, err, scrubbed_reads = _watch(argv, run, tmp_path)
    assert code == ExitCode.UNREACHABLE, out[-3000:] + err[-3000:]
    assert "did not start (it exited with status 1)" in err and KEY not in out + err
    assert "ValueError: the key *** was refused'; its log" in err  # its own words, not "another error"
    assert scrubbed_reads >= 5  # the fake says its key 2 s before it exits
    log = (run / "server.log").read_text()
    assert "'api_key': ['***']" in log and "ValueError: the key *** was refused" in log


def test_a_tune_whose_first_start_fails_leaves_no_key_anywhere(tmp_path: Path) -> None:
    vllm = install_fake_vllm(tmp_path / "bin")
    out_dir = tmp_path / "tune"
    serve = shlex.join([str(vllm), "serve", "fake-model", "--api-key", KEY, "--fake-fail"])
    argv = ["tune", str(FIXED), "--serve", serve, "--target-concurrency", "4", "--run-dir", str(out_dir)]
    code, out, err, scrubbed_reads = _watch(argv, out_dir, tmp_path)
    assert code == ExitCode.UNREACHABLE, out[-3000:] + err[-3000:]
    # the server's own line is quoted, the key's place in it kept
    assert "ValueError: the key *** was refused" in err and KEY not in out + err
    assert scrubbed_reads >= 5
    log = (out_dir / "candidates" / "01" / "server.log").read_text()
    assert "'api_key': ['***']" in log and "ValueError: the key *** was refused" in log


def test_a_served_server_that_dies_is_judged_by_its_last_lines_without_its_key(tmp_path: Path) -> None:
    """The verdict reads a death's cause at the end of ``server.log``: with a key in the line that file is
    the copy without it, and the cause is still the server's own last words. The simulator under a
    process memory limit (``test_memory_death_sim``'s) dies with the CPU allocator's words, the size it
    tried among them. (``sync_log``'s own test: ``tests/unit/realvllm/test_server_log.py``.)"""
    vllm = install_fake_vllm(tmp_path / "bin")
    run = tmp_path / "run"
    limit = "--host-memory-limit-mib 400 --host-limit-kind process --host-bytes-per-token 16384"
    serve = shlex.join([str(vllm), "serve", "fake-model", "--api-key", KEY, "--fake-sim-flags", limit])
    argv = ["replay", str(CHAT), "--serve", serve, "--concurrency", "4,32", "--hold-s", "4"]
    code, out, err, _ = _watch(
        [*argv, "--no-live", "--no-html", "--gpu", "none", "--run-dir", str(run)], run, tmp_path
    )
    assert code == ExitCode.OK, out[-3000:] + err[-3000:]
    assert KEY not in out + err
    log = (run / "server.log").read_text()
    said = [int(n) for n in re.findall(r"you tried to allocate (\d+) bytes", log)]
    death = json.loads((run / "summary.json").read_text())["verdict"]["onsets"]["engine_death"]
    assert death is not None and death["kind"] == "cpu_oom", death
    assert said and death["cause"]["tried_bytes"] == said[0]  # the server's own words


def test_secrets_set_in_front_of_the_served_command_are_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``env VLLM_API_KEY=… HF_TOKEN=… vllm serve …``: vLLM reads its key from ``VLLM_API_KEY``. A value
    whose name says it is a secret, and the run's own API key wherever the line holds it, read ``***`` in
    every file of the run directory and on the terminal."""
    api_key, token = "sk-the-runs-own-api-key-4242", "hf_token_never_written_77"
    monkeypatch.setenv("OPENAI_API_KEY", api_key)
    run = tmp_path / "run"
    sim = "oomload sim serve --time-scale 0.025"
    serve = f"env VLLM_API_KEY={api_key} HF_TOKEN={token} SERVE_LABEL={api_key} {sim}"
    argv = ["replay", str(FIXED), "--serve", serve, *REPLAY, "--run-dir", str(run)]
    code, out, err, _ = _watch(argv, run, tmp_path)
    assert code == ExitCode.OK, out[-3000:] + err[-3000:]
    for secret in (api_key, token):
        assert secret not in out + err
        assert _files_holding(run, secret.encode()) == []
    config = json.loads((run / "config.json").read_text())
    assert (
        config["serve"]
        == "env VLLM_API_KEY=*** HF_TOKEN=*** SERVE_LABEL=*** oomload sim serve --time-scale 0.025"
    )
