"""The load layer: request bodies, SSE parsing, outcome classification, the Locust user and shape,
and the runner that wires one replay. The only part of oomload that imports Locust/gevent, and only
inside ``user``, ``shape``, ``runner`` and ``worker`` — ``payload``, ``sse`` and ``classify`` are pure.
"""
