"""Secrets are never echoed, and exit codes mean what they say (issue 11, items 2, 3 and 7).

Every case runs before any load: a bad API key value, credentials in ``--url``, an endpoint's path
given as ``--url``, a run directory that cannot be created, an output that cannot be written. Each is
one sentence on stderr and exit 2; none repeats a secret, even in part.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_report_cli import make_run

from clirun import oomload
from oomload.cli import main
from oomload.credentials import api_key_problem, read_api_key, redact_url, scrub
from oomload.errors import ConfigError, EndpointError
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

SECRET = "sk-SECRET123abc"


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    write_trace(path, [TraceRecord("r0", 0.0, 10, 5)], TraceHeader())
    return path


def _replay(trace: Path, *flags: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``oomload replay`` as a subprocess (a run that got past validation would import Locust)."""
    return oomload("replay", str(trace), "--no-live", "--gpu", "none", *flags, env=env, cwd=cwd)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (SECRET + "\r", "carriage return"),  # a key file saved with Windows line ends
        (SECRET + "\r\n", "carriage return"),
        (SECRET + "\n", "line break"),
        (" " + SECRET, "white space"),
        (SECRET[:6] + "\u2014" + SECRET[6:], "non-ASCII"),  # not Latin-1: an em dash
        (SECRET[:6] + "\u00e9" + SECRET[6:], "non-ASCII"),  # Latin-1, still not a token character
        (SECRET[:6] + " " + SECRET[6:], "white space or a control character"),
        (SECRET[:6] + "\x07" + SECRET[6:], "white space or a control character"),
    ],
)
def test_an_api_key_that_is_not_a_header_value_is_named_never_shown(
    trace: Path, tmp_path: Path, value: str, needle: str
) -> None:
    proc = _replay(
        trace, "--url", "http://127.0.0.1:1", "--run-dir", str(tmp_path / "run"),
        env={"OPENAI_API_KEY": value}, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oomload: error: "), proc.stderr
    assert "$OPENAI_API_KEY" in proc.stderr and needle in proc.stderr
    for part in (SECRET, SECRET[:6], SECRET[6:], "Bearer"):
        assert part not in proc.stderr + proc.stdout
    assert not (tmp_path / "run").exists()


def test_the_variable_named_by_api_key_env_is_the_one_named(trace: Path, tmp_path: Path) -> None:
    proc = _replay(
        trace, "--url", "http://127.0.0.1:1", "--api-key-env", "MY_VLLM_KEY",
        env={"MY_VLLM_KEY": SECRET + "\r"}, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "$MY_VLLM_KEY" in proc.stderr and SECRET not in proc.stderr


def test_api_key_rules() -> None:
    assert api_key_problem(SECRET) is None
    assert read_api_key("K", {"K": SECRET}) == SECRET
    assert read_api_key("K", {}) is None and read_api_key("K", {"K": ""}) is None
    with pytest.raises(ConfigError) as err:
        read_api_key("K", {"K": SECRET + "\r"})
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://admin:hunter2pw@127.0.0.1:1",
        "http://hunter2pw@127.0.0.1:1",
        "http://admin:hunter2pw@127.0.0.1:port",  # also unparseable: still never echoed
        "https://admin:hunter2pw@[::1",
        "ftp://admin:hunter2pw@host",
    ],
)
def test_credentials_in_the_url_are_refused_and_never_echoed(
    trace: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(trace), "--url", url, "--run-dir", str(tmp_path / "run")]) == 2
    captured = capsys.readouterr()
    assert "hunter2pw" not in captured.err + captured.out and "admin" not in captured.err
    assert "credentials" in captured.err and "OPENAI_API_KEY" in captured.err
    assert not (tmp_path / "run").exists()


def test_credentials_in_a_gpu_sampler_url_are_refused_too(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["replay", str(trace), "--url", "http://127.0.0.1:1", "--gpu", "remote:http://u:hunter2pw@gpu:9400"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--gpu" in err and "credentials" in err and "hunter2pw" not in err


def test_redact_and_scrub() -> None:
    assert redact_url("http://u:p@h:1/x?q@r") == "http://***@h:1/x?***"  # a query may hold a key too
    assert redact_url("http://h:1/a@b") == "http://h:1/a@b"  # an @ in the path is not user information
    assert scrub(f"header Bearer {SECRET}\\r", [SECRET, None]) == "header Bearer ***\\r"


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8000/v1/completions", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1/chat/completions/", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/vllm/v1/models", "http://127.0.0.1:8000/vllm"),
    ],
)
def test_an_endpoint_path_as_url_says_to_give_the_base_url(
    trace: Path, url: str, base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(trace), "--url", url]) == 2
    err = capsys.readouterr().err
    assert "base URL" in err and f"({base})" in err, err


@pytest.mark.parametrize("under", ["a-file/run", "a-file/deeper/run"])
def test_a_run_dir_under_a_regular_file_is_exit_2_before_any_load(
    trace: Path, tmp_path: Path, under: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("x")
    code = main(["replay", str(trace), "--url", "http://127.0.0.1:1", "--run-dir", str(tmp_path / under)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "cannot create the run directory" in err and "a-file is a file, not a directory" in err


def test_a_default_runs_folder_that_is_a_file_is_exit_2(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a folder")
    assert main(["replay", str(trace), "--url", "http://127.0.0.1:1"]) == 2
    assert "runs is a file, not a directory" in capsys.readouterr().err


def test_a_report_that_cannot_be_written_is_exit_2_with_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run")
    (run / "report.md").mkdir()  # the report's own file name is taken by a folder
    assert main(["report", str(run), "--format", "md"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oomload: error: ") and "report.md" in err and "Traceback" not in err


def test_an_error_text_that_holds_the_key_is_scrubbed_everywhere(
    trace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Last line of defence: a message or a crash report built from an exception's text that holds
    the key (as http.client's 'Invalid header value b'Bearer …'' did) shows ``***`` instead."""
    import oomload.cli.replay as replay_cli

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)

    def endpoint_error(args: object) -> int:
        raise EndpointError(f"cannot reach http://h/v1/models (Invalid header value b'Bearer {SECRET}')")

    monkeypatch.setattr(replay_cli, "run", endpoint_error)
    assert main(["replay", str(trace)]) == 3
    err = capsys.readouterr().err
    assert SECRET not in err and "Bearer ***" in err

    def crash(args: object) -> int:
        raise RuntimeError(f"header Bearer {SECRET}")

    monkeypatch.setattr(replay_cli, "run", crash)
    assert main(["replay", str(trace)]) == 70
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and SECRET not in line and "internal error (RuntimeError)" in line
    saved = Path(line.rsplit("traceback saved in ", 1)[1])
    try:
        text = saved.read_text()
        assert SECRET not in text and "Bearer ***" in text and "Traceback" in text
    finally:
        saved.unlink()


def test_a_level_the_open_file_limit_cannot_carry_is_refused_before_any_load(
    trace: Path, tmp_path: Path
) -> None:
    """Under ``ulimit -n 120`` (hard too: nothing to raise to) 150 users cannot each hold a socket: one
    sentence, exit 2, before the endpoint is even asked (an unreachable one here)."""
    import resource
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (120, 120))

    proc = subprocess.run(
        [
            *(sys.executable, "-m", "oomload", "replay", str(trace), "--no-live", "--gpu", "none"),
            *("--url", "http://127.0.0.1:1", "--concurrency", "4,150", "--hold-s", "1"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        preexec_fn=limit,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("oomload: error: concurrency 150 needs about ") and "the limit is 120" in err
    assert "ulimit -n" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_web_port_in_use_is_refused_before_anything_starts(trace: Path, tmp_path: Path) -> None:
    """``--web`` on a port another program listens on: gevent's tracebacks, that program's URL printed
    as the UI's, and a run that went on to exit 0. Now one sentence, exit 2, before the endpoint is
    asked (an unreachable one here)."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        proc = _replay(
            trace, "--url", "http://127.0.0.1:1", "--web", "--web-port", str(port), env={}, cwd=tmp_path
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in proc.stdout + err
    assert err == (
        f"oomload: error: the web UI cannot listen on 127.0.0.1:{port} (Address already in use); is the "
        "port in use? Choose another with --web-port (or --web-host)"
    )
