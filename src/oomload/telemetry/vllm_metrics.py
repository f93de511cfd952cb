"""vLLM's Prometheus ``/metrics`` text → one ``VllmSnapshot`` (pure: no I/O, no clock).

Algorithm
---------
1. Keep the sample lines of the series read below (``WANTED_NAMES``; most of vLLM's text is
   histogram buckets no field needs) and parse them with ``prometheus_client.parser`` (never by
   hand); when no such line is there, parse the whole text instead. Malformed text raises
   ``EndpointError``; text with no ``vllm:`` series at all (a server started with
   ``--disable-log-stats``, or something that is not vLLM) raises ``EndpointError`` saying so.
2. Keep the ``vllm:`` samples, keyed by their exposed *sample* name (``vllm:num_preemptions_total``;
   ``*_created`` series are never looked up, so they are ignored).
3. Filter by the ``model_name`` label when a model is given (series without that label, such as
   ``cache_config_info``, always pass). vLLM labels every series of a server with its first served
   name, so a model it serves under another name — a LoRA adapter, the second of
   ``--served-model-name a b`` — has no label of its own: when the text has one ``model_name`` only,
   that label is the server's and is read whatever the model. Among several labels, a filter that
   matches none raises ``ConfigError`` naming them. Without a filter, several models raise
   ``ConfigError`` too: adding two models' KV usage would be meaningless.
4. For each field, take the first candidate name present (``NAME_CANDIDATES``: the current name
   first, then older ones — ``kv_cache_usage_perc`` then the pre-0.11 ``gpu_cache_usage_perc``;
   counters with and without ``_total``; ``prefix_cache_*`` then the 0.8-era ``gpu_prefix_cache_*``).
5. Combine the series of that name: counters and request counts are *summed* over every label
   combination (data-parallel ``engine`` labels, ``reason`` labels of admission rejections) — the
   latency histograms' ``_sum`` series (seconds) as floats, the counts as integers; the KV
   usage fraction takes the *maximum* over engines — each engine has its own pool of the same size
   and the fullest one is the one that preempts first.
6. ``vllm:cache_config_info`` labels become ``cache_config`` with numbers as numbers (``"96"`` → 96,
   ``"0.92"`` → 0.92, ``"True"`` → true, ``"None"`` → null; anything else stays a string). With
   several engines the first engine's labels are kept and ``engine_count`` says how many there were.

A sample no vLLM can expose — a usage fraction outside 0–1, a negative or infinite count or
sum — is dropped as a NaN sample is (a field with no other sample reads ``None``: not exposed),
and ``VllmSnapshot.invalid`` names it: one sentence a field, for the run's events.

``vllm:cpu_cache_usage_perc`` (V0 only) measured the CPU *swap space*, not the KV pool, so it is
reported separately as ``cpu_cache_usage`` and never used as the KV usage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from oomload.errors import ConfigError, EndpointError
from oomload.rundir.records import as_share, as_tally_float

VLLM_PREFIX = "vllm:"

# field → exposed sample names, newest first (reference/vllm-facts.md §1.3).
NAME_CANDIDATES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "cpu_cache_usage": ("vllm:cpu_cache_usage_perc",),
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "num_requests_swapped": ("vllm:num_requests_swapped",),
    "num_preemptions_total": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
    "generation_tokens_total": ("vllm:generation_tokens_total", "vllm:generation_tokens"),
    "admission_rejections_total": ("vllm:admission_rejections_total", "vllm:admission_rejections"),
    "prefix_cache_queries_total": (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_queries",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries",
    ),
    "prefix_cache_hits_total": (
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_hits",
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits",
    ),
    # histogram sums in seconds: Little's law over two scrapes gives the mean requests in the server
    # (``oomload.rundir.serverside``); the queue and inference phases exist in V1 only
    "e2e_latency_seconds_sum": ("vllm:e2e_request_latency_seconds_sum",),
    "inference_seconds_sum": ("vllm:request_inference_time_seconds_sum",),
    "queue_seconds_sum": ("vllm:request_queue_time_seconds_sum",),
}
# A counter's ``_created`` series: when it moves forward, the server's counters were re-created.
CREATED_NAME = "vllm:num_preemptions_created"
CACHE_CONFIG_NAME = "vllm:cache_config_info"
# Every exposed sample name a field, the restart check or the cache config is read from.
WANTED_NAMES = frozenset(
    {name for names in NAME_CANDIDATES.values() for name in names} | {CREATED_NAME, CACHE_CONFIG_NAME}
)
# Fields combined with max() across engines instead of sum().
FRACTION_FIELDS = frozenset({"kv_cache_usage", "cpu_cache_usage"})
# Fields summed across engines as floats (seconds), never rounded to an integer count.
SECONDS_FIELDS = frozenset({"e2e_latency_seconds_sum", "inference_seconds_sum", "queue_seconds_sum"})
# Fields that are monotonically increasing counters (deltas and restart detection use them).
COUNTER_FIELDS = (
    "num_preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "admission_rejections_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
)


@dataclass(frozen=True)
class VllmSnapshot:
    """One scrape of vLLM's ``/metrics``, mapped to version-independent fields (``None`` = not exposed)."""

    t_unix_s: float
    kv_cache_usage: float | None
    num_requests_running: int | None
    num_requests_waiting: int | None
    num_preemptions_total: int | None
    prompt_tokens_total: int | None
    generation_tokens_total: int | None
    admission_rejections_total: int | None
    prefix_cache_queries_total: int | None = None
    prefix_cache_hits_total: int | None = None
    cpu_cache_usage: float | None = None
    num_requests_swapped: int | None = None
    e2e_latency_seconds_sum: float | None = None
    inference_seconds_sum: float | None = None
    queue_seconds_sum: float | None = None
    cache_config: dict[str, Any] | None = None
    model_names: tuple[str, ...] = ()
    engine_count: int = 0
    counters_created_unix_s: float | None = None
    # exposed name each field was read from, e.g. {"kv_cache_usage": "vllm:gpu_cache_usage_perc"}
    sources: Mapping[str, str] | None = None
    # field → why its samples were dropped: "vllm:kv_cache_usage_perc = 7.5, not a fraction in 0–1"
    invalid: Mapping[str, str] | None = None

    def counters(self) -> dict[str, int | None]:
        """The monotonically increasing counters, by field name."""
        return {name: getattr(self, name) for name in COUNTER_FIELDS}


def parse_vllm_metrics(text: str, *, t_unix_s: float, model_name: str | None = None) -> VllmSnapshot:
    """Map one ``/metrics`` body to a ``VllmSnapshot`` (see the module docstring for the rules)."""
    samples = _vllm_samples(text)
    if not samples:
        raise EndpointError(
            "the /metrics answer has no vllm: metrics: the server runs with --disable-log-stats "
            "(start it without that flag) or it is not a vLLM server"
        )
    models = sorted({labels["model_name"] for _, labels, _ in samples if "model_name" in labels})
    if model_name is not None and models and model_name not in models and len(models) == 1:
        model_name = models[0]  # a LoRA adapter or another served name: counted under the server's one label
    if model_name is not None:
        if models and model_name not in models:
            raise ConfigError(
                f"model {model_name!r} has no vllm: metrics at /metrics; "
                f"models there: {', '.join(repr(m) for m in models)}"
            )
        samples = [s for s in samples if s[1].get("model_name", model_name) == model_name]
    elif len(models) > 1:
        raise ConfigError(
            f"/metrics serves several models ({', '.join(repr(m) for m in models)}): name the one to watch"
        )

    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in samples:
        by_name.setdefault(name, []).append((labels, value))

    fields: dict[str, Any] = {}
    sources: dict[str, str] = {}
    invalid: dict[str, str] = {}
    for field, candidates in NAME_CANDIDATES.items():
        for candidate in candidates:
            series = by_name.get(candidate)
            if series:
                values = [v for _, v in series if not math.isnan(v)]
                bad = [v for v in values if not _possible(field, v)]
                if bad:
                    invalid[field] = f"{candidate} = {bad[0]:g}, {_POSSIBLE_TEXT[field in FRACTION_FIELDS]}"
                    values = [v for v in values if _possible(field, v)]
                if not values:
                    break
                sources[field] = candidate
                if field in FRACTION_FIELDS:
                    fields[field] = max(values)
                elif field in SECONDS_FIELDS:
                    fields[field] = sum(values)
                else:
                    fields[field] = _as_int(sum(values))
                break
        else:
            fields[field] = None
        fields.setdefault(field, None)

    engines = {labels["engine"] for _, labels, _ in samples if "engine" in labels}
    created = [v for _, v in by_name.get(CREATED_NAME, [])]
    return VllmSnapshot(
        t_unix_s=t_unix_s,
        **fields,
        cache_config=_cache_config(by_name.get(CACHE_CONFIG_NAME, [])),
        model_names=tuple(models),
        engine_count=len(engines) if engines else 1,
        counters_created_unix_s=max(created) if created else None,
        sources=sources,
        invalid=invalid or None,
    )


_POSSIBLE_TEXT = {True: "not a fraction in 0–1", False: "not a finite number ≥ 0"}


def _possible(field: str, value: float) -> bool:
    """Whether any vLLM could expose ``value`` for ``field``: a fraction in 0–1, else finite ≥ 0 — the
    rule the run directory's reader applies too (``rundir.records.as_share`` / ``as_tally_float``)."""
    return (as_share if field in FRACTION_FIELDS else as_tally_float)(value) is not None


def parse_label_value(text: str) -> Any:
    """A ``cache_config_info`` label value as JSON: int, float, bool, ``None`` or the string itself."""
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def _wanted_lines(text: str) -> str:
    """The sample lines of the series this module reads (``WANTED_NAMES``), comments dropped.

    A real vLLM's ``/metrics`` is about 600 lines (54 KB), most of them histogram buckets that no
    field needs; parsing all of it took 8.5 ms of the load generator's CPU per scrape, in the
    process whose users read the streams. Empty when no such line is there: the caller then parses
    the whole text, so that malformed text and a server without vLLM's metrics are told as before.
    """
    kept = []
    for line in text.splitlines():
        if line.startswith(VLLM_PREFIX):
            end = len(line)
            for stop in ("{", " "):
                at = line.find(stop)
                if at != -1 and at < end:
                    end = at
            if line[:end] in WANTED_NAMES:
                kept.append(line)
    return "\n".join(kept) + "\n" if kept else ""


def _vllm_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    try:
        families = list(text_string_to_metric_families(_wanted_lines(text) or text))
    except (ValueError, TypeError, IndexError) as err:
        snippet = text.strip().splitlines()[0][:80] if text.strip() else ""
        raise EndpointError(
            f"the /metrics answer is not Prometheus text ({err}); it starts with {snippet!r}"
        ) from err
    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in families
        for sample in family.samples
        if sample.name.startswith(VLLM_PREFIX)
    ]


def _cache_config(series: Iterable[tuple[dict[str, str], float]]) -> dict[str, Any] | None:
    rows = sorted(series, key=lambda row: row[0].get("engine", ""))
    if not rows:
        return None
    labels = rows[0][0]
    config = {
        key: parse_label_value(value) for key, value in labels.items() if key not in ("engine", "model_name")
    }
    config["engine_count"] = len(rows)
    return config


def _as_int(value: float) -> int:
    return round(value)
