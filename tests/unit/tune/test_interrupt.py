"""A Ctrl-C while a candidate runs: the candidate is counted and listed in ``tune.json`` (started or not,
not proved), with a note on how far it got (``oomload.tune.run``). Before, ``tune.json`` held
``"candidates": []`` and the headline "0 of at most 8 starts" while ``candidates/01/`` held its server
log and its interrupted replay."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import oomload.tune.run as tune_run
from oomload.capacity.odds import Pool
from oomload.realvllm.servecmd import parse_serve_command
from oomload.tune.context import TuneConfig
from oomload.tune.search import SearchSpace, Settings

TRACE = Path(__file__).resolve().parents[3] / "traces" / "sample-fixed.jsonl"


class _Server:
    """``RealVllmServer``'s surface the tune uses; ``start`` raises when told to (``signum``: gets that
    signal, as the process would, instead)."""

    interrupt_start = False
    signum: int | None = None
    stops = 0

    def __init__(self, line: object, cand_dir: Path, **kwargs: Any) -> None:
        self.log_path = cand_dir / "server.log"
        self.url = "http://127.0.0.1:1"
        self.startup_s = 0.5
        self.exit_code = None

    def start(self) -> None:
        self.log_path.write_text("started\n")
        if _Server.interrupt_start:
            _interrupt()

    def stop(self) -> None:
        _Server.stops += 1

    def log_text(self) -> str:
        return self.log_path.read_text()


def _interrupt() -> None:
    """A Ctrl-C's ``KeyboardInterrupt``, or the signal ``_Server.signum`` delivered to this process."""
    if _Server.signum is None:
        raise KeyboardInterrupt
    signal.raise_signal(_Server.signum)


def _interrupted_proof(*args: object, **kwargs: object) -> object:
    _interrupt()  # the replay child was interrupted with the tune
    raise AssertionError("the signal did not stop the tune")


def _tune(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    in_start: bool,
    signum: int | None = None,
    pool: Pool | None = None,
) -> dict[str, Any]:
    monkeypatch.setattr(tune_run, "RealVllmServer", _Server)
    monkeypatch.setattr(tune_run, "server_pool", lambda *args: pool)  # /metrics, the start-up log
    monkeypatch.setattr(tune_run, "prove", _interrupted_proof)
    monkeypatch.setattr(tune_run, "free_device_bytes", lambda: None)
    monkeypatch.setattr(_Server, "interrupt_start", in_start)
    monkeypatch.setattr(_Server, "signum", signum)
    monkeypatch.setattr(_Server, "stops", 0)
    config = TuneConfig(
        trace_path=TRACE,
        serve=parse_serve_command("oomload sim serve"),
        target=4,
        space=SearchSpace(memory=(Settings(gpu_memory_utilization=0.9),), max_num_seqs=(1, 2, 3, 4)),
        run_dir=tmp_path / "t",
        port=1,
    )
    record = tune_run.run_tune(config, Console(file=io.StringIO()))
    assert record.exit_code() == 130 and _Server.stops == 1
    saved: dict[str, Any] = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert saved["candidates"] == json.loads(json.dumps(record.to_json()))["candidates"]
    return saved


def test_a_candidate_interrupted_during_its_proof_is_listed_as_started_and_not_proved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = _tune(tmp_path, monkeypatch, in_start=False)
    assert saved["status"] == "interrupted"
    [candidate] = saved["candidates"]
    assert candidate["index"] == 1 and candidate["started"] is True
    assert candidate["proof"] is None and candidate["failure"] is None
    assert "candidate 1 was interrupted after its server started: not proved" in saved["notes"][-1]
    assert saved["winner_index"] is None


def test_a_candidate_interrupted_during_its_start_is_listed_as_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = _tune(tmp_path, monkeypatch, in_start=True)
    [candidate] = saved["candidates"]
    assert candidate["index"] == 1 and candidate["started"] is False and candidate["proof"] is None
    assert "candidate 1 was interrupted before its server answered" in saved["notes"][-1]


@pytest.mark.parametrize("in_start", [True, False])
def test_a_sigterm_is_named_in_the_note_not_called_ctrl_c(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_start: bool
) -> None:
    """A tune stopped by SIGTERM noted "interrupted (Ctrl-C)"."""
    saved = _tune(tmp_path, monkeypatch, in_start=in_start, signum=signal.SIGTERM)
    assert saved["status"] == "interrupted"
    assert saved["notes"][0].startswith("interrupted by SIGTERM: the server was stopped")
    assert "Ctrl-C" not in " ".join(saved["notes"])
    assert signal.getsignal(signal.SIGTERM) is not tune_run._interrupt  # the handler is given back


def test_a_ctrl_c_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = _tune(tmp_path, monkeypatch, in_start=False)
    assert saved["notes"][0].startswith("interrupted by Ctrl-C (SIGINT): the server was stopped")


def test_a_candidate_interrupted_in_its_replay_keeps_the_pool_it_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console had printed "pool 826 blocks × 16 tokens" for candidate 2, and its row read "—"."""
    from oomload.report.tune import COLUMNS, render_markdown
    from oomload.tune.record import TuneRecord

    saved = _tune(tmp_path, monkeypatch, in_start=False, pool=Pool(826, 16, 8192))
    [candidate] = saved["candidates"]
    assert candidate["proof"] is None and (candidate["num_gpu_blocks"], candidate["block_size"]) == (826, 16)
    record = TuneRecord.from_json(saved)
    row = next(line for line in render_markdown(record).splitlines() if line.startswith("| 1 "))
    assert [c.strip() for c in row.strip("|").split("|")][COLUMNS.index("KV blocks")] == "826 × 16"
    unknown = _tune(tmp_path / "b", monkeypatch, in_start=False)["candidates"][0]
    assert unknown["num_gpu_blocks"] is None  # the pool was not read: nothing made up
