"""The ``oomload`` command line: a thin layer that parses flags and maps errors to exit codes.

Each sub-command lives in its own module (``trace``, ``sim``, ``plan``, ``replay``, ``report``,
``compare``, ``sample``, ``worker``, ``tune``) exposing ``register(subparsers)``; the handler it sets
as ``func`` takes the parsed ``argparse.Namespace`` and returns an exit code. ``flags`` holds the checks the
sub-commands' flags share. Heavy imports (Locust,
pandas, NVML) happen inside the handlers, so ``oomload --help`` is fast and importing the CLI patches nothing.

Errors: every ``OomloadError`` becomes one line on stderr (``oomload: error: …``) and its exit code
(``oomload.errors.ExitCode``); Ctrl-C becomes exit 130 with no traceback. An ``OSError`` that names a
file (a path under a regular file, a full disk, no permission) is a problem with an input or output
path: one sentence, exit 2; so is one that names none but is a disk refusing a write (full, read-only,
a file size limit, gone: ``oomload.outfile.is_disk_error``) — every write path names its file itself
(``OutputWriteError``), this is the backstop. Standard output is guarded while a command runs
(``GuardedStdout``): redirected to a full disk (or ``/dev/full``) it is one sentence and exit 2 too.
A reader that went away (``| head``, a closed pipe) is no failure: what is printed from then on is
discarded and the command goes on as if nobody read it — a replay to its end, its run directory
complete and its exit code its verdict's; a report command to exit 0 — except a command whose lines
to standard output are its product (``sample``: ``stop_when_reader_goes``), which ends there, exit 0,
as ``| head`` expects. Anything else is a bug: one line, the traceback
saved to a file (``oomload.cli.crash``), exit 70 — never 0, 1 or 4, the codes of a verdict or gate
result. Every message has the API key (the variable ``--api-key-env`` names) replaced by ``***``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from oomload import __version__
from oomload.cli import compare, plan, replay, report, sample, sim, trace, tune, worker
from oomload.cli.crash import save_internal_error
from oomload.credentials import scrub
from oomload.errors import ExitCode, OomloadError, OutputWriteError
from oomload.outfile import is_disk_error, reason

SUBCOMMANDS = (trace, replay, report, compare, plan, sim, sample, worker, tune)


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
    stdout = sys.stdout
    sys.stdout = GuardedStdout(stdout, stop_when_reader_goes=getattr(args, "stop_when_reader_goes", False))
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # output still buffered fails here, not in Python's own flush at exit
        return code
    except OomloadError as err:
        print(f"oomload: error: {scrub(str(err), secrets)}", file=sys.stderr)
        return int(err.exit_code)
    except KeyboardInterrupt:
        print("oomload: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:  # a pipe that broke outside GuardedStdout (a stream's own buffer): no failure
        return int(ExitCode.OK)
    except OSError as err:
        if err.filename is None:
            if is_disk_error(err):  # a write path that did not name its file: still the disk, not a bug
                print(f"oomload: error: cannot write an output ({reason(err)})", file=sys.stderr)
                return int(ExitCode.USAGE)
            return _internal(err, secrets)
        name = err.filename if err.filename2 is None else f"{err.filename} -> {err.filename2}"
        why = err.strerror or type(err).__name__
        print(f"oomload: error: cannot use {scrub(str(name), secrets)}: {why}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except Exception as err:
        return _internal(err, secrets)
    finally:
        sys.stdout = stdout


def _internal(err: Exception, secrets: tuple[str | None, ...]) -> int:
    internal = save_internal_error(err, None, secrets)
    print(f"oomload: error: {internal}", file=sys.stderr)
    return int(internal.exit_code)


class GuardedStdout:
    """``sys.stdout`` while a command runs. A write or flush the disk refuses (standard output
    redirected to a full disk, ``/dev/full``) raises ``OutputWriteError`` — one sentence, exit 2. A
    broken pipe (the reader went away: ``| head``) raises nothing: the command goes on with its
    output discarded. Either way the descriptor is pointed at ``/dev/null``, so that Python's own
    flush at exit does not fail on what is still buffered; everything else is the stream's own.
    ``stop_when_reader_goes``: a broken pipe is raised (``BrokenPipeError``, exit 0) once the
    descriptor points at ``/dev/null`` — for a command whose output is only for that reader.

    rich's ``Console`` writes through ``sys.stdout`` when it is made without a file, so a broken pipe
    never reaches its ``on_broken_pipe`` (which would end the process with exit 1)."""

    def __init__(self, inner: TextIO, *, stop_when_reader_goes: bool = False) -> None:
        self._inner = inner
        self._stop = stop_when_reader_goes
        self._reader_gone = False

    def write(self, text: str) -> int:
        if self._reader_gone:
            return len(text)
        try:
            return self._inner.write(text)
        except BrokenPipeError:
            self._discard()
            if self._stop:
                raise
            return len(text)
        except OSError as err:
            raise self._failed(err) from err

    def flush(self) -> None:
        if self._reader_gone:
            return
        try:
            self._inner.flush()
        except BrokenPipeError:
            self._discard()
            if self._stop:
                raise
        except OSError as err:
            raise self._failed(err) from err

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _discard(self) -> None:
        """The reader went away: from now on nothing is written (the module docstring)."""
        self._reader_gone = True
        self._to_devnull()

    def _to_devnull(self) -> None:
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._inner.fileno())
            finally:
                os.close(devnull)

    def _failed(self, err: OSError) -> OutputWriteError:
        self._to_devnull()
        why = reason(err)
        return OutputWriteError(f"cannot write to standard output ({why})", "<stdout>", why)
