"""Binding the Locust user to a trace and an endpoint — for ``oomload replay``, its worker processes
and the plain ``locust -f scenarios/…`` files (which are configured by environment variables).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from oomload.credentials import read_api_key
from oomload.errors import ConfigError, EndpointError
from oomload.load.context import ContextMeter, ReplayContext
from oomload.load.http import Endpoint
from oomload.load.payload import (
    ChatPayloads,
    CompletionPayloads,
    PayloadOptions,
    RequestOrder,
    parse_token_id_range,
)
from oomload.load.preflight import preflight, split_base_url
from oomload.load.user import ReplayUser
from oomload.rundir import RunWriter, server_marked_dead
from oomload.schedule import Hold, SchedulePlan, parse_levels, parse_stop_condition
from oomload.trace import TraceRecord, read_trace

ENV_PREFIX = "OOMLOAD_"
WORKER_REPORT_INTERVAL_S = 1.0
_TRUE = ("1", "true", "yes", "on")


class ScenarioUser(ReplayUser):
    """The user ``locust -f`` runs; ``configure`` binds it when Locust fires ``init``."""

    abstract = False


def bind_user(
    user_class: Any,
    options: Mapping[str, Any],
    *,
    records: Sequence[TraceRecord],
    api_key: str | None,
    sink: Any,
    worker: int = 0,
    workers: int = 1,
) -> ReplayContext:
    """Bind ``user_class`` (a ``ReplayUser`` subclass) to a fresh context; return the context."""
    payload = PayloadOptions(**options["payload"])
    order = RequestOrder(
        records,
        mode=options.get("order", "trace"),
        seed=int(options.get("seed", 0)),
        tail_percentile=options.get("tail_percentile"),
        offset=worker,
        stride=workers,
    )
    builder: Any
    if payload.api == "chat":
        builder = ChatPayloads(payload, tokenize_counter(options["url"], payload.model, api_key))
    else:
        builder = CompletionPayloads(payload)
    context = ReplayContext(order=order, payloads=builder, sink=sink)
    if options.get("open_loop"):
        import time

        context.start_open_loop(time.time() + 1.0, float(options.get("arrival_scale", 1.0)))
    user_class.replay = context
    user_class.endpoint = Endpoint.from_url(options["url"], api_key)
    user_class.request_timeout_s = float(options.get("request_timeout_s", 600.0))
    user_class.stream = payload.stream
    user_class.exact_output = payload.exact_output
    user_class.replay_path = payload.path
    user_class.host = options["url"]
    return context


def tokenize_counter(url: str, model: str, api_key: str | None) -> Callable[[str], int]:
    """``count_tokens(text)`` through the server's ``/tokenize`` (messages form: template counted)."""
    target = url.rstrip("/") + "/tokenize"

    def count(text: str) -> int:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode()
        request = urllib.request.Request(target, data=body, headers={"Content-Type": "application/json"})
        if api_key:
            request.add_header("Authorization", f"Bearer {api_key}")
        try:
            with urllib.request.urlopen(request, timeout=30.0) as resp:
                obj = json.loads(resp.read())
        except (OSError, ValueError) as err:
            raise EndpointError(f"{target} failed ({err}); chat mode needs the server's /tokenize") from err
        return int(obj["count"])

    return count


def scenario_options(environ: Mapping[str, str]) -> dict[str, Any]:
    """Options for a plain ``locust -f`` run, from ``OOMLOAD_*`` variables or ``OOMLOAD_SCENARIO``."""
    raw: dict[str, Any] = {}
    scenario = environ.get(ENV_PREFIX + "SCENARIO")
    if scenario:
        try:
            raw.update(json.loads(Path(scenario).read_text(encoding="utf-8")))
        except (OSError, ValueError) as err:
            raise ConfigError(f"scenario file {scenario}: {err}") from err
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key not in (ENV_PREFIX + "SCENARIO", ENV_PREFIX + "WORKER_JSON"):
            raw[key[len(ENV_PREFIX) :].lower()] = value
    if not raw.get("trace"):
        raise ConfigError("set OOMLOAD_TRACE to the trace to replay (or OOMLOAD_SCENARIO to a scenario file)")
    low, high = parse_token_id_range(str(raw.get("token_id_range", "100:2000")))
    tail = raw.get("tail_percentile")
    return {
        "trace": str(raw["trace"]),
        "url": raw.get("url"),
        "model": raw.get("model"),
        "api": str(raw.get("api", "completions")),
        "stream": _flag(raw.get("stream", True)),
        "exact_output": _flag(raw.get("exact_output", True)),
        "prefix_sharing": _flag(raw.get("prefix_sharing", False)),
        "token_id_range": (low, high),
        "order": str(raw.get("order", "trace")),
        "seed": int(raw.get("seed", 0)),
        "tail_percentile": None if tail in (None, "") else float(tail),
        "request_timeout_s": float(raw.get("request_timeout_s", 600.0)),
        "api_key_env": str(raw.get("api_key_env", "OPENAI_API_KEY")),
        "run_dir": raw.get("run_dir"),
        "ramp": raw.get("ramp") or raw.get("concurrency"),
        "hold_s": float(raw.get("hold_s", 10.0)),
        "stop_on": str(raw.get("stop_on", "never")),
    }


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in _TRUE


def configure(environment: Any, options: dict[str, Any], here: Path) -> None:
    """Bind ``ScenarioUser`` for this process (a worker of ``oomload replay``, or plain ``locust -f``)."""
    del here
    api_key = read_api_key(str(options.get("api_key_env") or "OPENAI_API_KEY"), os.environ)
    if "payload" not in options:  # a plain scenario: resolve the endpoint and the model now
        url = options.get("url") or environment.host
        if not url:
            raise ConfigError("give the endpoint with --host URL (or OOMLOAD_URL)")
        url, _note = split_base_url(url)  # no credentials in it, not an endpoint's path
        model = options.get("model") or preflight(url, model=None, api_key=api_key).model
        low, high = options["token_id_range"]
        payload = PayloadOptions(
            api=options["api"],
            model=model,
            stream=options["stream"],
            exact_output=options["exact_output"],
            prefix_sharing=options["prefix_sharing"],
            token_id_low=low,
            token_id_high=high,
            seed=options["seed"],
        )
        options.update(url=url, model=model, payload=asdict(payload))
    records = read_trace(options["trace"])
    worker, workers = int(options.get("worker", 0)), int(options.get("workers", 1))
    sink = None
    if options.get("run_dir"):
        sink = RunWriter(options["run_dir"], worker=str(worker) if "worker" in options else None)
        if (
            "worker" not in options
        ):  # a plain `locust -f` run: make the directory readable by `oomload report`
            _write_scenario_config(sink, options, records)
            _write_status_on_quit(environment, sink)
    context = bind_user(
        ScenarioUser, options, records=records, api_key=api_key, sink=sink, worker=worker, workers=workers
    )
    if options.get("run_dir"):
        context.declared_dead = partial(server_marked_dead, Path(options["run_dir"]))
    runner = getattr(environment, "runner", None)
    if runner is not None and type(runner).__name__ == "WorkerRunner":
        _serve_master(runner, environment, context, options, worker)
    environment.oomload_context = context


def _serve_master(runner: Any, environment: Any, context: ReplayContext, options: Any, worker: int) -> None:
    """A worker of ``oomload replay --processes N``: follow the master's steps, report, drain, announce.

    The user class the master asks for must be this one (by name); anything else ends the worker with
    one sentence before any load is sent.
    """
    import gevent
    import locust.runners

    wanted = str(options.get("user_class") or ScenarioUser.__name__)
    if wanted != ScenarioUser.__name__:
        raise ConfigError(f"the master runs user class {wanted!r}; this worker has {ScenarioUser.__name__!r}")
    # the master's step meter and hold counting read these reports: once a second, not every 3 s
    locust.runners.WORKER_REPORT_INTERVAL = WORKER_REPORT_INTERVAL_S

    context.live_users = lambda: int(runner.user_count)

    def on_step(msg: Any, **_kw: Any) -> None:
        data = msg.data
        context.begin_step(int(data["step"]), int(data["concurrency"]), str(data["phase"]))

    def on_step_end(msg: Any, **_kw: Any) -> None:
        del msg
        context.end_step()

    def on_stop(msg: Any, **_kw: Any) -> None:
        grace_s, seq = float(msg.data.get("grace_s", 0.0)), int(msg.data.get("seq", 0))
        context.stopping = True
        if grace_s <= 0:
            environment.stop_timeout = 0.0  # a later stop abandons what is in flight (cancelled)

        def drain() -> None:
            deadline = context.clock() + grace_s
            while context.in_flight and context.clock() < deadline:
                gevent.sleep(0.05)
            if grace_s > 0:
                environment.stop_timeout = 0.0
            runner.send_message("oomload_drained", {"worker": worker, "seq": seq})

        gevent.spawn(drain)

    def on_report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
        del client_id
        data["oomload"] = context.step_report()

    runner.register_message("oomload_step", on_step)
    runner.register_message("oomload_step_end", on_step_end)
    runner.register_message("oomload_stop", on_stop)
    environment.events.report_to_master.add_listener(on_report)
    runner.send_message("oomload_ready", {"worker": worker})


def _write_status_on_quit(environment: Any, writer: RunWriter) -> None:
    """When Locust quits, ``status.json`` says the run ended (Locust's run time, Ctrl-C or the shape's
    end are its own ways to finish); without it ``oomload report`` would call the run cut short."""

    def on_quitting(**_kw: Any) -> None:
        writer.write_status(finished=True, end_reason="locust_quit")

    environment.events.quitting.add_listener(on_quitting)


def _write_scenario_config(
    writer: RunWriter, options: Mapping[str, Any], records: Sequence[TraceRecord]
) -> None:
    import time

    from oomload import __version__
    from oomload.trace import TraceHeader, write_trace

    levels = [int(x) for x in parse_levels(str(options["ramp"]))] if options.get("ramp") else []
    writer.write_json(
        "config.json",
        {
            "schema": 1,
            "oomload_version": __version__,
            "started_unix_s": time.time(),
            "argv": [],
            "trace_path": str(options["trace"]),
            "trace_count": len(records),
            "url": options["url"],
            "simulated": False,
            "model": options["model"],
            "api": options["payload"]["api"],
            "stream": options["payload"]["stream"],
            "schedule": {
                "levels": levels,
                "hold_s": options.get("hold_s"),
                "min_requests": 0,
                "warmup_s": 0,
                "refine": False,
            },
            "stop_on": [str(options.get("stop_on", "never"))],
            "max_duration_s": None,
            "max_model_len": None,
            "gates": [],
            "processes": 1,
            "scenario": True,
            "api_key_env": options.get("api_key_env"),
        },
    )
    write_trace(
        writer.path / "trace.jsonl", records, TraceHeader(source=(str(options["trace"]),), format="oomload")
    )


def make_env_shape(options: Mapping[str, Any]) -> type:
    """A ``LoadTestShape`` class for ``locust -f`` runs with ``OOMLOAD_RAMP`` set."""
    from locust import LoadTestShape

    from oomload.load.shape import StepDriver

    levels = parse_levels(str(options["ramp"]))
    plan = SchedulePlan(
        levels=levels,
        refine=False,
        stop_on=tuple(parse_stop_condition(s) for s in str(options["stop_on"]).split(",")),
    )
    hold = Hold(float(options["hold_s"]))

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
                run_dir = options.get("run_dir")
                sink: Any = RunWriter(run_dir) if run_dir else _NullSink()
                self.driver = StepDriver(plan, hold, ContextMeter(context), sink)
            return self.driver.tick()

    return EnvStepShape
