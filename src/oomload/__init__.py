"""oomload: reproduce GPU out-of-memory and KV-cache preemption in vLLM deployments before production.

The package is layered; imports point one way only:

- pure core (no I/O, no Locust, no NVML): ``errors``, ``trace``, ``outcome``, ``stats``, ``schedule``,
  ``verdict`` …
- adapters that do I/O: log readers, the HTTP/SSE client, Locust users, samplers, ``rundir``
- the runner that wires one run
- the CLI (``oomload.cli``) and report renderers on top.
"""

__version__ = "0.1.0"
