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


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--seed", "-1", "--seed must be an integer ≥ 0, got -1"),
        ("--parent-pid", "-1", "--parent-pid must be a positive integer, got -1"),
        ("--parent-pid", "0", "--parent-pid must be a positive integer, got 0"),
        ("--stream-reject-every", "-1", "--stream-reject-every must be an integer ≥ 0, got -1"),
        ("--time-scale", "nan", "--time-scale must be a finite number ≥ 0, got nan"),
        ("--time-scale", "inf", "--time-scale must be a finite number ≥ 0, got inf"),
        ("--keepalive-timeout-s", "-1", "--keepalive-timeout-s must be a finite number ≥ 0, got -1.0"),
        ("--exit-delay-s", "nan", "--exit-delay-s must be a finite number ≥ 0, got nan"),
        ("--max-num-queued-reqs", "-1", "--max-num-queued-reqs must be an integer ≥ 0, got -1"),
        ("--gpu-memory-gib", "inf", "--gpu-memory-gib must be a finite number > 0, got inf"),
        ("--activation-scale", "inf", "--activation-scale must be a finite number > 0, got inf"),
        ("--other-process-gib", "inf", "--other-process-gib must be a finite number ≥ 0, got inf"),
        ("--cuda-graph-gib", "inf", "--cuda-graph-gib must be a finite number ≥ 0, got inf"),
        ("--host-memory-limit-mib", "inf", "--host-memory-limit-mib must be a finite number > 0, got inf"),
        ("--host-base-mib", "inf", "--host-base-mib must be a finite number ≥ 0, got inf"),
        ("--host-leak-mib-per-min", "inf", "--host-leak-mib-per-min must be a finite number ≥ 0, got inf"),
        ("--host-leak-cap-mib", "inf", "--host-leak-cap-mib must be a finite number ≥ 0, got inf"),
    ],
)
def test_a_meaningless_sim_serve_number_is_exit_2_before_it_serves(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: these served (the seed, a negative every-Nth, NaN or infinite times and leaks), ended
    at once (a --parent-pid that is no parent's) or were an internal error, exit 70 (an infinite size)."""
    import oomload.sim.process
    import oomload.sim.server

    def started(*args: object, **kwargs: object) -> None:
        pytest.fail(f"sim serve {flag} {value} went on: the value was not checked")

    monkeypatch.setattr(oomload.sim.server, "serve", started)
    monkeypatch.setattr(oomload.sim.process, "exit_with_parent", started)
    assert main(["sim", "serve", "--port", "0", flag, value]) == 2
    assert capsys.readouterr().err == f"oomload: error: {message}\n"


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
