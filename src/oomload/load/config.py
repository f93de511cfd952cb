"""What one replay run is told to do: ``ReplayConfig`` (validated flags), the demo's defaults, and the
JSON forms of a configuration — ``config.json`` in the run directory (no secrets: only the API key's
variable name) and the options a worker process or scenario needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oomload import __version__
from oomload.load.payload import Api, PayloadOptions
from oomload.schedule import DEFAULT_REPEATS, Hold, SchedulePlan, StopCondition
from oomload.trace import TraceRecord

# The demo target: a simulated Llama-3.1-8B on an L4 (device memory as vLLM would use it, served on the
# simulator's /dcgm/metrics) whose KV cache preempts on traces/sample-chat.jsonl within the first few
# steps, fast enough (time scale 0.1) for the whole demo to finish in about a minute.
DEMO_MODEL = "llama-3.1-8b"
DEMO_GPU = "l4"
DEMO_SIM_ARGS: tuple[str, ...] = (
    "--model",
    DEMO_MODEL,
    "--gpu",
    DEMO_GPU,
    "--gpu-memory-utilization",
    "0.8",
    "--max-model-len",
    "8192",
    "--max-num-seqs",
    "64",
    "--time-scale",
    "0.1",
)
DEMO_LEVELS = (1, 2, 4, 8, 16)  # the demo preempts at about 10: the refinement finds it
DEMO_HOLD_S = 4.0
PREFLIGHT_TIMEOUT_S = 30.0
RAMP_DOWN_GRACE_S = 10.0


@dataclass(frozen=True)
class ReplayConfig:
    """Everything one replay needs, validated (``oomload.cli.replay`` builds it from flags)."""

    trace_path: Path
    url: str | None = None
    model: str | None = None
    api: Api = "completions"
    stream: bool = True
    levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    hold_s: float = 30.0
    min_requests: int = 0
    warmup_s: float = 0.0
    refine: bool = True
    repeats: int = DEFAULT_REPEATS  # measurements of each of the two levels bracketing the onset
    evidence: bool = True  # extend a clean step until the trace's odds say it sent enough requests
    stop_on: tuple[StopCondition, ...] = (StopCondition("oom"),)
    max_duration_s: float | None = 1800.0
    order: str = "trace"
    seed: int = 0
    tail_percentile: float | None = None
    open_loop: bool = False
    arrival_scale: float = 1.0
    prefix_sharing: bool = False
    exact_output: bool = True
    token_id_range: tuple[int, int] = (100, 2000)
    api_key_env: str = "OPENAI_API_KEY"
    run_dir: Path | None = None
    runs_parent: Path = Path("runs")
    gates: tuple[str, ...] = ()
    web: bool = False
    web_host: str = "127.0.0.1"
    web_port: int = 8089
    web_keep_s: float | None = None  # after the run, the web UI keeps serving: None = until Ctrl-C
    processes: int = 1
    request_timeout_s: float = 600.0
    ramp_down_grace_s: float = RAMP_DOWN_GRACE_S
    metrics_interval_s: float = 1.0
    gpu: str = "auto"
    require_gpu: bool = False
    sim_args: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    live: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def schedule(self) -> SchedulePlan:
        return SchedulePlan(
            levels=self.levels,
            warmup=self.warmup_s > 0,
            refine=self.refine,
            stop_on=self.stop_on,
            repeats=self.repeats,
        )

    def hold(self) -> Hold:
        return Hold(self.hold_s, self.min_requests)

    def grace_s(self) -> float:
        """How long stopped users may take to finish their request (ramp-down, end of run)."""
        return min(self.ramp_down_grace_s, self.request_timeout_s)

    def payload_options(self, model: str) -> PayloadOptions:
        return PayloadOptions(
            api=self.api,
            model=model,
            stream=self.stream,
            exact_output=self.exact_output,
            prefix_sharing=self.prefix_sharing,
            token_id_low=self.token_id_range[0],
            token_id_high=self.token_id_range[1],
            seed=self.seed,
        )


def preflight_timeout_s(config: ReplayConfig) -> float:
    """How long the preflight waits for ``/v1/models``: 30 s, never more than a request's timeout or
    the run's whole maximum duration."""
    limits = [PREFLIGHT_TIMEOUT_S, config.request_timeout_s]
    if config.max_duration_s is not None:
        limits.append(config.max_duration_s)
    return min(limits)


def sim_flag(args: Sequence[str], flag: str) -> str | None:
    """The value the simulator will use for ``flag`` (the last one given, as argparse does)."""
    value = None
    for k, arg in enumerate(args):
        if arg == flag and k + 1 < len(args):
            value = args[k + 1]
        elif arg.startswith(flag + "="):
            value = arg.partition("=")[2]
    return value


def config_json(
    config: ReplayConfig,
    url: str,
    model: str,
    max_model_len: int | None,
    simulated: bool,
    records: Sequence[TraceRecord],
) -> dict[str, Any]:
    return {
        "schema": 1,
        "oomload_version": __version__,
        "started_unix_s": time.time(),
        "argv": list(config.argv),
        "trace_path": str(config.trace_path),
        "trace_count": len(records),
        "url": url,
        "simulated": simulated,
        "model": model,
        "api": config.api,
        "stream": config.stream,
        "schedule": {
            "levels": list(config.levels),
            "hold_s": config.hold_s,
            "min_requests": config.min_requests,
            "warmup_s": config.warmup_s,
            "refine": config.refine,
            "repeats": config.repeats,
            "evidence": config.evidence,
        },
        "stop_on": [str(c) for c in config.stop_on],
        "max_duration_s": config.max_duration_s,
        "max_model_len": max_model_len,
        "gates": list(config.gates),
        "processes": config.processes,
        "order": config.order,
        "seed": config.seed,
        "tail_percentile": config.tail_percentile,
        "open_loop": config.open_loop,
        "arrival_scale": config.arrival_scale,
        "prefix_sharing": config.prefix_sharing,
        "exact_output": config.exact_output,
        "token_id_range": list(config.token_id_range),
        "request_timeout_s": config.request_timeout_s,
        "ramp_down_grace_s": config.ramp_down_grace_s,
        "api_key_env": config.api_key_env,  # the variable's name, never its value
        "web": config.web,
    }


def config_to_worker_options(config: ReplayConfig, url: str, model: str) -> dict[str, Any]:
    """The JSON-able options a worker process needs (no secrets: the key's variable name only)."""
    return {
        "trace": str(config.trace_path),
        "url": url,
        "model": model,
        "payload": asdict(config.payload_options(model)),
        "order": config.order,
        "seed": config.seed,
        "tail_percentile": config.tail_percentile,
        "request_timeout_s": config.request_timeout_s,
        "api_key_env": config.api_key_env,
        "open_loop": config.open_loop,
        "arrival_scale": config.arrival_scale,
    }
