"""What one concurrency step measured, aggregated from its requests, scrapes and GPU samples (pure).

``summarize_step`` (``oomload.verdict.stepsummary``) turns one ``runview.StepData`` into a
frozen ``StepFacts``:

* requests by outcome, as recorded (``cancelled`` included: oomload abandoned those itself);
* ``casualties``: this step's requests that failed because the engine died under them
  (``oomload.verdict.death`` defines the window), by outcome;
* the *charged* failures: every error outcome (``Outcome.is_error``; ``cancelled`` is neither ok nor
  error) except casualties when the engine died in a *later* step — a request that started here but
  was in flight when the server died there failed because of the death, not because of this level.
  In the step the engine died in (``died_here``) casualties are charged like any failure.
  ``error_requests`` / ``unsafe_requests`` / ``error_rate`` count charged failures only;
* req/s and output tokens/s: the step's *throughput while it held its level* — the requests that
  ended (not cancelled, whichever step sent them) and their completion tokens, per second of the
  hold, as the step's ``steps.jsonl`` end line counted them (``per_second``). The live progress line
  prints the same figure from the same line, and it is Locust's RPS sense. A step without an end line
  (cut short by a crash) falls back to its own decided requests and answered tokens over its window;
* nearest-rank P50/P99 (``stats.percentile``) of TTFT, TPOT (mean inter-token latency) and end-to-end
  latency over the ok requests;
* from the ``/metrics`` scrapes in the step's window: max KV usage, max running / waiting, their
  *sustained* levels (``oomload.verdict.gauges``: reached in two consecutive scrapes), and the
  preemptions — the sum of the scrapes' ``preemptions_delta``, cross-checked against the counter
  (``num_preemptions_total`` of the step's last scrape minus the last scrape before the step); when
  they disagree (a lost scrape, a restart) the larger is used and ``counter_mismatch`` says so;
* rates, so levels compare whatever their length: ``preemptions_per_100`` (preemptions per 100 requests
  the step sent), ``waiting_share`` (the share of its scrapes with requests waiting) and
  ``kv_saturated_share`` (the share with KV usage ≥ ``KV_SATURATED``);
* the trace's odds at the step's level (``oomload.capacity.odds``, from ``odds.jsonl``) and the evidence they
  asked for: a clean step that sent fewer requests than ``LevelOdds.requests_for()`` is *thin*
  (``evidence_thin``) — by the odds it could have missed a preemption more than 5 % of the time;
* from the GPU samples: device total, max used, min free, and the largest process (the server);
* the load generator's own figures per process (``loadgen``: CPU used, CPU wait, loop lag, from the
  end line; ``oomload.verdict.loadgen`` judges whether it was starved);
* the *achieved* concurrency: the time-weighted mean number of requests in flight during the step
  (from every request's own start/end times), to compare with the target. In the step the engine died
  in, the death ends that mean early (requests fail fast, the step is cut): when the requests in
  flight at the death (``in_flight_at_death``, the death's casualties) reached the held share of the
  level, the level was reached when it mattered (``reached_at_death``), and its low mean is the
  death's, not the load generator's;
* the *server's* side (``oomload.rundir.serverside``): the mean requests in vLLM, in its engine and queued,
  by Little's law on its latency-sum counters between the scrape that opened the step and the last
  one in it, and the server's share of the client's time for the requests that ended in between
  (only when at least ``SHARE_MIN_ROUNDS`` rounds of the level's requests ended there, and never in
  a step that preempted: on the real vLLM the onset step's share read 0.70 while the levels below
  read 0.94–0.99 — vLLM's latency sums count less of a preempted request's time than its client).
  The *delivered* concurrency is the achieved one scaled by that share (capped at 1); below
  ``ACHIEVED_CONCURRENCY_MIN_SHARE`` (80 %) of the target the step did not hold its level — unless
  the server was *saturated*: requests waited in vLLM in at least half of the step's scrapes (two of
  them consecutive), so the engine ran all that ``max_num_seqs`` and its KV cache admit and the load
  generator was not what limited it (seen on the real vLLM with ``max_num_seqs`` 5 at level 8 on two
  busy cores: client 7.4, share 0.84 — the API server's own time — with 1–3 waiting throughout). A
  step whose client did not deliver its level while its load generator was starved
  (``oomload.verdict.loadgen``) says so in ``starvation``, held by saturation or not: the queue its own
  scrapes saw may have been its own burst of late sends (seen on the simulator: 3–4 waiting while vLLM
  held 0.5 of 4). That does not change whether the level counts as held: the tuner and the onsets
  read it, and a rule that turns the real vLLM's starved-but-queued steps into missing evidence
  belongs with the tuner's own "no evidence" rules (issue 32, items 1–3).

A step is *trusted* — evidence that its level is safe, or that a gate passes there — only when it
completed (not cut short: ``runview.CUT_SHORT_REASONS``), held its concurrency and was *answered*: at
least ``MIN_ANSWERED_SHARE`` (half) of its decided requests were answered by the server (``ok`` or
``truncated``: the server ran them) or failed because the engine died (``engine_dead`` answers and
the casualties of a death: the death is the finding). A step whose requests mostly failed
otherwise — transport errors, timeouts, 500, malformed answers, refusals — put no load on
the KV cache, so its lack of a preemption or an OOM says nothing (``mostly_failed``). A failure
seen in an untrusted step is still a failure. vLLM's own 503 (``admission_rejected``: its queue limit)
counts among those failures here: a step whose requests the engine mostly turned away ran too few of
them to vouch for the level (the run, though, was loaded: ``Verdict.failed_run``).

A step in which ``RATE_LIMITED_MIN`` requests were turned away (``rate_limited``: HTTP 429, or a 503 that is
not vLLM's own; a rate or concurrency limit in front of the engine, a gateway's) is not trusted either: its
level did not reach the engine, whatever reached it was answered. Those requests are no *unexplained* failure
— the limit explains them, and the verdict names it — so they neither make the step "mostly failed" nor, being
no failure of the engine, an unsafe one (``UNSAFE_OUTCOMES``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from oomload.capacity.odds import LevelOdds
from oomload.capacity.schedule import rate_limited_step
from oomload.outcome import Outcome
from oomload.rundir.loadgenrecord import LoadgenRow
from oomload.rundir.serverside import (
    SERVER_SHARE_MIN,
    ServerConcurrency,
    delivered_concurrency,
)
from oomload.verdict.loadgen import Starvation, starvation, starved_process
from oomload.verdict.rates import per_100

ACHIEVED_CONCURRENCY_MIN_SHARE = 0.8
# A step whose scrapes showed requests waiting in vLLM this often (and in two consecutive scrapes) had
# a saturated engine: it held its level whatever the server share, since the engine ran all it admitted.
SATURATED_WAITING_SHARE = 0.5
# Requests waiting in vLLM on average over a step, by its queue-time sum (Little's law), from which a
# step queued even when no two consecutive scrapes caught the queue (``StepFacts.queue_depth``).
QUEUED_MEAN_MIN = 1.0
# A step (or a run, ``oomload.verdict``) is evidence only when at least this share of its decided
# requests was answered (ok or truncated) or lost to an engine death; below it, it "mostly failed".
MIN_ANSWERED_SHARE = 0.5
KV_SATURATED = 0.99  # KV usage at or above this is a saturated pool
# The server's share is judged only over a window in which this many rounds of the level's requests
# ended (concurrency × rounds answers): with fewer, a batch that vLLM finished just before a boundary
# scrape but the client read just after it moves the share by a third or more (seen: 0.75 and 1.11
# in 5 s steps of 2.5 s requests on the real vLLM).
SHARE_MIN_ROUNDS = 3
END_REASON_WORDS = {  # why a step or run ended early, as a phrase (runview.CUT_SHORT_REASONS)
    "interrupted": "interrupted (Ctrl-C or SIGTERM)",
    "max_duration": "--max-duration-s was reached",
    "error": "oomload stopped on an error",
    "server_dead": "the server died",
}
# outcomes that are no unexplained failure: answers, oomload's own cancellations, the engine's death (an
# ``engine_dead`` request is evidence of the death, which is a finding of its own) and a limit in front of
# the engine (``rate_limited``: that limit is the finding)
NOT_FAILED = frozenset(
    o.value
    for o in (Outcome.OK, Outcome.TRUNCATED, Outcome.CANCELLED, Outcome.ENGINE_DEAD, Outcome.RATE_LIMITED)
)
UNSAFE_OUTCOMES = frozenset(
    {Outcome.ENGINE_DEAD, Outcome.ADMISSION_REJECTED, Outcome.SERVER_ERROR, Outcome.TIMEOUT}
)


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Nearest-rank P50 / P99 of one latency in one step (``None`` when no request carried it)."""

    count: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What one step measured (module docstring)."""

    index: int
    concurrency: int
    phase: str
    start_unix_s: float
    end_unix_s: float | None
    end_reason: str | None
    duration_s: float | None
    cut_short: bool
    requests: int
    outcomes: Mapping[str, int]
    error_requests: int  # charged failures (casualties of a later death excused)
    unsafe_requests: int  # charged failures with an outcome in UNSAFE_OUTCOMES
    req_per_s: float | None
    output_tokens_per_s: float | None
    ttft: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    achieved_concurrency: float | None
    scrapes_ok: int
    scrapes_failed: int
    kv_usage_max: float | None
    preemptions: int | None  # None: no metrics covered the step
    preemptions_counter: int | None  # counter(last in step) - counter(before step)
    running_max: int | None
    waiting_max: int | None
    device_total_bytes: int | None
    device_used_max_bytes: int | None
    device_free_min_bytes: int | None
    server_process_used_max_bytes: int | None
    casualties: Mapping[str, int] = field(default_factory=dict)  # failed because the engine died
    died_here: bool = False  # the engine died in this step (its casualties are charged here)
    in_flight_at_death: int | None = None  # the death's casualties, in the step it died in
    open_loop: bool = False  # the trace's arrivals set the load; ``concurrency`` only capped it
    after_death: bool = False  # started after the engine died: measures a dead server
    counter_mismatch: tuple[int, int] | None = None  # (delta sum, counter rise) when they disagree
    waiting_sustained: int | None = None  # waiting reached in consecutive scrapes (oomload.verdict.gauges)
    kv_usage_sustained: float | None = None  # KV usage reached in consecutive scrapes
    server: ServerConcurrency | None = None  # what vLLM's counters say it held (None: unknown)
    server_share: float | None = None  # server seconds / client seconds, same requests
    waiting_share: float | None = None  # share of the step's scrapes with requests waiting
    kv_saturated_share: float | None = None  # share of the step's scrapes with KV usage ≥ KV_SATURATED
    odds: LevelOdds | None = None  # the trace's odds at this level (None: no pool or no trace)
    evidence_requests: int | None = None  # requests the odds asked the step to send (steps.jsonl)
    extended_s: float | None = None  # how long the step ran past its hold for that evidence
    loadgen: tuple[LoadgenRow, ...] = ()  # each load-generating process's view of itself (end line)

    @property
    def preemptions_per_100(self) -> float | None:
        """Preemptions per 100 requests the step sent (``None``: no metrics or no request)."""
        return per_100(self.preemptions, self.requests)

    @property
    def evidence_needed(self) -> int | None:
        """Requests a clean step at this level must send to count as safe (``None``: no demand)."""
        return None if self.odds is None else self.odds.requests_for()

    @property
    def evidence_thin(self) -> bool:
        """Clean, but it sent fewer requests than the trace's odds need to trust that it is."""
        needed = self.evidence_needed
        return self.preemptions == 0 and needed is not None and self.requests < needed

    @property
    def conclusive(self) -> bool:
        """Counts for or against a preemption at its level: it has a ``/metrics`` scrape, and it either
        preempted (a preemption is one wherever it was seen) or ran clean, trusted, deciding requests
        (not all cancelled), as many as the odds ask for; any other clean step contradicts nothing."""
        if self.preemptions is None:
            return False
        return self.preemptions > 0 or (self.trusted and self.decided_requests > 0 and not self.evidence_thin)

    @property
    def delivered_concurrency(self) -> float | None:
        """The load the server held: achieved × min(1, server share) (achieved when the share is unknown)."""
        return delivered_concurrency(self.achieved_concurrency, self.server_share)

    @property
    def server_bottleneck(self) -> bool:
        """The server saw markedly less of the requests' time than the client held them."""
        return self.server_share is not None and self.server_share < SERVER_SHARE_MIN

    @property
    def warmup(self) -> bool:
        return self.phase == "warmup"

    def count(self, outcome: Outcome) -> int:
        return int(self.outcomes.get(outcome.value, 0))

    @property
    def ok_requests(self) -> int:
        return self.count(Outcome.OK)

    @property
    def cancelled_requests(self) -> int:
        return self.count(Outcome.CANCELLED)

    @property
    def rate_limited_requests(self) -> int:
        return self.count(Outcome.RATE_LIMITED)

    @property
    def queue_rejected_requests(self) -> int:
        """Requests vLLM's own queue limit turned away (``admission_rejected``), casualties aside."""
        return self.unexplained_by_outcome().get(Outcome.ADMISSION_REJECTED.value, 0)

    @property
    def rate_limited(self) -> bool:
        """A limit in front of the engine turned at least ``RATE_LIMITED_MIN`` of its requests away (module
        docstring): the level did not reach the engine."""
        return rate_limited_step(self.outcomes)

    @property
    def rate_limited_text(self) -> str:
        """``"32 of 32 requests were turned away by a limit …"``: why such a step is no evidence."""
        turned = f"{self.rate_limited_requests} of {self.decided_requests} requests were turned away"
        return f"{turned} by a limit in front of the engine — the level did not reach it"

    @property
    def decided_requests(self) -> int:
        """Requests the server decided (everything but ``cancelled``): the error-rate denominator."""
        return self.requests - self.cancelled_requests

    @property
    def error_rate(self) -> float | None:
        decided = self.decided_requests
        return None if decided == 0 else self.error_requests / decided

    def charged(self, outcome: Outcome) -> int:
        """Requests of ``outcome`` held against this step (casualties of a later death excused)."""
        return self.count(outcome) - (0 if self.died_here else self.casualties_of(outcome))

    def independent(self, outcome: Outcome) -> int:
        """Requests of ``outcome`` that were not casualties of an engine death."""
        return self.count(outcome) - self.casualties_of(outcome)

    def casualties_of(self, outcome: Outcome) -> int:
        return int(self.casualties.get(outcome.value, 0))

    @property
    def queue_depth(self) -> float | None:
        """How deep vLLM's waiting queue was in this step, as the queueing finding judges it: the waiting
        gauge's sustained level (two consecutive scrapes past the step's opening admission,
        ``oomload.verdict.gauges``) when it is above 0; else the mean requests queued by vLLM's
        queue-time sum (``server.queued``, Little's law) when it reached ``QUEUED_MEAN_MIN`` and a scrape
        saw the queue too; else 0 (``None``: neither observed). A one-second step has about two scrapes:
        on the simulator, level 8 read 0 then 7 waiting while vLLM's sum said 2.3 waited throughout; the
        next run read 3 then 5, 3.7 by the sum. On 25 real-vLLM runs the sum never reached 1 alone."""
        mean = None if self.server is None else self.server.queued
        if self.waiting_sustained is None and mean is None:
            return None
        if self.waiting_sustained:
            return float(self.waiting_sustained)
        if mean is not None and mean >= QUEUED_MEAN_MIN and (self.waiting_max or 0) > 0:
            return mean
        return 0.0

    @property
    def queued_by_mean(self) -> bool:
        """The queue depth is the queue-time sum's mean, not two scrapes' reading."""
        return not self.waiting_sustained and (self.queue_depth or 0.0) > 0

    @property
    def server_saturated(self) -> bool:
        """Requests waited in vLLM in at least ``SATURATED_WAITING_SHARE`` of the step's scrapes, and
        in two consecutive ones: the engine ran all it would admit (``max_num_seqs`` or the KV cache
        held the rest back), so the load generator did not limit what the engine held."""
        return (self.waiting_sustained or 0) > 0 and (self.waiting_share or 0.0) >= SATURATED_WAITING_SHARE

    @property
    def client_starved(self) -> bool:
        """A load-generating process waited for a CPU, or for its event loop, past the thresholds of
        ``oomload.verdict.loadgen`` (whether or not the step held)."""
        return starved_process(self.loadgen) is not None

    @property
    def starvation(self) -> Starvation | None:
        """The client did not deliver its level (below the line by its own figure) and its load
        generator was starved (``loadgen``) — also when vLLM's queue counts the level as held: the
        queue its own scrapes saw may be its own burst of late sends (module docstring)."""
        delivered = self.delivered_concurrency
        if delivered is None:
            return None
        return starvation(delivered >= ACHIEVED_CONCURRENCY_MIN_SHARE * self.concurrency, self.loadgen)

    @property
    def concurrency_held(self) -> bool | None:
        """Delivered ≥ 80 % of the target, or the server saturated (it queued what it could not run)
        while the load generator had its CPU; ``None`` when the achieved concurrency is unknown, and in
        an open loop, whose level is a cap on the requests in flight, not a target to hold."""
        delivered = self.delivered_concurrency
        if delivered is None or self.open_loop:
            return None
        return delivered >= ACHIEVED_CONCURRENCY_MIN_SHARE * self.concurrency or self.held_by_saturation

    @property
    def reached_at_death(self) -> bool:
        """The engine died in this step with at least the held share of its level in flight (module
        docstring): a mean below the line here is the death's doing."""
        return (
            self.in_flight_at_death is not None
            and self.in_flight_at_death >= ACHIEVED_CONCURRENCY_MIN_SHARE * self.concurrency
        )

    @property
    def held_by_saturation(self) -> bool:
        """Held only because the server saturated: the delivered figure alone was below the line (and
        the load generator was not starved: its queue would be its own burst, module docstring)."""
        delivered = self.delivered_concurrency
        return (
            self.server_saturated
            and delivered is not None
            and delivered < ACHIEVED_CONCURRENCY_MIN_SHARE * self.concurrency
        )

    @property
    def held_by(self) -> str | None:
        """Whose figure decides whether the step held its level (``concurrency_held``): ``"server"``
        when vLLM's counters scaled the client's mean down (share < 1: the delivered concurrency is the
        server's), else ``"load generator"`` (its own in-flight mean); ``None`` when neither is known."""
        if self.achieved_concurrency is None:
            return None
        return "server" if self.server_share is not None and self.server_share < 1.0 else "load generator"

    @property
    def held_text(self) -> str | None:
        """``"the server held 7.9"`` (``"the load generator held 1.6"``) for a step that did not hold
        its level: the figure that decided, and whose it is (``held_by``)."""
        if self.concurrency_held is not False:
            return None
        assert self.delivered_concurrency is not None
        return f"the {self.held_by} held {self.delivered_concurrency:.1f}"

    @property
    def not_held_text(self) -> str | None:
        """Why the step did not hold its level, naming the figure that decided first: ``"the server
        held 7.9 requests on average by its own counters (the load generator 9.0)"`` or ``"the load
        generator held 1.6 requests in flight on average"``; ``None`` for a step that held."""
        if self.concurrency_held is not False:
            return None
        assert self.achieved_concurrency is not None and self.delivered_concurrency is not None
        if self.held_by == "server":
            return (
                f"the server held {self.delivered_concurrency:.1f} requests on average by its own counters "
                f"(the load generator {self.achieved_concurrency:.1f})"
            )
        return f"the load generator held {self.achieved_concurrency:.1f} requests in flight on average"

    @property
    def queue_limit_text(self) -> str:
        """``" (vLLM's queue limit turned 20 of 56 requests away)"``, when it turned any away: why the engine
        held less than the level without the client's doing; ``""`` otherwise."""
        rejected = self.count(Outcome.ADMISSION_REJECTED)
        return (
            f" (vLLM's queue limit turned {rejected} of {self.decided_requests} requests away)"
            if rejected
            else ""
        )

    @property
    def unexplained_failures(self) -> int:
        """Decided requests neither answered nor lost to an engine death."""
        return sum(self.unexplained_by_outcome().values())

    def unexplained_by_outcome(self) -> dict[str, int]:
        """The failures not explained by an engine death (``NOT_FAILED`` and casualties aside)."""
        counts: dict[str, int] = {}
        for name, count in self.outcomes.items():
            n = int(count) - int(self.casualties.get(name, 0))
            if name not in NOT_FAILED and n > 0:
                counts[name] = n
        return counts

    @property
    def mostly_failed(self) -> bool:
        """More than ``1 - MIN_ANSWERED_SHARE`` of the decided requests failed for reasons other than
        an engine death: the step put too little load on the server to vouch for anything."""
        decided = self.decided_requests
        return decided > 0 and self.unexplained_failures > (1.0 - MIN_ANSWERED_SHARE) * decided

    @property
    def trusted(self) -> bool:
        """Completed, held its concurrency and was mostly answered: its absence of failures counts
        as evidence."""
        return (
            not self.cut_short
            and self.concurrency_held is not False
            and not self.mostly_failed
            and not self.rate_limited
        )

    @property
    def distrust(self) -> str | None:
        """Why the step is not trusted, in words (``None`` for a trusted step)."""
        where = f"step {self.index} (concurrency {self.concurrency})"
        if self.cut_short:
            how = (
                "never ended"
                if self.end_reason is None
                else END_REASON_WORDS.get(self.end_reason, f"ended {self.end_reason}")
            )
            after = "" if self.duration_s is None else f" after {self.duration_s:.1f} s"
            return f"{where} was cut short ({how}{after}, {self.requests} request(s))"
        if self.mostly_failed:  # before "not held": failing requests end early, so few are in flight
            return f"{where}: {self.failed_text} — no evidence"
        if self.rate_limited:  # before "not held": a turned-away user waits, so few are in flight
            return f"{where}: {self.rate_limited_text}"
        if self.concurrency_held is False:
            line = f"{ACHIEVED_CONCURRENCY_MIN_SHARE:.0%} of {self.concurrency}"
            return f"{where}: {self.not_held_text}, below {line}{self.queue_limit_text}"
        return None

    @property
    def failed_text(self) -> str:
        """``"12 of 12 requests failed (transport_error 12)"``: the unexplained failures, by outcome."""
        by_outcome = sorted(((n, name) for name, n in self.unexplained_by_outcome().items()), reverse=True)
        kinds = ", ".join(f"{name} {n}" for n, name in by_outcome)
        return f"{self.unexplained_failures} of {self.decided_requests} requests failed ({kinds})"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (one of ``summary.json``'s ``verdict.steps``; see docs/report.md): the fields, and
        what the properties judged."""
        obj = asdict(self)
        obj["outcomes"] = dict(self.outcomes)
        obj["casualties"] = dict(self.casualties)
        obj["warmup"] = self.warmup
        obj["error_rate"] = self.error_rate
        obj["trusted"] = self.trusted
        obj["mostly_failed"] = self.mostly_failed
        obj["rate_limited"] = self.rate_limited
        obj["concurrency_held"] = self.concurrency_held
        obj["server"] = None if self.server is None else self.server.to_json()
        obj["server_share"] = None if self.server_share is None else round(self.server_share, 3)
        held = self.delivered_concurrency
        obj["delivered_concurrency"] = None if held is None else round(held, 3)
        obj["kv_usage_max_share"] = self.kv_usage_max
        obj["odds"] = None if self.odds is None else self.odds.to_json()
        obj["preemptions_per_100_requests"] = _round(self.preemptions_per_100)
        obj["waiting_share"] = _round(self.waiting_share)
        obj["kv_saturated_share"] = _round(self.kv_saturated_share)
        obj["evidence_thin"] = self.evidence_thin
        obj["starved"] = None if self.starvation is None else self.starvation.to_json()
        return obj


class RanTally(NamedTuple):
    """Over a run's steps: the decided requests, and the unexplained failures and decided requests both
    without the requests turned away before they ran — by a limit in front of the engine (``rate_limited``)
    or by vLLM's own queue limit (``admission_rejected``: the engine was full, so the run did load it); of
    the failures, those the client gave up on (``timeout``), and what the server's ``/metrics`` say it held
    at most in the steps whose requests mostly failed (``None``: none scraped)."""

    decided: int
    failed: int
    ran: int
    timed_out: int = 0
    running_max: int | None = None
    kv_usage_max: float | None = None

    @property
    def nothing_to_judge(self) -> bool:
        """Requests were decided, and none of them ran or more than half of those that ran failed
        (``MIN_ANSWERED_SHARE``; ``Verdict.failed_run`` says why in words)."""
        return self.decided > 0 and (self.ran == 0 or self.failed > (1.0 - MIN_ANSWERED_SHARE) * self.ran)

    @property
    def unloaded_text(self) -> str:
        """Why failures that ran leave nothing to judge. What the server's ``/metrics`` say it held in
        the steps whose requests mostly failed is told when they show it loaded: those requests timed
        out at the client (its ``--request-timeout-s``) or failed while the engine held requests, but
        their answers never came. With no sign of load (never scraped, nothing held, KV usage under
        1 %), timeouts name the client's limit alone and other failures say the server was not
        loaded."""
        held = []
        if self.running_max:
            held.append(f"it held up to {self.running_max} requests")
        kv = kv_percent(self.kv_usage_max or 0.0)
        if kv != "0%":  # under 1 % is an idle pool (its null block), not load
            held.append(f"KV usage up to {kv}")
        loaded = f"while the server was loaded ({', '.join(held)})"
        if 2 * self.timed_out <= self.failed:
            if not held:
                return "the server was not loaded, so nothing about its memory can be judged"
            failed = "they" if self.failed == self.ran else "most"
            return (
                f"{failed} failed {loaded}: too few answers came, so nothing about its memory can be judged"
            )
        timed_out = f"{'they' if self.timed_out == self.failed else 'most'} timed out at the client"
        if not held:
            return f"{timed_out} (--request-timeout-s), so nothing about the server's memory can be judged"
        return (
            f"{timed_out} (--request-timeout-s) {loaded}: their answers never came, so nothing about its "
            "memory can be judged"
        )


def kv_percent(share: float) -> str:
    """A KV usage share in whole percent, rounded *down*: 0.986 reads 98 %, never the 99 % of the
    saturation threshold (``KV_SATURATED``) that it did not reach."""
    return f"{math.floor(share * 100 + 1e-9)}%"


def ran_tally(steps: Iterable[StepFacts]) -> RanTally:
    """``RanTally`` of ``steps``: whether the run loaded the server at all is read on what ran."""
    decided = failed = ran = timed_out = 0
    running: list[int] = []
    kv: list[float] = []
    for s in steps:
        decided += s.decided_requests
        failed += s.unexplained_failures - s.queue_rejected_requests
        ran += s.decided_requests - s.rate_limited_requests - s.queue_rejected_requests
        timed_out += s.unexplained_by_outcome().get(Outcome.TIMEOUT.value, 0)
        if s.mostly_failed:  # the load the failures met, not a healthy step's before them
            running += [] if s.running_max is None else [s.running_max]
            kv += [] if s.kv_usage_max is None else [s.kv_usage_max]
    return RanTally(decided, failed, ran, timed_out, max(running, default=None), max(kv, default=None))


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
