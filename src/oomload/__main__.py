"""The ``oomload`` command (``python -m oomload`` and the console script of ``pyproject.toml``).

This module imports nothing heavy itself. While it imports the CLI (Locust's gevent, rich, numpy: a
few hundred milliseconds) a Ctrl-C is only noted — raised inside those imports it may surface as
another error (numpy turns it into an ``ImportError``) — and acted on once they are done; after
that, until the command's own handling (``oomload.cli``) takes over, it is caught here. Either way it
ends as any Ctrl-C does: ``oomload: interrupted``, exit 130, no traceback.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

INTERRUPTED = 130  # oomload.errors.ExitCode.INTERRUPTED, without importing anything heavy first


def main() -> int:
    """Import and run the CLI; a Ctrl-C before the command's own handling is exit 130, quietly."""
    noted: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)

    held = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not when started ignoring it
    if held:
        signal.signal(signal.SIGINT, note)
    try:
        from oomload.cli import main as cli_main
    finally:
        if held:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if noted:
            raise KeyboardInterrupt
        return cli_main()
    except KeyboardInterrupt:
        print("oomload: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
