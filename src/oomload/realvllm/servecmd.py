"""The user's ``--serve`` command line, and the same line with a candidate's flags (pure).

``oomload tune --serve 'vllm serve MODEL …'`` takes the command a user already runs (split with
``shlex``, as a POSIX shell would) and changes only what it tunes: every flag a candidate sets
(``search.Settings.flags``) is removed from the line in both spellings (``--flag value`` and
``--flag=value``, and the simulator's and vLLM's aliases) and appended with the candidate's value;
``--host`` and ``--port`` are replaced by the tuner's (loopback and a free port unless the user gave
them). Nothing else in the line moves, so the winning line is the user's line plus the winner's flags.
Secrets in the line are shown and stored as ``***`` (``ServeCommand.secrets``): the value of a flag
in ``SECRET_FLAGS`` (``--api-key``, ``--hf-token``) and of an environment assignment whose name says it
holds one (``SECRET_NAME``: ``env VLLM_API_KEY=… HF_TOKEN=… vllm serve …``).
A verdict's recommendation is built the same way (``recommended_line``): the line the server was
started with, with the recommended flags, or ``vllm serve`` with what the server was given for the model.

Recognised servers (anything else is refused, before anything starts):

* ``vllm serve MODEL …`` (any path ending in ``vllm``);
* ``python -m vllm.entrypoints.openai.api_server --model MODEL …``;
* ``python …/launcher.py serve MODEL …`` (oomload's launcher for vLLM's CPU build, ``oomload.realvllm``);
* ``oomload sim serve …`` (the simulator; ``oomload`` is run as ``python -m oomload`` of this install).

Any of them may follow a wrapper that runs it under a limit or in an environment (``WRAPPERS``:
``prlimit --data=2G -- vllm serve …``, ``env VAR=1 vllm serve …``, ``taskset -c 0 …``): the wrapper and
its arguments stay in front, unchanged; flags are changed in the server's part only.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Protocol

from oomload.credentials import scrub
from oomload.errors import ConfigError


class FlagSource(Protocol):
    """What a serve line takes its tuned flags from (``search.Settings``; search imports this module)."""

    def flags(self) -> tuple[tuple[str, str | None], ...]: ...


# flag → its aliases (all removed when the candidate sets the flag)
ALIASES: dict[str, tuple[str, ...]] = {
    "--num-gpu-blocks-override": ("--num-gpu-blocks-override", "--num-gpu-blocks"),
    "--enable-prefix-caching": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
    "--no-enable-prefix-caching": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
    "--tensor-parallel-size": ("--tensor-parallel-size", "-tp", "--tp"),
}
SWITCHES = frozenset({"--enforce-eager", "--enable-prefix-caching", "--no-enable-prefix-caching"})
NETWORK_FLAGS = ("--host", "--port")
# commands that run the server under a limit or in an environment: kept in front of it, never changed
WRAPPERS = frozenset({"prlimit", "env", "nice", "taskset", "numactl", "ionice", "chrt"})
SECRET_FLAGS = frozenset({"--api-key", "--hf-token"})  # vLLM's flags whose value is a secret
# An environment variable whose name says it holds a secret: VLLM_API_KEY (vLLM's key), HF_TOKEN, …
SECRET_NAME = re.compile(r"[A-Z0-9_]*(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)[A-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class ServeCommand:
    """A recognised server command (module docstring)."""

    argv: tuple[str, ...]
    kind: str  # "vllm" | "sim"
    model: str | None
    start: int = 0  # where the server's own command begins (after a wrapper such as prlimit or env)

    @property
    def server_argv(self) -> tuple[str, ...]:
        """The server's own command, without the wrapper in front of it."""
        return self.argv[self.start :]

    def secrets(self) -> tuple[str, ...]:
        """The line's secrets (module docstring): never written to a report, log or run dir."""
        values = []
        for i, arg in enumerate(self.argv):
            head, eq, tail = arg.partition("=")
            if head in SECRET_FLAGS:
                value = tail if eq else (self.argv[i + 1] if i + 1 < len(self.argv) else "")
            elif eq and SECRET_NAME.fullmatch(head):  # env VLLM_API_KEY=… (before the server's command)
                value = tail
            else:
                continue
            if value:
                values.append(value)
        return tuple(values)

    def value(self, flag: str) -> str | None:
        """The value the user's line gives ``flag`` (the last one wins, as argparse does)."""
        return flag_value(self.argv, flag)

    def with_settings(self, settings: FlagSource, host: str, port: int) -> tuple[str, ...]:
        """The line with the candidate's flags and the tuner's host and port (module docstring)."""
        argv = list(self.server_argv)
        flags = settings.flags()
        for flag, _ in flags:
            argv = remove_flag(argv, flag)
        for flag in NETWORK_FLAGS:
            argv = remove_flag(argv, flag)
        argv = [*self.argv[: self.start], *argv]
        if self.kind == "sim":
            flags = tuple(
                (f, v) for f, v in flags if f != "--no-enable-prefix-caching"
            )  # the simulator's caching is off unless asked
        for flag, value in flags:
            argv += [flag] if value is None else [flag, value]
        return (*argv, "--host", host, "--port", str(port))

    def shell_line(self, settings: FlagSource) -> str:
        """The user's line with the candidate's flags, shell-quoted (no host/port change), its secrets
        replaced by ``***``."""
        argv = list(self.server_argv)
        for flag, _ in settings.flags():
            argv = remove_flag(argv, flag)
        argv = [*self.argv[: self.start], *argv]
        return scrub(serve_line(argv, settings.flags()), self.secrets())


def serve_line(argv: Sequence[str], flags: Iterable[tuple[str, str | None]]) -> str:
    """``argv`` with ``flags`` appended (``(flag, None)``: a bare switch), shell-quoted: a model name with
    spaces, quotes or ``;`` stays one argument and runs nothing. The one place a pasteable ``vllm serve``
    line is built (the tuner's winner and the verdict's recommendation)."""
    parts = list(argv)
    for flag, value in flags:
        parts += [flag] if value is None else [flag, value]
    return shlex.join(parts)


def recommended_line(
    served_line: str | None, model_args: Sequence[str], flags: tuple[tuple[str, str | None], ...]
) -> str:
    """The line a verdict recommends: the line the server was started with (``served_line``: ``--serve``'s
    or ``--served-with``'s) with ``flags`` set, as ``oomload tune`` sets a winner's; without one, or
    one this module does not recognise, ``vllm serve`` with ``model_args`` (what the server was given
    for the model: its path or Hub id, and ``--served-model-name`` when that differs) and ``flags``."""
    if served_line is not None:
        try:
            return parse_serve_command(served_line).shell_line(_Flags(flags))
        except ConfigError:
            pass
    return serve_line(["vllm", "serve", *model_args], flags)


@dataclass(frozen=True, slots=True)
class _Flags:
    """Fixed flags as a ``FlagSource``."""

    pairs: tuple[tuple[str, str | None], ...]

    def flags(self) -> tuple[tuple[str, str | None], ...]:
        return self.pairs


def flag_text(value: int | float) -> str:
    """A flag's value as vLLM's parser takes it: ``0.9``, not ``0.9000000000000001``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_serve_command(text: str, *, flag: str = "--serve") -> ServeCommand:
    """Split and recognise a serve line (``ConfigError`` with one sentence, naming ``flag``, when it is
    not a vLLM server)."""
    try:
        argv = shlex.split(text)
    except ValueError as err:
        raise ConfigError(f"{flag} cannot be split like a shell line: {err}") from err
    if not argv:
        raise ConfigError(f"{flag} is empty: give the command that starts vLLM, e.g. 'vllm serve MODEL'")
    starts = [0]
    if PurePath(argv[0]).name in WRAPPERS:  # e.g. prlimit --data=2G -- vllm serve …: the limit stays
        starts = list(range(1, len(argv)))
    for start in starts:
        found = _recognise(argv[start:])
        if found is not None:
            kind, model = found
            return ServeCommand(tuple(argv), kind, model, start)
    name = PurePath(argv[0]).name
    raise ConfigError(
        f"{flag} {name!r} is not a vLLM server command: give 'vllm serve MODEL …', "
        "'python -m vllm.entrypoints.openai.api_server --model MODEL …' or 'oomload sim serve …'"
        + (f", after {name}'s own arguments" if name in WRAPPERS else "")
    )


def _recognise(argv: Sequence[str]) -> tuple[str, str | None] | None:
    """``(kind, model)`` when ``argv`` starts a server this module knows, else ``None``."""
    if not argv:
        return None
    names = [PurePath(a).name for a in argv]
    if names[0] == "vllm" and len(argv) > 1 and argv[1] == "serve":
        return "vllm", _positional_after(argv, 2) or flag_value(argv, "--model")
    if names[0] == "oomload" and list(argv[1:3]) == ["sim", "serve"]:
        return "sim", flag_value(argv, "--model") or "llama-3.1-8b"
    if names[0].startswith("python") and "-m" in argv and "vllm.entrypoints.openai.api_server" in argv:
        return "vllm", flag_value(argv, "--model")
    if len(argv) > 2 and names[0].startswith("python") and names[1] == "launcher.py" and argv[2] == "serve":
        return "vllm", _positional_after(argv, 3) or flag_value(argv, "--model")
    return None


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``); ``""`` for a bare switch."""
    found: str | None = None
    names = ALIASES.get(flag, (flag,))
    for i, arg in enumerate(argv):
        head, eq, tail = arg.partition("=")
        if head not in names:
            continue
        if eq:
            found = tail
        elif flag in SWITCHES:
            found = ""
        elif i + 1 < len(argv):
            found = argv[i + 1]
    return found


def remove_flag(argv: Sequence[str], flag: str) -> list[str]:
    """``argv`` without any occurrence of ``flag`` or its aliases (with their values)."""
    names = ALIASES.get(flag, (flag,))
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        head, eq, _ = arg.partition("=")
        if head in names:
            skip = not eq and head not in SWITCHES
            continue
        out.append(arg)
    return out


def _positional_after(argv: Sequence[str], start: int) -> str | None:
    if len(argv) > start and not argv[start].startswith("-"):
        return argv[start]
    return None
