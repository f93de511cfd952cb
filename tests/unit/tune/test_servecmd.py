"""The user's --serve line: recognised or refused in one sentence, and rewritten flag by flag."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from oomload.errors import ConfigError
from oomload.realvllm.servecmd import parse_serve_command
from oomload.tune.search import Settings


def test_flags_are_replaced_in_both_spellings_and_nothing_else_moves() -> None:
    cmd = parse_serve_command(
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization=0.95 --max-num-seqs 256 "
        "--port 9000 --host 0.0.0.0 --trust-remote-code"
    )
    assert cmd.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert cmd.value("--gpu-memory-utilization") == "0.95"
    argv = cmd.with_settings(
        Settings(gpu_memory_utilization=0.8, max_num_seqs=6, enforce_eager=True), "127.0.0.1", 8123
    )
    assert argv == (
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--trust-remote-code",
        "--gpu-memory-utilization",
        "0.8",
        "--max-num-seqs",
        "6",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
    )


def test_the_winning_line_is_shell_quoted() -> None:
    cmd = parse_serve_command("vllm serve '/models/my model' --chat-template '{{ x }}'")
    line = cmd.shell_line(Settings(max_num_seqs=4))
    assert shlex.split(line) == [
        "vllm",
        "serve",
        "/models/my model",
        "--chat-template",
        "{{ x }}",
        "--max-num-seqs",
        "4",
    ]


def test_simulator_and_launcher_lines_are_recognised() -> None:
    assert parse_serve_command("oomload sim serve --gpu l4").kind == "sim"
    launcher = parse_serve_command(".e2e/venv/bin/python /x/launcher.py serve /m/tiny-model --block-size 256")
    assert (launcher.kind, launcher.model) == ("vllm", "/m/tiny-model")
    aliased = parse_serve_command("oomload sim serve --num-gpu-blocks 12").with_settings(
        Settings(num_gpu_blocks=24), "h", 1
    )
    assert "--num-gpu-blocks" not in aliased and aliased[-6:-4] == ("--num-gpu-blocks-override", "24")


def test_a_wrapper_in_front_stays_in_front_and_keeps_its_own_flags() -> None:
    line = "prlimit --data=1300000000 -- env A=1 vllm serve m --max-num-seqs 8 --port 9 --host 0.0.0.0"
    cmd = parse_serve_command(line)
    assert (cmd.kind, cmd.model, cmd.server_argv[:3]) == ("vllm", "m", ("vllm", "serve", "m"))
    argv = cmd.with_settings(Settings(max_num_seqs=4), "127.0.0.1", 8123)
    assert argv == (
        *("prlimit", "--data=1300000000", "--", "env", "A=1", "vllm", "serve", "m"),
        *("--max-num-seqs", "4", "--host", "127.0.0.1", "--port", "8123"),
    )
    assert cmd.shell_line(Settings(max_num_seqs=4)).startswith("prlimit --data=1300000000 -- env A=1 vllm")


def test_the_replay_line_runs_the_simulator_of_this_install_behind_a_wrapper() -> None:
    import sys

    from oomload.realvllm.serveline import ServeLine

    line = ServeLine(parse_serve_command("nice -n 5 oomload sim serve --gpu l4 --port 1"))
    assert line.serve_argv("127.0.0.1", 7) == [
        *("nice", "-n", "5", sys.executable, "-m", "oomload", "sim", "serve", "--gpu", "l4"),
        *("--host", "127.0.0.1", "--port", "7"),
    ]


@pytest.mark.parametrize("line", ["prlimit --data=1 -- sleep 1", "env A=1 python app.py"])
def test_a_wrapper_around_something_else_is_refused(line: str) -> None:
    with pytest.raises(ConfigError, match=r"after .*own arguments"):
        parse_serve_command(line)


@pytest.mark.parametrize("line", ["python app.py", "", "sleep 1", "vllm bench", "'unclosed"])
def test_a_line_that_is_not_a_vllm_server_is_one_sentence(line: str) -> None:
    with pytest.raises(ConfigError, match="--serve"):
        parse_serve_command(line)


def test_an_api_key_in_the_line_is_a_secret_never_shown() -> None:
    # the server's log never holds it either: tests/integration/test_serve_secrets.py
    cmd = parse_serve_command("vllm serve m --api-key sk-secret-123 --max-num-seqs 8")
    assert cmd.secrets() == ("sk-secret-123",)
    line = cmd.shell_line(Settings(max_num_seqs=4))
    assert "sk-secret-123" not in line and "--api-key ***" in line
    assert parse_serve_command("vllm serve m --api-key=sk-secret-456").secrets() == ("sk-secret-456",)
    wrapped = parse_serve_command(
        "env VLLM_API_KEY=sk-env-789 HF_TOKEN=hf_abc1 TZ=UTC vllm serve m --hf-token hf_x2"
    )
    assert wrapped.secrets() == ("sk-env-789", "hf_abc1", "hf_x2")  # TZ is no secret
    shown = wrapped.shell_line(Settings(max_num_seqs=4))
    assert shown.startswith("env VLLM_API_KEY=*** HF_TOKEN=*** TZ=UTC vllm serve m --hf-token ***")


def test_the_runs_api_key_is_a_secret_of_the_served_line_only_where_the_line_holds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from oomload.run.config import ReplayConfig

    monkeypatch.setenv("OPENAI_API_KEY", "none")  # a placeholder key, and a word of other arguments
    plain = ReplayConfig(trace_path=Path("t.jsonl"), served_with="vllm serve m --max-num-seqs 8")
    assert plain.serve_secrets() == ()  # "--gpu none" in the run's argv stays as it is
    held = ReplayConfig(trace_path=Path("t.jsonl"), served_with="env LABEL=none vllm serve m")
    assert held.serve_secrets() == ("none",)
