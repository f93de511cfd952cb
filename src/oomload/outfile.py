"""Output files written whole: a scratch file beside the target, renamed onto it once complete.

Every file oomload writes in one piece — a run's reports (``summary.json``, ``report.md``,
``report.html``, ``junit.xml``), its trace copy and ``repro/`` traces, ``tune.json``, ``tune.md``,
``tune.html``, a scrubbed server log, the crash file — goes through ``write_text`` / ``write_bytes`` /
``output_file``. The content goes to a hidden scratch file in the target's own directory
(``.NAME.<random>.tmp``), is flushed and closed, and only then renamed onto the target (``os.replace``,
atomic within one file system). So the target is always the old file, the new one, or absent — never
a truncated one that a later ``oomload report`` would trip on.

When the disk says no — full (``ENOSPC``), over a quota or a file size limit (``EDQUOT``, ``EFBIG``),
read-only (``EROFS``), gone (``ENOENT``, ``EIO``, ``ENOTDIR``) — the scratch file is removed, the old
target is left as it was, and ``OutputWriteError`` names the target and the OS's reason: one sentence,
exit 2 (``oomload.errors``). Callers that know more (the run directory, what was kept) catch it and
say so, and ``remedy`` is the advice they give: it follows the errno (free the space, a file size
limit, a read-only file system, no permission, no such directory, a path under a regular file, too
many open files). ``write_failure`` is that sentence for an ``OSError`` met elsewhere; ``is_disk_error`` tells
the CLI which ``OSError`` without a file name is a disk saying no rather than a bug. A process out of
file descriptors (``EMFILE``, ``ENFILE``) is not a disk: ``reason`` says ``too many open files (raise
ulimit -n)`` for it, and ``is_open_files_error`` tells it apart.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from oomload.errors import UNKNOWN_REMEDY, OutputWriteError

# the OS's ways of saying a write cannot happen on this disk (not a bug in oomload)
DISK_ERRNOS = frozenset(
    code
    for code in (
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EFBIG,
        errno.EROFS,
        errno.EIO,
        getattr(errno, "ESTALE", None),
        getattr(errno, "ENODEV", None),
    )
    if code is not None
)
# the process (or the host) has no file descriptor left: a limit to raise, not a disk to free
OPEN_FILE_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE))
TOO_MANY_OPEN_FILES = "too many open files (raise ulimit -n)"


def reason(err: OSError) -> str:
    """The OS's words for ``err`` (``No space left on device``), never a traceback; out of file
    descriptors, ``TOO_MANY_OPEN_FILES`` (what to do about it)."""
    if is_open_files_error(err):
        return TOO_MANY_OPEN_FILES
    return err.strerror or str(err) or type(err).__name__


def is_open_files_error(err: BaseException) -> bool:
    """Whether ``err`` is the process or the host out of file descriptors (``EMFILE``, ``ENFILE``)."""
    return isinstance(err, OSError) and err.errno in OPEN_FILE_ERRNOS


def is_disk_error(err: BaseException) -> bool:
    """Whether ``err`` is a disk refusing a write (full, read-only, a size limit, gone)."""
    return isinstance(err, OSError) and not isinstance(err, BrokenPipeError) and err.errno in DISK_ERRNOS


REMEDIES = {
    errno.ENOSPC: "free the space",
    errno.EDQUOT: "free the space (or raise the quota)",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
    errno.EROFS: "write to a writable file system (this one is read-only)",
    errno.EACCES: "write where you have permission (or fix the permissions)",
    errno.EPERM: "write where you have permission (or fix the permissions)",
    errno.ENOENT: "name a directory that exists or can be created",
    errno.ENOTDIR: "name a directory (a part of that path is a file)",
    errno.EEXIST: "name a directory (that path is a file)",
    errno.EISDIR: "move away the directory in the file's place",
    errno.EMFILE: "raise the limit",
    errno.ENFILE: "raise the limit",
    errno.EIO: "check the disk (it failed or went away)",
}


def remedy(err: OSError) -> str:
    """What to do about ``err`` before trying again, as a verb phrase (``"free the space"``): it
    follows the errno; one this module does not know is ``UNKNOWN_REMEDY`` (``"fix that"``)."""
    return REMEDIES.get(err.errno or 0, UNKNOWN_REMEDY)


def write_failure(path: str | Path, err: OSError) -> OutputWriteError:
    """One sentence for ``path`` that could not be written: ``cannot write PATH (REASON)``; its
    ``remedy`` follows the errno."""
    why = reason(err)
    return OutputWriteError(f"cannot write {path} ({why})", path, why, remedy(err))


def write_text(path: str | Path, text: str, *, mode: int = 0o666) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole, or raise ``OutputWriteError`` leaving ``path`` as it was."""
    write_bytes(path, text.encode("utf-8"), mode=mode)


def write_bytes(path: str | Path, data: bytes, *, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` whole, or raise ``OutputWriteError`` leaving ``path`` as it was."""
    with output_file(path, binary=True, mode=mode) as fh:
        fh.write(data)


@contextlib.contextmanager
def output_file(path: str | Path, *, binary: bool = False, mode: int = 0o666) -> Iterator[IO[Any]]:
    """A file to write ``path``'s new content into; renamed onto ``path`` when the block ends without
    an error. Any ``OSError`` (opening, writing, closing, renaming) becomes ``OutputWriteError``; any
    error at all removes the scratch file and leaves ``path`` as it was. ``mode`` is the new file's
    permission bits before the umask (``0o600``: the owner's only)."""
    target = Path(path)
    scratch = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
    fh: IO[Any] | None = None
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        fh = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")
        yield fh
        fh.close()  # a full disk may first say so here (delayed allocation, NFS)
        os.replace(scratch, target)
    except OSError as err:
        _discard(fh, scratch)
        raise write_failure(target, err) from err
    except BaseException:
        _discard(fh, scratch)
        raise


def _discard(fh: IO[Any] | None, scratch: Path) -> None:
    if fh is not None:
        with contextlib.suppress(OSError):
            fh.close()  # its buffer cannot be flushed either: closed all the same
    with contextlib.suppress(OSError):
        scratch.unlink(missing_ok=True)
