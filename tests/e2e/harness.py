"""E2E harness: the server pool (one real vLLM at a time), running a replay, reading a run directory.

The CLI as a subprocess is ``clirun.oomload`` (shared with the other suites); ``replay`` is the
``oomload replay`` every e2e test runs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

from clirun import HANG_S, oomload
from oomload.realvllm.server import RealVllmServer, VllmServerConfig
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

TIMINGS: list[tuple[str, float]] = []
FIGURES: list[str] = []  # measured figures printed at the end of the session


class ServerPool:
    """At most one real vLLM at a time, reused while tests ask for the same configuration."""

    def __init__(self, base: VllmServerConfig, log_root: Path) -> None:
        self.base = base
        self.log_root = log_root
        self.current: RealVllmServer | None = None
        self._count = 0

    def get(self, **overrides: Any) -> RealVllmServer:
        """A healthy server for ``base`` with ``overrides`` (fields of ``VllmServerConfig``)."""
        config = dataclasses.replace(self.base, **overrides)
        if self.current is not None:
            if self.current.config == config and self.current.is_running() and self.current.healthy(10.0):
                return self.current
            self.stop()
        self._count += 1
        # vLLM starts in 21–36 s here; 300 s is a hang detector that a noisy machine does not trip
        server = RealVllmServer(config, self.log_root / f"server-{self._count}", startup_timeout_s=300.0)
        server.start()
        assert server.startup_s is not None
        TIMINGS.append((f"server start #{self._count}", server.startup_s))
        self.current = server
        return server

    def stop(self) -> None:
        if self.current is not None:
            started = time.monotonic()
            self.current.stop()
            TIMINGS.append(("server stop", time.monotonic() - started))
            self.current = None


def replay(
    url: str, trace: Path, run_dir: Path, *flags: str, timeout_s: float = HANG_S
) -> CompletedProcess[str]:
    """``oomload replay TRACE --url URL --run-dir RUN_DIR --gpu none FLAGS``, as a user would run it."""
    return oomload(
        *("replay", str(trace), "--url", url, "--run-dir", str(run_dir), "--gpu", "none"),
        *flags,
        timeout_s=timeout_s,
    )


def write_trace_file(
    path: Path, lengths: Sequence[tuple[int, int]], arrivals_s: Sequence[float] = ()
) -> Path:
    """A trace with the given (prompt, output) lengths (arrivals 0 unless given)."""
    records = [
        TraceRecord(f"r{i}", arrivals_s[i] if arrivals_s else 0.0, prompt, output)
        for i, (prompt, output) in enumerate(lengths)
    ]
    write_trace(path, records, TraceHeader(source=("e2e",), format="synthetic"))
    return path


@dataclasses.dataclass(frozen=True)
class Run:
    """What one replay left in its run directory."""

    path: Path
    requests: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    events: list[dict[str, Any]]
    status: dict[str, Any] | None
    summary: dict[str, Any] | None

    @classmethod
    def read(cls, path: Path) -> Run:
        def jsonl(p: Path) -> list[dict[str, Any]]:
            if not p.exists():
                return []
            return [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]

        def doc(name: str) -> dict[str, Any] | None:
            p = path / name
            return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None

        return cls(
            path=path,
            requests=[r for f in sorted(path.glob("requests*.jsonl")) for r in jsonl(f)],
            steps=jsonl(path / "steps.jsonl"),
            events=jsonl(path / "events.jsonl"),
            status=doc("status.json"),
            summary=doc("summary.json"),
        )

    def step_windows(self) -> dict[int, tuple[int, float, float]]:
        """step index → (concurrency, start, end) of the non-warmup steps (end = last event if cut)."""
        windows: dict[int, tuple[int, float, float]] = {}
        for s in self.steps:
            if s.get("phase") == "warmup":
                continue
            c, start, end = windows.get(s["step"], (s["concurrency"], s["t_unix_s"], float("inf")))
            if s["event"] == "start":
                start = s["t_unix_s"]
            else:
                end = s["t_unix_s"]
            windows[s["step"]] = (c, start, end)
        return windows
