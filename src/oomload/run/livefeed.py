"""The run directory as the web UI's live charts see it: read incrementally while the run writes it.

The report draws its timeline from the run directory; the web UI's **oomload** tab draws the same
series from the same files while they grow, so the live charts and ``report.html`` never disagree
about what was measured. ``LiveFeed`` keeps a byte offset per file (``steps``, ``metrics``, ``gpu``,
``events``, every ``requests*.jsonl`` — worker processes write one each; ``rundir.io.JsonlTail``)
and on every ``poll()`` reads only the complete lines appended since; a torn last line waits for its
end. Each line is parsed by the run directory's own typed records (``oomload.rundir.records``:
``StepLines``, ``MetricsRow``, ``GpuSampleRow``, ``EventRow``; ``RequestResult``), the reader the
verdict uses, so the live view and the report read one format one way.

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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from oomload.outcome import Outcome
from oomload.run.snapshot import LatencyFigures, TtftFigures
from oomload.rundir.io import JsonlTail, parse_request
from oomload.rundir.records import EventRow, GpuSampleRow, MetricsRow, StepLines, as_float

MAX_POINTS = 1500
STREAMS = ("steps", "metrics", "gpu", "events")
GIB = 2**30
Row = TypeVar("Row")


class LiveFeed:
    """What the run directory holds so far, for the live charts (module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._tails = {name: JsonlTail(self.run_dir / f"{name}.jsonl") for name in STREAMS}
        self._request_tails: dict[Path, JsonlTail] = {}
        self.steps = StepLines()
        self.metrics: list[MetricsRow] = []  # the ok scrapes
        self.gpu: list[GpuSampleRow] = []
        self.events: list[EventRow] = []
        self.ttft_by_step: dict[int, list[float]] = {}

    def poll(self) -> None:
        self.steps.add(self._tails["steps"].read())
        scrapes = map(MetricsRow.from_json, self._tails["metrics"].read())
        self.metrics += [m for m in scrapes if m is not None and m.ok]
        self.gpu += filter(None, map(GpuSampleRow.from_json, self._tails["gpu"].read()))
        self.events += filter(None, map(EventRow.from_json, self._tails["events"].read()))
        for path in sorted(self.run_dir.glob("requests*.jsonl")):
            tail = self._request_tails.setdefault(path, JsonlTail(path))
            for r in filter(None, map(parse_request, tail.read())):
                ttft = as_float(r.ttft_ms)
                if r.outcome is Outcome.OK and isinstance(r.step, int) and ttft is not None:
                    self.ttft_by_step.setdefault(r.step, []).append(ttft)

    @property
    def t0_unix_s(self) -> float | None:
        starts = [b.start_unix_s for b in self.steps.boundaries()]
        firsts = [m.t_unix_s for m in self.metrics[:1]]
        candidates = starts + firsts
        return min(candidates) if candidates else None

    def timeline(self) -> dict[str, Any]:
        """The series the live charts draw (module docstring)."""
        t0 = self.t0_unix_s
        if t0 is None:
            return {"t0_unix_s": None, "steps": [], "metrics": {}, "gpu": {}, "marks": []}

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 3)

        steps = [
            {
                "index": b.index,
                "concurrency": b.concurrency,
                "phase": b.phase,
                "start_s": rel(b.start_unix_s),
                "end_s": rel(b.end_unix_s),
            }
            for b in self.steps.boundaries()
        ]
        metrics = _buckets(self.metrics)
        gpu = _buckets(self.gpu)
        marks: list[dict[str, Any]] = []
        for event in self.events:
            if event.kind == "first_preemption":
                marks.append({"kind": "first_preemption", "t_s": rel(event.t_unix_s),
                              "concurrency": event.fields.get("concurrency")})  # fmt: skip
            elif event.kind == "server_dead":
                marks.append({"kind": "server_dead", "t_s": rel(event.t_unix_s)})
        totals = [float(g.total_bytes) for g in self.gpu if g.total_bytes]
        return {
            "t0_unix_s": t0,
            "steps": steps,
            "metrics": {
                "t_s": [rel(b[-1].t_unix_s) for b in metrics],
                "kv_percent": [_scaled(_most(b, lambda m: m.kv_cache_usage), 100) for b in metrics],
                "preemptions": [_sum(b, lambda m: m.preemptions_delta) for b in metrics],
                "running": [_most(b, lambda m: m.num_requests_running) for b in metrics],
                "waiting": [_most(b, lambda m: m.num_requests_waiting) for b in metrics],
            },
            "gpu": {
                "t_s": [rel(b[-1].t_unix_s) for b in gpu],
                "used_gib": [_scaled(_most(b, lambda g: g.used_bytes), 1 / GIB) for b in gpu],
                "total_gib": None if not totals else round(max(totals) / GIB, 3),
            },
            "marks": marks,
        }

    def ttft(self, step: int | None) -> TtftFigures:
        """TTFT P50/P99 (ms) and sample counts: of ``step`` and of the whole run."""
        every = [v for values in self.ttft_by_step.values() for v in values]
        return TtftFigures(
            step=None if step is None else LatencyFigures.of(self.ttft_by_step.get(step, [])),
            run=LatencyFigures.of(every),
        )


def _buckets(rows: list[Row]) -> list[list[Row]]:
    """At most ``MAX_POINTS`` runs of consecutive rows (one row each while the run is short)."""
    stride = max(1, math.ceil(len(rows) / MAX_POINTS))
    return [rows[i : i + stride] for i in range(0, len(rows), stride)]


def _known(bucket: Iterable[Row], value_of: Callable[[Row], float | None]) -> list[float]:
    return [float(v) for v in map(value_of, bucket) if v is not None]


def _most(bucket: Iterable[Row], value_of: Callable[[Row], float | None]) -> float | None:
    known = _known(bucket, value_of)
    return max(known) if known else None


def _sum(bucket: Iterable[Row], value_of: Callable[[Row], float | None]) -> float | None:
    known = _known(bucket, value_of)
    return sum(known) if known else None


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 4)
