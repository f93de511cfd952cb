"""A stand-in for ``vllm serve`` that tests start through ``--serve`` as a user would: an executable
named ``vllm`` (``install_fake_vllm``) that runs this file.

It says its arguments the way vLLM does at start-up (``non-default args: {…}``), its ``--api-key``
among them. Then, with ``--fake-fail`` in its line, it waits ``FAIL_AFTER_S``, names the key once
more in an error line and exits 1 (a start that fails); otherwise it serves the simulated vLLM on the
host and port it was given (its child, whose lines it passes on; ``--fake-sim-flags 'FLAGS'`` adds
to the simulator's flags, a host-memory limit to die of, say) and names the key again every
``REPEAT_S`` — split between two writes, so a copy of the log sees it arrive in two reads, with none
of the child's lines between them — until it is stopped (SIGTERM to its process group, as oomload
stops a server).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

FAIL_AFTER_S = 2.0  # long enough for a test polling the run directory to see the log before the exit
REPEAT_S = 0.4
SIM = ("--model", "llama-3.1-8b", "--gpu", "l4", "--max-model-len", "4096", "--time-scale", "0.02")


def install_fake_vllm(directory: Path) -> Path:
    """``directory/vllm``: a path ``--serve`` recognises as vLLM, which runs this file; each start
    appends its process id to ``directory/pids`` (``kill_fake_vllms``)."""
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "vllm"
    pids = shlex.quote(str(directory / "pids"))
    exe.write_text(
        f'#!/bin/sh\necho $$ >> {pids}\nexec {shlex.quote(sys.executable)} {shlex.quote(__file__)} "$@"\n'
    )
    exe.chmod(0o755)
    return exe


def kill_fake_vllms(directory: Path) -> None:
    """SIGKILL the process group of every fake started from ``directory`` (oomload starts a server as a
    group of its own, led by it): none outlives a test, even one whose oomload was killed first."""
    path = directory / "pids"
    for pid in path.read_text().split() if path.is_file() else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), signal.SIGKILL)


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


SAYING = threading.Lock()  # one writer at a time: a line of the child's never splits the key


def say(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def pass_on(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        with SAYING:
            say(line)


def main(args: list[str]) -> int:
    key = _value(args, "--api-key")
    say("INFO 12-06 01:00:00 [api_server.py:1] vLLM API server version 0.0.0+fake\n")
    args_said = f"{{'model': {args[1]!r}, 'api_key': [{key!r}]}}"
    say(f"INFO 12-06 01:00:00 [utils.py:1] non-default args: {args_said}\n")
    if "--fake-fail" in args:
        time.sleep(FAIL_AFTER_S)
        say(f"ERROR 12-06 01:00:02 [core.py:1] ValueError: the key {key} was refused\n")
        return 1
    host, port = _value(args, "--host"), _value(args, "--port")
    extra = shlex.split(_value(args, "--fake-sim-flags")) if "--fake-sim-flags" in args else []
    sim = [sys.executable, "-m", "oomload", "sim", "serve", *SIM, *extra, "--host", host, "--port", port]
    child = subprocess.Popen(sim, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threading.Thread(target=pass_on, args=(child,), daemon=True).start()
    half = len(key) // 2
    while child.poll() is None:
        with SAYING:
            say(f"INFO 12-06 01:00:03 [loggers.py:1] still serving with {key[:half]}")
            time.sleep(REPEAT_S / 2)
            say(f"{key[half:]} as its key\n")
        time.sleep(REPEAT_S / 2)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
