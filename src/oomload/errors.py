"""One error hierarchy for oomload, and the exit codes the CLI maps it to.

::

    OomloadError                     any failure oomload reports as a sentence, never a traceback
    ├── ConfigError                  bad flags, bad scenario file, bad gate expression     (exit 2)
    │   └── LinkRefusedError         a worker refuses its master (token, untrusted URL)     (exit 2)
    ├── TraceFormatError             unreadable / malformed trace or log, with path and line (exit 2)
    ├── SamplerUnavailableError      NVML / DCGM / remote sampler cannot be used            (exit 2)
    ├── OutputWriteError             a file or stdout cannot be written: disk full or gone  (exit 2)
    │   └── RunDirWriteError         the run directory stops taking writes mid-run          (exit 2)
    ├── EndpointError                the target endpoint is unreachable or not vLLM-shaped   (exit 3)
    │   └── ServeStartError          ``oomload tune``: the --serve line did not start, not for memory (exit 3)
    ├── RunAbortedError              a run stopped before it could produce a verdict         (exit 3)
    └── InternalError                a bug in oomload: one line, the traceback in a file     (exit 70)

Only the CLI turns these into messages and exit codes (``oomload.cli.main``); library code raises
them with ``raise … from err`` and a message that names the bad value and what is allowed. Any other
exception is a bug: the CLI saves its traceback (in the run directory when there is one) and exits 70,
a code no verdict or gate result uses, so a crash never reads as a pass, a failed gate or bad input.

A message about a log never quotes what its lines hold (user text would reach stderr and CI logs):
it says what was seen in shape only — a count, a type — and shows a header's column names or an
object's keys only through ``names_shown``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path

_PLAIN_NAME = re.compile(r"[A-Za-z_@$][A-Za-z0-9_.@$-]{0,31}")
SHOWN_NAMES_CHARS = 40  # at most this many characters of names in a message


def names_shown(names: Sequence[str], what: str) -> str:
    """``"columns a, b, c"`` — a header's names (or an object's keys, ``what`` says which) as a message
    may show them: only when every one is a plain name (a letter, ``_``, ``@`` or ``$``, then letters,
    digits and ``_.@$-``: no spaces, so no sentence of a user's), the first that fit in
    ``SHOWN_NAMES_CHARS``; else only how many (``"7 columns"``): a data row is not a header."""
    if not names or not all(_PLAIN_NAME.fullmatch(name) for name in names):
        return f"{len(names)} {what}"
    shown: list[str] = []
    for name in names:
        if len(", ".join([*shown, name])) > SHOWN_NAMES_CHARS:
            return f"{len(names)} {what}: {', '.join(shown)}, …"
        shown.append(name)
    return f"{what} {', '.join(shown)}"


class ExitCode(IntEnum):
    """Documented process exit codes (README, "Exit codes")."""

    OK = 0  # the command did its job; a gate, if any, passed
    GATE_FAILED = 1  # a gate threshold was violated
    USAGE = 2  # bad flags, config, trace or input file
    UNREACHABLE = 3  # the target could not be reached, or the run aborted before a verdict
    GATE_NOT_EVALUATED = 4  # a gate could not be evaluated: missing evidence never passes
    INTERNAL = 70  # a bug in oomload (sysexits' EX_SOFTWARE); the traceback is saved to a file
    INTERRUPTED = 130  # Ctrl-C / SIGTERM; the run directory holds everything up to that moment


class OomloadError(Exception):
    """Root of every error oomload reports to a user as one clear sentence."""

    exit_code: ExitCode = ExitCode.USAGE


class ConfigError(OomloadError):
    """A flag, scenario file, mapping or gate expression is invalid."""

    exit_code = ExitCode.USAGE


class LinkRefusedError(ConfigError):
    """A Locust worker refuses its master: it did not prove the worker token, or it names a target
    URL the worker was not told to trust."""


class TraceFormatError(OomloadError):
    """A trace or log file cannot be read, or a line in it is malformed."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(f"{where}{message}")


class SamplerUnavailableError(OomloadError):
    """GPU telemetry (NVML, DCGM, a remote sampler) cannot be used on this machine."""

    exit_code = ExitCode.USAGE


UNKNOWN_REMEDY = "fix that"  # ``OutputWriteError.remedy`` for a failure whose errno says nothing more


class OutputWriteError(OomloadError):
    """A file oomload writes (a report, ``tune.json``, a worker's ``--results``, standard output) cannot
    be written: a full, read-only or vanished disk, a file size limit. ``path`` names it, ``reason``
    is the OS's word for it and ``remedy`` what to do about it (``oomload.outfile.remedy``: it follows
    the errno); what was written before stays as it was (``oomload.outfile``)."""

    exit_code = ExitCode.USAGE

    def __init__(
        self,
        message: str,
        path: str | Path | None = None,
        reason: str | None = None,
        remedy: str = UNKNOWN_REMEDY,
    ) -> None:
        self.path = None if path is None else str(path)
        self.reason = reason
        self.remedy = remedy
        super().__init__(message)


class RunDirWriteError(OutputWriteError):
    """The run directory stopped taking writes mid-run (disk full, read-only, a file size limit): the
    run stops and keeps what it wrote before (``oomload.rundir.RunWriter``)."""


class EndpointError(OomloadError):
    """The target endpoint is unreachable, or it does not answer like an OpenAI-compatible server."""

    exit_code = ExitCode.UNREACHABLE


class ServeStartError(EndpointError):
    """``oomload tune``: the ``--serve`` command's first start failed for a reason no memory setting can
    change (not a vLLM server, exits at once, never answers ``/health``); the server is stopped."""

    exit_code = ExitCode.UNREACHABLE


class RunAbortedError(OomloadError):
    """A run stopped before it could produce a verdict (the run directory keeps what was measured)."""

    exit_code = ExitCode.UNREACHABLE


class InternalError(OomloadError):
    """An unexpected exception inside oomload; ``report_path`` holds its traceback, or ``unsaved`` says
    why no file could (a full disk)."""

    exit_code = ExitCode.INTERNAL

    def __init__(self, kind: str, report_path: Path | None, unsaved: str | None = None) -> None:
        self.report_path = report_path
        if report_path is not None:
            where = f"traceback saved in {report_path}"
        else:
            where = "no traceback saved" + ("" if unsaved is None else f": {unsaved}")
        super().__init__(f"internal error ({kind}), a bug in oomload; {where}")
