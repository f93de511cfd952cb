"""The ``oomload`` command line: a thin layer that parses flags and maps errors to exit codes.

Each sub-command lives in its own module (``oomload.cli.trace``, ``…sim``, ``…plan``, ``…replay``,
``…report``, ``…sample``, ``…worker``, ``…tune``) exposing ``register(subparsers)``; the handler it sets as
``func`` takes the parsed ``argparse.Namespace`` and returns an exit code. Heavy imports (Locust,
pandas, NVML) happen inside the handlers, so ``oomload --help`` is fast and importing the CLI patches nothing.

Errors: every ``OomloadError`` becomes one line on stderr (``oomload: error: …``) and its exit code
(``oomload.errors.ExitCode``); Ctrl-C becomes exit 130 with no traceback. An ``OSError`` that names a
file (a path under a regular file, a full disk, no permission) is a problem with an input or output
path: one sentence, exit 2. Anything else is a bug: one line, the traceback saved to a file
(``oomload.cli.crash``), exit 70 — never 0, 1 or 4, the codes of a verdict or gate result. Every
message has the API key (the variable ``--api-key-env`` names) replaced by ``***``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from oomload import __version__
from oomload.cli import plan, replay, report, sample, sim, trace, tune, worker
from oomload.cli.crash import save_internal_error
from oomload.credentials import scrub
from oomload.errors import ExitCode, OomloadError

SUBCOMMANDS = (trace, replay, report, plan, sim, sample, worker, tune)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oomload",
        description="Reproduce vLLM KV-cache preemption and GPU OOM from production request lengths.",
    )
    parser.add_argument("--version", action="version", version=f"oomload {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return int(ExitCode.USAGE)
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command (``args.func``), its errors turned into messages and exit codes (above)."""
    secrets = (replay.api_key_value(args),)
    try:
        return int(args.func(args))
    except OomloadError as err:
        print(f"oomload: error: {scrub(str(err), secrets)}", file=sys.stderr)
        return int(err.exit_code)
    except KeyboardInterrupt:
        print("oomload: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        return int(ExitCode.OK)
    except OSError as err:
        if err.filename is None:
            return _internal(err, secrets)
        name = err.filename if err.filename2 is None else f"{err.filename} -> {err.filename2}"
        reason = err.strerror or type(err).__name__
        print(f"oomload: error: cannot use {scrub(str(name), secrets)}: {reason}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except Exception as err:
        return _internal(err, secrets)


def _internal(err: Exception, secrets: tuple[str | None, ...]) -> int:
    internal = save_internal_error(err, None, secrets)
    print(f"oomload: error: {internal}", file=sys.stderr)
    return int(internal.exit_code)
