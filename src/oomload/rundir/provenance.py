"""``provenance.json``: what a comparison of two runs needs to know about how each was made.

Written once, at the start of every ``oomload replay`` (beside ``config.json``, whole or not at all:
``RunWriter.write_json``). Schema ``oomload.provenance/1``; within major version 1 keys are only added.

=====================  ==========================================================================
key                    value
=====================  ==========================================================================
``oomload_version``    the oomload that ran
``server_version``     the server's ``GET /version`` (``null``: no such route or no answer)
``serve``              the ``--serve`` line oomload started the server with, scrubbed of secrets
                       (``null``: oomload did not start it)
``sim_args``           the simulator's flags when the server was oomload's simulator (else ``null``)
``model``, ``url``     what was served and where
``trace``              ``{"path", "sha256", "requests"}``: the trace file and the SHA-256 of its
                       bytes as read (two runs replayed the same trace when the digests agree)
``levels``             the concurrency levels asked for; ``repeats``: the refinement's repeats
``started_unix_s``     when the run started
=====================  ==========================================================================

The server's own pool is ``cache_config.json`` (vLLM's ``cache_config_info``, read at the first
scrape), not repeated here. ``read_provenance`` returns ``None`` for a run directory written before
this file existed, or one whose file is unreadable or of another schema: a reader falls back to
``config.json`` then.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomload.rundir.records import as_float, as_int, as_str

PROVENANCE_SCHEMA = "oomload.provenance/1"
PROVENANCE_FILE = "provenance.json"
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Provenance:
    """One run's ``provenance.json`` (module docstring)."""

    oomload_version: str
    trace_path: str
    trace_sha256: str
    trace_requests: int
    levels: tuple[int, ...]
    repeats: int | None
    server_version: str | None = None
    serve: str | None = None
    sim_args: tuple[str, ...] | None = None
    model: str | None = None
    url: str | None = None
    started_unix_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": PROVENANCE_SCHEMA,
            "oomload_version": self.oomload_version,
            "server_version": self.server_version,
            "serve": self.serve,
            "sim_args": None if self.sim_args is None else list(self.sim_args),
            "model": self.model,
            "url": self.url,
            "trace": {"path": self.trace_path, "sha256": self.trace_sha256, "requests": self.trace_requests},
            "levels": list(self.levels),
            "repeats": self.repeats,
            "started_unix_s": self.started_unix_s,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Provenance | None:
        """The record, or ``None`` when ``obj`` is not of schema ``oomload.provenance/1``."""
        if obj.get("schema") != PROVENANCE_SCHEMA:
            return None
        trace = obj.get("trace")
        if not isinstance(trace, Mapping):
            return None
        digest, path = as_str(trace.get("sha256")), as_str(trace.get("path"))
        if digest is None or path is None:
            return None
        levels = obj.get("levels")
        sim = obj.get("sim_args")
        return cls(
            oomload_version=str(obj.get("oomload_version") or "?"),
            trace_path=path,
            trace_sha256=digest,
            trace_requests=as_int(trace.get("requests")) or 0,
            levels=tuple(v for v in (as_int(x) for x in levels) if v is not None)
            if isinstance(levels, list)
            else (),
            repeats=as_int(obj.get("repeats")),
            server_version=as_str(obj.get("server_version")),
            serve=as_str(obj.get("serve")),
            sim_args=tuple(map(str, sim)) if isinstance(sim, list) else None,
            model=as_str(obj.get("model")),
            url=as_str(obj.get("url")),
            started_unix_s=as_float(obj.get("started_unix_s")),
        )


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB pieces (``OSError`` when it cannot be read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def make_provenance(
    *,
    oomload_version: str,
    trace_path: Path,
    trace_requests: int,
    levels: Sequence[int],
    repeats: int | None,
    server_version: str | None,
    serve: str | None,
    sim_args: Sequence[str] | None,
    model: str | None,
    url: str | None,
    started_unix_s: float | None,
) -> Provenance:
    """The record for a run about to start (reads the trace file once more for its digest)."""
    return Provenance(
        oomload_version=oomload_version,
        trace_path=str(trace_path),
        trace_sha256=file_sha256(trace_path),
        trace_requests=trace_requests,
        levels=tuple(levels),
        repeats=repeats,
        server_version=server_version,
        serve=serve,
        sim_args=None if sim_args is None else tuple(sim_args),
        model=model,
        url=url,
        started_unix_s=started_unix_s,
    )


def read_provenance(run_dir: str | Path) -> Provenance | None:
    """A run directory's ``provenance.json``; ``None`` when it has none (an older run), or it is
    unreadable or of another schema."""
    try:
        obj = json.loads((Path(run_dir) / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Provenance.from_json(obj) if isinstance(obj, dict) else None
