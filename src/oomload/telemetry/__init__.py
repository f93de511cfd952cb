"""Telemetry: what the server and the GPU said while the load ran.

* ``vllm_metrics`` (pure): vLLM's Prometheus ``/metrics`` text → one ``VllmSnapshot``, with metric
  names mapped across vLLM versions and summed across data-parallel engines.
* ``poller``: ``MetricsPoller`` scrapes ``/metrics`` on an interval and appends ``metrics.jsonl``
  (counter deltas, server restarts, scrape failures) plus ``cache_config.json`` to a run directory.
* ``gpu_sample`` (pure): the ``GpuSample`` value every GPU source produces (one ``gpu.jsonl`` line).
* ``nvml``: the NVML sampler behind a small ``NvmlLibrary`` protocol (``pynvml`` or a fake).
* ``fake_nvml``: a fake NVML with ``pynvml``'s interface and real ``NVMLError``s (tests, benchmark).
* ``dcgm``: GPU memory read from a DCGM exporter or from ``oomload sample --serve``.
* ``scrape``: one HTTP GET of a Prometheus text endpoint, failures as one ``EndpointError`` sentence.
* ``sampler``: the loop behind ``oomload sample``: samples a GPU source (and/or the server's memory)
  on a fixed grid into ``gpu.jsonl`` (``server_memory.jsonl``) lines and/or serves the latest ones
  over HTTP as DCGM text (and ``oomload_server_*`` series).
* ``gpu``: ``GpuSamplerProcess`` runs ``oomload sample`` as a child process (NVML calls block, so
  they stay out of Locust's gevent loop) and streams ``gpu.jsonl``; ``ServerMemoryProcess`` does the
  same for the server's host memory (``oomload sample --no-gpu``: ``server_memory.jsonl``).
* ``procfs`` (pure): the kernel's ``/proc`` and memory cgroup files, parsed as Linux writes them.
* ``proctree``: the processes from ``/proc``: every process, one's tree, the listener of a port.
* ``hostmem``: the server's own host memory (its process tree's RSS/PSS and data limit, its memory
  cgroup) read from ``/proc`` and ``/sys/fs/cgroup`` into one ``server_memory.jsonl`` line.
* ``hostsampler``: what server memory to watch (``MemoryTarget``), ``ServerMemorySampler`` (a thread
  appending ``server_memory.jsonl``) and ``RemoteServerMemory`` (another host's ``oomload sample``).
* ``serverlog``: ``ServerLogFollower`` copies what the server appends to its log during a run into
  the run directory's ``server.log`` (late creation, truncation, rotation, a size cap), for the death
  classifier (``oomload.verdict.deathcause``).

Nothing here is imported by ``oomload.telemetry`` itself: import the submodule you need, so the pure
parser never pulls in ``pynvml``.
"""
