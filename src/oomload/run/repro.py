"""The minimal reproduction: the requests in flight at the first preemption and at the server's death,
written as traces of their own (``repro/*.jsonl``) that ``oomload replay`` can replay.
"""

from __future__ import annotations

from pathlib import Path

from oomload.errors import TraceFormatError
from oomload.outfile import output_file, write_failure
from oomload.rundir import RunReader
from oomload.trace.model import (
    PrefixInfo,
    TraceHeader,
    TraceRecord,
    iter_trace,
    read_trace_header,
    write_trace,
)


def write_repro(run_dir: Path) -> list[Path]:
    """Write ``repro/first_preemption.jsonl`` and ``repro/server_death.jsonl`` from the run's files.

    The requests in flight at moment T are those with ``start ≤ T ≤ end``. T is the first
    preemption's scrape time, and for a death the earliest end of a request that failed with
    ``engine_dead``/``transport_error`` in the step of death (else the ``server_dead`` event's time).
    Each file is written whole (``oomload.outfile``): ``OutputWriteError`` when it cannot be.
    """
    reader = RunReader(run_dir)
    ids, prefix = _trace_prefix_ids(run_dir)
    events = list(reader.stream("events"))
    results = reader.requests()
    written: list[Path] = []
    moments: list[tuple[str, float]] = []
    pre = next((e for e in events if e.get("kind") == "first_preemption"), None)
    if pre is not None:
        moments.append(("first_preemption", float(pre["t_unix_s"])))
    dead = next((e for e in events if e.get("kind") == "server_dead"), None)
    if dead is not None:
        t_dead = float(dead["t_unix_s"])
        failed = [
            r.end_unix_s
            for r in results
            if r.outcome.value in ("engine_dead", "transport_error") and r.end_unix_s <= t_dead + 1.0
        ]
        moments.append(("server_death", min(failed) if failed else t_dead))
    for name, t in moments:
        in_flight = [r for r in results if r.start_unix_s <= t <= r.end_unix_s]
        if not in_flight:
            continue
        t0 = min(r.start_unix_s for r in in_flight)
        repro = [
            TraceRecord(
                id=r.request_id,
                arrival_s=r.start_unix_s - t0,
                prompt_tokens=r.prompt_tokens_asked,
                output_tokens=r.output_tokens_asked,
                hash_ids=ids.get(r.request_id.rpartition("#")[0], ()),
            )
            for r in sorted(in_flight, key=lambda r: r.start_unix_s)
        ]
        path = run_dir / "repro" / f"{name}.jsonl"
        header = TraceHeader(
            source=(str(run_dir),), format="oomload-repro", extra={"moment": name}, prefix=prefix
        )
        try:
            path.parent.mkdir(exist_ok=True)
        except OSError as err:
            raise write_failure(path, err) from err
        with output_file(path) as fh:  # whole or absent: OutputWriteError on a full disk
            write_trace(fh, repro, header)
        written.append(path)
    return written


def _trace_prefix_ids(run_dir: Path) -> tuple[dict[str, tuple[int, ...]], PrefixInfo | None]:
    """The run's trace ids → their prefix ids, and its header's prefix info, so that a repro replays
    the shared prefixes the run sent (empty when the run directory has no readable trace)."""
    try:
        header = read_trace_header(run_dir / "trace.jsonl")
        ids: dict[str, tuple[int, ...]] = {}
        for record in iter_trace(run_dir / "trace.jsonl"):
            if record.hash_ids:
                ids.setdefault(record.id, record.hash_ids)
    except TraceFormatError:
        return {}, None
    return ids, header.prefix
