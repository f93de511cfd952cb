"""Plain-HTTP helpers the e2e tests use to look at the real vLLM *independently* of oomload.

Standard library + ``prometheus_client``'s parser only; a fresh connection per request (no pooled
keep-alive), so these helpers never suffer the keep-alive race they help to test.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

PREEMPTIONS = "vllm:num_preemptions_total"


def get_json(url: str, timeout_s: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def samples(base_url: str, timeout_s: float = 30.0) -> list[Sample]:
    """Every sample of ``/metrics``, parsed by ``prometheus_client``."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode("utf-8")
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def scrape(base_url: str, timeout_s: float = 30.0) -> dict[str, float]:
    """``/metrics`` as {sample name: value summed over label sets}."""
    values: dict[str, float] = {}
    for sample in samples(base_url, timeout_s):
        values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


def cache_config(base_url: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info``."""
    for sample in samples(base_url):
        if sample.name == "vllm:cache_config_info":
            return dict(sample.labels)
    raise AssertionError("the server exports no vllm:cache_config_info")


def token_prompt(rng: random.Random, prompt_tokens: int) -> list[int]:
    """Distinct random token ids (no special tokens), so prefix caching cannot share blocks."""
    return [rng.randrange(16, 2000) for _ in range(prompt_tokens)]


@dataclass(frozen=True)
class Completion:
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None


def complete(
    base_url: str,
    prompt: list[int],
    output_tokens: int,
    *,
    model: str = "tiny-model",
    timeout_s: float = 120.0,
) -> Completion:
    """One non-streaming ``/v1/completions`` request with an exact output length."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "min_tokens": output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    request = urllib.request.Request(
        base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Connection": "close"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            usage = json.loads(resp.read()).get("usage") or {}
            return Completion(int(resp.status), usage.get("prompt_tokens"), usage.get("completion_tokens"))
    except urllib.error.HTTPError as err:
        return Completion(err.code, None, None)


def burst(
    base_url: str, concurrency: int, prompt_tokens: int, output_tokens: int, rng: random.Random
) -> list[Completion]:
    """``concurrency`` requests sent at the same moment; returns when all are answered."""
    prompts = [token_prompt(rng, prompt_tokens) for _ in range(concurrency)]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda p: complete(base_url, p, output_tokens), prompts))


@dataclass
class CounterWatch:
    """Polls one counter in a thread, recording (sent, received, value) for every scrape.

    A value read by a scrape reflects some moment between the request being sent and the answer
    arriving, so a rise between two scrapes happened after the earlier one was *sent* and before the
    later one was *received*.
    """

    base_url: str
    name: str = PREEMPTIONS
    interval_s: float = 0.2
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> CounterWatch:
        self._thread = threading.Thread(target=self._loop, name="counter-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        while not self._stop.is_set():
            sent = time.time()
            try:
                value = scrape(self.base_url).get(self.name, 0.0)
            except (OSError, ValueError):
                self.errors += 1
            else:
                self.samples.append((sent, time.time(), value))
            self._stop.wait(self.interval_s)

    def bounds(self, sent_unix_s: float, received_unix_s: float) -> tuple[float, float]:
        """(low, high) for the counter as another scrape, sent and received at these times, read it.

        Low: the highest value among this watch's scrapes received before that one was sent; high:
        the lowest among those sent after it was received (the counter only grows).
        """
        before = [v for _sent, recv, v in self.samples if recv <= sent_unix_s]
        after = [v for sent, _recv, v in self.samples if sent >= received_unix_s]
        assert before and after, f"the watch has no scrape on both sides of {sent_unix_s}–{received_unix_s}"
        return max(before), min(after)

    def first_rise_window(self) -> tuple[float, float] | None:
        """(earliest, latest) Unix time of the first rise above the first sample, or None."""
        if not self.samples:
            return None
        baseline = self.samples[0][2]
        for (prev_sent, _prev_recv, _), (_sent, recv, value) in itertools.pairwise(self.samples):
            if value > baseline:
                return (prev_sent, recv)
        return None
