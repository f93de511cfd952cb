"""The load layer: request bodies, SSE parsing, outcome classification, the Locust user and shape,
the shared replay context (``context``), the wire format of streamed results (``wire``; a worker's
results on their way in batches: ``resultstream``), ``baseurl``: the server's base URL, checked once;
``preflight``: the endpoint asked before the first request, ``selfcheck``: each
load-generating process's own CPU use, CPU wait and event-loop lag per step, and ``fdlimit``: its
open-file limit, raised at start and checked against the level. Besides the runner
(``oomload.run``), the only part of oomload that imports Locust/gevent, and only inside ``user``,
``shape``, ``http`` and ``selfcheck``'s ``start_selfcheck``; ``payload``, ``sse``, ``classify`` and
``backoff`` (how long a failed user waits) are pure.
"""
