"""``oomload sample``: errors are one sentence and exit 2; samples go to a file; signals stop it cleanly.

NVML is the fake (``fakesampler``): the command's own code with ``FakeNvml`` passed in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fakesampler import fake_sample_program, run_sample
from oomload.cli import main

NO_GPU = '{"error": "LIBRARY_NOT_FOUND"}'
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
