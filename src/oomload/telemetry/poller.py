"""``MetricsPoller``: scrape vLLM's ``/metrics`` on an interval into ``metrics.jsonl``.

Each ``poll_once()`` does one HTTP GET (stdlib ``urllib``, with a timeout; under Locust's gevent
patching its socket I/O is cooperative), parses it with ``parse_vllm_metrics`` and appends one line:

* ok: ``{"t_unix_s", "ok": true, "kv_cache_usage", "num_requests_running", "num_requests_waiting",
  "num_preemptions_total", "preemptions_delta", "prompt_tokens_total", "prompt_tokens_delta",
  "generation_tokens_total", "generation_tokens_delta", "admission_rejections_total",
  "prefix_cache_queries_total", "prefix_cache_hits_total", "e2e_latency_seconds_sum",
  "inference_seconds_sum", "queue_seconds_sum", "restarted", "scrape_ms"}`` — the three ``*_sum``
  fields are vLLM's latency histogram sums in seconds, from which ``oomload.rundir.serverside`` derives how
  many requests the server itself held (Little's law)
* failed: ``{"t_unix_s", "ok": false, "error": "<one sentence>", "scrape_ms"}``

Counters become per-interval deltas against the previous *ok* scrape (the first scrape's deltas
are 0: what happened before oomload watched is not this run's). A counter that drops, or counters
re-created (their ``_created`` timestamp moves), means the server restarted: the line says
``"restarted": true``, ``events.jsonl`` gets a ``server_restarted`` event, and the delta counts
from the new value (never negative). A sample no vLLM could expose (``VllmSnapshot.invalid``: a KV
usage of 7.5, waiting −3) is left out of the line, and the first one of each field is a
``metrics_invalid`` event. Failures are recorded with their time and reason, the first
of a streak also as a ``scrape_failed`` event; they never stop the loop — ``consecutive_failures``
lets the runner treat a streak as a sign of server death. ``t_unix_s`` is stamped when the answer
arrives (under load vLLM can take 1–3 s to answer).

The loop runs in one ``threading.Thread`` and scrapes one at a time: a slow answer delays the next
tick instead of piling up concurrent requests. A line's shape is ``oomload.rundir.records.MetricsLine``,
the one definition readers parse (``MetricsRow``). ``fetch`` (url, timeout_s → text) is the transport;
tests pass a fake one. ``vllm:cache_config_info`` is written once to
``cache_config.json`` (plus ``max_model_len`` when the caller knows it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from oomload.errors import OomloadError, RunDirWriteError
from oomload.rundir import RunWriter
from oomload.rundir.records import MetricsLine
from oomload.telemetry.scrape import fetch_text
from oomload.telemetry.vllm_metrics import VllmSnapshot, parse_vllm_metrics


class MetricsPoller:
    """Scrapes ``base_url``'s ``/metrics`` every ``interval_s`` and appends ``metrics.jsonl``."""

    def __init__(
        self,
        base_url: str,
        writer: RunWriter | None,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 5.0,
        model_name: str | None = None,
        clock: Callable[[], float] = time.time,
        max_model_len: int | None = None,
        fetch: Callable[[str, float], str] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.url = metrics_url(base_url)
        self._writer = writer
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.model_name = model_name
        self._clock = clock
        self.max_model_len = max_model_len
        self._fetch = fetch_text if fetch is None else fetch
        self._previous: VllmSnapshot | None = None
        self._latest: dict[str, Any] | None = None
        self._cache_config: dict[str, Any] | None = None
        self._consecutive_failures = 0
        self.scrapes = 0
        self.failures = 0
        self.restarts = 0
        self._invalid_told: set[str] = set()  # fields whose impossible samples an event already named
        self._scrape_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- public state -------------------------------------------------------------------------
    @property
    def latest(self) -> dict[str, Any] | None:
        """The last ok ``metrics.jsonl`` record, or ``None`` before the first ok scrape."""
        return self._latest

    @property
    def cache_config(self) -> dict[str, Any] | None:
        """``vllm:cache_config_info`` labels (numbers as numbers), once seen."""
        return self._cache_config

    @property
    def consecutive_failures(self) -> int:
        """Failed scrapes since the last ok one (0 after a success)."""
        return self._consecutive_failures

    # -- one scrape -----------------------------------------------------------------------------
    def poll_once(self) -> dict[str, Any]:
        """Scrape once, append the record to ``metrics.jsonl`` and return it."""
        with self._scrape_lock:
            started = time.monotonic()
            try:
                text = self._fetch(self.url, self.timeout_s)
                t_unix_s = self._clock()
                snapshot = parse_vllm_metrics(text, t_unix_s=t_unix_s, model_name=self.model_name)
            except OomloadError as err:
                return self._record_failure(str(err), started)
            return self._record_ok(snapshot, started)

    def _record_ok(self, snapshot: VllmSnapshot, started: float) -> dict[str, Any]:
        previous = self._previous
        restarted = previous is not None and _restarted(previous, snapshot)
        record: MetricsLine = {
            "t_unix_s": snapshot.t_unix_s,
            "ok": True,
            "kv_cache_usage": snapshot.kv_cache_usage,
            "num_requests_running": snapshot.num_requests_running,
            "num_requests_waiting": snapshot.num_requests_waiting,
            "num_preemptions_total": snapshot.num_preemptions_total,
            "preemptions_delta": _delta(previous, snapshot, "num_preemptions_total", restarted),
            "prompt_tokens_total": snapshot.prompt_tokens_total,
            "prompt_tokens_delta": _delta(previous, snapshot, "prompt_tokens_total", restarted),
            "generation_tokens_total": snapshot.generation_tokens_total,
            "generation_tokens_delta": _delta(previous, snapshot, "generation_tokens_total", restarted),
            "admission_rejections_total": snapshot.admission_rejections_total,
            "prefix_cache_queries_total": snapshot.prefix_cache_queries_total,
            "prefix_cache_hits_total": snapshot.prefix_cache_hits_total,
            "e2e_latency_seconds_sum": _seconds(snapshot.e2e_latency_seconds_sum),
            "inference_seconds_sum": _seconds(snapshot.inference_seconds_sum),
            "queue_seconds_sum": _seconds(snapshot.queue_seconds_sum),
            "restarted": restarted,
            "scrape_ms": round((time.monotonic() - started) * 1000.0, 1),
        }
        self._previous = snapshot
        self._latest = dict(record)
        self._consecutive_failures = 0
        self.scrapes += 1
        if self._writer is not None:
            self._writer.append("metrics", record)
        if restarted:
            self.restarts += 1
            assert previous is not None
            if self._writer is not None:
                self._writer.event(
                    "server_restarted",
                    t_unix_s=snapshot.t_unix_s,
                    evidence=_restart_evidence(previous, snapshot),
                )
        for field, why in (snapshot.invalid or {}).items():
            if field not in self._invalid_told and self._writer is not None:
                self._writer.event("metrics_invalid", t_unix_s=snapshot.t_unix_s, field=field, detail=why)
            self._invalid_told.add(field)
        if self._cache_config is None and snapshot.cache_config is not None:
            config = dict(snapshot.cache_config)
            if self.max_model_len is not None:
                config["max_model_len"] = self.max_model_len
            self._cache_config = config
            if self._writer is not None:
                # a full run directory is recorded by the writer, which stops the run (oomload.rundir)
                with contextlib.suppress(RunDirWriteError):
                    self._writer.write_json("cache_config.json", config)
        return dict(record)

    def _record_failure(self, error: str, started: float) -> dict[str, Any]:
        t_unix_s = self._clock()
        record: MetricsLine = {
            "t_unix_s": t_unix_s,
            "ok": False,
            "error": error,
            "scrape_ms": round((time.monotonic() - started) * 1000.0, 1),
        }
        self._consecutive_failures += 1
        self.failures += 1
        self.scrapes += 1
        if self._writer is not None:
            self._writer.append("metrics", record)
            if self._consecutive_failures == 1:
                self._writer.event("scrape_failed", t_unix_s=t_unix_s, url=self.url, error=error)
        return dict(record)

    # -- the loop -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start scraping every ``interval_s`` in a background thread (a greenlet under gevent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="oomload-metrics-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop; waits for a scrape in flight (at most ``timeout_s``)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.timeout_s + self.interval_s + 1.0)

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            self.poll_once()
            next_tick += self.interval_s
            now = time.monotonic()
            if next_tick < now:  # a slow answer: skip the missed ticks, never catch up in a burst
                next_tick = now
            self._stop.wait(next_tick - now)

    def __enter__(self) -> MetricsPoller:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def metrics_url(base_url: str) -> str:
    """``http://host:port`` (or ``…/v1``, or the full ``…/metrics`` URL) → the ``/metrics`` URL."""
    url = base_url.rstrip("/")
    if url.endswith("/metrics"):
        return url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url + "/metrics"


def _restarted(previous: VllmSnapshot, current: VllmSnapshot) -> bool:
    if (
        previous.counters_created_unix_s is not None
        and current.counters_created_unix_s is not None
        and current.counters_created_unix_s > previous.counters_created_unix_s
    ):
        return True
    return _dropped_counter(previous, current) is not None


def _dropped_counter(previous: VllmSnapshot, current: VllmSnapshot) -> tuple[str, int, int] | None:
    after = current.counters()
    for name, old in previous.counters().items():
        new = after[name]
        if old is not None and new is not None and new < old:
            return name, old, new
    return None


def _restart_evidence(previous: VllmSnapshot, current: VllmSnapshot) -> str:
    dropped = _dropped_counter(previous, current)
    if dropped is not None:
        name, old, new = dropped
        return f"vllm:{name} dropped from {old} to {new}"
    return "vllm: counters were re-created (their _created timestamp moved forward)"


def _delta(previous: VllmSnapshot | None, current: VllmSnapshot, field: str, restarted: bool) -> int | None:
    new = getattr(current, field)
    if new is None:
        return None
    if previous is None:
        return 0
    if restarted:
        return int(new)
    old = getattr(previous, field)
    if old is None:
        return 0
    return max(0, int(new) - int(old))


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
