"""The load layer: request bodies, SSE parsing, outcome classification, the Locust user and shape,
the shared replay context and the wire format of streamed results. Besides the runner
(``oomload.run``), the only part of oomload that imports Locust/gevent, and only inside ``user``,
``shape`` and ``http``; ``payload``, ``sse`` and ``classify`` are pure.
"""
