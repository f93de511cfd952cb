"""``ServeLine``: a user's ``--serve`` line as ``RealVllmServer`` starts it (a ``ServeSpec``).

``oomload tune`` starts the line once per candidate with the candidate's flags; ``oomload replay
--serve`` starts it once as given. Either way the line's own host and port are replaced by the caller's
(loopback and a free port unless told otherwise: ``ServeCommand.with_settings``), a wrapper in front
(``prlimit``, ``env``, …) stays in front, and ``oomload sim serve`` runs as ``python -m oomload`` of
this install. The line's secrets (``ServeCommand.secrets``) are ``RealVllmServer``'s to keep out of
the server's log. The environment: oomload's CPU-vLLM launcher gets the harness's (offline,
loopback); any other server the caller's, without ``VLLM_PORT`` (it would override ``--port``) and
with its own ``TMPDIR`` (vLLM's ZMQ IPC socket paths must stay short).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from oomload.realvllm.servecmd import FlagSource, ServeCommand
from oomload.realvllm.server import harness_env


@dataclass(frozen=True, slots=True)
class NoFlags:
    """The settings of a line started as given."""

    def flags(self) -> tuple[tuple[str, str | None], ...]:
        return ()


@dataclass(frozen=True)
class ServeLine:
    """The user's line with ``settings``' flags (module docstring)."""

    command: ServeCommand
    settings: FlagSource = NoFlags()

    @property
    def program(self) -> str:
        return repr(self.command.server_argv[0])

    def serve_argv(self, host: str, port: int) -> list[str]:
        argv = list(self.command.with_settings(self.settings, host, port))
        start = self.command.start
        if self.command.kind == "sim" and Path(argv[start]).name == "oomload":
            argv[start : start + 1] = [sys.executable, "-m", "oomload"]
        return argv

    def serve_env(self, env: dict[str, str], tmp_dir: Path) -> dict[str, str]:
        server = self.command.server_argv
        if len(server) > 1 and Path(server[1]).name == "launcher.py":
            return harness_env(env, tmp_dir)  # oomload's own CPU-vLLM launcher: the harness's env
        out = {k: v for k, v in env.items() if k != "VLLM_PORT"}
        out["TMPDIR"] = str(tmp_dir)
        return out
