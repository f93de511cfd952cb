"""The lines of a run directory as types: what writers write and what readers parse, in one place.

Writers build the TypedDicts (``StepStartLine``, ``StepEndLine``, ``StatusLine``, ``MetricsLine``;
a GPU sample's line is ``oomload.telemetry.gpu_sample.GpuSampleJson``). Readers parse a line once, at
the boundary (``oomload.verdict.runview``), into a frozen record, so the verdict reads attributes:

* ``StepBoundary`` — a step's start and end lines of ``steps.jsonl`` (``StepLine`` each, paired by
  ``StepLines`` — at once, or as the file grows); an end line's ``loadgen`` entries parse to
  ``LoadgenRow`` (``oomload.rundir.loadgenrecord``);
* ``RunStatus`` — ``status.json``;
* ``RunConfig`` — the fields of ``config.json`` the verdict reads;
* ``CacheConfig`` — the fields of ``cache_config.json`` the verdict reads;
* ``MetricsRow`` — a ``metrics.jsonl`` line (also a live scrape's record, ``oomload.load.shape``);
* ``GpuSampleRow`` — a ``gpu.jsonl`` line; ``EventRow`` — an ``events.jsonl`` line;
* ``ServerMemoryRow`` — a ``server_memory.jsonl`` line, in ``oomload.rundir.servermemory``.

A line that a reader cannot place in time (no finite ``t_unix_s``) parses to ``None`` and is dropped
there.

JSON values are loose: a field may be absent, ``null``, a bool or a string, and a file written by an
older oomload may lack newer fields. ``as_int``, ``as_float``, ``as_str`` and the ``max_``/``min_``
folds read such a value as a number (or text) or ``None``; a bool is never a number, and neither is
NaN or ±inf (``as_float``: JSON allows them as ``NaN``/``Infinity``, the run directory never means them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from oomload.rundir.loadgenrecord import LoadgenLine, LoadgenRow, parse_loadgen

CUT_SHORT_REASONS = frozenset({"interrupted", "max_duration", "server_dead", "error"})


class StepStartLine(TypedDict):
    """``steps.jsonl``: a step began."""

    event: Literal["start"]
    step: int
    concurrency: int
    phase: str
    t_unix_s: float


class StepEndLine(TypedDict):
    """``steps.jsonl``: a step ended (docs/replay.md, "The run directory")."""

    event: Literal["end"]
    step: int
    concurrency: int
    phase: str
    t_unix_s: float
    duration_s: float
    reason: str
    started: int | None
    ended: int
    ended_ok: int
    ended_errors: int
    ended_cancelled: int
    ended_outcomes: dict[str, int]
    completion_tokens: int
    preemptions: int | None
    achieved_concurrency_mean: NotRequired[float]
    achieved_concurrency_max: NotRequired[int | None]
    server_concurrency: NotRequired[dict[str, float | None]]
    evidence_requests: NotRequired[int]
    extended_s: NotRequired[float]
    loadgen: NotRequired[list[LoadgenLine]]


class StatusLine(TypedDict):
    """``status.json``, written last."""

    finished: bool
    end_reason: str
    ended_unix_s: float


class MetricsLine(TypedDict):
    """``metrics.jsonl``: one ``/metrics`` scrape (``oomload.telemetry.poller``). A failed scrape has
    ``error`` and none of the values; an ok one has the values (``None``: not exposed) and no ``error``."""

    t_unix_s: float
    ok: bool
    scrape_ms: float
    error: NotRequired[str]
    kv_cache_usage: NotRequired[float | None]
    num_requests_running: NotRequired[int | None]
    num_requests_waiting: NotRequired[int | None]
    num_preemptions_total: NotRequired[int | None]
    preemptions_delta: NotRequired[int | None]
    prompt_tokens_total: NotRequired[int | None]
    prompt_tokens_delta: NotRequired[int | None]
    generation_tokens_total: NotRequired[int | None]
    generation_tokens_delta: NotRequired[int | None]
    admission_rejections_total: NotRequired[int | None]
    prefix_cache_queries_total: NotRequired[int | None]
    prefix_cache_hits_total: NotRequired[int | None]
    e2e_latency_seconds_sum: NotRequired[float | None]
    inference_seconds_sum: NotRequired[float | None]
    queue_seconds_sum: NotRequired[float | None]
    restarted: NotRequired[bool]


@dataclass(frozen=True, slots=True)
class MetricsRow:
    """A ``metrics.jsonl`` line as read (``MetricsLine``): ``None`` for a value the line lacks."""

    t_unix_s: float
    ok: bool
    error: str | None = None
    kv_cache_usage: float | None = None
    num_requests_running: int | None = None
    num_requests_waiting: int | None = None
    num_preemptions_total: int | None = None
    preemptions_delta: int | None = None
    prompt_tokens_total: int | None = None
    prompt_tokens_delta: int | None = None
    generation_tokens_total: int | None = None
    generation_tokens_delta: int | None = None
    admission_rejections_total: int | None = None
    prefix_cache_queries_total: int | None = None
    prefix_cache_hits_total: int | None = None
    e2e_latency_seconds_sum: float | None = None
    inference_seconds_sum: float | None = None
    queue_seconds_sum: float | None = None
    restarted: bool = False
    scrape_ms: float | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> MetricsRow | None:
        """One line (or a live scrape's record) as a row; ``None`` without a finite ``t_unix_s``."""
        t_unix_s = as_float(obj.get("t_unix_s"))
        if t_unix_s is None:
            return None
        return cls(
            t_unix_s=t_unix_s,
            ok=bool(obj.get("ok")),
            error=as_str(obj.get("error")),
            kv_cache_usage=as_share(obj.get("kv_cache_usage")),
            num_requests_running=as_tally(obj.get("num_requests_running")),
            num_requests_waiting=as_tally(obj.get("num_requests_waiting")),
            num_preemptions_total=as_tally(obj.get("num_preemptions_total")),
            preemptions_delta=as_tally(obj.get("preemptions_delta")),
            prompt_tokens_total=as_tally(obj.get("prompt_tokens_total")),
            prompt_tokens_delta=as_tally(obj.get("prompt_tokens_delta")),
            generation_tokens_total=as_tally(obj.get("generation_tokens_total")),
            generation_tokens_delta=as_tally(obj.get("generation_tokens_delta")),
            admission_rejections_total=as_tally(obj.get("admission_rejections_total")),
            prefix_cache_queries_total=as_tally(obj.get("prefix_cache_queries_total")),
            prefix_cache_hits_total=as_tally(obj.get("prefix_cache_hits_total")),
            e2e_latency_seconds_sum=as_tally_float(obj.get("e2e_latency_seconds_sum")),
            inference_seconds_sum=as_tally_float(obj.get("inference_seconds_sum")),
            queue_seconds_sum=as_tally_float(obj.get("queue_seconds_sum")),
            restarted=bool(obj.get("restarted")),
            scrape_ms=as_float(obj.get("scrape_ms")),
        )


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One process of a GPU sample as read: its pid and the device memory it holds (``None``: unknown)."""

    pid: int | None
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuSampleRow:
    """A ``gpu.jsonl`` line as read (written as ``oomload.telemetry.gpu_sample.GpuSampleJson``).

    ``processes`` is ``None`` when the source cannot tell (``null``, or no such field), ``()`` when it
    saw none (the death rule's "vanished from later samples" counts only samples that listed them)."""

    t_unix_s: float
    source: str | None = None
    device: int | None = None
    total_bytes: int | None = None
    used_bytes: int | None = None
    free_bytes: int | None = None
    util_pct: float | None = None
    processes: tuple[ProcessRow, ...] | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> GpuSampleRow | None:
        """One line as a sample; ``None`` without a finite ``t_unix_s`` (entries that are not objects
        are left out of ``processes``)."""
        t_unix_s = as_float(obj.get("t_unix_s"))
        if t_unix_s is None:
            return None
        listed = obj.get("processes")
        processes = (
            tuple(
                ProcessRow(pid=as_int(p.get("pid")), used_bytes=as_int(p.get("used_bytes")))
                for p in listed
                if isinstance(p, Mapping)
            )
            if isinstance(listed, list)
            else None
        )
        return cls(
            t_unix_s=t_unix_s,
            source=as_str(obj.get("source")),
            device=as_int(obj.get("device")),
            total_bytes=as_int(obj.get("total_bytes")),
            used_bytes=as_int(obj.get("used_bytes")),
            free_bytes=as_int(obj.get("free_bytes")),
            util_pct=as_float(obj.get("util_pct")),
            processes=processes,
        )


EVENT_TEXT_FIELDS = ("evidence", "detail", "reason", "error")


@dataclass(frozen=True, slots=True)
class EventRow:
    """An ``events.jsonl`` line as read: ``{"t_unix_s", "kind", "step"?, …}`` (``RunWriter.event``).

    ``text`` holds the event's explanation fields (``EVENT_TEXT_FIELDS``, in that order) that are
    set, as text; ``fields`` is the whole line, for the kind-specific extras a report shows."""

    t_unix_s: float
    kind: str | None
    step: int | None = None
    text: tuple[str, ...] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EventRow | None:
        """One line as an event; ``None`` without a finite ``t_unix_s``."""
        t_unix_s = as_float(obj.get("t_unix_s"))
        if t_unix_s is None:
            return None
        return cls(
            t_unix_s=t_unix_s,
            kind=as_str(obj.get("kind")),
            step=as_int(obj.get("step")),
            text=tuple(str(obj[k]) for k in EVENT_TEXT_FIELDS if obj.get(k)),
            fields=dict(obj),
        )


@dataclass(frozen=True, slots=True)
class StepBoundary:
    """One step as ``steps.jsonl`` records it (``cut_short``: no end, or an end in ``CUT_SHORT_REASONS``)."""

    index: int
    concurrency: int
    phase: str
    start_unix_s: float
    end_unix_s: float | None = None
    end_reason: str | None = None
    # from the end line: requests the step started (each is written to ``requests*.jsonl``, cancelled
    # if it never ended), those that ended (not cancelled) while it held, their completion tokens, and
    # how long it held (``None`` without an end line, or from an older run directory)
    started: int | None = None
    ended: int | None = None
    completion_tokens: int | None = None
    duration_s: float | None = None
    evidence_requests: int | None = None  # requests the trace's odds asked a clean step to send
    extended_s: float | None = None  # how long the step ran past its hold for that evidence
    loadgen: tuple[LoadgenRow, ...] = ()  # each load-generating process's view of itself

    @property
    def cut_short(self) -> bool:
        return self.end_unix_s is None or self.end_reason in CUT_SHORT_REASONS


@dataclass(frozen=True, slots=True)
class PrefixSetting:
    """``config.json``'s ``prefix``: the prompt shape the replay sent (``mode`` ``shared``: the trace's
    ``hash_ids`` as identical token blocks of ``block_tokens``; ``distinct``: every prompt its own)."""

    mode: str | None = None
    block_tokens: int | None = None
    why_distinct: str | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PrefixSetting:
        block_tokens, why = obj.get("block_tokens"), obj.get("why_distinct")
        return cls(
            mode=as_str(obj.get("mode")),
            block_tokens=block_tokens
            if isinstance(block_tokens, int) and not isinstance(block_tokens, bool)
            else None,
            why_distinct=why if isinstance(why, str) else None,
        )


@dataclass(frozen=True, slots=True)
class RunConfig:
    """The fields of ``config.json`` the verdict reads (``None``: absent, or not of the field's kind).

    ``config.json`` holds more (argv, schedule, worker options …); reports that show all of it read the
    raw object (``RunView.config``)."""

    model: str | None = None
    serve_args: tuple[str, ...] = ()  # what ``vllm serve`` was given for the model (``load.preflight``)
    url: str | None = None
    simulated: bool | None = None  # the server was oomload's own simulator
    trace_path: str | None = None
    started_unix_s: float | None = None
    max_model_len: int | None = None  # from /v1/models
    tail_percentile: float | None = None
    only_fitting: bool = False  # --only-fitting: the trace's requests over max_model_len were not sent
    open_loop: bool = False
    soak_s: float | None = None  # --soak: one level held this long to watch memory's trend
    min_requests: int | None = None  # ``schedule.min_requests``: the evidence a clean level needs
    prompt_shape: str = "worst-case"  # prompts sent: "production" (the trace's shared prefixes) or not
    prefix: PrefixSetting | None = None  # ``prefix`` (None: a run written before it was recorded)
    order: str = "trace"  # the replay's order: "trace" (passes over the trace) or a sample
    api: str = "completions"  # "chat": calibrated text over /v1/chat/completions
    exact_output: bool = True  # False: --no-exact-output, the model ends its outputs

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RunConfig:
        simulated = obj.get("simulated")
        schedule = obj.get("schedule")
        prefix = obj.get("prefix")
        return cls(
            prompt_shape=_prompt_shape(obj),
            model=as_str(obj.get("model")),
            serve_args=_strings(obj.get("serve_args")),
            url=as_str(obj.get("url")),
            simulated=simulated if isinstance(simulated, bool) else None,
            trace_path=as_str(obj.get("trace_path")),
            started_unix_s=as_float(obj.get("started_unix_s")),
            max_model_len=as_count(obj.get("max_model_len")),
            tail_percentile=_percentile(obj.get("tail_percentile")),
            only_fitting=obj.get("only_fitting") is True,
            open_loop=obj.get("open_loop") is True,
            soak_s=as_float(obj.get("soak_s")),
            min_requests=as_int(schedule.get("min_requests")) if isinstance(schedule, Mapping) else None,
            prefix=PrefixSetting.from_json(prefix) if isinstance(prefix, Mapping) and prefix else None,
            order=str(obj.get("order", "trace")),
            api="chat" if obj.get("api") == "chat" else "completions",
            exact_output=obj.get("exact_output") is not False,
        )


def _prompt_shape(obj: Mapping[str, Any]) -> str:
    """Which prompts the replay sent: ``prefix.mode`` (``shared``/``distinct``) when written, else
    ``prompt_shape``, else from ``distinct_prompts`` or
    ``prefix_sharing`` (runs written before the shape had its own key); the worst case when none says."""
    prefix = obj.get("prefix")
    if isinstance(prefix, Mapping) and prefix.get("mode") in ("shared", "distinct"):
        return "production" if prefix["mode"] == "shared" else "worst-case"
    shape = obj.get("prompt_shape")
    if shape in ("production", "worst-case"):
        return str(shape)
    if isinstance(obj.get("distinct_prompts"), bool):
        return "worst-case" if obj["distinct_prompts"] else "production"
    return "production" if obj.get("prefix_sharing") is True else "worst-case"


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The fields of ``cache_config.json`` (vLLM's ``cache_config_info`` labels, plus ``max_model_len``
    when the poller knew it) that the verdict and its recommendation read; ``None``: not reported."""

    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None  # a bool, or the label's text "True"/"False"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CacheConfig:
        caching = obj.get("enable_prefix_caching")
        if isinstance(caching, str) and caching in ("True", "False"):
            caching = caching == "True"
        return cls(
            enable_prefix_caching=caching if isinstance(caching, bool) else None,
            num_gpu_blocks=as_count(obj.get("num_gpu_blocks")),
            block_size=as_count(obj.get("block_size")),
            kv_cache_size_tokens=as_count(obj.get("kv_cache_size_tokens"), MAX_COUNT**2),
            gpu_memory_utilization=as_float(obj.get("gpu_memory_utilization")),
            max_num_batched_tokens=as_count(obj.get("max_num_batched_tokens")),
            max_model_len=as_count(obj.get("max_model_len")),
        )


@dataclass(frozen=True, slots=True)
class RunStatus:
    """``status.json`` as read: how the run ended."""

    finished: bool
    end_reason: str | None
    ended_unix_s: float | None


def parse_status(obj: Mapping[str, Any] | None) -> RunStatus | None:
    """``status.json``'s object as a ``RunStatus`` (``None``: no status, the run was cut short)."""
    if obj is None:
        return None
    return RunStatus(
        finished=bool(obj.get("finished")),
        end_reason=as_str(obj.get("end_reason")),
        ended_unix_s=as_float(obj.get("ended_unix_s")),
    )


@dataclass(frozen=True, slots=True)
class StepLine:
    """One ``steps.jsonl`` line as read: a step's ``start`` or ``end`` (``StepStartLine``/``StepEndLine``;
    the end's counts are ``None`` on a start line, or when an older run directory lacks them)."""

    event: Literal["start", "end"]
    step: int
    t_unix_s: float
    concurrency: int = 0
    phase: str = "ramp"
    reason: str | None = None
    started: int | None = None
    ended: int | None = None
    completion_tokens: int | None = None
    duration_s: float | None = None
    evidence_requests: int | None = None
    extended_s: float | None = None
    loadgen: tuple[LoadgenRow, ...] = ()

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> StepLine | None:
        """One line; ``None`` without an integer step, a finite time or an event ``start``/``end``."""
        step, t_unix_s, event = obj.get("step"), as_float(obj.get("t_unix_s")), obj.get("event")
        if not isinstance(step, int) or t_unix_s is None or event not in ("start", "end"):
            return None
        return cls(
            event="start" if event == "start" else "end",
            step=step,
            t_unix_s=t_unix_s,
            concurrency=as_int(obj.get("concurrency")) or 0,
            phase=str(obj.get("phase", "ramp")),
            reason=as_str(obj.get("reason")),
            started=as_int(obj.get("started")),
            ended=as_int(obj.get("ended")),
            completion_tokens=as_int(obj.get("completion_tokens")),
            duration_s=as_float(obj.get("duration_s")),
            evidence_requests=as_int(obj.get("evidence_requests")),
            extended_s=as_float(obj.get("extended_s")),
            loadgen=parse_loadgen(obj.get("loadgen")),
        )


def step_boundary(start: StepLine, end: StepLine | None) -> StepBoundary:
    """A step's boundary from its start line and, once the step ended, its end line."""
    return StepBoundary(
        index=start.step,
        concurrency=start.concurrency,
        phase=start.phase,
        start_unix_s=start.t_unix_s,
        end_unix_s=None if end is None else end.t_unix_s,
        end_reason=None if end is None else end.reason,
        started=None if end is None else end.started,
        ended=None if end is None else end.ended,
        completion_tokens=None if end is None else end.completion_tokens,
        duration_s=None if end is None else end.duration_s,
        evidence_requests=None if end is None else end.evidence_requests,
        extended_s=None if end is None else end.extended_s,
        loadgen=() if end is None else end.loadgen,
    )


class StepLines:
    """``steps.jsonl`` read so far, paired into boundaries (the first start and the last end win);
    lines may arrive in any number of ``add`` calls (the live feed reads the file as it grows)."""

    def __init__(self) -> None:
        self.starts: dict[int, StepLine] = {}
        self.ends: dict[int, StepLine] = {}

    def add(self, lines: Iterable[Mapping[str, Any]]) -> None:
        for line in filter(None, map(StepLine.from_json, lines)):
            if line.event == "start":
                self.starts.setdefault(line.step, line)
            else:
                self.ends[line.step] = line

    def boundaries(self) -> list[StepBoundary]:
        """Every started step, ordered by start time (an end without its start waits for it)."""
        boundaries = [step_boundary(start, self.ends.get(i)) for i, start in self.starts.items()]
        boundaries.sort(key=lambda b: (b.start_unix_s, b.index))
        return boundaries


def parse_step_lines(lines: Iterable[Mapping[str, Any]]) -> list[StepBoundary]:
    """Pair ``start`` / ``end`` lines of ``steps.jsonl`` into boundaries, ordered by start time (a line
    without an integer step or a finite time is skipped; the first start and the last end win)."""
    paired = StepLines()
    paired.add(lines)
    return paired.boundaries()


def as_float(value: Any) -> float | None:
    """A finite JSON number as ``float``; ``None`` for anything else (bools, NaN and ±inf included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def as_int(value: Any) -> int | None:
    """A finite JSON number as ``int`` (truncated); ``None`` for anything else (bools included)."""
    number = as_float(value)
    return None if number is None else int(value)


def as_share(value: Any) -> float | None:
    """``as_float`` of a fraction a server reports, ``None`` outside 0–1 (a KV usage of 7.5 is no
    server's: ``oomload.telemetry.vllm_metrics`` leaves such a sample out, and so does the reader)."""
    number = as_float(value)
    return number if number is not None and 0.0 <= number <= 1.0 else None


def as_tally_float(value: Any) -> float | None:
    """``as_float`` of a gauge, counter or sum a server reports, ``None`` below 0."""
    number = as_float(value)
    return number if number is not None and number >= 0.0 else None


def as_tally(value: Any) -> int | None:
    """``as_int`` of a gauge, counter or delta a server reports, ``None`` below 0 (waiting −3)."""
    number = as_int(value)
    return number if number is not None and number >= 0 else None


MAX_COUNT = 2**31  # a pool's blocks, a block's tokens, a length: more is no server's (a file edited by hand)


def as_count(value: Any, limit: int = MAX_COUNT) -> int | None:
    """``as_int`` of a count a server reports, ``None`` unless it is 1 to ``limit``: a value no server
    has (0, negative, ``1e308``) would break the arithmetic built on it."""
    number = as_int(value)
    return number if number is not None and 1 <= number <= limit else None


def _percentile(value: Any) -> float | None:
    """A percentile of ``(0, 100]``, ``None`` for anything else."""
    number = as_float(value)
    return number if number is not None and 0 < number <= 100 else None


def as_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _strings(value: Any) -> tuple[str, ...]:
    """A JSON list of strings as a tuple; ``()`` for anything else."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return ()
    return tuple(value)


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
