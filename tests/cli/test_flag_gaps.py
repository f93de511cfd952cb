"""Flag values that once got past the checks — a URL that is no URL, a negative SLO, an empty level
list, a flag without the flag it belongs to — are one sentence and exit 2 before anything runs.

``replay``'s flags are checked by ``build_config`` (no load, no Locust in this process); ``tune``'s by
its command with ``run_tune`` replaced by one that fails the test, so a check that comes too late (or
never) fails here instead of starting servers."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from clirun import run
from fakesampler import run_sample
from oomload.cli import build_parser
from oomload.cli.replay import build_config
from oomload.errors import ConfigError

FIXED = Path(__file__).resolve().parents[2] / "traces" / "sample-fixed.jsonl"
URL = "http://127.0.0.1:1"
SIM = "oomload sim serve --time-scale 0.025"
ONE_GPU = '{"devices": [{"name": "Fake", "total_bytes": 1000, "used_bytes": 250, "util_pct": 3}]}'


def _replay_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["replay", str(FIXED), *flags])


def _refused(*flags: str) -> str:
    """``replay FIXED FLAGS``'s sentence (a ``ConfigError`` from ``build_config``)."""
    with pytest.raises(ConfigError) as info:
        build_config(_replay_args(*flags))
    return str(info.value)


@pytest.mark.parametrize("scheme", ["dcgm", "remote"])
@pytest.mark.parametrize("url", ["notaurl", "ftp://h:9400", "http://"])
def test_a_gpu_url_that_is_not_http_is_refused_before_any_load(scheme: str, url: str) -> None:
    message = _refused("--url", URL, "--gpu", f"{scheme}:{url}")
    assert message.startswith(f"--gpu {scheme}:URL "), message
    assert "must be an http(s) URL" in message or "names no host" in message, message


def test_a_gpu_url_that_is_http_is_taken_as_given() -> None:
    config = build_config(_replay_args("--url", URL, "--gpu", "dcgm:http://gpu-host:9400/metrics"))
    assert config.gpu == "dcgm:http://gpu-host:9400/metrics"


def test_sample_refuses_a_dcgm_url_that_is_not_http(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_sample(ONE_GPU, ["--dcgm-url", "notaurl", "--duration-s", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "oomload: error: --dcgm-url must be an http(s) URL (http://HOST[:PORT][/PATH]), got 'notaurl'\n"
    )


def _tune(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *flags: str
) -> tuple[int, str]:
    """``tune FIXED --serve SIM FLAGS`` in this process, refused before the tune starts: (code, stderr)."""
    import oomload.tune.run

    def started(*args: object, **kwargs: object) -> None:
        pytest.fail("the tune started: its flags were not checked before it")

    monkeypatch.setattr(oomload.tune.run, "run_tune", started)
    code, _, err = run(["tune", str(FIXED), "--serve", SIM, *flags], capsys)
    assert len(err.strip().splitlines()) == 1, err
    return code, err


@pytest.mark.parametrize(
    ("host", "needle"),
    [
        ("8.8.8.8", "the server cannot listen on --host 8.8.8.8 (Cannot assign requested address)"),
        ("no-such-host.invalid", "--host 'no-such-host.invalid' is not an address or a name"),
    ],
)
def test_a_tune_host_this_machine_cannot_listen_on_is_exit_2_before_any_candidate(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    host: str,
    needle: str,
) -> None:
    flags = ("--target-concurrency", "4", "--host", host, "--run-dir", str(tmp_path / "t"))
    code, err = _tune(capsys, monkeypatch, *flags)
    assert code == 2 and needle in err, err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("host", "needle"),
    [
        ("8.8.8.8", "the Locust master cannot listen on --master-bind-host 8.8.8.8 (Cannot assign"),
        ("no-such-host.invalid", "--master-bind-host 'no-such-host.invalid' is not an address or a name"),
    ],
)
def test_a_master_bind_host_this_machine_cannot_listen_on_is_exit_2_before_any_load(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    host: str,
    needle: str,
) -> None:
    """Before: the trace was read, the simulator started and the run directory written, then the
    master's bind failed (exit 2, "is the port in use?")."""
    import oomload.run.runner

    def started(*args: object, **kwargs: object) -> None:
        pytest.fail("the replay started: --master-bind-host was not checked before it")

    monkeypatch.setattr(oomload.run.runner, "run_replay", started)
    flags = ("--workers", "1", "--master-bind-host", host, "--run-dir", str(tmp_path / "r"))
    code, _, err = run(["replay", str(FIXED), *flags], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()
    assert (
        build_config(_replay_args("--url", URL, "--processes", "2", "--master-bind-host", "*")).processes == 2
    )


def test_free_port_and_the_server_url_take_an_ipv6_host(tmp_path: Path) -> None:
    from oomload.realvllm.server import RealVllmServer, free_port

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError as err:  # IPv6 configured off: nothing to check here
        pytest.skip(f"::1 cannot be bound here ({err.strerror})")
    port = free_port("::1")  # an IPv4 socket bound to an IPv6 address: an internal error before
    assert 0 < port < 65536
    server = RealVllmServer(None, tmp_path, host="::1", port=port)  # type: ignore[arg-type]
    assert server.url == f"http://[::1]:{port}"


def test_the_listen_check_is_free_port_with_sentences(monkeypatch: pytest.MonkeyPatch) -> None:
    """One bind for both: ``free_port`` binds a given port too, and ``check_listen_address`` is it with
    each ``OSError`` told in a sentence (tune's --host/--port, replay's --master-bind-host)."""
    import errno

    import oomload.realvllm.server as server

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"^--port {port} on 127.0.0.1 is in use "):
            server.check_listen_address("127.0.0.1", port)
    assert server.free_port("127.0.0.1", port) == port  # free again once closed

    def refused(host: str, port: int = 0) -> int:
        raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")

    monkeypatch.setattr(server, "free_port", refused)
    with pytest.raises(
        ConfigError, match=r"^the Locust master cannot listen on --master-bind-host 10\.9\.9\.9 "
    ):
        server.check_listen_address("10.9.9.9", None, who="the Locust master", host_flag="--master-bind-host")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--slo-ttft-p99-s", "-1"], "--slo-ttft-p99-s must be a finite number > 0, got -1.0"),
        (["--slo-ttft-p99-s", "0"], "--slo-ttft-p99-s must be a finite number > 0, got 0.0"),
        (["--slo-ttft-p99-s", "nan"], "--slo-ttft-p99-s must be a finite number > 0, got nan"),
        (["--hold-s", "inf"], "--hold-s must be a finite number > 0, got inf"),
        (["--max-duration-s", "inf"], "--max-duration-s must be a finite number > 0, got inf"),
        (["--startup-timeout-s", "inf"], "--startup-timeout-s must be a finite number > 0, got inf"),
    ],
)
def test_a_meaningless_tune_number_is_exit_2_at_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    code, err = _tune(capsys, monkeypatch, "--target-concurrency", "4", *flags)
    assert (code, err) == (2, f"oomload: error: {message}\n")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--warmup-s", "nan"], "--warmup-s must be a finite number ≥ 0, got nan"),
        (["--warmup-s", "inf"], "--warmup-s must be a finite number ≥ 0, got inf"),
        (["--seed", "-1"], "--seed must be an integer ≥ 0, got -1"),  # numpy's odds: exit 70 before
        (["--max-duration-s", "inf"], "--max-duration-s must be a finite number > 0, got inf"),
        (["--request-timeout-s", "inf"], "--request-timeout-s must be a finite number > 0, got inf"),
        (["--metrics-interval-s", "inf"], "--metrics-interval-s must be a finite number > 0, got inf"),
        (["--open-loop", "--arrival-scale", "inf"], "--arrival-scale must be a finite number > 0, got inf"),
    ],
)
def test_a_meaningless_replay_number_is_refused(flags: list[str], message: str) -> None:
    assert _refused("--url", URL, *flags) == message


def test_trace_synth_refuses_a_negative_seed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(
        ["trace", "synth", "--count", "3", "--seed", "-1", "-o", str(tmp_path / "t.jsonl")], capsys
    )
    assert (code, err) == (2, "oomload: error: --seed must be an integer ≥ 0, got -1\n")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", ""], "concurrency list '' is empty; give levels like 1,2,4,8"),
        (["--concurrency", " "], "concurrency list ' ' is empty; give levels like 1,2,4,8"),
        (["--concurrency", "1,,2"], "concurrency list '1,,2' has an empty item; give levels like 1,2,4,8"),
        (["--concurrency", "1,2,"], "concurrency list '1,2,' has an empty item; give levels like 1,2,4,8"),
        (["--ramp", ""], "--ramp is empty; give linear:START:STOP:STEP or geometric:START:STOP:FACTOR"),
    ],
)
def test_an_empty_level_list_or_item_is_refused_not_the_default(flags: list[str], message: str) -> None:
    assert _refused("--url", URL, *flags) == message


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-num-seqs", ""], "--max-num-seqs is empty; give comma-separated positive integers"),
        (
            ["--max-num-seqs", "4,,8"],
            "--max-num-seqs '4,,8' has an empty item; give comma-separated positive integers",
        ),
        (["--utilization", ""], "--utilization is empty; give comma-separated values"),
        (
            ["--utilization", "0.9,,0.8"],
            "--utilization '0.9,,0.8' has an empty item; give comma-separated values",
        ),
        (["--num-gpu-blocks", ","], "--num-gpu-blocks is empty; give comma-separated positive integers"),
        (
            ["--kv-cache-memory-bytes", "1,"],
            "--kv-cache-memory-bytes '1,' has an empty item; give comma-separated positive integers",
        ),
    ],
)
def test_an_empty_tune_ladder_or_item_is_refused_not_the_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    code, err = _tune(capsys, monkeypatch, "--target-concurrency", "4", *flags)
    assert (code, err) == (2, f"oomload: error: {message}\n")


def test_plan_refuses_an_empty_level_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        ["plan", str(FIXED), "--concurrency", "", "--model", "llama-3.1-8b", "--gpu", "l4"], capsys
    )
    assert (code, err) == (
        2,
        "oomload: error: --concurrency concurrency list '' is empty; give levels like 1,2,4,8\n",
    )


DISTRIBUTED = "--workers K or --processes N > 1"


@pytest.mark.parametrize(
    ("flags", "partner"),
    [
        (["--web-keep-s", "5"], "--web"),
        (["--web-port", "20999"], "--web"),
        (["--web-host", "127.0.0.1"], "--web"),
        (["--arrival-scale", "3"], "--open-loop"),
        (["--master-bind-port", "20999"], DISTRIBUTED),
        (["--master-bind-host", "0.0.0.0"], DISTRIBUTED),
        (["--worker-timeout-s", "5"], DISTRIBUTED),
        (["--serve-timeout-s", "5"], "--serve"),
    ],
)
def test_a_flag_without_its_partner_is_refused_not_ignored(flags: list[str], partner: str) -> None:
    flag = flags[0]
    assert (
        _refused("--url", URL, *flags) == f"{flag} only applies with {partner}: give that too, or drop {flag}"
    )


REPEATS_OFF = "--repeats measures the refinement's levels again, which {} turns off: drop one"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--no-refine", "--repeats", "3"], REPEATS_OFF.format("--no-refine")),
        (["--concurrency", "4", "--soak", "10m", "--repeats", "2"], REPEATS_OFF.format("--soak")),
        (
            ["--gpu", "none", "--require-gpu"],
            "--require-gpu asks for GPU samples and --gpu none turns them off",
        ),
        (
            ["--api", "chat", "--token-id-range", "1:50"],
            "--token-id-range is for --api completions' token-id",
        ),
    ],
)
def test_a_flag_that_its_company_turns_off_is_refused_not_ignored(flags: list[str], message: str) -> None:
    assert _refused("--url", URL, *flags).startswith(message)


def test_flags_with_their_partners_pass_and_the_defaults_stay() -> None:
    default = build_config(_replay_args("--url", URL))
    assert (default.web_host, default.web_port, default.arrival_scale, default.repeats) == (
        "127.0.0.1",
        8089,
        1.0,
        3,
    )
    assert (default.master_bind_host, default.worker_timeout_s, default.serve_timeout_s) == (
        "127.0.0.1",
        60.0,
        900.0,
    )
    assert default.token_id_range == (100, 2000)
    given = build_config(
        _replay_args("--url", URL, "--web", "--web-port", "20998", "--web-keep-s", "5", "--processes", "2",
                     "--master-bind-port", "20999", "--worker-timeout-s", "5", "--no-refine", "--repeats",
                     "1")
    )  # fmt: skip
    assert (given.web_port, given.web_keep_s, given.master_bind_port, given.worker_timeout_s) == (
        20998,
        5,
        20999,
        5,
    )
    assert (
        build_config(_replay_args("--url", URL, "--open-loop", "--arrival-scale", "3")).arrival_scale == 3.0
    )
    soak = build_config(
        _replay_args("--url", URL, "--concurrency", "4", "--soak", "10m", "--no-refine", "--no-evidence")
    )
    assert soak.soak_s == 600.0  # the documented harmless ones: they agree with --soak


FIXED_LADDER = "{} is a ladder to search and --fix {} keeps that knob still: drop one"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--utilization", "0.9,0.8"], FIXED_LADDER.format("--utilization", "gpu-memory-utilization")),
        (["--num-gpu-blocks", "80"], FIXED_LADDER.format("--num-gpu-blocks", "gpu-memory-utilization")),
    ],
)
def test_a_tune_ladder_for_a_fixed_knob_is_refused_not_ignored(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    code, err = _tune(
        capsys, monkeypatch, "--target-concurrency", "4", "--fix", "gpu-memory-utilization", *flags
    )
    assert (code, err) == (2, f"oomload: error: {message}\n")
    code, err = _tune(
        capsys, monkeypatch, "--target-concurrency", "4", "--fix", "max-num-seqs", "--max-num-seqs", "4"
    )
    assert (code, err) == (2, f"oomload: error: {FIXED_LADDER.format('--max-num-seqs', 'max-num-seqs')}\n")


def test_a_relative_baseline_is_recorded_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``config.json`` kept ``--baseline runs/last`` as given, so ``oomload report RUN`` (which takes the
    baseline from there) failed from any other directory: "runs/last is not a run directory"."""
    from runbuilder import StepSpec, write_run

    write_run(tmp_path / "runs" / "last", [StepSpec(2)])
    monkeypatch.chdir(tmp_path)
    config = build_config(_replay_args("--url", URL, "--gate", "onset>=baseline", "--baseline", "runs/last"))
    assert config.baseline == tmp_path / "runs" / "last"
