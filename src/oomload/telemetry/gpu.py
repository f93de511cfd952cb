"""``GpuSamplerProcess``: run ``oomload sample`` as a child process that streams ``gpu.jsonl`` (and
``ServerMemoryProcess``, the same for the server's host memory: ``server_memory.jsonl``).

NVML calls block, and Locust monkey-patches the load process with gevent, so GPU sampling runs in
its own process: ``sys.executable -m oomload sample --out PATH --interval-s S [--device N …]
[--dcgm-url URL] --parent-pid PID``. The child appends one flushed line per device per tick
(``oomload.telemetry.gpu_sample``); the parent only reads the file's tail (``latest()``).

``start()`` waits until the child has written its first sample, or has exited. A child that exits
first (no GPU, no driver, an index out of range, a DCGM URL that does not answer) left one sentence
on stderr: that becomes ``unavailable_reason`` (and a ``sampler_unavailable`` event when a
``RunWriter`` is given); ``start()`` then returns False, or raises ``SamplerUnavailableError`` when
the user required GPU samples. ``stop()`` sends SIGTERM (the child finishes its line and exits 0),
then SIGKILL after ``stop_timeout_s``. No orphans: the child watches ``--parent-pid`` and exits when
its parent is gone, and a finalizer stops it when the parent interpreter exits without ``stop()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from oomload.errors import ConfigError, SamplerUnavailableError
from oomload.rundir import RunWriter
from oomload.telemetry.gpu_sample import GPU_SOURCES

TAIL_BYTES = 64 * 1024
SAMPLE_PROGRAM = (sys.executable, "-m", "oomload", "sample")


class GpuSamplerProcess:
    """A child ``oomload sample`` process writing ``out_path`` (normally ``RUN_DIR/gpu.jsonl``)."""

    def __init__(
        self,
        out_path: Path,
        *,
        interval_s: float = 0.1,
        devices: Sequence[int] | None = None,
        source: str = "nvml",
        url: str | None = None,
        required: bool = False,
        writer: RunWriter | None = None,
        startup_timeout_s: float = 30.0,
        stop_timeout_s: float = 5.0,
        program: Sequence[str] | None = None,
    ) -> None:
        """``program``: the command that runs ``oomload sample`` and takes its flags (default
        ``SAMPLE_PROGRAM``; tests give one that samples a fake NVML)."""
        if source not in GPU_SOURCES:
            raise ConfigError(f"GPU source must be one of {', '.join(GPU_SOURCES)}, got {source!r}")
        if source != "nvml" and not url:
            raise ConfigError(f"GPU source {source!r} needs a URL (e.g. {source}:http://gpu-host:9400)")
        if not interval_s > 0:
            raise ConfigError(f"GPU sampling interval must be > 0 s, got {interval_s}")
        self.out_path = Path(out_path)
        self.interval_s = interval_s
        self.devices = None if devices is None else list(devices)
        self.source = source
        self.url = url
        self.required = required
        self._writer = writer
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.program = list(SAMPLE_PROGRAM if program is None else program)
        self.unavailable_reason: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def command(self) -> list[str]:
        """The child's command line."""
        cmd = [*self.program, "--out", str(self.out_path)]
        cmd += ["--interval-s", repr(self.interval_s), "--parent-pid", str(os.getpid())]
        if self.devices:
            cmd += ["--device", *(str(d) for d in self.devices)]
        if self.source != "nvml" and self.url:
            cmd += ["--dcgm-url", self.url]
        return cmd

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def start(self) -> bool:
        """Start the child and wait for its first sample; False (or raise, if required) when unavailable."""
        if self.running:
            return True
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        initial_size = self.out_path.stat().st_size if self.out_path.exists() else 0
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _cleanup()
        try:
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                # its own process group (Ctrl-C reaches the parent, which stops the child itself), in
                # oomload's session: a session is a CPU autogroup, and in one of its own beside a busy
                # server it woke seconds late (285 of ~1,200 samples over a 600 s soak, gaps to 18.8 s)
                process_group=0,
            )
        except OSError as err:
            return self._unavailable(f"cannot start the GPU sampler ({self.program[0]}): {err.strerror}")
        self._proc = proc
        self._finalizer = weakref.finalize(self, _terminate, proc, self.stop_timeout_s)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if _has_new_line(self.out_path, initial_size):
                return True
            if proc.poll() is not None:
                reason = self._child_error() or f"the GPU sampler exited with code {proc.returncode}"
                self._cleanup()
                return self._unavailable(reason)
            if time.monotonic() > deadline:
                self.stop()
                return self._unavailable(
                    f"the GPU sampler wrote no sample within {self.startup_timeout_s:g} s"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``; waits for the child (idempotent)."""
        if self._proc is not None:
            _terminate(self._proc, self.stop_timeout_s)
        self._cleanup()

    def latest(self) -> dict[str, Any] | None:
        """The last complete line of ``out_path``, or ``None`` before the first sample."""
        lines = _tail_lines(self.out_path)
        return lines[-1] if lines else None

    def latest_by_device(self) -> dict[int, dict[str, Any]]:
        """The last complete line per device index."""
        by_device: dict[int, dict[str, Any]] = {}
        for line in _tail_lines(self.out_path):
            device = line.get("device")
            if isinstance(device, int):
                by_device[device] = line
        return by_device

    def _unavailable(self, reason: str) -> bool:
        self.unavailable_reason = reason
        if self._writer is not None:
            self._writer.event(
                "sampler_unavailable", detail=reason, source=self.source, required=self.required
            )
        if self.required:
            raise SamplerUnavailableError(reason)
        return False

    def _child_error(self) -> str | None:
        if self._stderr is None:
            return None
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        for line in reversed(lines):
            if line.startswith("oomload: error: "):
                return line[len("oomload: error: ") :]
        return lines[-1] if lines else None

    def _cleanup(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> GpuSamplerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerMemoryProcess(GpuSamplerProcess):
    """A child ``oomload sample --no-gpu`` writing the server's host memory to ``out_path`` (normally
    ``RUN_DIR/server_memory.jsonl``): its /proc and cgroup reads block, so they stay out of Locust's
    gevent loop, as NVML's do. ``target_flags`` name the server (``--server-pid N``, ``--server-port P``,
    ``--cgroup DIR``); start, stop, ``latest()`` and the one-sentence unavailability are the GPU
    sampler's."""

    def __init__(
        self, out_path: Path, target_flags: Sequence[str], *, interval_s: float = 0.5, **kw: Any
    ) -> None:
        super().__init__(out_path, interval_s=interval_s, **kw)
        self.target_flags = list(target_flags)
        self.source = "server_memory"

    def command(self) -> list[str]:
        cmd = [*self.program, "--no-gpu", *self.target_flags, "--server-out", str(self.out_path)]
        return [*cmd, "--server-interval-s", repr(self.interval_s), "--parent-pid", str(os.getpid())]


def _terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _has_new_line(path: Path, initial_size: int) -> bool:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= initial_size:
        return False
    with open(path, "rb") as fh:
        fh.seek(initial_size)
        return b"\n" in fh.read(size - initial_size)


def _tail_lines(path: Path) -> list[dict[str, Any]]:
    """Complete JSON lines from the last ``TAIL_BYTES`` of ``path`` (a torn last line is skipped)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            chunk = fh.read()
    except FileNotFoundError:
        return []
    if size > TAIL_BYTES:
        chunk = chunk.split(b"\n", 1)[1] if b"\n" in chunk else b""
    complete = chunk[: chunk.rfind(b"\n") + 1] if b"\n" in chunk else b""
    out: list[dict[str, Any]] = []
    for raw in complete.splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
