"""``summary.json`` read back: the verdict's values a program acts on, as typed values (pure).

``read_summary(path)`` / ``summary_from_doc(doc)`` give a ``Summary``: the onsets, the last safe
level, the KV pool, each step (latency percentiles, throughput, whether it held its level and how —
the client's delivered concurrency, vLLM's most running requests, its waiting queue, the server's
own mean in the engine, a starved load generator's figures), the repeats of each level, prefix-cache
hit rate, peak memory, the engine's death and its kind, context overflow, the gate results. A value
the document does not hold is ``None``; keys it does not know are ignored. A file that is not such a
document is ``ConfigError`` (one sentence, exit 2). ``oomload.report.summary`` writes the document
(schema ``SUMMARY_SCHEMA``, docs/report.md); ``oomload compare``, ``report --history`` and ``tune``
read it here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomload.errors import ConfigError
from oomload.rundir.records import as_float, as_int, as_str, max_int

SUMMARY_SCHEMA = "oomload.summary/1"


@dataclass(frozen=True, slots=True)
class Latency:
    """One latency of one step: nearest-rank P50 / P99 over its ok requests (ms; ``None``: none)."""

    count: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Starved:
    """A starved load generator's figures for a step (``oomload.verdict.loadgen.Starvation``)."""

    wait_share: float
    loop_lag_max_ms: float | None
    worker: int | None


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One step as ``summary.json`` records it."""

    index: int
    concurrency: int
    phase: str
    warmup: bool
    after_death: bool
    trusted: bool
    cut_short: bool
    requests: int
    ok: int
    preemptions: int | None  # None: no /metrics scrape covered the step
    evidence_thin: bool  # clean, but fewer requests than the trace's odds ask for
    req_per_s: float | None
    output_tokens_per_s: float | None
    achieved_concurrency: float | None
    ttft: Latency
    tpot: Latency
    e2e: Latency
    kv_usage_max: float | None
    device_used_max_bytes: int | None
    server_process_used_max_bytes: int | None
    end_reason: str | None = None
    mostly_failed: bool = False
    concurrency_held: bool | None = None  # None: not said (an older summary: ``trusted`` stands in)
    delivered_concurrency: float | None = None  # the client's in-flight mean, by its own measure
    running_max: int | None = None  # vLLM's most requests running at once
    waiting_sustained: int = 0  # vLLM's waiting queue over consecutive scrapes
    server_in_engine: float | None = None  # the server's own mean of requests in the engine
    server_queued: float | None = None  # … and waiting in its queue
    starved: Starved | None = None

    @property
    def measured(self) -> bool:
        """Not warmup and not after the engine's death: a step the findings read."""
        return not self.warmup and not self.after_death


@dataclass(frozen=True, slots=True)
class Onset:
    """The preemption onset: its level, the step that first showed it, and the repeats behind it."""

    concurrency: int
    step: int | None
    seen_in: int
    measurements: int


@dataclass(frozen=True, slots=True)
class Death:
    """The engine's death: where, and of what (``kind``: ``oomload.verdict.deathcause.DeathKind``)."""

    concurrency: int | None
    step: int | None
    kind: str | None
    memory: bool
    real_oom: bool


@dataclass(frozen=True, slots=True)
class Pool:
    """The server's KV pool as it reported it (``cache_config_info``)."""

    num_gpu_blocks: int | None
    block_size: int | None
    gpu_memory_utilization: float | None
    kv_cache_size_tokens: int | None


@dataclass(frozen=True, slots=True)
class GateSummary:
    rule: str
    status: str
    reason: str
    observed: float | None
    unit: str | None


@dataclass(frozen=True, slots=True)
class Summary:
    """``summary.json`` as typed values (module docstring)."""

    schema: str
    oomload_version: str
    exit_code: int | None
    model: str | None
    url: str | None
    simulated: bool | None
    cut_short: bool
    cut_short_detail: str | None
    levels: tuple[int, ...]
    steps: tuple[StepSummary, ...]
    preemption_onset: Onset | None
    kv_saturation_onset: int | None
    queueing_onset: int | None
    death: Death | None
    last_safe_concurrency: int | None
    first_unsafe_concurrency: int | None
    max_tested_concurrency: int | None
    pool: Pool | None
    max_model_len: int | None
    prefix_hit_rate: float | None
    expected_prefix_hit_rate: float | None
    server_host_peak_bytes: int | None
    requests_total: int
    requests_ok: int
    requests_failed: int
    error_rate: float | None
    failed_run: str | None
    confidence: str | None
    context_refused: int
    context_clamped: int
    context_model_limit: int | None  # the served max_model_len the overflow was judged against
    gates: tuple[GateSummary, ...]

    @property
    def measured_steps(self) -> tuple[StepSummary, ...]:
        return tuple(s for s in self.steps if s.measured)

    def steps_at(self, concurrency: int) -> tuple[StepSummary, ...]:
        return tuple(s for s in self.measured_steps if s.concurrency == concurrency)

    @property
    def device_used_peak_bytes(self) -> int | None:
        """The most device memory in use in any measured step (``None``: not sampled)."""
        return max_int(s.device_used_max_bytes for s in self.measured_steps)

    @property
    def server_device_peak_bytes(self) -> int | None:
        """The most device memory the server's own process held in any measured step."""
        return max_int(s.server_process_used_max_bytes for s in self.measured_steps)


def read_summary(path: str | Path) -> Summary:
    """A ``summary.json`` (or the run directory holding one) as a ``Summary``; ``ConfigError`` with one
    sentence when it is missing, not JSON, or not an ``oomload.summary/1`` document."""
    target = Path(path)
    if target.is_dir():
        target = target / "summary.json"
    try:
        doc = json.loads(target.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read {target} ({err.strerror or type(err).__name__})") from err
    except ValueError as err:
        raise ConfigError(f"{target} is not valid JSON ({err})") from err
    if not isinstance(doc, dict):
        raise ConfigError(f"{target} is not a summary (a JSON {type(doc).__name__}, not an object)")
    return summary_from_doc(doc, source=str(target))


def summary_from_doc(doc: Mapping[str, Any], *, source: str = "summary.json") -> Summary:
    """The typed values of a ``summary.json`` document (``ConfigError`` for another schema)."""
    schema = doc.get("schema")
    if not isinstance(schema, str) or schema.split("/")[0] != SUMMARY_SCHEMA.split("/")[0]:
        raise ConfigError(
            f"{source} is not an oomload summary (schema {schema!r}, expected {SUMMARY_SCHEMA})"
        )
    if schema != SUMMARY_SCHEMA:
        raise ConfigError(f"{source} has schema {schema}; this oomload reads {SUMMARY_SCHEMA}")
    verdict = _obj(doc.get("verdict"))
    run, onsets = _obj(verdict.get("run")), _obj(verdict.get("onsets"))
    requests, prefix = _obj(verdict.get("requests")), _obj(verdict.get("prefix"))
    overflow = _obj(verdict.get("context_overflow"))
    cache = run.get("cache_config")
    pre, death = onsets.get("preemption"), onsets.get("engine_death")
    kv_sat, queueing = onsets.get("kv_saturation"), onsets.get("queueing")
    memory = _obj(verdict.get("server_memory"))
    return Summary(
        schema=schema,
        oomload_version=str(doc.get("oomload_version") or "?"),
        exit_code=as_int(doc.get("exit_code")),
        model=as_str(run.get("model")),
        url=as_str(run.get("url")),
        simulated=run.get("simulated") if isinstance(run.get("simulated"), bool) else None,
        cut_short=run.get("cut_short") is True,
        cut_short_detail=as_str(run.get("cut_short_detail")),
        levels=tuple(v for v in map(as_int, verdict.get("levels") or ()) if v is not None),
        steps=tuple(_step(s) for s in verdict.get("steps") or () if isinstance(s, Mapping)),
        preemption_onset=None
        if not isinstance(pre, Mapping) or as_int(pre.get("concurrency")) is None
        else Onset(
            concurrency=int(pre["concurrency"]),
            step=as_int(pre.get("step")),
            seen_in=as_int(pre.get("seen_in")) or 1,
            measurements=as_int(pre.get("measurements")) or 1,
        ),
        kv_saturation_onset=as_int(kv_sat.get("concurrency")) if isinstance(kv_sat, Mapping) else None,
        queueing_onset=as_int(queueing.get("concurrency")) if isinstance(queueing, Mapping) else None,
        death=None
        if not isinstance(death, Mapping)
        else Death(
            concurrency=as_int(death.get("concurrency")),
            step=as_int(death.get("step")),
            kind=as_str(death.get("kind")),
            memory=death.get("memory") is True,
            real_oom=death.get("real_oom") is True,
        ),
        last_safe_concurrency=as_int(verdict.get("last_safe_concurrency")),
        first_unsafe_concurrency=as_int(verdict.get("first_unsafe_concurrency")),
        max_tested_concurrency=as_int(verdict.get("max_tested_concurrency")),
        pool=None
        if not isinstance(cache, Mapping)
        else Pool(
            num_gpu_blocks=as_int(cache.get("num_gpu_blocks")),
            block_size=as_int(cache.get("block_size")),
            gpu_memory_utilization=as_float(cache.get("gpu_memory_utilization")),
            kv_cache_size_tokens=as_int(cache.get("kv_cache_size_tokens")),
        ),
        max_model_len=as_int(run.get("max_model_len")),
        prefix_hit_rate=as_float(prefix.get("server_hit_rate")),
        expected_prefix_hit_rate=as_float(prefix.get("expected_hit_rate")),
        server_host_peak_bytes=as_int(memory.get("peak_bytes")),
        requests_total=as_int(requests.get("total")) or 0,
        requests_ok=as_int(requests.get("ok")) or 0,
        requests_failed=as_int(requests.get("failed")) or 0,
        error_rate=as_float(requests.get("error_rate")),
        failed_run=as_str(requests.get("failed_run")),
        confidence=as_str(_obj(verdict.get("confidence")).get("level")),
        context_refused=as_int(overflow.get("refused")) or 0,
        context_clamped=as_int(overflow.get("clamped")) or 0,
        context_model_limit=as_int(overflow.get("model_limit_tokens", overflow.get("model_limit"))),
        gates=tuple(
            GateSummary(
                rule=str(g.get("rule")),
                status=str(g.get("status")),
                reason=str(g.get("reason") or ""),
                observed=as_float(g.get("observed")),
                unit=as_str(g.get("unit")),
            )
            for g in doc.get("gates") or ()
            if isinstance(g, Mapping)
        ),
    )


def _step(obj: Mapping[str, Any]) -> StepSummary:
    outcomes, server, starved = _obj(obj.get("outcomes")), _obj(obj.get("server")), _obj(obj.get("starved"))
    phase = str(obj.get("phase") or "ramp")
    return StepSummary(
        index=as_int(obj.get("index")) or 0,
        concurrency=as_int(obj.get("concurrency")) or 0,
        phase=phase,
        warmup=obj.get("warmup") is True or phase == "warmup",
        after_death=obj.get("after_death") is True,
        trusted=obj.get("trusted") is True,
        cut_short=obj.get("cut_short") is True,
        requests=as_int(obj.get("requests")) or 0,
        ok=as_int(outcomes.get("ok")) or 0,
        preemptions=as_int(obj.get("preemptions")),
        evidence_thin=obj.get("evidence_thin") is True,
        req_per_s=as_float(obj.get("req_per_s")),
        output_tokens_per_s=as_float(obj.get("output_tokens_per_s")),
        achieved_concurrency=as_float(obj.get("achieved_concurrency")),
        ttft=_latency(obj.get("ttft")),
        tpot=_latency(obj.get("tpot")),
        e2e=_latency(obj.get("e2e")),
        kv_usage_max=as_float(obj.get("kv_usage_max")),
        device_used_max_bytes=as_int(obj.get("device_used_max_bytes")),
        server_process_used_max_bytes=as_int(obj.get("server_process_used_max_bytes")),
        end_reason=as_str(obj.get("end_reason")),
        mostly_failed=obj.get("mostly_failed") is True,
        concurrency_held=held if isinstance(held := obj.get("concurrency_held"), bool) else None,
        delivered_concurrency=as_float(obj.get("delivered_concurrency")),
        running_max=as_int(obj.get("running_max")),
        waiting_sustained=as_int(obj.get("waiting_sustained")) or 0,
        server_in_engine=as_float(server.get("in_engine")),
        server_queued=as_float(server.get("queued")),
        starved=None
        if (share := as_float(starved.get("wait_share"))) is None
        else Starved(share, as_float(starved.get("loop_lag_max_ms")), as_int(starved.get("worker"))),
    )


def _latency(obj: Any) -> Latency:
    stats = _obj(obj)
    return Latency(
        count=as_int(stats.get("count")) or 0,
        p50_ms=as_float(stats.get("p50_ms")),
        p99_ms=as_float(stats.get("p99_ms")),
    )


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
