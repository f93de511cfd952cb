"""An unexpected exception (a bug in oomload) as one line and a saved traceback, never a verdict's code.

``save_internal_error(err, directory, secrets)`` writes the traceback to ``directory/crash.txt`` (the
run directory when a run has one) or, without one or when it cannot be written there, to a fresh
``oomload-crash-*.txt`` (mode 0600) in the system's temporary folder; every secret it is given (the API
key) is replaced by ``***`` first. It returns the ``InternalError`` the CLI prints (exit 70).

Saving the traceback never fails in turn: each file is written whole or not at all
(``oomload.outfile``: no truncated ``crash.txt`` is left on a full disk), and when neither place takes
it the line says so and why — ``no traceback saved: cannot write run/crash.txt (No space left on
device) nor /tmp/oomload-crash-….txt (No space left on device)`` — still one line, still exit 70.
"""

from __future__ import annotations

import secrets as tokens
import tempfile
import traceback
from collections.abc import Iterable
from pathlib import Path

from oomload.credentials import scrub
from oomload.errors import InternalError, OutputWriteError
from oomload.outfile import write_text


def save_internal_error(
    err: BaseException, directory: Path | None = None, secrets: Iterable[str | None] = ()
) -> InternalError:
    """Save ``err``'s traceback (scrubbed) and return the ``InternalError`` that names the file."""
    text = scrub("".join(traceback.format_exception(err)), tuple(secrets))
    places: list[tuple[Path, int]] = []
    if directory is not None and directory.is_dir():
        places.append((directory / "crash.txt", 0o666))
    try:
        temp = Path(tempfile.gettempdir())
    except OSError:  # no usable temporary folder at all (tempfile could create nothing in any)
        temp = None
    if temp is not None:
        places.append((temp / f"oomload-crash-{tokens.token_hex(4)}.txt", 0o600))
    refused: list[str] = []
    for path, mode in places:
        try:
            write_text(path, text, mode=mode)
        except OutputWriteError as failed:
            refused.append(f"{path} ({failed.reason})")
            continue
        return InternalError(type(err).__name__, path)
    unsaved = f"cannot write {' nor '.join(refused)}" if refused else "no temporary folder"
    return InternalError(type(err).__name__, None, unsaved)
