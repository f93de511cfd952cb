"""The runner: one replay run, wired (``runner``: preflight → run directory → session → verdict).

``config`` holds what a run is told to do; ``preflight`` asks the endpoint before the first request;
``session`` is the live part (telemetry, Locust, the death watch of ``deathwatch``, the live view of
``progress``, the web UI of ``webui`` and ``livefeed``), with the master's side of distributed load in
``workers`` and a worker's side in ``worker``; ``repro`` writes the minimal reproduction; ``scenario``
and ``locustfile`` bind the Locust user to a trace for plain ``locust -f scenarios/…`` runs. The
request-level pieces they drive (the user, the shape, HTTP/SSE) live in ``oomload.load``.
"""
