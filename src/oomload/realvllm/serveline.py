"""``ServeLine``: a user's ``--serve`` line as ``RealVllmServer`` starts it (a ``ServeSpec``).

``oomload tune`` starts the line once per candidate with the candidate's flags; ``oomload replay
--serve`` starts it once as given. Either way the line's own host and port are replaced by the caller's
(loopback and a free port unless told otherwise: ``ServeCommand.with_settings``), a wrapper in front
(``prlimit``, ``env``, …) stays in front, and ``oomload sim serve`` runs as ``python -m oomload`` of
this install. ``scrub_file`` takes the line's secrets out of the server's log. The environment:
oomload's CPU-vLLM launcher gets the harness's (offline, loopback);
any other server the caller's, without ``VLLM_PORT`` (it would override ``--port``) and with its own
``TMPDIR`` (vLLM's ZMQ IPC socket paths must stay short).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

from oomload.credentials import scrub
from oomload.errors import OutputWriteError
from oomload.outfile import write_text
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


def scrub_file(path: Path, secrets: tuple[str, ...]) -> None:
    """Rewrite ``path`` with every secret replaced by ``***`` (vLLM logs its non-default arguments, an
    ``--api-key`` among them); nothing to do without secrets or without the file. When the rewrite
    cannot be written (a full disk) the file is removed rather than left with a secret in it, and
    ``OutputWriteError`` says so."""
    if not secrets or not path.is_file():
        return
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    cleaned = scrub(text, secrets)
    if cleaned == text:
        return
    try:
        write_text(path, cleaned)
    except OutputWriteError as err:
        with contextlib.suppress(OSError):
            path.unlink()
        raise OutputWriteError(
            f"cannot write {path} without its secrets ({err.reason}); it was removed so that no secret "
            "is left in it, and the server was stopped",
            path,
            err.reason,
        ) from err
