"""A run directory that fills up mid-run, for real: `oomload replay` in a child process whose files may
not grow past a limit (``RLIMIT_FSIZE``: writes beyond it fail with ``EFBIG`` as a full disk fails
with ``ENOSPC``; no root, no mount), and in a tmpfs that is really full (``ENOSPC``; skipped where
``mount`` is not allowed). Issue 24, finding 5: the run printed tens of thousands of
tracebacks until stopped and exited 70. Now it stops at once, keeps what it wrote, says so in one
sentence and exits 2.
"""

from __future__ import annotations

import contextlib
import json
import re
import resource
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomload.errors import ExitCode
from oomload.rundir import RunReader
from oomload.sim.process import SimServer
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

LIMIT_BYTES = 30_000  # requests.jsonl reaches it after ~100 requests; config and trace stay below
PROMPT_TOKENS = 32
HANG_S = 120.0  # a hang detector: the schedule below would run 2 × 60 s if the run did not stop
SIM_ARGS = ("--model", "tiny", "--num-gpu-blocks", "128", "--block-size", "32", "--max-model-len", "2048")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(SIM_ARGS) as server:
        yield server


def _requests_served(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    tokens = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prompt_tokens_total")
    )
    return round(tokens / PROMPT_TOKENS)


def _limit_file_size() -> None:
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # Python ignores it too: EFBIG, not a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


@contextlib.contextmanager
def small_tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A real disk that fills up: a tmpfs of ``size_bytes`` (root and CAP_SYS_ADMIN, as in CI)."""
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)]
    try:
        done = subprocess.run(mount, capture_output=True, text=True, timeout=30, check=False)
    except OSError as err:
        pytest.skip(f"cannot mount a tmpfs here ({err})")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


@pytest.mark.parametrize("mechanism", ["rlimit-fsize", "tmpfs"])
def test_a_run_directory_that_fills_up_stops_the_run_keeps_its_lines_and_exits_2(
    sim: SimServer, tmp_path: Path, mechanism: str
) -> None:
    trace = tmp_path / "t.jsonl"
    records = [TraceRecord(f"r{i}", 0.0, PROMPT_TOKENS, 8) for i in range(200)]
    write_trace(trace, records, TraceHeader(source=("disk-full",), format="synthetic"))
    with contextlib.ExitStack() as stack:
        if mechanism == "tmpfs":
            run_dir = stack.enter_context(small_tmpfs(tmp_path / "disk", 2 * LIMIT_BYTES)) / "run"
            limit, why, advice = None, "No space left on device", "free the space"
        else:
            if not hasattr(resource, "RLIMIT_FSIZE"):
                pytest.skip("no RLIMIT_FSIZE on this platform")
            run_dir, limit, why = tmp_path / "run", _limit_file_size, "File too large"
            advice = r"raise the file size limit \(ulimit -f\)"  # the advice follows the errno
        before = _requests_served(sim.url)
        argv = [
            *(
                sys.executable,
                "-m",
                "oomload",
                "replay",
                str(trace),
                "--url",
                sim.url,
                "--run-dir",
                str(run_dir),
            ),
            *("--gpu", "none", "--concurrency", "2,4", "--hold-s", "60", "--warmup-s", "0", "--no-refine"),
            *("--no-evidence", "--stop-on", "never"),
        ]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=HANG_S, preexec_fn=limit, check=False
        )
        sent = _requests_served(sim.url) - before
        assert proc.returncode == ExitCode.USAGE, proc.stderr[-2000:]
        # one sentence, no traceback
        assert "Traceback" not in proc.stderr + proc.stdout
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        sentence = re.fullmatch(
            rf"oomload: error: cannot write to the run directory {re.escape(str(run_dir))} "
            rf"\((?P<file>[a-z_.]+): {why}\); the run stopped and kept what it wrote before that — "
            rf"{advice}, then `oomload report {re.escape(str(run_dir))}` judges it",
            lines[0],
        )
        assert sentence is not None, lines[0]
        # what was written is kept and readable
        kept = RunReader(run_dir).requests()
        assert len(kept) >= 50
        assert json.loads((run_dir / "config.json").read_text())["url"] == sim.url
        # the load stopped with the writes: only the requests in flight then (≤ the level, 2 or 4) and
        # the one whose line did not fit were sent and not kept
        assert 0 <= sent - len(kept) <= 10, (sent, len(kept))
