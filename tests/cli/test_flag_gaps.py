"""Flag values that once got past the checks — a URL that is no URL, a negative SLO, an empty level
list, a flag without the flag it belongs to — are one sentence and exit 2 before anything runs.

``replay``'s flags are checked by ``build_config`` (no load, no Locust in this process); ``tune``'s by
its command with ``run_tune`` replaced by one that fails the test, so a check that comes too late (or
never) fails here instead of starting servers."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

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
