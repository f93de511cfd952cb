"""oomload: reproduce GPU out-of-memory and KV-cache preemption in vLLM deployments before production.

The package is layered; imports point one way only (``tests/unit/test_layers.py`` checks it):

- pure core (no I/O, no Locust, no NVML): ``errors``, ``trace``, ``outcome``, ``stats``, ``odds``,
  ``schedule`` …, and the judging pipeline ``verdict`` (runview → death, stepfacts → prediction →
  confidence → verdict → recommend, gate; see ``oomload/verdict/__init__.py``);
- adapters that do I/O: log readers (``ingest``), the HTTP/SSE client and Locust user (``load``),
  samplers (``telemetry``), the run directory (``rundir``), the simulated and the real vLLM;
- the runner that wires one run (``run``);
- the CLI (``oomload.cli``) and report renderers (``report``) on top.
"""

__version__ = "0.1.0"
