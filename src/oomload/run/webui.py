"""The server's side of the run in Locust's web UI (``oomload replay --web``).

Locust's UI shows what the client sees; this extension adds what the server and the GPU show, as the
run goes and after it ends (following Locust's ``examples/extend_web_ui``):

* an **oomload** tab next to Statistics/Charts. Locust renders an extended tab as a table of rows
  (step, target and achieved concurrency, KV-cache usage, preemptions, running/waiting requests, GPU
  memory, TTFT, outcomes, server death), which ride along in the ``extended_stats`` of
  ``/stats/requests``; a small script added to Locust's page (``/oomload/tab.js``) lays the cockpit
  page over that tab;
* ``GET /oomload``: the cockpit page (``static/cockpit.html``, no network, no library): the plan
  ("step 4 of 5 · levels 1,2,4,8,16 · 2.1 s left", a *draining* state while a lower step waits for
  the requests in flight), a SIMULATED badge against the simulator, live charts of KV usage,
  preemptions, running/waiting and GPU memory with the steps shaded and the first preemption marked,
  and, once the run is over, the verdict, the ``vllm serve`` line and a link to ``report.html``;
* ``GET /oomload/telemetry``: the snapshot as JSON (the latest ``/metrics`` record, the latest GPU
  sample, the step and the plan, TTFT, the verdict when the run is over), for scripts and dashboards;
* ``GET /oomload/timeline``: the charts' series (``oomload.run.livefeed``), read from the run
  directory as it grows — the same files the report draws;
* ``GET /oomload/report``: the run's ``report.html`` once written.

Locust's STOP button (``POST /stop``) stops Locust's users and its shape; while the run goes on it
first calls ``on_stop`` (``Session.stop_from_web``), which ends the run as Ctrl-C does (interrupted,
the requests in flight abandoned, the reports written), so the run does not sit idle without a shape.
When the run is over Locust is stopped but its web server keeps answering (``Session.serve_verdict``):
its NEW button cannot start anything, so ``POST /swarm`` answers that the run is over and the page
script hides the button.

State-changing requests (every method but GET/HEAD/OPTIONS: Locust's ``POST /stop``, ``/swarm``,
``/stats/reset``, ``/user``, and any of oomload's) are accepted only from the UI's own page
(``cross_origin``): a browser names the page that sent a request in ``Origin`` (else ``Referer``),
and that must be this server, the ``Host`` the request came to. Any other web page the user has open
gets 403 and changes nothing, so it cannot stop or stall the run. A request that names no page at all
is not from a browser page (a script on this machine, which could reach the port anyway) and is let
through. A web UI bound to loopback (the default) also wants a loopback ``Host`` (``localhost``,
``127.x``, ``[::1]``) on every request, reads included: a page whose own name was re-pointed at
127.0.0.1 (DNS rebinding) is its own origin, so the browser would let it read the run's pages (the
target URL, the model, the plan, the verdict), but not under such a name.

``check_web_port`` binds the web UI's address once before anything starts (``oomload.run.runner``): a
port another program holds is one sentence (``ConfigError``, exit 2), not gevent's tracebacks and
another program's URL printed as the UI's.

``snapshot`` is the runner's ``telemetry_snapshot``: it only reads the latest samples, never scrapes. It
is a typed ``oomload.run.snapshot.TelemetrySnapshot``; JSON is made only where it leaves over HTTP.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from oomload.capacity.schedule import StepPlan
from oomload.errors import ConfigError
from oomload.run.livefeed import LiveFeed
from oomload.run.snapshot import FinalState, LatencyFigures, PlanState, TelemetrySnapshot
from oomload.verdict import kv_percent

TAB_KEY = "oomload"
PAGE_PATH = "/oomload"
TELEMETRY_PATH = "/oomload/telemetry"
TIMELINE_PATH = "/oomload/timeline"
REPORT_PATH = "/oomload/report"
TAB_SCRIPT_PATH = "/oomload/tab.js"
_STATS_PATH = "/stats/requests"
GIB = 2**30
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_origin(
    method: str, host: str, origin: str | None, referer: str | None, *, loopback: bool = False
) -> str | None:
    """Why a request to the web UI is refused as coming from another web page; ``None``: accepted.

    ``host`` is the request's ``Host`` header; ``origin``/``referer`` its headers; ``loopback``: the
    web UI is bound to a loopback address (module docstring).
    """
    if loopback and not is_loopback_host(host):  # reads too: they show the target, the plan, the verdict
        return (
            f"refused: {method.upper()} to {host[:100]!r}, not a loopback name of this machine; "
            "the oomload web UI answers its own page only (http://127.0.0.1 or http://localhost)"
        )
    if method.upper() in SAFE_METHODS:
        return None
    sender = origin if origin is not None else referer
    if sender is None:
        return None
    try:
        sent_from = urlsplit(sender.strip()).netloc.lower()
    except ValueError:
        sent_from = ""
    if sent_from and sent_from == host.strip().lower():
        return None
    shown = sender[:100]
    return (
        f"refused: {method.upper()} from another web page ({shown!r} is not this server, {host[:100]!r}); "
        "the oomload run only takes commands from its own page"
    )


def is_loopback_host(host: str) -> bool:
    """True for a ``Host`` header (or a bind address) that names this machine's loopback interface."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def telemetry_rows(snapshot: TelemetrySnapshot) -> list[dict[str, str]]:
    """The tab's rows (``{"what", "value"}``, the JSON Locust's table takes); unknown values read ``?``."""
    rows: list[tuple[str, str]] = []
    plan, step = snapshot.plan, snapshot.step
    if plan.state:
        rows.append(("run", plan_text(plan, step)))
    if step is not None and plan.state == "over":  # the load has stopped: no "now" to show for it
        rows.append(("last step", f"{step.index} ({step.phase}, concurrency {step.concurrency})"))
    elif step is not None:
        achieved = snapshot.achieved_concurrency
        held = "" if achieved is None else f" · achieved {achieved:.1f}"
        if plan.state == "draining":  # the step is over; the next waits for the drain
            rows.append(("step", f"{step.index} ({step.phase}) ended · draining"))
            rows.append(("concurrency", f"next target {plan.draining_to}{held}"))
        else:
            rows.append(("step", f"{step.index} ({step.phase})"))
            rows.append(("concurrency", f"target {step.concurrency}{held}"))
    metrics = snapshot.metrics_row
    kv = None if metrics is None else metrics.kv_cache_usage
    rows.append(("KV cache usage", "?" if kv is None else kv_percent(kv)))
    pre = snapshot.preemptions_since_start
    rows.append(("preemptions since start", "?" if pre is None else str(pre)))
    rows.append(("running requests", _text(None if metrics is None else metrics.num_requests_running)))
    rows.append(("waiting requests", _text(None if metrics is None else metrics.num_requests_waiting)))
    gpu = snapshot.gpu_row
    if gpu is not None and gpu.used_bytes is not None and gpu.total_bytes:
        used, total = gpu.used_bytes, gpu.total_bytes
        rows.append(("GPU memory", f"{used / GIB:.2f} / {total / GIB:.2f} GiB ({gpu.source or '?'})"))
    else:
        rows.append(("GPU memory", "not sampled"))
    host = snapshot.server_memory
    if host is not None and host.used_bytes is not None:
        limit = "" if host.cgroup_limit_bytes is None else f" / {host.cgroup_limit_bytes / GIB:.2f}"
        kills = f" · OOM kills {host.cgroup_oom_kill}" if host.cgroup_oom_kill else ""
        rows.append(("server memory", f"{host.used_bytes / GIB:.2f}{limit} GiB{kills}"))
    if snapshot.ttft is not None:
        rows.append(("TTFT (this step)", ttft_text(snapshot.ttft.step)))
        rows.append(("TTFT (run)", ttft_text(snapshot.ttft.run)))
    outcomes = snapshot.outcomes
    rows.append(("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "none yet"))
    if snapshot.server_dead:
        rows.append(("server dead", str(snapshot.server_dead)))
    final = snapshot.final
    if final is not None and final.flag_line:
        rows.append(("recommendation", final.flag_line))
    return [{"what": what, "value": value} for what, value in rows]


def plan_text(plan: PlanState, step: StepPlan | None) -> str:
    """``step 3 (ramp, concurrency 8) · 4 of 5 planned · levels 1,2,4,8,16 · 2.1 s left``; while a lower
    step waits, ``… · draining to concurrency 12``; ``over`` once the run is over. Step numbers are
    the run directory's (from 0), as in the report."""
    levels = ",".join(str(level) for level in plan.levels)
    state = plan.state
    if state == "over":
        return f"over · levels {levels}"
    if state == "starting" or step is None:
        return f"starting · levels {levels}"
    number, planned = plan.step_number, plan.planned_steps
    where = f"step {step.index} ({step.phase}, concurrency {step.concurrency})"
    if number is not None and planned and number <= planned:
        where += f" · {number} of {planned} planned"
    parts = [where, f"levels {levels}" + (" + refinement" if plan.refine else "")]
    if state == "draining":
        parts.append(f"draining to concurrency {plan.draining_to}")
    elif state == "finishing":
        parts.append("schedule done, draining the last requests")
    elif plan.step_left_s is not None:
        parts.append(f"{plan.step_left_s:.1f} s left")
    return " · ".join(parts)


def ttft_text(latency: LatencyFigures | None) -> str:
    """``p50 120 ms · p99 1.25 s · n=37`` (ok requests)."""
    if latency is None or not latency.n or latency.p50_ms is None or latency.p99_ms is None:
        return "no ok request yet"
    return f"p50 {_ms(latency.p50_ms)} · p99 {_ms(latency.p99_ms)} · n={latency.n}"


def _ms(value: float) -> str:
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def _text(value: object) -> str:
    return "?" if value is None else str(value)


def final_state(run_dir: Path, exit_code: int) -> FinalState:
    """What the web UI shows once the run is over: the findings, the ``vllm serve`` line, the settings,
    the onset and death times (for the charts) and whether ``report.html`` exists."""
    from oomload.report.findings import describe
    from oomload.verdict import build_verdict
    from oomload.verdict.recommend import recommend
    from oomload.verdict.runview import load_run

    report = (run_dir / "report.html").exists()
    try:
        verdict = build_verdict(load_run(run_dir))
    except Exception as err:  # the terminal already said why; the page says it could not judge
        return FinalState(int(exit_code), str(run_dir), report, error=f"no verdict: {err}")
    recommendation = recommend(verdict)
    onset, death = verdict.preemption_onset, verdict.engine_death
    return FinalState(
        int(exit_code),
        str(run_dir),
        report,
        findings=tuple(
            {"key": f.key, "label": f.label, "text": f.text, "severity": f.severity}
            for f in describe(verdict, recommendation)
            if f.key != "recommendation"
        ),
        flag_line=recommendation.flag_line,
        reasoning=tuple(recommendation.reasoning),
        settings=tuple(
            {"flag": s.flag, "recommended": s.shown, "reason": s.reason} for s in recommendation.settings
        ),
        onset=None
        if onset is None
        else {"concurrency": onset.concurrency, "t_unix_s": onset.t_unix_s, "step": onset.step},
        death=None if death is None else {"concurrency": death.concurrency, "t_unix_s": death.t_unix_s},
    )


def _static(name: str) -> str:
    return resources.files("oomload.run").joinpath("static", name).read_text(encoding="utf-8")


def web_ui_banner(host: str, port: int) -> str:
    """The web UI's address as the run prints it; bound beyond loopback (asked for), a warning that it
    has no login."""
    line = f"Locust web UI: http://{host}:{port} (telemetry: the oomload tab)"
    if is_loopback_host(host):
        return line
    return (
        f"{line}\n[yellow]warning:[/] the web UI has no login: whoever reaches port {port} on {host} can "
        "stop the run and read its pages (the target URL, the model, the verdict)"
    )


def check_web_port(host: str, port: int) -> None:
    """``ConfigError`` when the web UI could not listen on ``host:port`` (bound as gevent's server
    binds, with ``SO_REUSEADDR``: a port in ``TIME_WAIT`` is free, one with a listener is not)."""
    bind_host = "" if host in ("*", "") else host
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            bind_host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as err:
        why = err.strerror or type(err).__name__
        hint = (
            f"{host} is not an address of this machine; choose one with --web-host (default 127.0.0.1)"
            if err.errno == errno.EADDRNOTAVAIL
            else "is the port in use? Choose another with --web-port (or --web-host)"
        )
        raise ConfigError(f"the web UI cannot listen on {host}:{port} ({why}); {hint}") from err


def extend_web_ui(
    web_ui: Any,
    snapshot: Callable[[], TelemetrySnapshot],
    feed: LiveFeed | None = None,
    run_dir: Path | None = None,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Add the oomload tab and the ``/oomload…`` routes to a Locust ``WebUI`` (module docstring).

    ``feed`` is a ``LiveFeed`` over the run directory (the charts and TTFT); ``run_dir`` holds
    ``report.html`` once the run is over; ``on_stop`` is called by an accepted ``POST /stop`` while
    the run goes on, before Locust's own handler stops its runner.
    """
    from flask import Response, jsonify, request

    app = web_ui.app
    web_ui.template_args["extended_tabs"] = [{"title": "oomload", "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB_KEY, "structure": [{"key": "what", "title": "What"}, {"key": "value", "title": "Now"}]}
    ]

    def full_snapshot() -> dict[str, Any]:
        """The snapshot as the JSON the page and ``/stats/requests`` get (the HTTP edge)."""
        snap = snapshot()
        if feed is not None:
            feed.poll()
            snap = snap.with_ttft(feed.ttft(None if snap.step is None else snap.step.index))
        body = snap.to_json()
        body["rows"] = telemetry_rows(snap)
        return body

    def oomload_telemetry() -> Response:
        return Response(json.dumps(full_snapshot(), default=str), mimetype="application/json")

    def oomload_timeline() -> Response:
        if feed is None:
            return Response(json.dumps({"t0_unix_s": None}), mimetype="application/json")
        feed.poll()
        return Response(json.dumps(feed.timeline(), default=str), mimetype="application/json")

    def oomload_page() -> Response:
        return Response(_static("cockpit.html"), mimetype="text/html")

    def oomload_tab_script() -> Response:
        return Response(_static("tab.js"), mimetype="application/javascript")

    def oomload_report() -> Response:
        page = None if run_dir is None else run_dir / "report.html"
        if page is None or not page.exists():
            return Response("report.html is written when the run is over", status=404, mimetype="text/plain")
        return Response(page.read_text(encoding="utf-8"), mimetype="text/html")

    loopback = is_loopback_host(str(getattr(web_ui, "host", "")))

    def refuse_cross_origin() -> Any:
        reason = cross_origin(
            request.method,
            request.host,
            request.headers.get("Origin"),
            request.headers.get("Referer"),
            loopback=loopback,
        )
        return None if reason is None else Response(reason, status=403, mimetype="text/plain")

    def refuse_new_run() -> Any:
        swarm = request.path.rstrip("/").endswith("/swarm") and request.method == "POST"
        if swarm and snapshot().final is not None:
            return jsonify(
                {"success": False, "message": "this oomload run is over; start another with oomload replay"}
            )
        return None

    def stop_the_run() -> Any:
        stop = request.path.rstrip("/").endswith("/stop") and request.method == "POST"
        if stop and on_stop is not None and snapshot().final is None:
            on_stop()
        return None  # Locust's handler then stops its runner

    def after(response: Response) -> Response:
        if request.path == "/" and response.mimetype == "text/html":
            _add_tab_script(response)
            return response
        if request.path != _STATS_PATH or response.mimetype != "application/json":
            return response
        try:
            body = json.loads(response.get_data())
        except ValueError:
            return response
        extended = [e for e in body.get("extended_stats") or [] if e.get("key") != TAB_KEY]
        extended.append({"key": TAB_KEY, "data": full_snapshot()["rows"]})
        body["extended_stats"] = extended
        response.set_data(json.dumps(body))
        return response

    app.add_url_rule(TELEMETRY_PATH, "oomload_telemetry", oomload_telemetry)
    app.add_url_rule(TIMELINE_PATH, "oomload_timeline", oomload_timeline)
    app.add_url_rule(PAGE_PATH, "oomload_page", oomload_page)
    app.add_url_rule(TAB_SCRIPT_PATH, "oomload_tab_script", oomload_tab_script)
    app.add_url_rule(REPORT_PATH, "oomload_report", oomload_report)
    app.before_request(refuse_cross_origin)
    app.before_request(refuse_new_run)
    app.before_request(stop_the_run)  # after the cross-origin refusal: a refused stop stops nothing
    app.after_request(after)


def _add_tab_script(response: Any) -> None:
    """Locust's page gains ``<script src="./oomload/tab.js">`` (the cockpit over the oomload tab)."""
    page = response.get_data(as_text=True)
    tag = f'<script src=".{TAB_SCRIPT_PATH}"></script>'
    if tag not in page and "</body>" in page:
        response.set_data(page.replace("</body>", f"{tag}</body>", 1))
