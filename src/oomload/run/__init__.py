"""The runner: one replay run, wired (``runner``: preflight → run directory → session → verdict).

``config`` holds what a run is told to do (the endpoint's preflight is ``oomload.load.preflight``);
``session`` is the live part (telemetry, Locust, the death watch of ``deathwatch``, the live view of
``progress``, the web UI of ``webui`` and ``livefeed``, what the web UI shows in ``snapshot``), with
the trace's odds computed beside the load by ``oddsfeed``; ``served`` is the server oomload started
itself and ``serverwatch`` its evidence (host memory, log). Distributed load: the master's pool of
workers in ``worker_pool``, its step measure in ``master_meter``, the link's checks in front of
Locust's master in ``master_auth``, and one worker's side in ``worker_node``. ``repro`` writes the
minimal reproduction; ``scenario`` and ``locustfile`` bind the Locust user to a trace for plain
``locust -f scenarios/…`` runs. The request-level pieces they drive (the user, the shape, HTTP/SSE)
live in ``oomload.load``.
"""
