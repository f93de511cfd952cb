"""``ServerEvidence`` follows ``--server-log`` without the run's secrets reaching the run directory."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from oomload.run.config import ReplayConfig
from oomload.run.serverwatch import ServerEvidence

ENV_KEY = "sk-envKEY123abc"
SERVED_KEY = "sk-servedKEY456"


class Writer:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[tuple[str, dict[str, object]]] = []

    def event(self, kind: str, **fields: object) -> None:
        self.events.append((kind, fields))


def test_a_followed_log_is_copied_without_the_api_key_or_the_served_lines_secrets(tmp_path: Path) -> None:
    log = tmp_path / "late.log"  # created after the start: copied from its first byte
    run = tmp_path / "run"
    run.mkdir()
    config = ReplayConfig(
        trace_path=tmp_path / "t.jsonl",
        server_log=log,
        served_with=f"vllm serve m --api-key {SERVED_KEY}",
    )
    session = SimpleNamespace(config=config, api_key=ENV_KEY, writer=Writer(run), console=Console(quiet=True))
    evidence = ServerEvidence(session)
    evidence._start_log()
    try:
        log.write_text(f"INFO non-default args: {{'api_key': ['{SERVED_KEY}', '{ENV_KEY}']}}\n")
        evidence.log.poll_once()
        copied = (run / "server.log").read_text()  # as the run goes: a killed oomload leaves this
        assert "non-default args" in copied and "['***', '***']" in copied
        assert ENV_KEY not in copied and SERVED_KEY not in copied
    finally:
        evidence.stop()
    assert SERVED_KEY not in (run / "server.log").read_text()
