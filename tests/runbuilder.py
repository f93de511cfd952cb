"""Hand-built run directories for the verdict/report tests, written through the real ``RunWriter``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oomload.outcome import Outcome, RequestResult
from oomload.rundir import RunWriter
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

T0 = 1_700_000_000.0
GIB = 2**30


@dataclass
class StepSpec:
    concurrency: int
    preemptions: int = 0
    kv_max: float = 0.5
    waiting_max: int = 0
    requests: int = 12
    failures: Mapping[Outcome, int] = field(default_factory=dict)
    phase: str = "ramp"
    cut_short: bool = False
    end_reason: str = "hold_done"
    duration_s: float = 10.0
    scrapes: int = 5  # 0: no successful /metrics scrape in this step
    peak_scrapes: int = 2  # consecutive scrapes showing kv_max / waiting_max (sustained from 2 on)
    ttft_ms: float = 50.0
    unknown_step: bool = False  # write requests with step = -1
    in_flight: int | None = None  # requests overlapping at once (default: the concurrency)
    used_bytes: int = 70 * GIB
    error_text: str | None = None
    prompt_tokens: int = 256  # asked by every request of the step
    output_tokens: int = 256
    # vLLM's share of the client's seconds for the requests that end in this step: when set (in any
    # step), every scrape carries the latency sums (``e2e_latency_seconds_sum`` …) accordingly
    server_share: float | None = None
    queued_share: float = 0.1  # the share of those seconds vLLM counts as queued (queue_seconds_sum)
    end_extra: Mapping[str, Any] = field(default_factory=dict)  # more fields for the step's end line


def write_run(
    path: Path,
    steps: Sequence[StepSpec],
    *,
    cache_config: Mapping[str, Any] | None = None,
    lengths: Sequence[tuple[int, int]] = ((256, 256),) * 20,
    status: Mapping[str, Any] | None = None,
    no_status: bool = False,
    config: Mapping[str, Any] | None = None,
    gpu: bool = True,
    events: Sequence[Mapping[str, Any]] = (),
    server_pid_vanishes_after: int | None = None,
    extra_requests: Sequence[RequestResult] = (),
    odds: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Write a complete run directory; returns ``path``.

    Steps run back to back from ``T0`` (step *i* from ``T0 + sum of earlier durations``);
    ``extra_requests`` are written as given, for hand-placed scenarios (deaths, cancellations).
    """
    path.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = {
        "schema": 1,
        "oomload_version": "0.1.0",
        "started_unix_s": T0,
        "argv": ["oomload", "replay"],
        "trace_path": "trace.jsonl",
        "trace_count": len(lengths),
        "url": "http://127.0.0.1:8000",
        "simulated": True,
        "model": "tiny-model",
        "api": "completions",
        "stream": True,
        "schedule": {"levels": [s.concurrency for s in steps], "hold_s": 10, "min_requests": 3},
        "max_model_len": 4096,
        "gates": [],
    }
    cfg.update(config or {})
    t = T0
    counter = 0
    sums = any(spec.server_share is not None for spec in steps)
    # (end, server seconds, queued seconds) of every answered request so far
    server_s: list[tuple[float, float, float]] = []
    with RunWriter(path) as w:
        w.write_json("config.json", cfg)
        if cache_config is not None:
            w.write_json("cache_config.json", dict(cache_config))
        write_trace(
            path / "trace.jsonl",
            [
                TraceRecord(id=f"t{i}", arrival_s=float(i), prompt_tokens=p, output_tokens=o)
                for i, (p, o) in enumerate(lengths)
            ],
            TraceHeader(source=("test",)),
        )
        w.append("metrics", _scrape(t - 0.5, counter, 0, 0.0, 0, 0, (0.0, 0.0) if sums else None))
        for index, spec in enumerate(steps):
            start = t
            if sums and index > 0:  # the boundary scrape that closes one step and opens the next
                seconds = _sums(server_s, start)
                w.append("metrics", _scrape(start - 1e-6, counter, 0, 0.0, 0, 0, seconds))
            w.append(
                "steps",
                {
                    "event": "start",
                    "step": index,
                    "concurrency": spec.concurrency,
                    "phase": spec.phase,
                    "t_unix_s": start,
                },
            )
            share = 1.0 if spec.server_share is None else spec.server_share
            server_s += [
                (end, e2e_s * share, e2e_s * share * spec.queued_share)
                for end, e2e_s in _write_requests(w, index, spec, start)
            ]
            for k in range(spec.scrapes):
                ts = start + spec.duration_s * (k + 1) / (spec.scrapes + 1)
                delta = spec.preemptions if k == spec.scrapes // 2 else 0
                counter += delta
                at_peak = spec.scrapes // 2 <= k < spec.scrapes // 2 + spec.peak_scrapes
                kv = spec.kv_max if at_peak else spec.kv_max * 0.8
                waiting = spec.waiting_max if at_peak else 0
                seconds = _sums(server_s, ts) if sums else None
                running = min(spec.concurrency, 8)
                w.append("metrics", _scrape(ts, counter, delta, kv, running, waiting, seconds))
            if spec.scrapes == 0:
                w.append("metrics", {"t_unix_s": start + 1, "ok": False, "error": "timeout"})
            if gpu:
                for k in range(3):
                    alive = server_pid_vanishes_after is None or index <= server_pid_vanishes_after
                    w.append(
                        "gpu",
                        {
                            "t_unix_s": start + spec.duration_s * (k + 1) / 4,
                            "source": "nvml",
                            "device": 0,
                            "total_bytes": 80 * GIB,
                            "used_bytes": spec.used_bytes if alive else GIB,
                            "free_bytes": 80 * GIB - (spec.used_bytes if alive else GIB),
                            "util_pct": 90,
                            "processes": [{"pid": 4242, "used_bytes": spec.used_bytes}] if alive else [],
                        },
                    )
            t = start + spec.duration_s
            if spec.cut_short:
                break
            w.append(
                "steps",
                {
                    "event": "end",
                    "step": index,
                    "concurrency": spec.concurrency,
                    "phase": spec.phase,
                    "t_unix_s": t,
                    "reason": spec.end_reason,
                    **spec.end_extra,
                },
            )
        for request in extra_requests:
            w.request(request)
        for line in odds:
            w.append("odds", dict(line))
        for event in events:
            w.event(str(event["kind"]), **{k: v for k, v in event.items() if k != "kind"})
        if not no_status:
            w.write_json(
                "status.json",
                dict(status or {"finished": True, "end_reason": "completed", "ended_unix_s": t}),
            )
    return path


def _write_requests(w: RunWriter, index: int, spec: StepSpec, start: float) -> list[tuple[float, float]]:
    """Write the step's requests; returns (end, e2e seconds) of the answered ones."""
    answered: list[tuple[float, float]] = []
    failures = [o for o, n in spec.failures.items() for _ in range(n)]
    in_flight = spec.in_flight or spec.concurrency
    per_slot = max(-(-spec.requests // in_flight), 1)
    duration = spec.duration_s / per_slot
    for i in range(spec.requests):
        slot, turn = i % in_flight, i // in_flight
        s = start + turn * duration + 0.001 * slot
        e = s + duration * 0.999
        if spec.cut_short and e > start + spec.duration_s:
            continue
        outcome = failures[i] if i < len(failures) else Outcome.OK
        ok = outcome is Outcome.OK
        if ok:
            answered.append((e, e - s))
        w.request(
            RequestResult(
                request_id=f"s{index}-r{i}",
                step=-1 if spec.unknown_step else index,
                concurrency=spec.concurrency,
                start_unix_s=s,
                end_unix_s=e,
                outcome=outcome,
                prompt_tokens_asked=spec.prompt_tokens,
                output_tokens_asked=spec.output_tokens,
                usage_prompt_tokens=spec.prompt_tokens if ok else None,
                usage_completion_tokens=spec.output_tokens
                if ok
                else (spec.output_tokens // 2 if outcome is Outcome.TRUNCATED else None),
                ttft_ms=spec.ttft_ms * (1 + i % 5) if ok else None,
                tpot_ms=10.0 if ok else None,
                e2e_ms=(e - s) * 1000 if ok else None,
                http_status=200 if ok else _http_status(outcome),
                error=None if ok else (spec.error_text or outcome.value),
            )
        )
    return answered


def _http_status(outcome: Outcome) -> int | None:
    if outcome in (Outcome.CANCELLED, Outcome.TRANSPORT_ERROR, Outcome.TIMEOUT):
        return None
    return {Outcome.ENGINE_DEAD: 500, Outcome.RATE_LIMITED: 429}.get(outcome, 400)


def request(
    rid: str,
    step: int,
    concurrency: int,
    start_s: float,
    end_s: float,
    outcome: Outcome = Outcome.OK,
    *,
    prompt_tokens: int = 256,
    output_tokens: int = 256,
) -> RequestResult:
    """One hand-placed request, times in seconds after ``T0``."""
    ok = outcome is Outcome.OK
    return RequestResult(
        request_id=rid,
        step=step,
        concurrency=concurrency,
        start_unix_s=T0 + start_s,
        end_unix_s=T0 + end_s,
        outcome=outcome,
        prompt_tokens_asked=prompt_tokens,
        output_tokens_asked=output_tokens,
        usage_completion_tokens=256 if ok else None,
        ttft_ms=40.0 if ok else None,
        tpot_ms=0.4 if ok else None,
        e2e_ms=(end_s - start_s) * 1000 if ok else None,
        http_status=200 if ok else _http_status(outcome),
        error=None if ok else outcome.value,
    )


def _sums(server_s: Sequence[tuple[float, float, float]], t: float) -> tuple[float, float]:
    """(server seconds, queued seconds) of the requests answered by ``t``: what vLLM's sums hold then."""
    return sum(x for end, x, _ in server_s if end <= t), sum(q for end, _, q in server_s if end <= t)


def _scrape(
    t: float,
    counter: int,
    delta: int,
    kv: float,
    running: int,
    waiting: int,
    sums_s: tuple[float, float] | None = None,
) -> dict[str, Any]:
    sums = {} if sums_s is None else {
        "e2e_latency_seconds_sum": sums_s[0],
        "inference_seconds_sum": sums_s[0] - sums_s[1],
        "queue_seconds_sum": sums_s[1],
    }  # fmt: skip
    return {
        **sums,
        "t_unix_s": t,
        "ok": True,
        "kv_cache_usage": kv,
        "num_requests_running": running,
        "num_requests_waiting": waiting,
        "num_preemptions_total": counter,
        "preemptions_delta": delta,
        "prompt_tokens_total": 0,
        "generation_tokens_total": 0,
        "admission_rejections_total": 0,
        "restarted": False,
    }


CPU_CACHE = {
    "num_gpu_blocks": 96,
    "block_size": 32,
    "kv_cache_size_tokens": 3072,
    "gpu_memory_utilization": 0.9,
}


def cpu_knee_steps() -> list[StepSpec]:
    """The finer grid measured on real CPU vLLM (reference vllm-cpu.md §6): onset at 6."""
    table = [(1, 0, 0.17, 0), (2, 0, 0.27, 0), (4, 0, 0.59, 0), (5, 0, 0.68, 0), (6, 2, 1.0, 1),
             (7, 4, 1.0, 2), (8, 3, 0.88, 3), (12, 25, 0.98, 7), (16, 32, 0.97, 10)]  # fmt: skip
    return [StepSpec(c, preemptions=p, kv_max=kv, waiting_max=w, requests=3 * c) for c, p, kv, w in table]
