"""What the server itself held: requests inside vLLM during a step, from its own counters (pure).

The client's in-flight count says what it *sent*. On a busy host the server can hold fewer: requests
wait in the client, the kernel or the API server before vLLM counts them, and tokens that vLLM has
produced wait to be read. A verdict "preemption begins at concurrency N" is only as good as the
load the engine saw, so each step also reports the server's side, from the sums of three per-request
latency histograms that vLLM exports (a request adds its time to each sum when it finishes):

* ``in_server`` — ``vllm:e2e_request_latency_seconds_sum``: arrival in vLLM to the last token;
* ``in_engine`` — ``vllm:request_inference_time_seconds_sum``: scheduled and running (prefill +
  decode);
* ``queued`` — ``vllm:request_queue_time_seconds_sum``: waiting for the scheduler.

**Little's law.** The mean number of requests in a system over a window is the time they spent in it
divided by the window's length. Over two scrapes, Δsum / Δt counts the requests that *finished* in the
window with their whole latency; in a closed loop at a steady level the time carried in by requests
that began before the window balances the time of those still running at its end, so over a step of
several request durations it is the mean in flight. Sampled gauges are no substitute: a busy vLLM
answers ``/metrics`` when its engine idles, so ``num_requests_running`` reads low.

**Server share.** To judge a step, the server's seconds are compared with the client's for the same
requests: ``share`` = Δ``e2e_request_latency_seconds_sum`` over the step's window ÷ the end-to-end time
the client measured for the answered requests (ok or truncated: the ones vLLM counts) that ended in
that window. Edge effects cancel, because both sides count the same departures. ``delivered`` = the
client's time-weighted in-flight mean × min(1, share): the load the server really held. A step whose
delivered load is below ``stepfacts.ACHIEVED_CONCURRENCY_MIN_SHARE`` of its target did not hold its
level, and a share below ``SERVER_SHARE_MIN`` is a finding of its own: the client held requests the
engine did not see (the API server, or the client host, is the bottleneck).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from oomload.rundir.records import MetricsRow

# A shorter window between two scrapes says nothing about a mean. Not 1 s: a one-second short check
# measured 0.998-1.003 s between its scrapes, so its mean was known by a few milliseconds' luck.
MIN_WINDOW_S = 0.5
SERVER_SHARE_MIN = 0.8  # below this the server held markedly less than the client sent


@dataclass(frozen=True, slots=True)
class ServerConcurrency:
    """Mean requests in vLLM over ``[start_unix_s, end_unix_s]`` by Little's law (module docstring)."""

    start_unix_s: float
    end_unix_s: float
    in_server: float
    in_engine: float | None
    queued: float | None
    server_seconds: float  # Δ e2e latency sum: what the requests that finished in the window spent

    @property
    def window_s(self) -> float:
        return self.end_unix_s - self.start_unix_s

    def to_json(self) -> dict[str, float | None]:
        """Means rounded to 0.001; ``from_unix_s``/``to_unix_s`` are the two scrapes' times."""
        return {
            "in_server": round(self.in_server, 3),
            "in_engine": None if self.in_engine is None else round(self.in_engine, 3),
            "queued": None if self.queued is None else round(self.queued, 3),
            "window_s": round(self.window_s, 3),
            "from_unix_s": self.start_unix_s,
            "to_unix_s": self.end_unix_s,
        }


def server_concurrency(
    first: MetricsRow | None,
    last: MetricsRow | None,
    between: Iterable[MetricsRow] = (),
) -> ServerConcurrency | None:
    """Little's law between two ok ``metrics.jsonl`` rows; ``None`` when it cannot be told.

    ``None``: either record missing or failed, no ``e2e_latency_seconds_sum`` (not vLLM, or an old
    one), a window under ``MIN_WINDOW_S``, or a restart between them (``restarted`` on ``last`` or
    on a record ``between``, or a sum that went down).
    """
    if first is None or last is None or not first.ok or not last.ok:
        return None
    if last.restarted or any(m.restarted for m in between):
        return None
    t0, t1 = first.t_unix_s, last.t_unix_s
    if t1 - t0 < MIN_WINDOW_S:
        return None
    means: dict[str, float | None] = {}
    seconds: dict[str, float | None] = {}
    sums = (  # ServerConcurrency attribute, the sum at the first and at the last scrape
        ("in_server", first.e2e_latency_seconds_sum, last.e2e_latency_seconds_sum),
        ("in_engine", first.inference_seconds_sum, last.inference_seconds_sum),
        ("queued", first.queue_seconds_sum, last.queue_seconds_sum),
    )
    for name, a, b in sums:
        if a is None or b is None:
            means[name] = seconds[name] = None
            continue
        if b < a:
            return None  # the counters went back: a restart the poller did not flag
        seconds[name] = b - a
        means[name] = (b - a) / (t1 - t0)
    in_server, server_seconds = means["in_server"], seconds["in_server"]
    if in_server is None or server_seconds is None:
        return None
    return ServerConcurrency(t0, t1, in_server, means["in_engine"], means["queued"], server_seconds)


def server_share(server: ServerConcurrency, client_seconds: float) -> float | None:
    """The server's seconds over the client's for the requests that ended in the window."""
    if not client_seconds > 0:
        return None
    return server.server_seconds / client_seconds


def delivered_concurrency(achieved: float | None, share: float | None) -> float | None:
    """What the server held: the client's in-flight mean, scaled down by the server's share."""
    if achieved is None:
        return None
    if share is None:
        return achieved
    return achieved * min(1.0, share)
