"""``oomload sim serve`` flag handling: loopback by default, vLLM's start-up refusals, clean errors."""

from __future__ import annotations

import os

import pytest

from oomload.cli import main
from oomload.errors import ConfigError
from oomload.sim.process import SimServer


def test_non_loopback_bind_is_refused_unless_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "not a loopback address" in capsys.readouterr().err


def test_kv_pool_smaller_than_one_request_is_refused_like_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--model",
        "tiny",
        "--kv-cache-memory-bytes",
        "1048576",
        "--block-size",
        "128",
        "--max-model-len",
        "2048",
    ]
    code = main(["sim", "serve", "--port", "0", *args])
    assert code == 2
    err = capsys.readouterr().err
    assert "the estimated maximum model length is 896" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu", "tpu-v5"], "unknown GPU"),
        (["--model", "nope"], "unknown model"),
        (["--gpu", "l4", "--gpu-memory-utilization", "0.5"], "No available memory for the cache blocks"),
        (["--time-scale", "-1"], "--time-scale"),
        (["--num-gpu-blocks", "1"], "at least 2"),
        (["--max-model-len", "0"], "--max-model-len must be a positive integer, got 0"),
        (
            ["--port-file", "/nonexistent/dir/p"],
            "cannot write the port file /nonexistent/dir/p: the directory",
        ),
    ],
)
def test_bad_flags_are_one_line_errors(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "serve", "--port", "0", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("oomload: error:")


def test_sim_without_action_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim"]) == 2
    assert "serve" in capsys.readouterr().out


def test_simserver_surfaces_a_startup_failure_and_leaves_no_process() -> None:
    server = SimServer(["--model", "nope"], startup_timeout_s=20)
    with pytest.raises(ConfigError, match="unknown model"):  # the simulator's usage error (exit 2)
        server.start()
    assert server.returncode == 2  # its exit status is kept (evidence for a run) …
    assert server.pid is not None
    with pytest.raises(ProcessLookupError):  # … and the process is reaped
        os.kill(server.pid, 0)


def test_simserver_stop_terminates_the_child() -> None:
    with SimServer(["--model", "tiny", "--num-gpu-blocks", "16", "--max-model-len", "1024"]) as server:
        pid = server.pid
        assert pid is not None and server.url.startswith("http://127.0.0.1:")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
