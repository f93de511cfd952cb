"""An unexpected exception (a bug in oomload) as one line and a saved traceback, never a verdict's code.

``save_internal_error(err, directory, secrets)`` writes the traceback to ``directory/crash.txt`` (the
run directory when a run has one) or, without one or when it cannot be written there, to a fresh
``oomload-crash-*.txt`` in the system's temporary folder; every secret it is given (the API key) is
replaced by ``***`` first. It returns the ``InternalError`` the CLI prints (exit 70).
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Iterable
from pathlib import Path

from oomload.credentials import scrub
from oomload.errors import InternalError


def save_internal_error(
    err: BaseException, directory: Path | None = None, secrets: Iterable[str | None] = ()
) -> InternalError:
    """Save ``err``'s traceback (scrubbed) and return the ``InternalError`` that names the file."""
    text = scrub("".join(traceback.format_exception(err)), tuple(secrets))
    path: Path | None = None
    if directory is not None and directory.is_dir():
        try:
            path = directory / "crash.txt"
            path.write_text(text, encoding="utf-8")
        except OSError:
            path = None
    if path is None:
        try:
            with tempfile.NamedTemporaryFile(
                "w", prefix="oomload-crash-", suffix=".txt", delete=False, encoding="utf-8"
            ) as fh:
                fh.write(text)
                path = Path(fh.name)
        except OSError:
            path = None
    return InternalError(type(err).__name__, path)
