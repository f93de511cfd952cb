"""The e2e session's server pool: at most one real vLLM at a time, reused per configuration."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from oomload.realvllm.server import RealVllmServer, VllmServerConfig

TIMINGS: list[tuple[str, float]] = []


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
        server = RealVllmServer(config, self.log_root / f"server-{self._count}")
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
