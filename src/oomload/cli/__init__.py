"""The ``oomload`` command line: a thin layer that parses flags and maps errors to exit codes.

Each sub-command lives in its own module (``oomload.cli.trace``, ``…sim``, ``…plan``, ``…replay``,
``…report``, ``…sample``) exposing ``register(subparsers)``; the handler it sets as ``func`` takes the
parsed ``argparse.Namespace`` and returns an exit code. Heavy imports (Locust, pandas, NVML) happen
inside the handlers, so ``oomload --help`` is fast and importing the CLI patches nothing.

Errors: every ``OomloadError`` becomes one line on stderr (``oomload: error: …``) and its exit code
(``oomload.errors.ExitCode``); Ctrl-C becomes exit 130 with no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from oomload import __version__
from oomload.cli import plan, replay, report, sample, sim, trace
from oomload.errors import ExitCode, OomloadError

SUBCOMMANDS = (trace, replay, report, plan, sim, sample)


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
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return int(ExitCode.USAGE)
    try:
        return int(func(args))
    except OomloadError as err:
        print(f"oomload: error: {err}", file=sys.stderr)
        return int(err.exit_code)
    except KeyboardInterrupt:
        print("oomload: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        return int(ExitCode.OK)
