"""The simulated vLLM: a memory-faithful engine model, an OpenAI-compatible server and a planner.

- ``geometry``: KV bytes per token, GPU/model presets, vLLM's start-up memory budget (pure).
- ``build``: ``sim serve`` / ``plan`` options turned into a sized engine.
- ``model``: the engine = scheduler (``oomload.capacity.scheduler``) + step-time model + modelled
  CUDA OOM + vLLM counters (pure).
- ``tokenizer``: the toy 4-characters-per-token tokenizer (pure).
- ``planner``: ``oomload plan``'s offline closed-loop runs on a virtual clock (pure).
- ``metrics``: Prometheus / DCGM exposition with vLLM's names.
- ``openai_request``: vLLM's validation of OpenAI requests and its error bodies (pure).
- ``vllmlog``: vLLM's log lines and the words of its memory deaths (pure).
- ``hostmem``: real host memory held in proportion to the modelled one; the container and process limits.
- ``engine``: admission, the engine loop that steps the model in time, engine death.
- ``server``: the aiohttp front end (routing, JSON/SSE answers); ``process``: ``SimServer``, a
  subprocess context manager.
"""
