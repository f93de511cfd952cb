"""A run directory read into plain values, with every sample assigned to the step it belongs to.

``load_run(path)`` is the only function here that touches the file system; ``assemble_run`` does the
grouping on values already parsed (tests and the verdict call it directly).

Step windows. ``steps.jsonl`` gives each step a start and (unless the run was cut short) an end.
A step is *cut short* when it has no end line, or when its end ``reason`` is one of
``records.CUT_SHORT_REASONS`` (``interrupted``, ``max_duration``, ``server_dead``, ``error``): the step ended,
but not because its hold was done, so it measured less than the schedule asked for.
Steps are ordered by start time; step *i* owns the time window ``(start_i, start_{i+1}]`` — the drain
between one step's end and the next step's start still belongs to the step whose requests are
finishing — and the last step owns ``(start, end + tail_s]`` (``tail_s`` catches the final metrics
scrape taken after the load stopped), or everything after its start when it never ended.

* Requests: by their ``step`` field; a request written with ``step == -1`` (a worker process that
  could not know the step) goes to the step whose window holds its ``start_unix_s``.
* Metrics scrapes, GPU samples, the server's host-memory samples: by ``t_unix_s`` within the windows.

The server's own evidence is read whole: ``server_memory.jsonl``, the tail of ``server.log`` (its last
``LOG_TAIL_BYTES``) and ``server_exit.json``'s exit status (``oomload.run.served``).
* A run whose ``steps.jsonl`` is missing or empty gets its steps rebuilt from the requests' own
  ``step`` / ``concurrency`` fields (phase ``ramp``, start/end from the first start and last end, end
  reason ``REBUILT_FROM_REQUESTS``: the verdict's ``steps_missing`` caveat says what that loses).

Lines are parsed here, once, into the records of ``oomload.rundir.records`` (step boundaries, the
config, the cache config, the status, metrics rows, GPU samples, events); values read from JSON are
loose, and ``records.as_int``, ``as_float``, … read them as numbers or ``None`` there.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from oomload.capacity.blocks import PromptShape
from oomload.capacity.odds import LevelOdds
from oomload.errors import ConfigError, TraceFormatError
from oomload.outcome import RequestResult
from oomload.rundir import RunReader
from oomload.rundir.provenance import read_provenance
from oomload.rundir.records import (
    CacheConfig,
    EventRow,
    GpuSampleRow,
    MetricsRow,
    RunConfig,
    RunStatus,
    StepBoundary,
    as_int,
    parse_status,
    parse_step_lines,
)
from oomload.rundir.servermemory import ServerMemoryRow
from oomload.trace.model import PrefixInfo, TraceRecord, read_trace, read_trace_header

REBUILT_FROM_REQUESTS = "rebuilt_from_requests"  # a step rebuilt without steps.jsonl: its end reason
LAST_STEP_TAIL_S = 5.0
SERVER_LOG = "server.log"  # the server's log during the run (--serve's, --server-log's copy)
SERVER_EXIT = "server_exit.json"  # oomload.run.served
LOG_TAIL_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StepData:
    """One step with everything measured during it."""

    boundary: StepBoundary
    window_start_unix_s: float
    window_end_unix_s: float  # math.inf for a step that never ended and has no successor
    requests: tuple[RequestResult, ...]
    metrics: tuple[MetricsRow, ...]
    gpu: tuple[GpuSampleRow, ...]
    baseline_metric: MetricsRow | None  # last ok scrape before the window (counter baseline)
    server_memory: tuple[ServerMemoryRow, ...] = ()  # the server's host memory during the window


@dataclass(frozen=True, slots=True)
class RunView:
    """Everything one run directory holds, as plain values."""

    path: Path
    config: Mapping[str, Any]  # config.json as written, for reports that show all of it
    status: RunStatus | None
    cache_config: Mapping[str, Any] | None
    steps: tuple[StepData, ...]
    requests: tuple[RequestResult, ...]
    metrics: tuple[MetricsRow, ...]
    gpu: tuple[GpuSampleRow, ...]
    events: tuple[EventRow, ...]
    unassigned_requests: int
    trace_note: str | None = None  # why the trace's lengths are missing, when they are
    config_note: str | None = None  # why config.json could not be read, when it could not
    odds: tuple[LevelOdds, ...] = ()  # the trace's odds per level (odds.jsonl), ascending
    settings: RunConfig = field(default_factory=RunConfig)  # the fields of config.json the verdict reads
    pool: CacheConfig | None = None  # the fields of cache_config.json the verdict reads (None: no file)
    trace_prefix: PrefixInfo = field(default_factory=PrefixInfo)  # what the trace's hash_ids mean
    trace_records: tuple[TraceRecord, ...] = ()  # the run's trace.jsonl: lengths and prefix ids
    server_memory: tuple[ServerMemoryRow, ...] = ()  # server_memory.jsonl: the server's host memory
    server_log: str | None = None  # server.log: the server's own words during the run (its tail)
    server_exit_status: int | None = None  # server_exit.json: how a server oomload started ended
    trace_sha256: str | None = None  # provenance.json's digest of the trace file (None: an older run)

    @property
    def trace_prompt_tokens(self) -> tuple[int, ...]:
        return tuple(r.prompt_tokens for r in self.trace_records)

    @property
    def trace_output_tokens(self) -> tuple[int, ...]:
        return tuple(r.output_tokens for r in self.trace_records)

    @property
    def prompt_shape(self) -> PromptShape:
        """The prompts the run sent: the trace's shared prefixes ("production") or all distinct."""
        return "production" if self.settings.prompt_shape == "production" else "worst-case"

    def odds_at(self, concurrency: int, shape: PromptShape | None = None) -> LevelOdds | None:
        """The odds of a level for ``shape`` (default: the run's own prompts)."""
        want = shape or self.prompt_shape
        return next((o for o in self.odds if o.concurrency == concurrency and o.shape == want), None)

    @property
    def trace_total_tokens(self) -> tuple[int, ...]:
        return tuple(r.prompt_tokens + r.output_tokens for r in self.trace_records)


def load_run(path: str | Path) -> RunView:
    """Read a run directory (``ConfigError`` when it is not one) into a ``RunView``."""
    reader = RunReader(path)
    config = reader.config()
    config_note = config_problem(reader.path)
    prefix = PrefixInfo()
    trace_note: str | None = None
    trace_file = reader.path / "trace.jsonl"
    records: list[TraceRecord] = []
    if trace_file.exists():
        try:
            records = read_trace(trace_file)
            prefix = read_trace_header(trace_file).prefix_or_default()
        except (TraceFormatError, OSError) as err:
            trace_note = f"trace.jsonl is unreadable ({err})"
    else:
        trace_note = "the run directory holds no trace.jsonl"
    try:  # each line parsed once, here, into the run directory's records
        status = reader.status()
        cache_config = reader.json("cache_config.json")
        view = assemble_run(
            path=reader.path,
            config=config,
            status=parse_status(status),
            cache_config=cache_config,
            boundaries=parse_step_lines(reader.stream("steps")),
            requests=reader.requests(),
            metrics=list(filter(None, map(MetricsRow.from_json, reader.stream("metrics")))),
            gpu=list(filter(None, map(GpuSampleRow.from_json, reader.stream("gpu")))),
            events=list(filter(None, map(EventRow.from_json, reader.stream("events")))),
            trace=records,
            trace_note=trace_note,
            config_note=config_note,
            odds=_odds(reader.stream("odds")),
            trace_prefix=prefix,
            server_memory=list(filter(None, map(ServerMemoryRow.from_json, reader.stream("server_memory")))),
            server_log=read_log_tail(reader.path / SERVER_LOG),
            server_exit_status=as_int((reader.json(SERVER_EXIT) or {}).get("exit_status")),
        )
    except (TypeError, ValueError, KeyError) as err:
        raise ConfigError(f"{reader.path} holds malformed run data ({err})") from err
    provenance = read_provenance(reader.path)
    return view if provenance is None else replace(view, trace_sha256=provenance.trace_sha256)


def assemble_run(
    *,
    path: Path,
    config: Mapping[str, Any],
    status: RunStatus | None,
    cache_config: Mapping[str, Any] | None,
    boundaries: Sequence[StepBoundary],
    requests: Sequence[RequestResult],
    metrics: Sequence[MetricsRow],
    gpu: Sequence[GpuSampleRow],
    events: Sequence[EventRow],
    trace: Sequence[TraceRecord] = (),
    trace_note: str | None = None,
    config_note: str | None = None,
    odds: tuple[LevelOdds, ...] = (),
    trace_prefix: PrefixInfo | None = None,
    server_memory: Sequence[ServerMemoryRow] = (),
    server_log: str | None = None,
    server_exit_status: int | None = None,
) -> RunView:
    """Group already-parsed run data by step (see the module docstring). ``config`` and
    ``cache_config`` are kept as written (reports show all of them); the verdict reads their typed
    fields (``RunConfig``, ``CacheConfig``)."""
    metrics_sorted = sorted(metrics, key=lambda m: m.t_unix_s)
    gpu_sorted = sorted(gpu, key=lambda g: g.t_unix_s)
    host_sorted = sorted(server_memory, key=lambda h: h.t_unix_s)
    events_sorted = sorted(events, key=lambda e: e.t_unix_s)
    requests_sorted = sorted(requests, key=lambda r: r.start_unix_s)
    boundaries = list(boundaries) or _steps_from_requests(requests_sorted)

    windows = _windows(boundaries)
    by_index: dict[int, list[RequestResult]] = {b.index: [] for b in boundaries}
    starts = [w[0] for w in windows]
    unassigned = 0
    for request in requests_sorted:
        if request.step >= 0 and request.step in by_index:
            by_index[request.step].append(request)
            continue
        slot = _slot(starts, windows, request.start_unix_s)
        if request.step < 0 and slot is not None:
            by_index[boundaries[slot].index].append(request)
        else:
            unassigned += 1

    metric_times = [m.t_unix_s for m in metrics_sorted]
    gpu_times = [g.t_unix_s for g in gpu_sorted]
    host_times = [h.t_unix_s for h in host_sorted]
    steps = []
    for boundary, (lo, hi) in zip(boundaries, windows, strict=True):
        m_lo, m_hi = _span(metric_times, lo, hi)
        g_lo, g_hi = _span(gpu_times, lo, hi)
        h_lo, h_hi = _span(host_times, lo, hi)
        baseline = next((m for m in reversed(metrics_sorted[:m_lo]) if m.ok), None)
        steps.append(
            StepData(
                boundary=boundary,
                window_start_unix_s=lo,
                window_end_unix_s=hi,
                requests=tuple(by_index[boundary.index]),
                metrics=tuple(metrics_sorted[m_lo:m_hi]),
                gpu=tuple(gpu_sorted[g_lo:g_hi]),
                baseline_metric=baseline,
                server_memory=tuple(host_sorted[h_lo:h_hi]),
            )
        )
    return RunView(
        path=path,
        config=config,
        status=status,
        settings=RunConfig.from_json(config),
        pool=None if cache_config is None else CacheConfig.from_json(cache_config),
        cache_config=cache_config,
        steps=tuple(steps),
        requests=tuple(requests_sorted),
        metrics=tuple(metrics_sorted),
        gpu=tuple(gpu_sorted),
        events=tuple(events_sorted),
        unassigned_requests=unassigned,
        trace_note=trace_note,
        config_note=config_note,
        odds=odds,
        trace_prefix=trace_prefix or PrefixInfo(),
        trace_records=tuple(trace),
        server_memory=tuple(host_sorted),
        server_log=server_log,
        server_exit_status=server_exit_status,
    )


def read_log_tail(path: Path, max_bytes: int = LOG_TAIL_BYTES) -> str | None:
    """The last ``max_bytes`` of a server log as text (``None`` when there is no such file): a death's
    root cause is in its last lines, and a day of a server's log must not be read whole."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return None
    return data.decode("utf-8", errors="replace")


def _odds(lines: Iterable[Mapping[str, Any]]) -> tuple[LevelOdds, ...]:
    """One ``LevelOdds`` per level and prompt shape (the last line for one wins; malformed lines are
    skipped), ascending by level."""
    by_level = {
        (o.concurrency, o.shape): o for o in (LevelOdds.from_json(line) for line in lines) if o is not None
    }
    return tuple(by_level[k] for k in sorted(by_level))


def config_problem(run_dir: Path) -> str | None:
    """Why ``config.json`` of a run directory cannot be read as a JSON object; ``None`` when it can."""
    target = run_dir / "config.json"
    try:
        obj = json.loads(target.read_text(encoding="utf-8"))
    except OSError as err:
        return f"{target} is unreadable ({err.strerror or err})"
    except ValueError as err:
        return f"{target} is unreadable (not valid JSON: {err})"
    if not isinstance(obj, dict):
        return f"{target} is unreadable (a JSON {type(obj).__name__}, not an object)"
    return None


def _steps_from_requests(requests: Sequence[RequestResult]) -> list[StepBoundary]:
    groups: dict[int, list[RequestResult]] = {}
    for request in requests:
        if request.step >= 0:
            groups.setdefault(request.step, []).append(request)
    boundaries = [
        StepBoundary(
            index=index,
            concurrency=max(r.concurrency for r in group),
            phase="ramp",
            start_unix_s=min(r.start_unix_s for r in group),
            end_unix_s=max(r.end_unix_s for r in group),
            end_reason=REBUILT_FROM_REQUESTS,
        )
        for index, group in groups.items()
    ]
    boundaries.sort(key=lambda b: (b.start_unix_s, b.index))
    return boundaries


def _windows(boundaries: Sequence[StepBoundary]) -> list[tuple[float, float]]:
    windows = []
    for i, boundary in enumerate(boundaries):
        if i + 1 < len(boundaries):
            hi = boundaries[i + 1].start_unix_s
        elif boundary.end_unix_s is None:
            hi = math.inf
        else:
            hi = boundary.end_unix_s + LAST_STEP_TAIL_S
        windows.append((boundary.start_unix_s, max(hi, boundary.start_unix_s)))
    return windows


def _slot(starts: list[float], windows: list[tuple[float, float]], t: float) -> int | None:
    """Index of the window ``[lo, hi)`` that holds ``t`` (requests start at or after a step start)."""
    i = bisect.bisect_right(starts, t) - 1
    if i < 0:
        return None
    lo, hi = windows[i]
    return i if lo <= t < hi or (math.isinf(hi) and t >= lo) else None


def owns_sample(window: tuple[float, float], t_unix_s: float) -> bool:
    """Whether the step whose window is ``(lo, hi]`` owns a scrape or sample taken at ``t_unix_s`` (module
    docstring, "Step windows"): the boundary scrape read as a step begins, at or before its start, is the
    step before's; the one read as it ends is its own. The live step line counts by it too."""
    lo, hi = window
    return lo < t_unix_s <= hi


def _span(times: list[float], lo: float, hi: float) -> tuple[int, int]:
    """Slice bounds of the sorted ``times`` within ``(lo, hi]``: those ``owns_sample`` gives the step."""
    return bisect.bisect_right(times, lo), bisect.bisect_right(times, hi)
