"""The run directory as the web UI's live charts see it: read incrementally while the run writes it.

The report draws its timeline from the run directory; the web UI's **oomload** tab draws the same
series from the same files while they grow, so the live charts and ``report.html`` never disagree
about what was measured. ``LiveFeed`` keeps a byte offset per file (``steps``, ``metrics``, ``gpu``,
``events``, every ``requests*.jsonl`` — worker processes write one each) and on every ``poll()``
reads only the complete lines appended since; a torn last line waits for its end.

``timeline()`` is the JSON the page draws (times in seconds since the run's first step, ``t0_unix_s``
given): the steps (start, end, concurrency, phase), KV usage, preemptions per scrape, running and
waiting requests, device memory used and total, the first preemption and the server's death. A long
run's samples are merged into at most ``MAX_POINTS`` buckets of consecutive samples: the peak of the
gauges, the sum of the preemptions (none is lost).

``ttft()`` is TTFT as its own metric — it is not a Locust request: nearest-rank P50/P99 over the ok
requests of the current step and of the run, with the sample counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oomload.rundir import json_object
from oomload.stats import percentile

MAX_POINTS = 1500
STREAMS = ("steps", "metrics", "gpu", "events")
GIB = 2**30


class _Tail:
    """The complete JSON lines appended to one file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()  # b"" after a complete last line
        return [obj for line in lines if (obj := json_object(line)) is not None]


class LiveFeed:
    """What the run directory holds so far, for the live charts (module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._tails = {name: _Tail(self.run_dir / f"{name}.jsonl") for name in STREAMS}
        self._request_tails: dict[Path, _Tail] = {}
        self.steps: dict[int, dict[str, Any]] = {}
        self.metrics: list[dict[str, Any]] = []
        self.gpu: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.ttft_by_step: dict[int, list[float]] = {}

    def poll(self) -> None:
        for record in self._tails["steps"].read():
            index = record.get("step")
            if not isinstance(index, int):
                continue
            entry = self.steps.setdefault(index, {"index": index})
            if record.get("event") == "start":
                entry.update(
                    start=_num(record.get("t_unix_s")),
                    concurrency=record.get("concurrency"),
                    phase=record.get("phase", "ramp"),
                )
            elif record.get("event") == "end":
                entry.update(end=_num(record.get("t_unix_s")), reason=record.get("reason"))
        self.metrics += [m for m in self._tails["metrics"].read() if m.get("ok") and _num(m.get("t_unix_s"))]
        self.gpu += [g for g in self._tails["gpu"].read() if _num(g.get("t_unix_s"))]
        self.events += self._tails["events"].read()
        for path in sorted(self.run_dir.glob("requests*.jsonl")):
            tail = self._request_tails.setdefault(path, _Tail(path))
            for r in tail.read():
                ttft, step = _num(r.get("ttft_ms")), r.get("step")
                if r.get("outcome") == "ok" and isinstance(step, int) and ttft is not None:
                    self.ttft_by_step.setdefault(step, []).append(ttft)

    @property
    def t0_unix_s(self) -> float | None:
        starts = [s["start"] for s in self.steps.values() if s.get("start") is not None]
        firsts = [float(m["t_unix_s"]) for m in self.metrics[:1]]
        candidates = starts + firsts
        return min(candidates) if candidates else None

    def timeline(self) -> dict[str, Any]:
        """The series the live charts draw (module docstring)."""
        t0 = self.t0_unix_s
        if t0 is None:
            return {"t0_unix_s": None, "steps": [], "metrics": {}, "gpu": {}, "marks": []}

        def rel(t: Any) -> float | None:
            value = _num(t)
            return None if value is None else round(value - t0, 3)

        steps = [
            {
                "index": s["index"],
                "concurrency": s.get("concurrency"),
                "phase": s.get("phase"),
                "start_s": rel(s.get("start")),
                "end_s": rel(s.get("end")),
            }
            for s in sorted(self.steps.values(), key=lambda s: s.get("start") or math.inf)
            if s.get("start") is not None
        ]
        metrics = _buckets(self.metrics)
        gpu = _buckets(self.gpu)
        marks = []
        for event in self.events:
            if event.get("kind") == "first_preemption":
                marks.append({"kind": "first_preemption", "t_s": rel(event.get("t_unix_s")),
                              "concurrency": event.get("concurrency")})  # fmt: skip
            elif event.get("kind") == "server_dead":
                marks.append({"kind": "server_dead", "t_s": rel(event.get("t_unix_s"))})
        totals = [float(g["total_bytes"]) for g in self.gpu if _num(g.get("total_bytes"))]
        return {
            "t0_unix_s": t0,
            "steps": steps,
            "metrics": {
                "t_s": [rel(b[-1]["t_unix_s"]) for b in metrics],
                "kv_percent": [_scaled(_most(b, "kv_cache_usage"), 100) for b in metrics],
                "preemptions": [_sum(b, "preemptions_delta") for b in metrics],
                "running": [_most(b, "num_requests_running") for b in metrics],
                "waiting": [_most(b, "num_requests_waiting") for b in metrics],
            },
            "gpu": {
                "t_s": [rel(b[-1]["t_unix_s"]) for b in gpu],
                "used_gib": [_scaled(_most(b, "used_bytes"), 1 / GIB) for b in gpu],
                "total_gib": None if not totals else round(max(totals) / GIB, 3),
            },
            "marks": marks,
        }

    def ttft(self, step: int | None) -> dict[str, Any]:
        """TTFT P50/P99 (ms) and sample counts: of ``step`` and of the whole run."""
        every = [v for values in self.ttft_by_step.values() for v in values]
        return {
            "step": None if step is None else _latency(self.ttft_by_step.get(step, [])),
            "run": _latency(every),
        }


def _latency(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    return {"n": len(values), "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99)}


def _buckets(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """At most ``MAX_POINTS`` runs of consecutive records (one record each while the run is short)."""
    stride = max(1, math.ceil(len(records) / MAX_POINTS))
    return [records[i : i + stride] for i in range(0, len(records), stride)]


def _most(bucket: list[dict[str, Any]], key: str) -> float | None:
    known = [v for v in (_num(r.get(key)) for r in bucket) if v is not None]
    return max(known) if known else None


def _sum(bucket: list[dict[str, Any]], key: str) -> float | None:
    known = [v for v in (_num(r.get(key)) for r in bucket) if v is not None]
    return sum(known) if known else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _scaled(value: Any, factor: float) -> float | None:
    number = _num(value)
    return None if number is None else round(number * factor, 4)
