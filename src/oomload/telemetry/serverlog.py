"""``ServerLogFollower``: copy what a vLLM server appends to its log during a run into the run directory.

The cause of an engine death is only in the server's log (``oomload.verdict.deathcause``), so a run
keeps the part of that log written while it ran: ``server.log`` in the run directory, flushed as it
grows, so a run cut short still has it. The rules:

* **Only this run's text.** Copying starts at the end of the file as it is at ``start()``: what was
  written before (an earlier life of the server, an earlier death) is not this run's. A file that does
  not exist at ``start()`` (``kubectl logs -f … > FILE`` creates it late) is copied from its first byte
  when it appears, with one problem sentence while it is missing.
* **Bytes as written, less the secrets.** Chunks are copied as they arrive, a partial last line
  included (its rest follows on the next read), so ``server.log`` is byte for byte what the server
  appended — except that each of ``secrets`` (the API key, the served line's ``--api-key``: vLLM logs
  its non-default arguments at start-up) is written as ``***`` (``credentials.StreamScrubber``). The
  scrub happens before the bytes reach the disk, so a run killed mid-way leaves no secret behind; the
  end of a chunk that could begin a secret waits for the next chunk; at ``stop()`` it is written as
  ``***`` (the server may have been killed in the middle of the secret).
* **Truncation and rotation.** The file is followed by path. A new file at the path (another inode:
  rotation by rename, or delete and re-create) is read from its start once what the old one still held
  is drained; a file that shrank below what was read, or whose first bytes changed (truncated and
  written again between two polls), is read again from its start. Each is one problem sentence, and a
  newline is put between the old text and the new when the old ended mid-line. A truncation followed,
  within one poll, by a rewrite of the same first 64 bytes and more than was read goes unseen.
* **A size cap.** Past ``max_bytes`` copied, copying into ``server.log`` stops with one sentence; the
  follower keeps reading, and keeps the last ``tail_bytes`` in memory: ``text()`` ends with them and
  ``stop()`` appends them to ``server.log`` after a marker line, because a death is at the end.
* **Sentences name what the user knows.** The source is ``the server log PATH`` in them, or what the
  caller calls it (``shown``) when it reads the file through a path the user never gave.
* **Failures are sentences.** A ``dest`` that cannot be opened or written stops the copy to disk (one
  sentence); the text is still followed in memory for ``text()``. Nothing here raises into the caller's
  thread once constructed; ``problems`` (and ``on_problem``, called from the follower's thread) get each
  distinct sentence once.

``stalled_s()`` is how long the source has not grown (since ``start()`` when it never has): the runner
warns when a server under load stops logging. ``stop()`` joins the thread, then reads once more. The
follower is one ``threading.Thread`` polling every ``poll_s`` (a greenlet under Locust's gevent
patching, like ``MetricsPoller``; its reads are small). ``poll_once()`` is that poll, for tests.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from oomload.credentials import StreamScrubber
from oomload.errors import ConfigError

MIB = 1024**2
DEFAULT_MAX_BYTES = 64 * MIB
DEFAULT_TAIL_BYTES = 1 * MIB
HEAD_BYTES = 64  # the first bytes of the followed file, to see it rewritten in place
READ_CHUNK = 1 * MIB


class ServerLogFollower:
    """Copies what ``source`` gains after ``start()`` into ``dest`` (module docstring)."""

    def __init__(
        self,
        source: Path,
        dest: Path,
        *,
        poll_s: float = 0.5,
        max_bytes: int = DEFAULT_MAX_BYTES,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        clock: Callable[[], float] = time.time,
        on_problem: Callable[[str], None] | None = None,
        secrets: Iterable[str | None] = (),
        shown: str | None = None,
    ) -> None:
        """``shown``: how the problem sentences name the source — ``the server log SOURCE`` unless the
        caller reads it through a path the user never gave (``/proc/PID/fd/N``: ``RealVllmServer``)."""
        if poll_s <= 0 or max_bytes <= 0 or tail_bytes < 0:
            raise ConfigError(
                "server log follower: poll_s and max_bytes must be > 0 and tail_bytes ≥ 0, got "
                f"poll_s={poll_s}, max_bytes={max_bytes}, tail_bytes={tail_bytes}"
            )
        self.shown = shown or f"the server log {source}"
        if source.resolve() == dest.resolve():
            raise ConfigError(f"{self.shown} cannot be copied onto itself")
        self.source = source
        self.dest = dest
        self.poll_s = poll_s
        self.max_bytes = max_bytes
        self.tail_bytes = tail_bytes
        self._clock = clock
        self._on_problem = on_problem
        self._scrub = StreamScrubber.of(secrets)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._problems: list[str] = []
        self._fh: BinaryIO | None = None  # the followed file, open
        self._ident: tuple[int, int] | None = None  # its (device, inode)
        self._head = b""
        self._out: BinaryIO | None = None
        self._copied = bytearray()  # what went to dest (or would have): at most max_bytes
        self._tail = bytearray()  # past the cap: the last tail_bytes
        self._skipped = 0  # bytes past the cap
        self._last_grew: float | None = None
        self._stopped = False

    # --- the caller's side ----------------------------------------------------------------------------
    def start(self) -> None:
        """Note where the file ends now, open ``dest`` and start following."""
        with self._lock:
            if self._thread is not None:
                return
            self._last_grew = self._clock()
            try:
                self._out = self.dest.open("ab")
            except OSError as err:
                self._problem(f"cannot write {self.dest} ({_why(err)}): the server log is not copied there")
            try:
                self._open_source(at_end=True)
            except OSError as err:
                self._problem(f"cannot read {self.shown} ({_why(err)})")
            self._thread = threading.Thread(target=self._run, name="oomload-serverlog", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, read what is left, write the kept tail (past the cap) and close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            if self._stopped or self._last_grew is None:  # stopped already, or never started
                self._stopped = True
                return
            self.poll_once()
            self._stopped = True
            self._release()
            if self._skipped:
                self._write(self._marker() + bytes(self._tail))
            for handle in (self._fh, self._out):
                if handle is not None:
                    with contextlib.suppress(OSError):  # all was flushed; nothing to lose
                        handle.close()
            self._fh = self._out = None

    @property
    def problems(self) -> list[str]:
        """Each distinct problem sentence, once, in order."""
        with self._lock:
            return list(self._problems)

    @property
    def copied_bytes(self) -> int:
        """Bytes of the server log copied (at most ``max_bytes``; the kept tail not counted)."""
        with self._lock:
            return len(self._copied)

    def stalled_s(self) -> float:
        """Seconds since the source last grew (since ``start()`` if it has not; 0 before it)."""
        with self._lock:
            return 0.0 if self._last_grew is None else max(0.0, self._clock() - self._last_grew)

    def text(self) -> str:
        """What was copied, and past the cap a marker line and the kept tail (UTF-8, errors replaced)."""
        with self._lock:
            data = bytes(self._copied)
            if self._skipped:
                data += self._marker() + bytes(self._tail)
        return data.decode("utf-8", errors="replace")

    # --- the follower's side --------------------------------------------------------------------------
    def poll_once(self) -> None:
        """Read what the source gained since the last poll (module docstring for the rules)."""
        with self._lock:
            if self._stopped or self._last_grew is None:  # stopped, or not started
                return
            try:
                self._poll()
            except OSError as err:  # unreadable for now (permissions, I/O): try again at the next poll
                self._problem(f"cannot read {self.shown} ({_why(err)})")

    def _poll(self) -> None:
        try:
            stat = self.source.stat()
        except FileNotFoundError:
            if self._fh is not None:
                self._drain()  # what the file got before it was removed
                self._close_source()
                self._problem(f"{self.shown} disappeared; waiting for it to come back")
            return
        if self._fh is None:
            self._open_source(at_end=False)
        elif (stat.st_dev, stat.st_ino) != self._ident:
            self._drain()  # what the old file got before it was moved away
            self._close_source()
            self._problem(f"{self.shown} was replaced (rotated); reading the new file")
            self._open_source(at_end=False)
        elif stat.st_size < self._fh.tell() or not self._same_head():
            self._problem(f"{self.shown} was truncated; reading it again from its start")
            self._fh.seek(0)
            self._head = b""
            self._newline()
        if self._fh is not None:
            self._same_head()  # note the first bytes while the file is short
            self._drain()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as err:  # a bug must not pass silently, nor surface in another thread
                with self._lock:
                    self._problems.append(f"following the server log stopped: {type(err).__name__}: {err}")
                return
            self._stop.wait(self.poll_s)

    def _open_source(self, *, at_end: bool) -> None:
        """Open the source at its end (at ``start()``) or at its start (a file that appeared later)."""
        try:
            handle = self.source.open("rb")
        except FileNotFoundError:
            self._problem(f"{self.shown} does not exist yet; waiting for it to appear")
            return
        stat = os.fstat(handle.fileno())
        self._fh, self._ident, self._head = handle, (stat.st_dev, stat.st_ino), b""
        if at_end:
            handle.seek(0, os.SEEK_END)
        else:
            self._newline()
        self._same_head()

    def _close_source(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh, self._ident, self._head = None, None, b""

    def _same_head(self) -> bool:
        """Whether the file still starts with the bytes seen there before (and note more of them)."""
        if self._fh is None:
            return True
        head = os.pread(self._fh.fileno(), HEAD_BYTES, 0)
        same = head[: len(self._head)] == self._head
        if same:
            self._head = head
        return same

    def _drain(self) -> None:
        assert self._fh is not None
        while chunk := self._fh.read(READ_CHUNK):
            self._last_grew = self._clock()
            self._accept(self._scrub.feed(chunk))

    def _release(self) -> None:
        """Copy the end the scrubber held back, as ``***`` (the text it might have begun a secret with
        has ended)."""
        if held := self._scrub.flush():
            self._accept(held)

    def _accept(self, data: bytes) -> None:
        room = max(self.max_bytes - len(self._copied), 0)
        kept, rest = data[:room], data[room:]
        if kept:
            self._copied += kept
            self._write(kept)
        if rest:
            if not self._skipped:
                self._problem(
                    f"the server log passed {self.max_bytes} bytes in this run: {self.dest} stops there; "
                    f"its last {self.tail_bytes} bytes are kept and written when the run ends"
                )
            self._skipped += len(rest)
            self._tail += rest
            del self._tail[: max(len(self._tail) - self.tail_bytes, 0)]

    def _newline(self) -> None:
        """Before text from a new file: end the old text's partial last line."""
        self._release()
        last = self._tail[-1:] if self._skipped else self._copied[-1:]
        if last and last != b"\n":
            self._accept(b"\n")

    def _marker(self) -> bytes:
        left_out = self._skipped - len(self._tail)
        return f"\n[oomload: {left_out} bytes of the server log left out here]\n".encode()

    def _write(self, data: bytes) -> None:
        if self._out is None:
            return
        try:
            self._out.write(data)
            self._out.flush()
        except OSError as err:
            self._problem(
                f"writing {self.dest} failed ({_why(err)}): the server log is no longer copied there"
            )
            with contextlib.suppress(OSError):  # the write failed; closing can fail the same way
                self._out.close()
            self._out = None

    def _problem(self, sentence: str) -> None:
        if sentence in self._problems:
            return
        self._problems.append(sentence)
        if self._on_problem is not None:
            self._on_problem(sentence)


def _why(err: OSError) -> str:
    return err.strerror or type(err).__name__
