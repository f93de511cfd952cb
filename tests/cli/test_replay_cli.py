"""``oomload replay`` validates every flag before any load is sent: one sentence, exit 2 (or 3)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from oomload.cli import main
from oomload.run.config import DEMO_SIM_ARGS, sim_flag, sim_line_args
from oomload.trace.model import TraceHeader, TraceRecord, write_trace


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    write_trace(path, [TraceRecord("r0", 0.0, 10, 5)], TraceHeader())
    return path


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--concurrency", "4,2"], "strictly increasing"),
        (["--ramp", "geometric:1:64:1"], "FACTOR"),
        (["--stop-on", "bogus"], "unknown stop condition"),
        (["--stop-on", "never", "--stop-on", "oom"], "cannot be combined"),
        (["--hold-s", "0"], "hold time"),
        (["--tail-percentile", "100"], "--tail-percentile"),
        (["--gpu", "cuda"], "--gpu"),
        (["--url", "localhost:8000"], "http://"),
        (["--url", "http://[::1"], "is not a valid URL (Invalid IPv6 URL)"),
        (["--url", "http://a..b:8000"], "is not a valid URL"),
        (["--url", "http://h:port"], "is not a valid URL"),
        (["--url", "http:///v1"], "names no host"),
        (["--processes", "0"], "--processes"),
        (["--token-id-range", "9:3"], "token id range"),
        (["--gate", "this is not a gate"], "gate"),
        (["--url", "http://127.0.0.1:1", "--sim", "--time-scale 0"], "--sim"),
        (["--web", "--web-keep-s", "-1"], "--web-keep-s"),
        (["--web", "--web-keep-s", "nan"], "--web-keep-s"),
        (["--prefix-sharing", "--distinct-prompts"], "contradict each other"),
        (["--served-with", "vllm serve m --max-num-seqs 8"], "give its --url too"),
        (["--serve", "vllm serve m", "--served-with", "vllm serve m"], "with --serve the line is already"),
        (["--url", "http://127.0.0.1:1", "--served-with", "python app.py"], "--served-with 'python'"),
    ],
)
def test_bad_flags_are_one_sentence_and_exit_2(
    trace: Path, flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["replay", str(trace), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("oomload: error: ") and needle in err, err
    assert "Traceback" not in err


def test_production_shape_is_the_default_with_the_headers_block_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from oomload.cli import build_parser
    from oomload.cli.replay import build_config
    from oomload.run.config import ReplayConfig
    from oomload.trace.model import PrefixInfo

    path = tmp_path / "t.jsonl"
    write_trace(path, [TraceRecord("r0", 0.0, 40, 5, hash_ids=(1, 2))], TraceHeader(prefix=PrefixInfo(16)))

    def config(*flags: str) -> ReplayConfig:
        result: ReplayConfig = build_config(build_parser().parse_args(["replay", str(path), *flags]))
        return result

    default = config()
    assert not default.distinct_prompts and default.prefix_block_tokens == 16
    assert default.payload_options("m").prefix_sharing
    assert not config("--distinct-prompts").payload_options("m").prefix_sharing
    old = config("--prefix-sharing")  # the old name of the default: a note, nothing else
    assert old.payload_options("m").prefix_sharing
    assert "--prefix-sharing is the default now" in capsys.readouterr().err


def test_the_odds_place_only_the_default_levels(trace: Path) -> None:
    """Levels the user names (``--concurrency``, ``--ramp``) are measured as named; the default ones
    (the demo's, or the default ladder against a URL) are placed by the trace's odds."""
    from oomload.cli import build_parser
    from oomload.cli.replay import build_config

    def placed(*flags: str) -> bool:
        return bool(build_config(build_parser().parse_args(["replay", str(trace), *flags])).place_levels)

    assert placed() and placed("--url", "http://127.0.0.1:9")
    assert not placed("--concurrency", "1,2,4") and not placed("--ramp", "linear:1:8:1")


def test_a_gate_file_adds_its_rules_before_any_load(trace: Path, tmp_path: Path) -> None:
    """The README's CI gate names ``--gate-file`` for replay: its rules join ``--gate``'s, and a bad one
    is exit 2 before any load, as on ``report`` and ``compare``."""
    from oomload.cli import build_parser
    from oomload.cli.replay import build_config

    scenario = tmp_path / "scenario.toml"
    scenario.write_text('[gate]\nrules = ["no-oom-up-to:8", "error-rate<=1%"]\n')
    flags = ["replay", str(trace), "--gate", "no-preemption-below:4", "--gate-file", str(scenario)]
    config = build_config(build_parser().parse_args(flags))
    assert config.gates == ("no-preemption-below:4", "no-oom-up-to:8", "error-rate<=1%")
    scenario.write_text('[gate]\nrules = ["onset>=baseline"]\n')
    assert main(["replay", str(trace), "--gate-file", str(scenario)]) == 2


def test_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_validation_does_not_import_locust() -> None:
    code = "import sys; import oomload.cli.replay, oomload.run.runner; print('locust' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_command_line_does_not_import_the_verdict_until_a_run_is_judged() -> None:
    """``oomload --help`` and every flag check stay light: the verdict package (30 modules, ~0.15 s) is
    imported by what judges a run, or by one flag's check that needs it (``--soak``), not by the CLI."""
    code = "import sys; import oomload.cli; print('oomload.verdict' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unreachable_endpoint_exits_3_with_a_sentence(trace: Path, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "oomload",
        "replay",
        str(trace),
        "--url",
        f"http://127.0.0.1:{port}",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "cannot reach" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing was started


def test_help_lists_the_contract_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    out = capsys.readouterr().out
    for flag in (
        "--concurrency",
        "--ramp",
        "--hold-s",
        "--min-requests",
        "--warmup-s",
        "--no-refine",
        "--stop-on",
        "--max-duration-s",
        "--order",
        "--tail-percentile",
        "--open-loop",
        "--arrival-scale",
        "--distinct-prompts",
        "--no-exact-output",
        "--api-key-env",
        "--run-dir",
        "--gate",
        "--web",
        "--processes",
        "--request-timeout-s",
        "--metrics-interval-s",
        "--gpu",
        "--require-gpu",
        "--sim",
    ):
        assert flag in out, flag


def test_a_run_dir_that_holds_an_earlier_run_is_refused_before_any_load(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old-run"
    old.mkdir()
    (old / "requests.jsonl").write_text('{"request_id": "r0"}\n')
    assert main(["replay", str(trace), "--run-dir", str(old)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oomload: error: --run-dir") and "already holds files" in err, err
    assert (old / "requests.jsonl").read_text() == '{"request_id": "r0"}\n'  # untouched
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert main(["replay", str(trace), "--run-dir", str(a_file)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_a_bad_sim_flag_is_a_usage_error(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert main(["replay", str(trace), "--sim=--bogus-flag", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --bogus-flag" in err and "Traceback" not in err
    assert not run_dir.exists()


def test_a_simulator_that_does_not_start_leaves_no_run_directory(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default run directory (``runs/<stamp>``, made before the server starts) is gone again when
    the simulator refuses its flags: its words are in the error, and ``compare`` or ``report`` finds no
    half-made run to trip on."""
    monkeypatch.chdir(tmp_path)
    assert main(["replay", str(trace), "--sim=--gpu-memory-utilization 0.05"]) == 2
    err = capsys.readouterr().err
    assert "at start-up" in err and "Traceback" not in err, err
    assert not any((tmp_path / "runs").glob("*")), list((tmp_path / "runs").glob("*/*"))


@pytest.mark.parametrize("given", [("--gpu-memory-utilization", "0.75"), ("--gpu-memory-utilization=0.75",)])
def test_a_sim_flag_given_again_replaces_the_demos(given: tuple[str, ...]) -> None:
    """The line a run shows and records names each setting once (it named the demo's 0.8, then 0.75)."""
    args = sim_line_args((*given, "--host-leak-mib-per-min", "30"))
    assert sum(a.startswith("--gpu-memory-utilization") for a in args) == 1, args
    assert sim_flag(args, "--gpu-memory-utilization") == "0.75"
    assert sim_flag(args, "--max-num-seqs") == "64" and args[-2:] == ("--host-leak-mib-per-min", "30")
    assert sim_line_args(()) == DEMO_SIM_ARGS
