"""The run's metadata block: what was replayed, how, against what — one labelled row each.

Read from the run directory as recorded (``config.json``, ``cache_config.json``, ``status.json``,
the GPU samples and the trace's lengths); a value that was not recorded reads ``not recorded``
(older run directories, plain-Locust runs) rather than a guess. The server's flags are those vLLM
reports itself (``vllm:cache_config_info`` plus the served ``max_model_len``), not the ones a user
may believe were passed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from oomload import __version__
from oomload.rundir.records import EventRow, GpuSampleRow, RunStatus, as_float, as_int
from oomload.trace.stats import LengthSummary
from oomload.verdict import Verdict
from oomload.verdict.confidence import lost_worker
from oomload.verdict.runinfo import sim_line
from oomload.verdict.runview import RunView

NOT_RECORDED = "not recorded"
# cache_config_info fields worth a reader's eye, in this order (others stay in cache_config.json)
SERVER_FLAGS = (
    "block_size",
    "num_gpu_blocks",
    "gpu_memory_utilization",
    "cache_dtype",
    "enable_prefix_caching",
    "kv_cache_size_tokens",
    "num_cpu_blocks",
)


def run_metadata(view: RunView, verdict: Verdict) -> list[tuple[str, str]]:
    """``(label, text)`` rows of the run block (module docstring)."""
    cfg = view.config
    schedule = cfg.get("schedule") if isinstance(cfg.get("schedule"), Mapping) else {}
    assert isinstance(schedule, Mapping)
    rows: list[tuple[str, str]] = []
    trace = str(cfg.get("trace_path") or NOT_RECORDED)
    rows.append(("trace", f"{trace} · {_trace_stats(verdict)}"))
    levels = schedule.get("levels")
    rows.append(
        ("levels", ", ".join(map(str, levels)) if isinstance(levels, list) and levels else NOT_RECORDED)
    )
    rows.append(("schedule", _schedule_text(schedule, cfg)))
    seed, order = cfg.get("seed"), cfg.get("order")
    rows.append(
        ("order and seed", NOT_RECORDED if order is None and seed is None else f"order {order} · seed {seed}")
    )
    rows.append(("date", _dates(cfg, view.status)))
    if as_int(cfg.get("workers")):
        rows.append(("load generators", _workers_text(cfg, view.events)))
    recorded = cfg.get("oomload_version")
    versions = f"oomload {recorded or NOT_RECORDED} (this report: {__version__})"
    vllm = cfg.get("vllm_version")
    if vllm and verdict.run.simulated:
        versions += f" · vLLM {vllm} (as the simulator reports it)"
    elif vllm:
        versions += f" · vLLM {vllm}"
    else:
        versions += " · vLLM version not reported (no GET /version)"
    rows.append(("versions", versions))
    target = f"{verdict.run.model or '?'} at {verdict.run.url or '?'}"
    if verdict.run.simulated:
        sim = sim_line(cfg)
        target += " · SIMULATED vLLM" + (f" ({sim})" if sim else "")
    rows.append(("model and server", target))
    rows.append(("server flags (as reported)", _server_flags(verdict)))
    rows.append(("GPU", _gpu_text(view.gpu)))
    return rows


def _workers_text(cfg: Mapping[str, Any], events: Sequence[EventRow]) -> str:
    """A distributed run: the master's workers, and each one lost during the run, by name."""
    workers, local = as_int(cfg.get("workers")) or 0, as_int(cfg.get("processes")) or 0
    text = f"Locust master + {workers} workers ({min(local, workers)} local)"
    for row in events:
        event = row.fields  # a worker_lost event's extras, shown as written
        if row.kind == "worker_lost":
            text += (
                f" · {lost_worker(row)} lost: {event.get('detail')}; "
                f"{event.get('rows_received')} results received, {event.get('workers_left')} workers left"
            )
        elif row.kind == "link_rejected_total" and isinstance(event.get("counts"), Mapping):
            counts = {str(k): as_int(v) or 0 for k, v in event["counts"].items()}
            text += (
                f" · {sum(counts.values())} messages dropped on the worker port ("
                + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
                + ")"
            )
    return text


def _trace_stats(verdict: Verdict) -> str:
    parts = []
    for name, summary in (
        ("prompt", verdict.trace_prompt),
        ("output", verdict.trace_output),
        ("total", verdict.trace_total),
    ):
        if summary is not None:
            parts.append(f"{name} {_lengths(summary)}")
    if not parts:
        return "no lengths (the run directory holds no readable trace)"
    count = verdict.trace_total.count if verdict.trace_total is not None else 0
    return f"{count} requests · " + " · ".join(parts) + " tokens"


def _lengths(s: LengthSummary) -> str:
    return f"P50 {s.p50:.0f} / P99 {s.p99:.0f} / max {s.max:.0f}"


def _schedule_text(schedule: Mapping[str, Any], cfg: Mapping[str, Any]) -> str:
    if not schedule:
        return NOT_RECORDED
    parts = [f"hold {schedule.get('hold_s', '?')} s per step"]
    if as_int(schedule.get("min_requests")):
        parts.append(f"at least {schedule['min_requests']} requests per step")
    if as_float(schedule.get("warmup_s")):
        parts.append(f"warmup {schedule['warmup_s']} s")
    if "refine" in schedule:
        parts.append("refinement on" if schedule.get("refine") else "no refinement")
    stop_on = cfg.get("stop_on")
    if isinstance(stop_on, list) and stop_on:
        parts.append("stop on " + ", ".join(map(str, stop_on)))
    if cfg.get("max_duration_s") is not None:
        parts.append(f"at most {cfg['max_duration_s']} s")
    if cfg.get("open_loop"):
        parts.append(f"open loop (arrival times × {cfg.get('arrival_scale', 1)})")
    return " · ".join(parts)


def _dates(cfg: Mapping[str, Any], status: RunStatus | None) -> str:
    started = as_float(cfg.get("started_unix_s"))
    ended = None if status is None else status.ended_unix_s
    if started is None:
        return NOT_RECORDED
    text = _utc(started)
    if ended is not None and ended >= started:
        text += f" → {_utc(ended)} ({ended - started:.0f} s)"
    return text


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _server_flags(verdict: Verdict) -> str:
    cache = verdict.run.cache_config or {}
    parts = [] if verdict.run.max_model_len is None else [f"max_model_len {verdict.run.max_model_len}"]
    parts += [f"{key} {cache[key]}" for key in SERVER_FLAGS if cache.get(key) is not None]
    return " · ".join(parts) if parts else NOT_RECORDED + " (no /metrics cache_config_info)"


def _gpu_text(gpu: Sequence[GpuSampleRow]) -> str:
    totals = [t for t in (g.total_bytes for g in gpu) if t]
    if not totals:
        return "not sampled"
    devices = {g.device for g in gpu}
    sources = sorted({g.source for g in gpu if g.source})
    count = f"{len(devices)} devices, " if len(devices) > 1 else ""
    return f"{count}{max(totals) / 2**30:.1f} GiB device memory (sampled via {', '.join(sources) or '?'})"
