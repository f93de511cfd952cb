"""``oomload sample``: errors are one sentence and exit 2; samples go to a file; signals stop it cleanly;
the server's own memory (``--server-pid`` of a real child) to a file and over HTTP.

NVML is the fake (``fakesampler``): the command's own code with ``FakeNvml`` passed in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakesampler import fake_sample_program, run_sample
from oomload.cli import main

NO_GPU = '{"error": "LIBRARY_NOT_FOUND"}'
HANG_S = 60.0  # a hang guard, not a timing assertion
ONE_GPU = json.dumps({"devices": [{"name": "Fake", "total_bytes": 1000, "used_bytes": 250, "util_pct": 3}]})


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_no_gpu_is_one_sentence_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_sample(NO_GPU, []) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "oomload: error: no NVIDIA GPU can be sampled here: the NVML library (libnvidia-ml.so) "
        "was not found, so there is no NVIDIA driver on this machine"
    )


def test_driver_library_mismatch(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_sample('{"error": "LIB_RM_VERSION_MISMATCH"}', []) == 2
    assert "driver/library mismatch" in one_error_line(capsys.readouterr().err)


def test_the_shipped_command_has_no_fake_nvml_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["sample", "--fake-nvml", ONE_GPU])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --fake-nvml" in capsys.readouterr().err


def test_device_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_sample(ONE_GPU, ["--device", "0", "3"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "oomload: error: GPU index 3 is out of range: this machine has 1 GPU(s) (allowed: 0)"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--interval-s", "0"], "--interval-s must be > 0, got 0.0"),
        (["--duration-s", "-1"], "--duration-s must be > 0, got -1.0"),
        (["--port", "70000"], "--port must be 0–65535, got 70000"),
    ],
)
def test_bad_flags(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_sample(ONE_GPU, [*flags]) == 2
    assert one_error_line(capsys.readouterr().err) == f"oomload: error: {message}"


def test_out_file_for_a_duration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu.jsonl"
    assert (
        run_sample(
            ONE_GPU,
            [
                "--out",
                str(out),
                "--interval-s",
                "0.01",
                "--duration-s",
                "0.5",  # room for two samples on a busy machine
            ],
        )
        == 0
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) >= 2
    assert lines[0] == {
        "t_unix_s": lines[0]["t_unix_s"],
        "source": "nvml",
        "device": 0,
        "total_bytes": 1000,
        "used_bytes": 250,
        "free_bytes": 750,
        "util_pct": 3.0,
        "processes": [],
    }
    assert "1 GPU(s) via NVML (Fake) every 0.01 s" in capsys.readouterr().err


def test_stdout_when_no_out_and_no_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_sample(ONE_GPU, ["--duration-s", "0.01"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert json.loads(first)["used_bytes"] == 250


def test_serve_on_a_port_in_use_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert run_sample(ONE_GPU, ["--serve", "--port", str(port)]) == 2
    assert f"cannot serve on 127.0.0.1:{port}" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "gpu.jsonl"
    with subprocess.Popen(
        [*fake_sample_program(ONE_GPU), "--out", str(out), "--interval-s", "0.02"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        deadline = time.monotonic() + 20
        while not (out.exists() and out.read_text().count("\n") >= 2) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "Traceback" not in err
    assert out.read_text().endswith("\n")  # no torn last line


# -- the server's own memory (--server-pid, --server-port, --cgroup) ----------------------------------
HOLD_MIB = 50
HOLDER = (
    f"import time; b = bytearray({HOLD_MIB} << 20); b[::4096] = b'\\x01' * ({HOLD_MIB} << 8); "
    "print('ready', flush=True); time.sleep(300)"
)


@pytest.fixture
def holder() -> Iterator[int]:
    """A real child process holding HOLD_MIB MiB; its pid."""
    with subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        try:
            yield proc.pid
        finally:
            proc.kill()
            proc.wait()


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_server_memory_without_a_gpu_to_a_file(
    holder: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mem.jsonl"
    flags = [
        "--server-pid",
        str(holder),
        "--out",
        str(out),
        "--duration-s",
        "1",
        "--server-interval-s",
        "0.2",
    ]
    assert run_sample(NO_GPU, flags) == 0
    lines = json_lines(out)
    assert len(lines) >= 2
    assert all(line["pid"] == holder and line["alive"] is True for line in lines)
    assert all(line["processes"] == 1 and line["rss_bytes"] >= HOLD_MIB << 20 for line in lines)
    assert set(lines[0]) >= {"t_unix_s", "source", "cgroup", "cgroup_current_bytes", "cgroup_oom_kill"}
    assert lines[0]["source"] == "local"
    err = capsys.readouterr().err
    assert "no NVIDIA GPU can be sampled here" in err and "; sampling the server's memory only" in err
    cgroup = "" if lines[0]["cgroup"] is None else f", cgroup {lines[0]['cgroup']}"
    assert f"the server's memory (pid {holder}{cgroup}) every 0.2 s → {out}\n" in err
    assert "Traceback" not in err


def test_gpu_and_server_memory_to_their_own_files(holder: int, tmp_path: Path) -> None:
    gpu, mem = tmp_path / "gpu.jsonl", tmp_path / "server_memory.jsonl"
    flags = ["--server-pid", str(holder), "--out", str(gpu), "--server-out", str(mem), "--duration-s", "0.5"]
    assert run_sample(ONE_GPU, [*flags, "--interval-s", "0.05", "--server-interval-s", "0.1"]) == 0
    gpu_lines, mem_lines = json_lines(gpu), json_lines(mem)
    assert gpu_lines and all(line["device"] == 0 and line["used_bytes"] == 250 for line in gpu_lines)
    assert mem_lines and all(line["pid"] == holder and "device" not in line for line in mem_lines)


def test_out_files_in_a_new_folder_are_written_there(
    holder: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out new/gpu.jsonl`` makes its folder, as ``trace build -o`` does (it was refused); a path
    that cannot be made names its own flag."""
    gpu, mem = tmp_path / "new" / "gpu.jsonl", tmp_path / "other" / "deeper" / "mem.jsonl"
    flags = ["--server-pid", str(holder), "--out", str(gpu), "--server-out", str(mem), "--duration-s", "0.3"]
    assert run_sample(ONE_GPU, [*flags, "--interval-s", "0.05", "--server-interval-s", "0.1"]) == 0
    assert json_lines(gpu) and json_lines(mem)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    bad = ["--server-pid", str(holder), "--out", str(gpu), "--server-out", str(blocked / "m.jsonl")]
    capsys.readouterr()
    assert run_sample(ONE_GPU, [*bad, "--duration-s", "0.1"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write --server-out {blocked / 'm.jsonl'}: " in err and "Traceback" not in err


def test_no_gpu_samples_the_server_only_even_where_a_gpu_is(holder: int, tmp_path: Path) -> None:
    out = tmp_path / "server_memory.jsonl"
    flags = ["--no-gpu", "--server-pid", str(holder), "--server-out", str(out), "--duration-s", "0.5"]
    assert run_sample(ONE_GPU, [*flags, "--server-interval-s", "0.1"]) == 0
    lines = json_lines(out)
    assert lines and all("device" not in line and line["pid"] == holder for line in lines)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--no-gpu"], "--no-gpu samples the server's memory only"),
        (["--no-gpu", "--server-pid", "1", "--device", "0"], "--no-gpu contradicts --dcgm-url and --device"),
    ],
)
def test_no_gpu_without_a_server_or_with_gpu_flags_is_one_sentence(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_sample(ONE_GPU, [*flags, "--duration-s", "0.1"]) == 2
    assert says in one_error_line(capsys.readouterr().err)


def test_the_replays_child_sampler_streams_the_servers_memory(holder: int, tmp_path: Path) -> None:
    from oomload.telemetry.gpu import ServerMemoryProcess

    out = tmp_path / "server_memory.jsonl"
    sampler = ServerMemoryProcess(out, [f"--server-pid={holder}"], interval_s=0.1)
    try:
        assert sampler.start()  # waits for the first line
        latest = sampler.latest()
        assert latest is not None and latest["pid"] == holder and latest["rss_bytes"] >= HOLD_MIB << 20
    finally:
        sampler.stop()
    assert not sampler.running


def test_a_gpu_asked_for_is_still_required(holder: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_sample(NO_GPU, ["--server-pid", str(holder), "--device", "0", "--duration-s", "0.1"]) == 2
    assert "no NVIDIA GPU can be sampled here" in one_error_line(capsys.readouterr().err)


def not_running_pid() -> int:
    pid = 4_000_000  # above any pid_max: never running
    assert not Path(f"/proc/{pid}").exists()
    return pid


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--server-pid", "PID"], "pid {missing} is not running (or not visible here)"),
        (["--server-pid", "abc"], "--server-pid must be a process id (a whole number > 0), got 'abc'"),
        (["--server-pid", "-5"], "--server-pid must be a process id (a whole number > 0), got '-5'"),
        (["--server-port", "70000"], "--server-port must be a TCP port (1–65535), got '70000'"),
        (["--server-pid", "1", "--server-port", "80"], "give --server-pid or --server-port, not both"),
        (["--cgroup", "/nonexistent/cgroup"], "the cgroup directory /nonexistent/cgroup does not exist"),
        (["--server-out", "x.jsonl"], "--server-out needs --server-pid, --server-port or --cgroup"),
        (["--server-pid", "1", "--server-interval-s", "0"], "--server-interval-s must be > 0, got 0.0"),
    ],
)
def test_bad_server_memory_flags(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    missing = not_running_pid()
    flags = [str(missing) if flag == "PID" else flag for flag in flags]
    assert run_sample(NO_GPU, flags) == 2
    assert one_error_line(capsys.readouterr().err) == f"oomload: error: {message.format(missing=missing)}"


def test_a_port_nobody_listens_on(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as sock:  # bound, not listening: the port is free and nobody listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert run_sample(NO_GPU, ["--server-port", str(port)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"oomload: error: no process that oomload can see listens on TCP port {port} here "
        "(another user's process can be hidden from a user without root: give its pid)"
    )


def test_serve_round_trip_with_the_gpu_series(holder: int) -> None:
    from oomload.telemetry.dcgm import DcgmReader
    from oomload.telemetry.hostsampler import RemoteServerMemory

    program = [*fake_sample_program(ONE_GPU), "--server-pid", str(holder), "--serve", "--port", "0"]
    with subprocess.Popen(
        [*program, "--server-interval-s", "0.05"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        announced = ""
        while "http://" not in announced:  # the announcement names the bound port
            announced = proc.stderr.readline()
            assert announced, "the sampler exited before serving"
        url = announced.rsplit(" ", 1)[1].strip().removesuffix("/metrics")
        line = RemoteServerMemory(url).read()
        gpus = DcgmReader(url).sample()
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, err
    assert line["source"] == f"remote:{url}"
    assert (line["pid"], line["processes"], line["alive"]) == (holder, 1, True)
    assert line["rss_bytes"] is not None and line["rss_bytes"] >= HOLD_MIB << 20
    assert [(g.device, g.used_bytes, g.source) for g in gpus] == [(0, 250, "remote")]
