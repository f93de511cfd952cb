"""Binding the Locust user to a trace and an endpoint — for ``oomload replay``, its Locust workers
(``oomload.run.worker_node``) and the plain ``locust -f scenarios/…`` files (configured by environment
variables: ``ScenarioSettings``).

Every one of them binds the user the same way, from one ``LoadOptions`` (``oomload.run.config``):
``bind_user``. A plain scenario first resolves its settings into ``LoadOptions`` (the endpoint from
``--host``, the model from ``/v1/models``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomload.capacity.schedule import Hold, SchedulePlan, parse_levels, parse_stop_condition
from oomload.credentials import read_api_key
from oomload.errors import ConfigError
from oomload.load.baseurl import BaseUrl
from oomload.load.context import ContextMeter, ReplayContext
from oomload.load.http import Endpoint
from oomload.load.payload import (
    ChatPayloads,
    CompletionPayloads,
    RequestOrder,
    parse_token_id_range,
)
from oomload.load.preflight import preflight, tokenize_counter
from oomload.load.user import ReplayUser
from oomload.run.config import (
    DEFAULT_API_KEY_ENV,
    REQUEST_TIMEOUT_S,
    LoadOptions,
    ReplayConfig,
    prefix_block_tokens,
    prefix_mode_of,
)
from oomload.rundir import RunWriter
from oomload.trace.model import TraceRecord, read_trace

ENV_PREFIX = "OOMLOAD_"
_TRUE = ("1", "true", "yes", "on")


class ScenarioUser(ReplayUser):
    """The user ``locust -f`` runs; ``configure`` binds it when Locust fires ``init``."""

    abstract = False


def bind_user(
    user_class: Any,
    options: LoadOptions,
    *,
    records: Sequence[TraceRecord],
    api_key: str | None,
    sink: Any,
    worker: int = 0,
    workers: int = 1,
) -> ReplayContext:
    """Bind ``user_class`` (a ``ReplayUser`` subclass) to a fresh context; return the context.

    Worker ``worker`` of ``workers`` takes every ``workers``-th request of the trace, from its own
    offset (``RequestOrder``)."""
    payload = options.payload
    order = RequestOrder(
        records,
        mode=options.order,  # type: ignore[arg-type]  # checked by RequestOrder
        seed=options.seed,
        tail_percentile=options.tail_percentile,
        fit_within=payload.max_model_len if options.only_fitting else None,
        offset=worker,
        stride=workers,
        block_tokens=payload.prefix_block_tokens,
    )
    builder: Any
    if payload.api == "chat":
        builder = ChatPayloads(payload, tokenize_counter(options.url, payload.model, api_key))
    else:
        builder = CompletionPayloads(payload, trace_requests=order.pass_length)
    context = ReplayContext(order=order, payloads=builder, sink=sink)
    user_class.replay = context
    user_class.endpoint = Endpoint.from_url(options.url, api_key)
    user_class.request_timeout_s = options.request_timeout_s
    user_class.stream = payload.stream
    user_class.exact_output = payload.exact_output
    user_class.replay_path = payload.path
    user_class.host = options.url
    return context


@dataclass(frozen=True)
class ScenarioSettings:
    """A plain ``locust -f`` run's settings, from ``OOMLOAD_*`` variables or ``OOMLOAD_SCENARIO``."""

    trace: str
    url: str | None = None
    model: str | None = None
    api: str = "completions"
    stream: bool = True
    exact_output: bool = True
    distinct_prompts: bool = False  # the worst case; by default the trace's shared prefixes
    token_id_range: tuple[int, int] = (100, 2000)
    order: str = "trace"
    seed: int = 0
    tail_percentile: float | None = None
    only_fitting: bool = False  # needs the server's max_model_len: from /v1/models when no model is set
    request_timeout_s: float = REQUEST_TIMEOUT_S
    api_key_env: str = DEFAULT_API_KEY_ENV
    run_dir: str | None = None
    ramp: str | None = None  # a level list or ramp: the file then also defines a step shape
    hold_s: float = 10.0
    stop_on: str = "never"

    def resolve(self, host: str | None, api_key: str | None) -> LoadOptions:
        """The ``LoadOptions`` of this scenario: the endpoint (``OOMLOAD_URL`` or Locust's ``--host``),
        the model (``OOMLOAD_MODEL`` or the first one ``/v1/models`` lists), built by the replay's own
        ``ReplayConfig.load_options``."""
        if not (self.url or host):
            raise ConfigError("give the endpoint with --host URL (or OOMLOAD_URL)")
        url = BaseUrl.parse(self.url, "OOMLOAD_URL") if self.url else BaseUrl.parse(str(host), "--host")
        model, max_model_len = self.model, None
        if not model:  # the server's first model, and its window (bounds what is sent)
            info = preflight(url.text, model=None, api_key=api_key)
            model, max_model_len = info.model, info.max_model_len
        return self.replay_config().load_options(url.text, model, max_model_len)

    def replay_config(self) -> ReplayConfig:
        """The same settings as a replay's configuration (what is sent is decided in one place)."""
        return ReplayConfig(
            trace_path=Path(self.trace),
            api=self.api,  # type: ignore[arg-type]  # checked by PayloadOptions
            stream=self.stream,
            exact_output=self.exact_output,
            distinct_prompts=self.distinct_prompts,
            prefix_block_tokens=prefix_block_tokens(self.trace),
            token_id_range=self.token_id_range,
            order=self.order,
            seed=self.seed,
            tail_percentile=self.tail_percentile,
            only_fitting=self.only_fitting,
            request_timeout_s=self.request_timeout_s,
            api_key_env=self.api_key_env,
        )


def scenario_settings(environ: Mapping[str, str]) -> ScenarioSettings:
    """Settings for a plain ``locust -f`` run, from ``OOMLOAD_*`` variables or ``OOMLOAD_SCENARIO``."""
    raw: dict[str, Any] = {}
    scenario = environ.get(ENV_PREFIX + "SCENARIO")
    if scenario:
        try:
            raw.update(json.loads(Path(scenario).read_text(encoding="utf-8")))
        except (OSError, ValueError) as err:
            raise ConfigError(f"scenario file {scenario}: {err}") from err
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key != ENV_PREFIX + "SCENARIO":
            raw[key[len(ENV_PREFIX) :].lower()] = value
    if not raw.get("trace"):
        raise ConfigError("set OOMLOAD_TRACE to the trace to replay (or OOMLOAD_SCENARIO to a scenario file)")
    tail = raw.get("tail_percentile")
    ramp = raw.get("ramp") or raw.get("concurrency")
    return ScenarioSettings(
        trace=str(raw["trace"]),
        url=raw.get("url"),
        model=raw.get("model"),
        api=str(raw.get("api", "completions")),
        stream=_flag(raw.get("stream", True)),
        exact_output=_flag(raw.get("exact_output", True)),
        distinct_prompts=_flag(raw.get("distinct_prompts", False)),
        token_id_range=parse_token_id_range(str(raw.get("token_id_range", "100:2000"))),
        order=str(raw.get("order", "trace")),
        seed=int(raw.get("seed", 0)),
        tail_percentile=None if tail in (None, "") else float(tail),
        only_fitting=_flag(raw.get("only_fitting", False)),
        request_timeout_s=float(raw.get("request_timeout_s", REQUEST_TIMEOUT_S)),
        api_key_env=str(raw.get("api_key_env", DEFAULT_API_KEY_ENV)),
        run_dir=raw.get("run_dir") or None,
        ramp=None if not ramp else str(ramp),
        hold_s=float(raw.get("hold_s", 10.0)),
        stop_on=str(raw.get("stop_on", "never")),
    )


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in _TRUE


def configure(environment: Any, settings: ScenarioSettings) -> None:
    """Bind ``ScenarioUser`` for a plain ``locust -f`` run (``oomload worker`` has its own path)."""
    api_key = read_api_key(settings.api_key_env, os.environ)
    options = settings.resolve(environment.host, api_key)
    records = read_trace(options.trace_path)
    sink = None
    if settings.run_dir:
        sink = RunWriter(settings.run_dir)
        _write_scenario_config(sink, settings, options, records)  # `oomload report` can read it
        _write_status_on_quit(environment, sink)
    context = bind_user(ScenarioUser, options, records=records, api_key=api_key, sink=sink)
    if sink is not None:  # a full run directory: no new request (its results could not be kept)
        sink.on_write_error = lambda: setattr(context, "stopping", True)
    environment.oomload_context = context


def _write_status_on_quit(environment: Any, writer: RunWriter) -> None:
    """When Locust quits, ``status.json`` says the run ended (Locust's run time, Ctrl-C or the shape's
    end are its own ways to finish); without it ``oomload report`` would call the run cut short."""

    def on_quitting(**_kw: Any) -> None:
        if writer.write_error is not None:  # a full run directory: the run ended on it, said once
            return
        writer.write_status(finished=True, end_reason="locust_quit")

    environment.events.quitting.add_listener(on_quitting)


def _write_scenario_config(
    writer: RunWriter, settings: ScenarioSettings, options: LoadOptions, records: Sequence[TraceRecord]
) -> None:
    import time

    from oomload import __version__
    from oomload.trace.model import TraceHeader, read_trace_header, write_trace

    levels = [int(x) for x in parse_levels(settings.ramp)] if settings.ramp else []
    writer.write_json(
        "config.json",
        {
            "schema": 1,
            "oomload_version": __version__,
            "started_unix_s": time.time(),
            "argv": [],
            "trace_path": options.trace_path,
            "trace_count": len(records),
            "url": options.url,
            "simulated": False,
            "model": options.payload.model,
            "api": options.payload.api,
            "stream": options.payload.stream,
            "schedule": {
                "levels": levels,
                "hold_s": settings.hold_s,
                "min_requests": 0,
                "warmup_s": 0,
                "refine": False,
            },
            "stop_on": [settings.stop_on],
            "max_duration_s": None,
            "max_model_len": None,
            "gates": [],
            "processes": 1,
            "scenario": True,
            "api_key_env": options.api_key_env,
            "order": options.order,
            "tail_percentile": options.tail_percentile,
            "prefix": prefix_mode_of(options.payload, records),
        },
    )
    prefix = read_trace_header(options.trace_path).prefix_or_default()
    write_trace(
        writer.path / "trace.jsonl",
        records,
        TraceHeader(source=(options.trace_path,), format="oomload", prefix=prefix),
    )


def make_env_shape(settings: ScenarioSettings) -> type:
    """A ``LoadTestShape`` class for ``locust -f`` runs with ``OOMLOAD_RAMP`` set."""
    from locust import LoadTestShape

    from oomload.load.shape import StepDriver

    levels = parse_levels(str(settings.ramp))
    plan = SchedulePlan(
        levels=levels,
        refine=False,
        stop_on=tuple(parse_stop_condition(s) for s in settings.stop_on.split(",")),
    )
    hold = Hold(settings.hold_s)

    class _NullSink:
        def append(self, stream: str, obj: dict[str, Any]) -> None:
            del stream, obj

    class EnvStepShape(LoadTestShape):
        driver: StepDriver | None = None

        def tick(self) -> tuple[int, float] | None:
            if self.driver is None:
                context = ScenarioUser.replay
                if context is None:
                    return None
                run_dir = settings.run_dir
                sink: Any = RunWriter(run_dir) if run_dir else _NullSink()
                self.driver = StepDriver(plan, hold, ContextMeter(context), sink)
            return self.driver.tick()

    return EnvStepShape
