"""Prometheus exposition of the simulated engine with vLLM's metric names, types and labels.

Two profiles:

- ``current`` — vLLM V1 (0.32/0.33, as captured from the real CPU server in reference
  ``vllm-cpu-metrics.txt``): labels ``{engine="0", model_name=…}``, ``vllm:kv_cache_usage_perc``,
  ``vllm:num_preemptions_total``, ``vllm:admission_rejections_total{model_name, reason}``,
  ``vllm:cache_config_info`` with the real label set, latency histograms with vLLM's buckets.
- ``legacy`` — vLLM 0.6 (V0): label ``{model_name=…}`` only, ``vllm:gpu_cache_usage_perc`` (no
  ``kv_cache_usage_perc``), ``vllm:num_requests_swapped``, ``vllm:time_per_output_token_seconds``, no
  admission counter, and V0's ``cache_config_info`` labels — so clients' name fallbacks get tested.

A custom collector on a private ``CollectorRegistry`` reads the engine's plain counters at scrape
time (nothing is updated per token), so exporting costs nothing while the engine runs.
``prometheus_client`` renders counters with ``_total`` and a ``_created`` gauge, as vLLM's do.

``dcgm_text`` renders GPU memory the way NVIDIA's dcgm-exporter does (``DCGM_FI_DEV_FB_USED`` /
``DCGM_FI_DEV_FB_FREE`` in MiB) from the modelled allocation: weights, non-torch memory, CUDA graphs
and the whole KV pool from start-up on (vLLM preallocates it), plus the last step's activations.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from oomload.sim.geometry import MIB
from oomload.sim.model import EngineModel, Histogram

PROFILES = ("current", "legacy")


class EngineCollector:
    """Yields vLLM metric families from an ``EngineModel`` (``prometheus_client`` collector protocol)."""

    def __init__(
        self,
        engine: EngineModel,
        *,
        model_name: str,
        profile: str = "current",
        created_unix_s: float = 0.0,
        cache_config: dict[str, str] | None = None,
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"metrics profile must be one of {PROFILES}, got {profile!r}")
        self.engine = engine
        self.model_name = model_name
        self.profile = profile
        self.created = created_unix_s
        self.cache_config = cache_config or {}

    # -- helpers -------------------------------------------------------------------------------
    def _labels(self) -> tuple[list[str], list[str]]:
        if self.profile == "legacy":
            return ["model_name"], [self.model_name]
        return ["engine", "model_name"], ["0", self.model_name]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        names, values = self._labels()
        g = GaugeMetricFamily(name, doc, labels=names)
        g.add_metric(values, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        names, values = self._labels()
        c = CounterMetricFamily(name, doc, labels=names)
        c.add_metric(values, value, created=self.created)
        return c

    def _histogram(self, name: str, doc: str, hist: Histogram) -> Metric:
        names, values = self._labels()
        m = Metric(name, doc, "histogram")
        for le, count in hist.cumulative():
            m.add_sample(f"{name}_bucket", _labels_with(names, values, "le", le), count)
        base = dict(zip(names, values, strict=True))
        m.add_sample(f"{name}_count", base, float(hist.count))
        m.add_sample(f"{name}_sum", base, hist.total)
        m.add_sample(f"{name}_created", base, self.created)
        return m

    # -- collection ----------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        if self.profile == "legacy":
            yield from self._collect_legacy()
        else:
            yield from self._collect_current()

    def _collect_current(self) -> Iterator[Metric]:
        e = self.engine
        s = e.stats
        names, values = self._labels()
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", e.num_running
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting
        )
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all "
            "reasons equals vllm:num_requests_waiting.",
            labels=[*names, "reason"],
        )
        by_reason.add_metric([*values, "capacity"], e.num_waiting)
        by_reason.add_metric([*values, "deferred"], 0)
        yield by_reason
        sleep = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            labels=[*names, "sleep_state"],
        )
        for state, v in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.add_metric([*values, state], v)
        yield sleep
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.scheduler.usage
        )
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_cache_hits,
        )
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.num_preemptions
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", labels=[*names, "source"]
        )
        for source, v in (
            ("local_compute", s.prompt_tokens - s.prefix_cache_hits),
            ("local_cache_hit", s.prefix_cache_hits),
            ("external_kv_transfer", 0),
        ):
            by_source.add_metric([*values, source], max(v, 0), created=self.created)
        yield by_source
        yield self._counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            s.prefix_cache_hits,
        )
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["engine", "finished_reason", "model_name"],
        )
        for reason, n in s.finished.items():
            success.add_metric(["0", reason, self.model_name], n, created=self.created)
        yield success
        rejections = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason, n in s.admission_rejections.items():
            rejections.add_metric([self.model_name, reason], n, created=self.created)
        yield rejections
        yield self._histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", s.request_prompt_tokens
        )
        yield self._histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            s.request_generation_tokens,
        )
        yield self._histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            s.iteration_tokens,
        )
        yield self._histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            s.request_max_tokens,
        )
        yield self._histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft
        )
        yield self._histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl
        )
        yield self._histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            s.tpot,
        )
        yield self._histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e
        )
        yield self._histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            s.queue,
        )
        yield self._histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            s.inference,
        )
        yield self._histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            s.prefill,
        )
        yield self._histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            s.decode,
        )
        yield self._histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            s.request_preemptions,
        )
        yield self._info("vllm:cache_config_info", "Information of the LLMEngine CacheConfig")

    def _collect_legacy(self) -> Iterator[Metric]:
        e = self.engine
        s = e.stats
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests currently running on GPU.", e.num_running
        )
        yield self._gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", 0)
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting
        )
        yield self._gauge(
            "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", e.scheduler.usage
        )
        yield self._gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", 0.0)
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.num_preemptions
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["finished_reason", "model_name"],
        )
        for reason in ("stop", "length", "abort"):
            success.add_metric([reason, self.model_name], s.finished.get(reason, 0), created=self.created)
        yield success
        yield self._histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft
        )
        yield self._histogram(
            "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", s.itl
        )
        yield self._histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", s.e2e
        )
        yield self._info("vllm:cache_config_info", "Information of the LLMEngine CacheConfig")

    def _info(self, name: str, doc: str) -> GaugeMetricFamily:
        labels = dict(self.cache_config)
        if self.profile == "current":
            labels["engine"] = "0"
        keys = sorted(labels)
        g = GaugeMetricFamily(name, doc, labels=keys)
        g.add_metric([labels[k] for k in keys], 1.0)
        return g


def _labels_with(names: list[str], values: list[str], key: str, value: str) -> dict[str, str]:
    out = dict(zip(names, values, strict=True))
    out[key] = value
    return out


def cache_config_labels(
    engine: EngineModel,
    *,
    profile: str,
    kv_cache_memory_bytes: int | None,
    num_gpu_blocks_override: int | None,
    user_block_size: bool,
) -> dict[str, str]:
    """The label set of ``vllm:cache_config_info`` (``str()`` of each CacheConfig field, as vLLM does)."""
    layout = engine.layout
    cfg = engine.engine
    prefix = "True" if engine.scheduler.config.enable_prefix_caching else "False"
    window = engine.model.sliding_window
    if profile == "legacy":
        return {
            "block_size": str(layout.block_size),
            "cache_dtype": "auto",
            "cpu_offload_gb": "0",
            "enable_prefix_caching": prefix,
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "is_attention_free": "False",
            "num_cpu_blocks": str(4 * 1024**3 // max(layout.block_bytes, 1)),
            "num_gpu_blocks": str(layout.num_gpu_blocks),
            "num_gpu_blocks_override": str(num_gpu_blocks_override),
            "sliding_window": str(window),
            "swap_space_bytes": str(4 * 1024**3),
        }
    concurrency = layout.max_concurrency
    return {
        "_block_size_resolved": "True",
        "block_size": str(layout.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(layout.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": prefix,
        "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(concurrency, 2)),
        "kv_cache_memory_bytes": str(kv_cache_memory_bytes),
        "kv_cache_size_tokens": str(int(concurrency * layout.max_model_len)),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(layout.num_gpu_blocks),
        "num_gpu_blocks_override": str(num_gpu_blocks_override),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": str(window),
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": str(user_block_size),
    }


def build_registry(collector: EngineCollector, *, process_metrics: bool = True) -> CollectorRegistry:
    """A private registry with the engine collector (plus python/process metrics like a real server)."""
    registry = CollectorRegistry(auto_describe=False)
    if process_metrics:
        GCCollector(registry=registry)
        PlatformCollector(registry=registry)
        ProcessCollector(registry=registry)
    registry.register(collector)
    return registry


def dcgm_text(engine: EngineModel, *, gpu_name: str, num_gpus: int = 1) -> str:
    """DCGM-exporter-shaped text: framebuffer used/free (MiB) and utilisation per modelled GPU."""
    layout = engine.layout
    used = engine.gpu_used_bytes()
    total = layout.gpu_total_bytes or (layout.static_used_bytes + 1024 * MIB)
    used_mib = used // MIB
    free_mib = max(total // MIB - used_mib, 0)
    util = 100 if engine.num_running else 0
    lines: list[str] = []

    def family(name: str, doc: str, value: float) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} gauge")
        for gpu in range(num_gpus):
            labels = (
                f'gpu="{gpu}",UUID="GPU-00000000-0000-0000-0000-00000000000{gpu}",device="nvidia{gpu}",'
                f'modelName="{gpu_name}",Hostname="oomload-sim",DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            lines.append(f"{name}{{{labels}}} {value:g}")

    family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", free_mib)
    family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", used_mib)
    family("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", 0)
    family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", util)
    return "\n".join(lines) + "\n"
