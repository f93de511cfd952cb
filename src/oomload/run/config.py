"""What one replay run is told to do: ``ReplayConfig`` (validated flags), the demo's defaults, and the
two forms a configuration leaves the process in.

* ``config.json`` in the run directory (``config_json``; no secrets: only the API key's variable name);
* ``LoadOptions``: what every load-generating process needs to send the run's requests — the in-process
  runner, each Locust worker (local or on another host) and the plain ``locust -f`` scenario. It is one
  frozen dataclass with one serialized form (``to_json`` / ``from_json``), the body of the message the
  master sends its workers (``oomload.load.wire``). It holds the API key's variable *name*; each
  process reads the key from its own environment.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from oomload import __version__
from oomload.capacity.schedule import DEFAULT_REPEATS, Hold, SchedulePlan, StopCondition
from oomload.credentials import scrub
from oomload.load.baseurl import BaseUrl
from oomload.load.payload import Api, PayloadOptions
from oomload.realvllm.servecmd import ServeCommand, parse_serve_command
from oomload.trace.model import TraceRecord, read_trace_header

# The demo target: a simulated Llama-3.1-8B on an L4 (device memory as vLLM would use it, served on the
# simulator's /dcgm/metrics) whose KV cache preempts on traces/sample-chat.jsonl within the first few
# steps. Time scale 0.025 and 2 s holds: the onset's level preempts about once per 100 requests on the
# simulator, and the demo measures it at least twice (the majority of its repeats), so the time per request
# decides the demo's time — at 0.1 with 4 s holds one run took 54–104 s, at 0.025 with 2 s holds 41 s (the
# levels around the onset still send 30–120 requests a step; bench_onset_repeat), 33 s once the odds
# skipped decode-only steps and a step ended within 0.2 s of its reason.
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
    "0.025",
)
DEMO_LEVELS = (1, 2, 4, 8, 16)  # the demo preempts at about 10: the refinement finds it
DEMO_HOLD_S = 2.0
PREFLIGHT_TIMEOUT_S = 30.0
RAMP_DOWN_GRACE_S = 10.0
REQUEST_TIMEOUT_S = 600.0  # the one default for a request's limit, from connect to the last byte
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


@dataclass(frozen=True)
class LoadOptions:
    """What a load-generating process needs to send the run's requests, with the run's exact lengths.

    The trace itself is not part of it: the in-process runner and the scenario read it from
    ``trace_path``; a worker gets the trace's lengths from the master (``oomload.load.wire``).
    """

    url: str
    payload: PayloadOptions
    trace_path: str = ""
    order: str = "trace"
    seed: int = 0
    tail_percentile: float | None = None
    only_fitting: bool = False  # send only the requests that fit the server's max_model_len (payload's)
    request_timeout_s: float = REQUEST_TIMEOUT_S
    api_key_env: str = DEFAULT_API_KEY_ENV  # the variable's name, never its value
    open_loop: bool = False
    arrival_scale: float = 1.0

    def to_json(self) -> dict[str, Any]:
        """The one serialized form (JSON types only)."""
        obj = asdict(self)
        obj["payload"] = asdict(self.payload)
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LoadOptions:
        """The inverse of ``to_json``; ``ConfigError`` for a shape this version does not know."""
        from oomload.errors import ConfigError

        known = {f.name for f in fields(cls)}
        try:
            payload = PayloadOptions(**obj["payload"])
            rest = {k: v for k, v in obj.items() if k in known and k != "payload"}
            return cls(payload=payload, **rest)
        except (KeyError, TypeError) as err:
            raise ConfigError(f"load options from the master have an unknown shape ({err})") from err


@dataclass(frozen=True)
class ReplayConfig:
    """Everything one replay needs, validated (``oomload.cli.replay`` builds it from flags)."""

    trace_path: Path
    url: BaseUrl | None = None  # --url, checked (None: the simulator, or --serve's server)
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
    place_levels: bool = False  # the odds place the ramp (schedule.place_levels): default levels only
    stop_on: tuple[StopCondition, ...] = (StopCondition("oom"),)
    max_duration_s: float | None = 1800.0
    order: str = "trace"
    seed: int = 0
    # the run's own prompt tokens (payload's module docstring): a rerun does not hit the last one's cache
    prompt_salt: int = field(default_factory=lambda: secrets.randbits(48))
    tail_percentile: float | None = None
    only_fitting: bool = False  # leave out the trace's requests longer than the server's max_model_len
    open_loop: bool = False
    arrival_scale: float = 1.0
    distinct_prompts: bool = False  # the worst case; by default the trace's shared prefixes are replayed
    prefix_block_tokens: int = 512  # tokens per hash id (the trace header's prefix.block_tokens)
    exact_output: bool = True
    token_id_range: tuple[int, int] = (100, 2000)
    api_key_env: str = DEFAULT_API_KEY_ENV
    run_dir: Path | None = None
    runs_parent: Path = Path("runs")
    gates: tuple[str, ...] = ()
    baseline: Path | None = None  # the run relative gate rules compare with
    web: bool = False
    web_host: str = "127.0.0.1"
    web_port: int = 8089
    web_keep_s: float | None = None  # after the run, the web UI keeps serving: None = until Ctrl-C
    processes: int = 1  # local worker processes (1 and no workers: Locust runs in this process)
    workers: int = 0  # the workers the master waits for, local and remote (0: none, or --processes)
    master_bind_host: str = "127.0.0.1"
    master_bind_port: int | None = None  # None: Locust's 5557 with --workers, a free port otherwise
    worker_timeout_s: float = 60.0  # how long the master waits for its workers to arrive
    request_timeout_s: float = REQUEST_TIMEOUT_S
    ramp_down_grace_s: float = RAMP_DOWN_GRACE_S
    metrics_interval_s: float = 1.0
    gpu: str = "auto"
    require_gpu: bool = False
    sim_args: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    live: bool = True
    html: bool = True  # write report.html (its plots); --no-html: the other reports only
    serve: str | None = None  # --serve: the line oomload starts the server with (instead of --url)
    served_with: str | None = None  # --served-with: the line the server at --url was started with
    serve_timeout_s: float = 900.0  # how long a --serve server may take to answer /health
    server_log: Path | None = None  # --server-log: a log of a server someone else started, followed
    server_pid: int | None = None  # --server-pid: the server's process on this host
    server_memory: str = "auto"  # auto, none or remote:URL (an `oomload sample` beside the server)
    soak_s: float | None = None  # --soak: hold the one level this long and report memory's trend

    def serve_command(self) -> ServeCommand | None:
        """The ``--serve`` line, recognised (``None`` without one)."""
        return None if self.serve is None else parse_serve_command(self.serve)

    @property
    def served_line(self) -> str | None:
        """The line the server was started with: ``--serve``'s, else ``--served-with``'s."""
        return self.serve if self.serve is not None else self.served_with

    def serve_secrets(self) -> tuple[str, ...]:
        """The served line's secrets (``ServeCommand.secrets``: its ``--api-key``, a ``VLLM_API_KEY=`` in
        front of it, …) and the API key the run sends, wherever the line holds it: never written to the
        run directory."""
        line = self.served_line
        if line is None:
            return ()
        api_key = os.environ.get(self.api_key_env)
        # only where the line holds it: a short key ("none") must not blank out the run's other arguments
        held = (api_key,) if api_key and api_key in line else ()
        return (*parse_serve_command(line).secrets(), *held)

    def schedule(self) -> SchedulePlan:
        return SchedulePlan(
            levels=self.levels,
            warmup=self.warmup_s > 0,
            refine=self.refine,
            stop_on=self.stop_on,
            repeats=self.repeats,
        )

    def expected_workers(self) -> int:
        """The Locust workers the master waits for; 0 when Locust runs in this process."""
        if self.workers:
            return self.workers
        return self.processes if self.processes > 1 else 0

    def local_workers(self) -> int:
        """The worker processes oomload starts itself on this host."""
        return self.processes if self.expected_workers() else 0

    def load_options(self, url: str, model: str, max_model_len: int | None = None) -> LoadOptions:
        return LoadOptions(
            url=url,
            payload=self.payload_options(model, max_model_len),
            trace_path=str(self.trace_path),
            order=self.order,
            seed=self.seed,
            tail_percentile=self.tail_percentile,
            only_fitting=self.only_fitting,
            request_timeout_s=self.request_timeout_s,
            api_key_env=self.api_key_env,
            open_loop=self.open_loop,
            arrival_scale=self.arrival_scale,
        )

    def hold(self) -> Hold:
        return Hold(self.hold_s, self.min_requests)

    def grace_s(self) -> float:
        """How long stopped users may take to finish their request (ramp-down, end of run)."""
        return min(self.ramp_down_grace_s, self.request_timeout_s)

    def payload_options(self, model: str, max_model_len: int | None = None) -> PayloadOptions:
        """How bodies are built; ``max_model_len`` (the server's, when known) bounds what is sent."""
        return PayloadOptions(
            api=self.api,
            model=model,
            stream=self.stream,
            exact_output=self.exact_output,
            prefix_sharing=not self.distinct_prompts,
            prefix_block_tokens=self.prefix_block_tokens,
            token_id_low=self.token_id_range[0],
            token_id_high=self.token_id_range[1],
            seed=self.seed,
            prompt_salt=self.prompt_salt,
            max_model_len=max_model_len,
        )


def prefix_block_tokens(trace_path: str | Path) -> int:
    """Tokens one of the trace's hash ids stands for (its header's ``prefix``, Mooncake's 512 without)."""
    return read_trace_header(trace_path).prefix_or_default().block_tokens


def prefix_mode(config: ReplayConfig, records: Sequence[TraceRecord]) -> dict[str, Any]:
    """What the replay measures, for ``config.json`` and every report (``prefix_mode_of``)."""
    return prefix_mode_of(config.payload_options(""), records)


def prefix_mode_of(payload: PayloadOptions, records: Sequence[TraceRecord]) -> dict[str, Any]:
    """``shared`` (production shape: the trace's shared prefixes are sent as identical token blocks) or
    ``distinct`` (worst case: every prompt distinct from token 0), and why when the production shape
    could not be replayed."""
    why = None
    if not payload.prefix_sharing:
        why = "--distinct-prompts"
    elif payload.api != "completions":
        why = "the chat API replays calibrated text, which cannot carry the trace's shared blocks"
    elif not any(r.hash_ids for r in records):
        why = "the trace has no hash_ids: no prefix structure to replay"
    return {
        "mode": "distinct" if why else "shared",
        "block_tokens": payload.prefix_block_tokens,
        "why_distinct": why,
    }


def preflight_timeout_s(config: ReplayConfig) -> float:
    """How long the preflight waits for ``/v1/models``: 30 s, never more than a request's timeout or
    the run's whole maximum duration."""
    limits = [PREFLIGHT_TIMEOUT_S, config.request_timeout_s]
    if config.max_duration_s is not None:
        limits.append(config.max_duration_s)
    return min(limits)


def sim_line_args(sim_args: Sequence[str]) -> tuple[str, ...]:
    """The simulator's flags for a replay without a URL: ``DEMO_SIM_ARGS`` but each demo flag the user's
    ``--sim`` gives again (``--flag VALUE`` or ``--flag=VALUE``), then the user's flags — so the line a
    run shows and records names each setting once, with the value the simulator uses."""
    given = {arg.partition("=")[0] for arg in sim_args if arg.startswith("--")}
    kept = [
        token
        for flag, value in zip(DEMO_SIM_ARGS[::2], DEMO_SIM_ARGS[1::2], strict=True)
        if flag not in given
        for token in (flag, value)
    ]
    return (*kept, *sim_args)


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
    serve_args: Sequence[str] = (),
) -> dict[str, Any]:
    return {
        "schema": 1,
        "oomload_version": __version__,
        "started_unix_s": time.time(),
        "argv": [scrub(a, config.serve_secrets()) for a in config.argv],
        "serve": None if config.serve is None else scrub(config.serve, config.serve_secrets()),
        "served_with": None
        if config.served_with is None
        else scrub(config.served_with, config.serve_secrets()),
        "trace_path": str(config.trace_path),
        "trace_count": len(records),
        "url": url,
        "simulated": simulated,
        "model": model,
        "serve_args": list(serve_args),  # what ``vllm serve`` was given for it (``load.preflight``)
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
        "baseline": None if config.baseline is None else str(config.baseline),
        "soak_s": config.soak_s,
        "server_memory": config.server_memory,
        "server_log": None if config.server_log is None else str(config.server_log),
        "processes": config.processes,
        "workers": config.expected_workers(),
        "order": config.order,
        "seed": config.seed,
        "prompt_salt": config.prompt_salt,
        "tail_percentile": config.tail_percentile,
        "only_fitting": config.only_fitting,
        "open_loop": config.open_loop,
        "arrival_scale": config.arrival_scale,
        "prefix": prefix_mode(config, records),
        "exact_output": config.exact_output,
        "token_id_range": list(config.token_id_range),
        "request_timeout_s": config.request_timeout_s,
        "ramp_down_grace_s": config.ramp_down_grace_s,
        "api_key_env": config.api_key_env,  # the variable's name, never its value
        "web": config.web,
    }
