"""The run directory: everything one run measured, written as it goes.

A run directory is the contract between the replay/telemetry side (writers) and the verdict/report
side (readers). Every stream is JSON Lines, appended and flushed one line at a time, so a run cut
short by a dead server, Ctrl-C, SIGTERM or a crash of oomload itself keeps everything up to that
moment and ``oomload report RUN_DIR`` can still summarize it. Clock: Unix seconds (``t_unix_s``,
``time.time()``) in every file, shared by all processes and hosts.

==========================  ===================================================================
file                        content
==========================  ===================================================================
``config.json``             resolved run configuration (schema, argv without secrets, trace,
                            url, schedule, …); written once at the start
``provenance.json``         what a comparison needs: the server's version, the scrubbed
                            ``--serve`` line, the trace's SHA-256, levels and repeats
                            (``oomload.rundir.provenance``); written once at the start
``requests*.jsonl``         one ``oomload.outcome.RequestResult`` per finished request; each
                            writing process has its own file (``requests.jsonl``,
                            ``requests.<worker>.jsonl``), readers take them all
``steps.jsonl``             step boundaries: ``{"event": "start"|"end", "step": i,
                            "concurrency": c, "phase": "warmup"|"ramp"|"refine",
                            "t_unix_s": …, "reason": …}`` (reason on "end")
``metrics.jsonl``           vLLM ``/metrics`` scrapes: ``{"t_unix_s", "ok", …}`` (see
                            ``oomload.telemetry``)
``gpu.jsonl``               GPU memory samples (NVML, DCGM or a remote sampler)
``server_memory.jsonl``     the server's own host memory (``rundir.servermemory.ServerMemoryLine``)
``server.log``              the server's log during the run (``--serve``, the simulator, a
                            followed ``--server-log``)
``server_exit.json``        how a server oomload started ended (``oomload.run.served``)
``events.jsonl``            notable moments: ``{"t_unix_s", "kind", "step"?, "detail"?}`` —
                            kinds include ``scrape_failed``, ``server_restarted``,
                            ``metrics_invalid``, ``server_dead``, ``first_preemption``, ``interrupted``,
                            ``sampler_unavailable``, ``stop_condition``
``cache_config.json``       the server's ``vllm:cache_config_info`` labels, read once
``odds.jsonl``              the trace's odds per level on that pool (``oomload.capacity.odds.LevelOdds``),
                            one line per level when the run first measures it
``repro/*.jsonl``           oomload traces of the requests in flight at the first preemption
                            and at a server death: minimal reproductions for ``oomload replay``
``status.json``             written last: ``{"finished": true, "end_reason": …,
                            "ended_unix_s": …}``; its absence means the run was cut short
``summary.json`` etc.       the verdict and reports (``oomload.report``)
==========================  ===================================================================

No file in a run directory ever holds an API key, prompt text or completion text.

A full disk (or a read-only one, or a file size limit) mid-run: the first write that fails
(``OSError``: ``ENOSPC``, ``EROFS``, ``EFBIG``, …) is recorded in ``RunWriter.write_error`` and the
writer's ``on_write_error`` is called once (the session stops the load); every later line is dropped
without an attempt, so no greenlet or thread ever sees the error and nothing spins. What was flushed
before stays (a torn last line is skipped by ``RunReader``). A whole file (``write_json``,
``write_file``: ``config.json``, ``trace.jsonl``, ``status.json``) is written under a scratch name and
renamed into place, so it is complete or absent; one that cannot be written raises ``RunDirWriteError``
(one sentence, exit 2), as the runner does when the run ends on a failed write.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from oomload.errors import ConfigError, OutputWriteError, RunDirWriteError
from oomload.outcome import RequestResult
from oomload.outfile import output_file, reason, remedy, write_failure
from oomload.rundir.records import StatusLine

RUN_SCHEMA_VERSION = 1
STREAMS = ("steps", "metrics", "gpu", "events", "odds")


def new_run_dir(parent: str | Path = "runs", now_unix_s: float | None = None) -> Path:
    """Create and return a fresh ``parent/YYYYmmdd-HHMMSS[-N]`` directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now_unix_s))
    base = Path(parent)
    for n in range(1000):
        candidate = base / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            candidate.mkdir(parents=True, exist_ok=False)
            return candidate
        except FileExistsError:
            continue
        except OSError as err:
            raise run_dir_error(candidate, err) from err
    raise ConfigError(f"cannot create a new run directory under {base}")


SERVER_DEAD_MARKER = ".server-dead"  # made when the server is declared dead: every process stops sending


def mark_server_dead(run_dir: Path) -> None:
    """Tell every process writing ``run_dir`` that the server was declared dead (before anything else)."""
    (run_dir / SERVER_DEAD_MARKER).touch()


def server_marked_dead(run_dir: Path) -> bool:
    return (run_dir / SERVER_DEAD_MARKER).exists()


def run_dir_error(path: Path, err: OSError) -> ConfigError:
    """One sentence for a run directory that cannot be created (exit 2)."""
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return ConfigError(f"cannot create the run directory {path}: {blocker} is a file, not a directory")
    return ConfigError(f"cannot create the run directory {path}: {err.strerror or type(err).__name__}")


def check_run_dir_creatable(path: Path) -> None:
    """``ConfigError`` unless ``path`` is, or can be made, a directory: checked before any load is sent."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return
    if not existing.is_dir():
        raise ConfigError(f"cannot create the run directory {path}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot create the run directory {path}: {existing} is not writable")


def open_append(path: Path) -> IO[str]:
    """How ``RunWriter`` opens a stream: text, appended, kept open."""
    return open(path, "a", encoding="utf-8")


class RunWriter:
    """Appends to the streams of one run directory, one flushed line at a time (thread-safe).

    ``worker`` names this process's own request file (``requests.<worker>.jsonl``) so that several
    Locust processes can write one run directory without interleaving lines. ``open_file`` opens a
    stream (tests inject a file that fills up). A failed write stops all writing (module docstring):
    ``write_error`` holds it, ``on_write_error`` (set by the session) is called once.
    """

    def __init__(
        self,
        path: str | Path,
        worker: str | None = None,
        *,
        open_file: Callable[[Path], IO[str]] = open_append,
    ) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise run_dir_error(self.path, err) from err
        self._worker = worker
        self._open = open_file
        self._files: dict[str, IO[str]] = {}
        self._lock = threading.Lock()
        self.write_error: OSError | None = None
        self.failed_file: str | None = None  # the file the first failed write was for
        self.on_write_error: Callable[[], None] | None = None

    def _file(self, name: str) -> IO[str]:
        fh = self._files.get(name)
        if fh is None:
            fh = self._open(self.path / f"{name}.jsonl")
            self._files[name] = fh
        return fh

    def append(self, stream: str, obj: Mapping[str, Any]) -> None:
        """Append one object to ``<stream>.jsonl`` and flush it to the OS (dropped once a write failed)."""
        line = json.dumps(obj, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            if self.write_error is not None:
                return
            try:
                fh = self._file(stream)
                fh.write(line)
                fh.flush()
                return
            except OSError as err:
                first = self._failed(err, f"{stream}.jsonl")
        if first:
            self._notify()

    def _failed(self, err: OSError, name: str) -> bool:
        """Record the first failed write; True when this was it."""
        if self.write_error is not None:
            return False
        self.write_error, self.failed_file = err, name
        return True

    def _notify(self) -> None:
        callback = self.on_write_error
        if callback is not None:
            callback()

    def write_failure(self) -> RunDirWriteError | None:
        """The failed write as one sentence (``None`` while every write succeeded)."""
        err = self.write_error
        if err is None:
            return None
        why = reason(err)
        advice = remedy(err)
        return RunDirWriteError(
            f"cannot write to the run directory {self.path} ({self.failed_file}: {why}); the run "
            f"stopped and kept what it wrote before that — {advice}, then `oomload report "
            f"{self.path}` judges it",
            self.path,
            why,
            advice,
        )

    def request(self, result: RequestResult) -> None:
        stream = "requests" if self._worker is None else f"requests.{self._worker}"
        self.append(stream, result.to_json())

    def event(self, kind: str, t_unix_s: float | None = None, **detail: Any) -> None:
        self.append(
            "events", {"t_unix_s": time.time() if t_unix_s is None else t_unix_s, "kind": kind, **detail}
        )

    def write_json(self, name: str, obj: dict[str, Any]) -> None:
        """Write a whole JSON document atomically (``config.json``, ``status.json`` …);
        ``RunDirWriteError`` when it cannot be written."""
        text = json.dumps(obj, indent=2, default=str) + "\n"
        self.write_file(name, lambda fh: fh.write(text))

    def write_file(self, name: str, fill: Callable[[IO[str]], object]) -> None:
        """Write one whole file of the run directory (``fill`` writes its content) under a scratch name,
        renamed into place once complete (``oomload.outfile``); ``RunDirWriteError`` when it cannot be
        written, recorded as a failed stream write is (module docstring)."""
        target = self.path / name
        try:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise write_failure(target, err) from err
            with output_file(target) as fh:
                fill(fh)
        except OutputWriteError as failed:
            cause = failed.__cause__ if isinstance(failed.__cause__, OSError) else OSError(failed.reason)
            with self._lock:
                first = self._failed(cause, name)
            if first:
                self._notify()
            failure = self.write_failure()
            assert failure is not None
            raise failure from cause

    def write_status(self, *, finished: bool, end_reason: str) -> None:
        """``status.json``, written last: how the run ended (its absence means it was cut short)."""
        status: StatusLine = {"finished": finished, "end_reason": end_reason, "ended_unix_s": time.time()}
        self.write_json("status.json", dict(status))

    def close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                with contextlib.suppress(OSError):  # a full disk: what was flushed is kept
                    fh.close()
            self._files.clear()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunReader:
    """Reads a run directory, tolerating a torn last line (a run killed mid-write)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            why = "a file, not a directory" if self.path.exists() else "no such directory"
            raise ConfigError(f"{self.path} is not a run directory ({why})")
        if not (self.path / "config.json").exists():
            raise ConfigError(f"{self.path} is not a run directory (no config.json)")

    def json(self, name: str) -> dict[str, Any] | None:
        target = self.path / name
        if not target.exists():
            return None
        try:
            obj = json.loads(target.read_text(encoding="utf-8"))
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    def config(self) -> dict[str, Any]:
        return self.json("config.json") or {}

    def status(self) -> dict[str, Any] | None:
        """``status.json``, or ``None`` when the run was cut short."""
        return self.json("status.json")

    def stream(self, name: str) -> Iterator[dict[str, Any]]:
        """Objects of ``<name>.jsonl``; a torn or garbled line (crash mid-write) is skipped."""
        target = self.path / f"{name}.jsonl"
        if not target.exists():
            return
        with open(target, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                obj = json_object(line)
                if obj is not None:
                    yield obj

    def requests(self) -> list[RequestResult]:
        """Every request result from every writer's file, ordered by start time."""
        results: list[RequestResult] = []
        for target in sorted(self.path.glob("requests*.jsonl")):
            results += filter(None, map(parse_request, self.stream(target.stem)))
        results.sort(key=lambda r: r.start_unix_s)
        return results


class JsonlTail:
    """The complete JSON lines appended to one ``.jsonl`` file since the last ``read`` (a file that a
    run is still writing: a torn last line waits for its end; a garbled one is skipped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()  # b"" after a complete last line
        return [obj for line in lines if (obj := json_object(line)) is not None]


def parse_request(obj: dict[str, Any]) -> RequestResult | None:
    """A ``requests*.jsonl`` line as a result; ``None`` for one that is not a valid result."""
    try:
        return RequestResult.from_json(obj)
    except (KeyError, ValueError, TypeError):
        return None


def json_object(line: str | bytes) -> dict[str, Any] | None:
    """One JSON Lines line as an object; ``None`` for a torn or garbled line (a crash mid-write)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
