"""A run directory read into plain values, with every sample assigned to the step it belongs to.

``load_run(path)`` is the only function here that touches the file system; ``assemble_run`` does the
grouping on values already in memory (tests and the verdict call it directly).

Step windows. ``steps.jsonl`` gives each step a start and (unless the run was cut short) an end.
A step is *cut short* when it has no end line, or when its end ``reason`` is one of
``CUT_SHORT_REASONS`` (``interrupted``, ``max_duration``, ``server_dead``, ``error``): the step ended,
but not because its hold was done, so it measured less than the schedule asked for.
Steps are ordered by start time; step *i* owns the time window ``(start_i, start_{i+1}]`` — the drain
between one step's end and the next step's start still belongs to the step whose requests are
finishing — and the last step owns ``(start, end + tail_s]`` (``tail_s`` catches the final metrics
scrape taken after the load stopped), or everything after its start when it never ended.

* Requests: by their ``step`` field; a request written with ``step == -1`` (a worker process that
  could not know the step) goes to the step whose window holds its ``start_unix_s``.
* Metrics scrapes, GPU samples: by ``t_unix_s`` within the windows.
* A run whose ``steps.jsonl`` is missing or empty gets its steps rebuilt from the requests' own
  ``step`` / ``concurrency`` fields (phase ``ramp``, start/end from the first start and last end).

Values read from JSON are loose (a field may be absent, ``null``, a bool or a string); ``as_int``,
``as_float``, ``max_int``, … read them as numbers or ``None`` for every consumer of a ``RunView``.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomload.errors import ConfigError, TraceFormatError
from oomload.odds import LevelOdds
from oomload.outcome import RequestResult
from oomload.rundir import RunReader
from oomload.trace import read_trace

LAST_STEP_TAIL_S = 5.0
CUT_SHORT_REASONS = frozenset({"interrupted", "max_duration", "server_dead", "error"})


@dataclass(frozen=True, slots=True)
class StepBoundary:
    """One step as ``steps.jsonl`` records it (``cut_short``: no end, or an end in ``CUT_SHORT_REASONS``)."""

    index: int
    concurrency: int
    phase: str
    start_unix_s: float
    end_unix_s: float | None = None
    end_reason: str | None = None
    # from the end line: requests that ended (not cancelled) while the step held, their completion
    # tokens, and how long it held (``None`` without an end line, or from an older run directory)
    ended: int | None = None
    completion_tokens: int | None = None
    duration_s: float | None = None
    evidence_requests: int | None = None  # requests the trace's odds asked a clean step to send
    extended_s: float | None = None  # how long the step ran past its hold for that evidence

    @property
    def cut_short(self) -> bool:
        return self.end_unix_s is None or self.end_reason in CUT_SHORT_REASONS


@dataclass(frozen=True, slots=True)
class StepData:
    """One step with everything measured during it."""

    boundary: StepBoundary
    window_start_unix_s: float
    window_end_unix_s: float  # math.inf for a step that never ended and has no successor
    requests: tuple[RequestResult, ...]
    metrics: tuple[Mapping[str, Any], ...]
    gpu: tuple[Mapping[str, Any], ...]
    baseline_metric: Mapping[str, Any] | None  # last ok scrape before the window (counter baseline)


@dataclass(frozen=True, slots=True)
class RunView:
    """Everything one run directory holds, as plain values."""

    path: Path
    config: Mapping[str, Any]
    status: Mapping[str, Any] | None
    cache_config: Mapping[str, Any] | None
    steps: tuple[StepData, ...]
    requests: tuple[RequestResult, ...]
    metrics: tuple[Mapping[str, Any], ...]
    gpu: tuple[Mapping[str, Any], ...]
    events: tuple[Mapping[str, Any], ...]
    trace_prompt_tokens: tuple[int, ...]
    trace_output_tokens: tuple[int, ...]
    unassigned_requests: int
    trace_note: str | None = None  # why the trace's lengths are missing, when they are
    config_note: str | None = None  # why config.json could not be read, when it could not
    odds: tuple[LevelOdds, ...] = ()  # the trace's odds per level (odds.jsonl), ascending

    def odds_at(self, concurrency: int) -> LevelOdds | None:
        return next((o for o in self.odds if o.concurrency == concurrency), None)

    @property
    def trace_total_tokens(self) -> tuple[int, ...]:
        return tuple(p + o for p, o in zip(self.trace_prompt_tokens, self.trace_output_tokens, strict=True))


def load_run(path: str | Path) -> RunView:
    """Read a run directory (``ConfigError`` when it is not one) into a ``RunView``."""
    reader = RunReader(path)
    config = reader.config()
    config_note = config_problem(reader.path)
    prompt_tokens: tuple[int, ...] = ()
    output_tokens: tuple[int, ...] = ()
    trace_note: str | None = None
    trace_file = reader.path / "trace.jsonl"
    if trace_file.exists():
        try:
            records = read_trace(trace_file)
            prompt_tokens = tuple(r.prompt_tokens for r in records)
            output_tokens = tuple(r.output_tokens for r in records)
        except (TraceFormatError, OSError) as err:
            trace_note = f"trace.jsonl is unreadable ({err})"
    else:
        trace_note = "the run directory holds no trace.jsonl"
    try:
        return assemble_run(
            path=reader.path,
            config=config,
            status=reader.status(),
            cache_config=reader.json("cache_config.json"),
            step_records=list(reader.stream("steps")),
            requests=reader.requests(),
            metrics=list(reader.stream("metrics")),
            gpu=list(reader.stream("gpu")),
            events=list(reader.stream("events")),
            trace_prompt_tokens=prompt_tokens,
            trace_output_tokens=output_tokens,
            trace_note=trace_note,
            config_note=config_note,
            odds=reader.stream("odds"),
        )
    except (TypeError, ValueError, KeyError) as err:
        raise ConfigError(f"{reader.path} holds malformed run data ({err})") from err


def assemble_run(
    *,
    path: Path,
    config: Mapping[str, Any],
    status: Mapping[str, Any] | None,
    cache_config: Mapping[str, Any] | None,
    step_records: Iterable[Mapping[str, Any]],
    requests: Sequence[RequestResult],
    metrics: Iterable[Mapping[str, Any]],
    gpu: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    trace_prompt_tokens: Sequence[int] = (),
    trace_output_tokens: Sequence[int] = (),
    trace_note: str | None = None,
    config_note: str | None = None,
    odds: Iterable[Mapping[str, Any]] = (),
) -> RunView:
    """Group already-read run data by step (see the module docstring)."""
    metrics_sorted = sorted((m for m in metrics if _is_number(m.get("t_unix_s"))), key=_t)
    gpu_sorted = sorted((g for g in gpu if _is_number(g.get("t_unix_s"))), key=_t)
    events_sorted = sorted((e for e in events if _is_number(e.get("t_unix_s"))), key=_t)
    requests_sorted = sorted(requests, key=lambda r: r.start_unix_s)
    boundaries = parse_step_records(step_records) or _steps_from_requests(requests_sorted)

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

    metric_times = [_t(m) for m in metrics_sorted]
    gpu_times = [_t(g) for g in gpu_sorted]
    steps = []
    for boundary, (lo, hi) in zip(boundaries, windows, strict=True):
        m_lo, m_hi = _span(metric_times, lo, hi)
        g_lo, g_hi = _span(gpu_times, lo, hi)
        baseline = next((m for m in reversed(metrics_sorted[:m_lo]) if m.get("ok")), None)
        steps.append(
            StepData(
                boundary=boundary,
                window_start_unix_s=lo,
                window_end_unix_s=hi,
                requests=tuple(by_index[boundary.index]),
                metrics=tuple(metrics_sorted[m_lo:m_hi]),
                gpu=tuple(gpu_sorted[g_lo:g_hi]),
                baseline_metric=baseline,
            )
        )
    if len(trace_prompt_tokens) != len(trace_output_tokens):
        raise ValueError("trace prompt and output length lists differ in size")
    return RunView(
        path=path,
        config=config,
        status=status,
        cache_config=cache_config,
        steps=tuple(steps),
        requests=tuple(requests_sorted),
        metrics=tuple(metrics_sorted),
        gpu=tuple(gpu_sorted),
        events=tuple(events_sorted),
        trace_prompt_tokens=tuple(int(v) for v in trace_prompt_tokens),
        trace_output_tokens=tuple(int(v) for v in trace_output_tokens),
        unassigned_requests=unassigned,
        trace_note=trace_note,
        config_note=config_note,
        odds=_odds(odds),
    )


def _odds(lines: Iterable[Mapping[str, Any]]) -> tuple[LevelOdds, ...]:
    """One ``LevelOdds`` per level (the last line for a level wins; malformed lines are skipped)."""
    by_level = {o.concurrency: o for o in (LevelOdds.from_json(line) for line in lines) if o is not None}
    return tuple(by_level[c] for c in sorted(by_level))


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


def parse_step_records(records: Iterable[Mapping[str, Any]]) -> list[StepBoundary]:
    """Pair ``start`` / ``end`` records of ``steps.jsonl`` into boundaries, ordered by start time."""
    starts: dict[int, Mapping[str, Any]] = {}
    ends: dict[int, Mapping[str, Any]] = {}
    for record in records:
        if not isinstance(record.get("step"), int) or not _is_number(record.get("t_unix_s")):
            continue
        if record.get("event") == "start":
            starts.setdefault(record["step"], record)
        elif record.get("event") == "end":
            ends[record["step"]] = record
    boundaries = []
    for index, start in starts.items():
        end = ends.get(index)
        boundaries.append(
            StepBoundary(
                index=index,
                concurrency=int(start.get("concurrency", 0)),
                phase=str(start.get("phase", "ramp")),
                start_unix_s=float(start["t_unix_s"]),
                end_unix_s=None if end is None else float(end["t_unix_s"]),
                end_reason=None if end is None else as_str(end.get("reason")),
                ended=None if end is None else as_int(end.get("ended")),
                completion_tokens=None if end is None else as_int(end.get("completion_tokens")),
                duration_s=None if end is None else as_float(end.get("duration_s")),
                evidence_requests=None if end is None else as_int(end.get("evidence_requests")),
                extended_s=None if end is None else as_float(end.get("extended_s")),
            )
        )
    boundaries.sort(key=lambda b: (b.start_unix_s, b.index))
    return boundaries


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
            end_reason="rebuilt_from_requests",
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


def _span(times: list[float], lo: float, hi: float) -> tuple[int, int]:
    """Slice bounds of the sorted ``times`` within ``(lo, hi]``."""
    return bisect.bisect_right(times, lo), bisect.bisect_right(times, hi)


def as_int(value: Any) -> int | None:
    """A finite JSON number as ``int`` (truncated); ``None`` for anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value)


def as_float(value: Any) -> float | None:
    """A JSON number as ``float``; ``None`` for anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def as_str(value: Any) -> str | None:
    return None if value is None else str(value)


def max_int(values: Iterable[Any]) -> int | None:
    """The largest of the values that are numbers, or ``None`` when none is."""
    known = [v for v in map(as_int, values) if v is not None]
    return max(known) if known else None


def min_int(values: Iterable[Any]) -> int | None:
    known = [v for v in map(as_int, values) if v is not None]
    return min(known) if known else None


def max_float(values: Iterable[Any]) -> float | None:
    known = [v for v in map(as_float, values) if v is not None]
    return max(known) if known else None


def _t(obj: Mapping[str, Any]) -> float:
    return float(obj["t_unix_s"])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
