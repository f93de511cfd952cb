"""Was the load generator starved? The rule that tells "the client could not send" from "the server
did not hold" (pure).

Every load-generating process of oomload measures itself per step (``oomload.load.selfcheck``, the
``loadgen`` entries of a ``steps.jsonl`` end line): the CPU time it used, how long the thread that runs
its users waited runnable for a CPU (the scheduler's run-queue delay), and how late its event loop woke
from a fixed sleep (the loop lag).

**The rule.** A step is *starved* when it did not hold its concurrency (``stepfacts``:
``concurrency_held`` is false; the live line, which has no verdict yet, reads the client's own
in-flight mean against 80 % of the target: vLLM's raw mean over one step reads low from edge effects,
and said "not held" of demo steps that held 7.0 of 7) **and** one of its load-generating processes

* waited for a CPU at least ``WAIT_SHARE_STARVED`` (50 %) of the step, or
* had a loop lag of at least ``LOOP_LAG_STARVED_MS`` (100 ms).

The worst process names the figures (the highest wait share; its loop lag).

**In an open loop** the level is not the client's to hold (requests leave at the trace's arrival
times), so the evidence is the sends themselves (``oomload.load.context``): a step whose processes
sent at least ``LATE_SHARE_STARVED`` (5 %) of its requests ``LATE_SEND_S`` (100 ms) or more after
their arrival time did not replay the asked rate, held or not. When most of those were late because
every user was busy (one request at a time each), the user cap was the limit (advice: a higher cap);
otherwise the process woke late from its sleeps (advice: a quieter or separate load host). 5 % keeps
a stray late wake-up (a garbage collection, one slow scrape) from naming a step.

**Why both halves.** A level that was held is evidence whatever the client's CPU: a client that waited
64 % of a step for a CPU still kept 3.7 of 4 requests in flight (below), so its wait alone is no
finding. A level that was not held is no evidence either way (``stepfacts``); what this rule adds is
*whose* failure it was, so the advice fits: more load capacity (``--processes``, a separate load host,
``--workers``) for a starved client, the server's side for the rest.

**A starved client's queue may be its own.** ``stepfacts`` counts a level as held when requests waited
in vLLM through it (the engine ran all it would admit). When the load generator crossed a threshold
(``client_starved``) that queue may be its own burst: its ``/metrics`` scrapes run in the same starved
process, just after it wakes and sends what it owes (seen on the simulator, starved as below: 0 running
and 3–4 waiting at the scrapes while vLLM held 0.5 of 4 and 0.6 of 8). The step then says it was
starved whenever the client's own figure fell below the line (``StepFacts.starvation``); whether the
level counts as held is left to the saturation rule, which the tuner reads.

**Why these thresholds** (steps of 4 s on this 2-core machine; the client pinned to one CPU, the
simulator on the other; "burners" are CPU-bound processes pinned to the client's CPU):

================================  ===============  ===========  =========================
client host                       CPU wait share   loop lag     client held
================================  ===============  ===========  =========================
the simulator demo, unpinned      0.8–4.3 %        1–4 ms       every level
pinned, no burner                 9.7–11 %         2–5 ms       3.8 of 4, 7.1 of 8
pinned, 3 burners                 64–67 %          15–16 ms     3.7 of 4, 7.1 of 8
pinned, 3 burners, client nice 10 95–96 %          118–283 ms   3.3 of 4, 4.8 of 8
real vLLM beside the client       93 %             ~200 ms      2.4 of 11
the demo beside a real vLLM run   2–86 %           3–822 ms     every level (vLLM's share)
================================  ===============  ===========  =========================

50 % is five times the most an unstarved client waited and below every client that did not hold; 100
ms is twenty times the largest unstarved lag and below the starved ones (one blocking ``sendto`` of
0.2 s on loopback on the real vLLM's host). The last row (a host at load average 7–10) is why a
threshold alone is no finding: its client waited up to 86 % and every level still held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from oomload.load.context import LATE_SEND_S
from oomload.rundir.loadgenrecord import LoadgenRow

WAIT_SHARE_STARVED = 0.5  # waited for a CPU at least half the step (module docstring)
LOOP_LAG_STARVED_MS = 100.0  # the event loop woke at least this late once
LATE_SHARE_STARVED = 0.05  # open loop: this share of a step's requests left late (module docstring)
ADVICE = "more --processes, a separate load host, --workers, or a server here at nice -n 10"
ADVICE_USER_CAP = "a higher user cap (the largest --concurrency level)"
ADVICE_OPEN_LOOP = "a quieter or separate load host"


@dataclass(frozen=True, slots=True)
class LateSends:
    """An open-loop step's requests that left late (module docstring), over all its processes."""

    timed: int
    late: int
    busy: int  # of the late ones, taken late because every user was busy
    late_max_ms: float | None

    @property
    def share(self) -> float:
        return self.late / self.timed if self.timed else 0.0

    @property
    def text(self) -> str:
        """``sent 12 % of its requests ≥ 100 ms after their arrival time (up to 2.3 s; 9 of 10 because
        every user was busy)``."""
        most = "" if self.late_max_ms is None else f"up to {self.late_max_ms / 1000:.1f} s"
        busy = f"{self.busy} of {self.late} because every user was busy" if self.busy else ""
        detail = "; ".join(x for x in (most, busy) if x)
        return (
            f"sent {100 * self.share:.0f} % of its requests ≥ {1000 * LATE_SEND_S:.0f} ms after their "
            f"arrival time" + (f" ({detail})" if detail else "")
        )

    @property
    def advice(self) -> str:
        return ADVICE_USER_CAP if 2 * self.busy > self.late else ADVICE_OPEN_LOOP


def late_sends(rows: Sequence[LoadgenRow]) -> LateSends | None:
    """The open-loop lateness of a step's processes, summed; ``None`` when none sent timed requests."""
    timed = sum(r.sends_timed for r in rows)
    if not timed:
        return None
    maxima = [r.send_late_max_ms for r in rows if r.sends_timed and r.send_late_max_ms is not None]
    return LateSends(
        timed,
        sum(r.sends_late for r in rows),
        sum(r.sends_late_busy for r in rows),
        max(maxima) if maxima else None,
    )


@dataclass(frozen=True, slots=True)
class Starvation:
    """The worst load-generating process of a starved step."""

    wait_share: float
    loop_lag_max_ms: float | None
    worker: int | None  # None: the in-process runner
    late: LateSends | None = None  # open loop: its late sends, when they name the step

    @property
    def text(self) -> str:
        """``waited 93 % of the step for a CPU; loop lag up to 210 ms`` (``worker 1 waited …``); in an
        open loop the late sends first."""
        who = "" if self.worker is None else f"worker {self.worker} "
        lag = "" if self.loop_lag_max_ms is None else f"; loop lag up to {self.loop_lag_max_ms:.0f} ms"
        cpu = f"{who}waited {100 * self.wait_share:.0f} % of the step for a CPU{lag}"
        return cpu if self.late is None else f"{self.late.text}; {cpu}"

    @property
    def advice(self) -> str:
        return ADVICE if self.late is None else self.late.advice

    def to_json(self) -> dict[str, object]:
        """``summary.json``'s ``starved``: the figures, and ``late`` only in an open loop."""
        obj: dict[str, object] = {
            "wait_share": self.wait_share,
            "loop_lag_max_ms": self.loop_lag_max_ms,
            "worker": self.worker,
        }
        if self.late is not None:
            obj["late"] = asdict(self.late)
        return obj


def starved_process(rows: Sequence[LoadgenRow]) -> Starvation | None:
    """The process whose figures cross a threshold (the highest wait share first), or ``None``."""
    over = [
        r
        for r in rows
        if r.cpu_wait_share >= WAIT_SHARE_STARVED
        or (r.loop_lag_max_ms is not None and r.loop_lag_max_ms >= LOOP_LAG_STARVED_MS)
    ]
    if not over:
        return None
    worst = max(over, key=lambda r: (r.cpu_wait_share, r.loop_lag_max_ms or 0.0))
    return Starvation(worst.cpu_wait_share, worst.loop_lag_max_ms, worst.worker)


def starvation(held: bool | None, rows: Sequence[LoadgenRow]) -> Starvation | None:
    """The rule (module docstring): an open-loop step that sent late, or a step that did not hold
    (``held`` false) and whose client crossed a threshold; ``None`` otherwise (held, unknown, or a
    client that had its CPU)."""
    late = late_sends(rows)
    if late is not None:
        if late.share < LATE_SHARE_STARVED:
            return None
        worst = max(rows, key=lambda r: (r.cpu_wait_share, r.loop_lag_max_ms or 0.0))
        return Starvation(worst.cpu_wait_share, worst.loop_lag_max_ms, worst.worker, late)
    return None if held is not False else starved_process(rows)


def live_held(concurrency: int, achieved: float | None, *, min_share: float) -> bool | None:
    """Whether a step held its level by its end line alone (the live line, before any verdict): the
    client's own in-flight mean against ``min_share`` of the target."""
    if achieved is None or concurrency <= 0:
        return None
    return achieved >= min_share * concurrency


def starved_line(step: int, found: Starvation) -> str:
    """``the load generator was starved in step 3 (waited 93 % …): more --processes, …``."""
    return f"the load generator was starved in step {step} ({found.text}): {found.advice}"
