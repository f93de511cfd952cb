"""The server's side of the run in Locust's web UI (``oomload replay --web``).

Locust's UI shows what the client sees; this extension adds what the server and the GPU show, as the
run goes, in three places (following Locust's ``examples/extend_web_ui``):

* an **oomload** tab next to Statistics/Charts: a table of rows (step, target and achieved
  concurrency, KV-cache usage, preemptions since the start, running/waiting requests, GPU memory,
  outcomes, server death) that refreshes with Locust's own statistics poll — the rows ride along in
  the ``extended_stats`` of ``/stats/requests``;
* ``GET /oomload/telemetry``: the same snapshot as JSON (the latest ``/metrics`` record, the latest
  GPU sample, the step), for scripts and dashboards;
* ``GET /oomload``: a small self-refreshing HTML page of the snapshot.

``snapshot`` is the runner's ``telemetry_snapshot``: it only reads the latest samples, never scrapes.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

from oomload.verdict import kv_percent

TAB_KEY = "oomload"
TELEMETRY_PATH = "/oomload/telemetry"
PAGE_PATH = "/oomload"
_STATS_PATH = "/stats/requests"
GIB = 2**30


def telemetry_rows(snapshot: dict[str, Any]) -> list[dict[str, str]]:
    """The tab's rows (``{"what", "value"}``) from a snapshot; unknown values read ``?``."""
    rows: list[tuple[str, str]] = []
    step = snapshot.get("step")
    if step:
        achieved = snapshot.get("achieved_concurrency")
        rows.append(("step", f"{step['index']} ({step['phase']})"))
        rows.append(
            (
                "concurrency",
                f"target {step['concurrency']}"
                + ("" if achieved is None else f" · achieved {float(achieved):.1f}"),
            )
        )
    metrics = snapshot.get("metrics") or {}
    kv = metrics.get("kv_cache_usage")
    rows.append(("KV cache usage", "?" if kv is None else kv_percent(float(kv))))
    pre = snapshot.get("preemptions_since_start")
    rows.append(("preemptions since start", "?" if pre is None else str(pre)))
    rows.append(("running requests", _text(metrics.get("num_requests_running"))))
    rows.append(("waiting requests", _text(metrics.get("num_requests_waiting"))))
    gpu = snapshot.get("gpu") or {}
    used, total = gpu.get("used_bytes"), gpu.get("total_bytes")
    if isinstance(used, int | float) and isinstance(total, int | float) and total:
        rows.append(("GPU memory", f"{used / GIB:.2f} / {total / GIB:.2f} GiB ({gpu.get('source', '?')})"))
    else:
        rows.append(("GPU memory", "not sampled"))
    outcomes = snapshot.get("outcomes") or {}
    rows.append(("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "none yet"))
    if snapshot.get("server_dead"):
        rows.append(("server dead", str(snapshot["server_dead"])))
    return [{"what": what, "value": value} for what, value in rows]


def _text(value: object) -> str:
    return "?" if value is None else str(value)


def extend_web_ui(web_ui: Any, snapshot: Callable[[], dict[str, Any]]) -> None:
    """Add the oomload tab, ``/oomload/telemetry`` and ``/oomload`` to a Locust ``WebUI``."""
    from flask import Response, request

    app = web_ui.app
    web_ui.template_args["extended_tabs"] = [{"title": "oomload", "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB_KEY, "structure": [{"key": "what", "title": "What"}, {"key": "value", "title": "Now"}]}
    ]

    def oomload_telemetry() -> Response:
        return Response(json.dumps(snapshot(), default=str), mimetype="application/json")

    def oomload_page() -> Response:
        rows = "".join(
            f"<tr><th>{html.escape(r['what'])}</th><td>{html.escape(r['value'])}</td></tr>"
            for r in telemetry_rows(snapshot())
        )
        page = (
            '<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="1">'
            "<title>oomload telemetry</title><style>body{font-family:sans-serif}th{text-align:left;"
            "padding-right:1em}</style></head><body><h1>oomload: the server's side</h1>"
            f'<table>{rows}</table><p><a href="./">Locust</a> · <a href=".{TELEMETRY_PATH}">JSON</a></p>'
            "</body></html>"
        )
        return Response(page, mimetype="text/html")

    def add_oomload_rows(response: Response) -> Response:
        if request.path != _STATS_PATH or response.mimetype != "application/json":
            return response
        try:
            body = json.loads(response.get_data())
        except ValueError:
            return response
        extended = [e for e in body.get("extended_stats") or [] if e.get("key") != TAB_KEY]
        extended.append({"key": TAB_KEY, "data": telemetry_rows(snapshot())})
        body["extended_stats"] = extended
        response.set_data(json.dumps(body))
        return response

    app.add_url_rule(TELEMETRY_PATH, "oomload_telemetry", oomload_telemetry)
    app.add_url_rule(PAGE_PATH, "oomload_page", oomload_page)
    app.after_request(add_oomload_rows)
