"""Where the worker token comes from, on the master and on a worker: never a command-line value, a file
only with mode 0600, the default file made once and reused."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from oomload.errors import ConfigError
from oomload.run.master_meter import MasterMeter, report_ok, worker_loadgen
from oomload.run.worker_node import default_token_path, worker_token
from oomload.run.worker_pool import master_token

TOKEN = "a-worker-token-of-forty-characters-0123"


def test_the_master_makes_the_default_file_once_with_mode_0600_and_reuses_it(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path)}
    said: list[str] = []
    token = master_token(environ, True, said.append)
    path = default_token_path(environ)
    assert path == tmp_path / "oomload" / "worker-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == token + "\n"
    assert master_token(environ, True, said.append) == token  # reused, not replaced
    assert len(said) == 2 and all(str(path) in s and token not in s for s in said)
    assert worker_token(None, environ) == token  # a worker on the same host (or a shared home)


def test_the_environment_wins_and_local_workers_need_no_file(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path), "OOMLOAD_WORKER_TOKEN": TOKEN}
    assert master_token(environ, True, print) == TOKEN
    local = master_token({"XDG_CONFIG_HOME": str(tmp_path)}, False, print)
    assert len(local) >= 32 and local != TOKEN
    assert not default_token_path(environ).exists()  # neither wrote a file


def test_a_worker_takes_its_file_then_the_environment_else_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("f" * 40 + "\n")
    path.chmod(0o600)
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "none"), "OOMLOAD_WORKER_TOKEN": TOKEN}
    assert worker_token(path, environ) == "f" * 40
    assert worker_token(None, environ) == TOKEN
    with pytest.raises(ConfigError, match="--token-file FILE, or set \\$OOMLOAD_WORKER_TOKEN"):
        worker_token(None, {"XDG_CONFIG_HOME": str(tmp_path / "none")})
    with pytest.raises(ConfigError, match="cannot be read"):
        worker_token(tmp_path / "missing", environ)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        worker_token(path, environ)


def test_a_step_report_must_hold_finite_numbers() -> None:
    good = {"step": 1, "mean": 2.0, "max": 3, "in_flight": 2, "started": 9, "outcomes": {"ok": 3}}
    assert report_ok(good)
    for bad in (
        {"mean": "2"},
        {"max": -1},
        {"mean": float("nan")},
        {"outcomes": {"ok": "3"}},
        {"started": []},
        {"loadgen": "x"},
        {"loadgen": {**LOADGEN, "cpu_wait_share": float("inf")}},
        {"loadgen": {**LOADGEN, "loop_lag_max_ms": "210"}},
        {"oldest_s": -0.5},
        {"oldest_s": "1.0"},
    ):
        assert not report_ok(good | bad), bad
    assert report_ok(good | {"oldest_s": 0.003})


def test_the_oldest_request_in_flight_is_the_oldest_over_the_live_workers() -> None:
    """What says whether a step answered nothing (``capacity.schedule``, "No answer"): unknown while a
    live worker has not reported it, and a worker no longer live does not count."""
    live = ["a", "b"]
    session = SimpleNamespace(pool=SimpleNamespace(live_client_ids=lambda: live))
    meter = MasterMeter(session, SimpleNamespace(replay_path=None))
    meter.reports = {"a": {"oldest_s": 0.01}, "gone": {"oldest_s": 9.0}}
    assert meter._oldest_in_flight_s() is None  # b has not said
    meter.reports["b"] = {"oldest_s": 1.5}
    assert meter._oldest_in_flight_s() == 1.5
    live.remove("b")
    assert meter._oldest_in_flight_s() == 0.01


LOADGEN = {
    "duration_s": 2.0,
    "cpu_s": 0.1,
    "cpu_wait_s": 1.86,
    "cpu_wait_share": 0.93,
    "loop_lag_max_ms": 210.0,
    "loop_lag_p99_ms": None,
}


def test_a_workers_own_figures_travel_in_its_report_tagged_with_its_index() -> None:
    good = {"step": 1, "mean": 2.0, "max": 3, "outcomes": {}, "loadgen": LOADGEN}
    assert report_ok(good)
    assert worker_loadgen(LOADGEN, 2) == {**LOADGEN, "worker": 2}
    assert worker_loadgen({"cpu_s": 1.0}, 2) is None
