"""``--target-rate R``: the concurrency a request rate needs, measured on the server (pure).

The tuner's search and proof work in concurrency: ``max_num_seqs`` caps the requests the server holds
at once, the trace's odds are per concurrency level, and the proof replays closed-loop levels. A rate
target (requests per second, open loop: arrivals do not wait for answers) becomes a concurrency by
Little's law, ``L = R × W``: the mean number of requests in flight is the arrival rate times the mean
time each one stays. The trace carries lengths and arrival times but no latency, and ``W`` depends on
the server (its speed, its batch, whether it preempts), so ``W`` is not guessed — it is measured:

1. the first candidate that starts is given the largest ``max_num_seqs`` of the ladder (nothing held
   back: the rate's own in-flight count shows) and, before its proof, a short **open-loop replay**
   (``oomload replay --open-loop``) of the trace's first ``calibration_requests`` requests, their
   arrival times scaled so that they arrive at ``R`` on average (``arrival_scale``);
2. that replay's step measures the mean requests in flight at the client directly (its
   ``achieved_concurrency``: the time-average of the in-flight count, which *is* ``R × W`` over the
   step), and the target concurrency is ``ceil`` of it (``rate_target_from_summary``); ``W`` is
   reported beside it as ``L`` over the rate the replay achieved;
3. the tune then runs exactly as ``--target-concurrency C`` would: the same candidate is proved at
   ``C`` and one level above (the level above covers the bursts a mean hides), and the search goes on.

Why measured rather than predicted: a latency model would need the GPU's and model's speed, which
only the server knows; one short replay costs seconds and no extra start. The rate, the measured
``L`` and ``W``, and the concurrency are all in ``tune.json`` and every report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oomload.rundir.summary import Summary
from oomload.trace.model import TraceRecord

CALIBRATION_WINDOW_S = 20.0  # the open-loop replay spans about this long at the target rate
MIN_CALIBRATION_REQUESTS = 24


@dataclass(frozen=True, slots=True)
class RateTarget:
    """What the open-loop replay at the target rate measured, and the concurrency it translates to."""

    rate_rps: float  # asked
    concurrency: int  # ceil(in_flight_mean): the target the search proves
    in_flight_mean: float  # L, measured at the client
    achieved_rps: float | None  # the rate the replay delivered
    requests: int  # counted in the open-loop replay's step (at most the requests it sent)
    preemptions: int  # the server's own counter during that replay
    run_dir: str

    @property
    def latency_s(self) -> float | None:
        """``W = L / R`` (Little's law), from the achieved rate."""
        if not self.achieved_rps:
            return None
        return self.in_flight_mean / self.achieved_rps

    def sentence(self) -> str:
        w = self.latency_s
        return (
            f"{self.rate_rps:g} req/s → concurrency {self.concurrency} (Little's law, measured: "
            f"{self.in_flight_mean:.2f} requests in flight on average"
            + ("" if w is None else f" = {self.achieved_rps:.2f} req/s × {w:.2f} s each")
            + f", {self.requests} open-loop requests, {self.preemptions} preemptions)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rate_rps": self.rate_rps,
            "concurrency": self.concurrency,
            "in_flight_mean": self.in_flight_mean,
            "achieved_rps": self.achieved_rps,
            "latency_s": self.latency_s,
            "requests": self.requests,
            "preemptions": self.preemptions,
            "run_dir": self.run_dir,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RateTarget:
        return cls(
            rate_rps=float(obj["rate_rps"]),
            concurrency=int(obj["concurrency"]),
            in_flight_mean=float(obj["in_flight_mean"]),
            achieved_rps=obj.get("achieved_rps"),
            requests=int(obj.get("requests") or 0),
            preemptions=int(obj.get("preemptions") or 0),
            run_dir=str(obj.get("run_dir", "")),
        )


def calibration_requests(rate_rps: float, available: int, max_requests: int) -> int:
    """How many of the trace's requests the open-loop replay sends: about ``CALIBRATION_WINDOW_S`` at
    the rate, at least ``MIN_CALIBRATION_REQUESTS``, at most ``max_requests`` and the trace's size."""
    wanted = max(MIN_CALIBRATION_REQUESTS, math.ceil(rate_rps * CALIBRATION_WINDOW_S))
    return max(1, min(wanted, max_requests, available))


def arrival_scale(records: Sequence[TraceRecord], rate_rps: float) -> float:
    """The ``--arrival-scale`` that makes ``records`` arrive at ``rate_rps`` on average: the trace's own
    mean rate over the asked one (1 when the trace's arrivals carry no spacing: all at once)."""
    if len(records) < 2:
        return 1.0
    span_s = max(r.arrival_s for r in records) - min(r.arrival_s for r in records)
    if span_s <= 0:
        return 1.0
    own_rps = (len(records) - 1) / span_s
    return own_rps / rate_rps


def rate_target_from_summary(summary: Summary | None, *, rate_rps: float, run_dir: str) -> RateTarget | None:
    """The translation from the open-loop replay's ``summary.json`` (``None``: nothing measured)."""
    steps = [] if summary is None else [s for s in summary.steps if not s.warmup]
    if not steps:
        return None
    step = steps[0]
    in_flight = step.achieved_concurrency
    if in_flight is None or not in_flight > 0:
        return None
    achieved = step.req_per_s
    return RateTarget(
        rate_rps=rate_rps,
        concurrency=max(1, math.ceil(in_flight - 1e-9)),
        in_flight_mean=in_flight,
        achieved_rps=achieved if achieved is not None and achieved > 0 else None,
        requests=step.requests,
        preemptions=step.preemptions or 0,
        run_dir=run_dir,
    )
