"""What a run's measurements say of its true last safe level, and how a gate rule judges that (pure).

The verdict's last safe concurrency ``L`` is a level proven safe: a trusted step at it, observed, with
the evidence the trace's odds ask for. It is a lower bound on the level where the server stops being
safe, not the level itself: the true last safe level lies in ``[L, H]`` with ``H`` one below the lowest
level that broke (preempted, failed, died) or queued — or is unbounded when no measured level above
``L`` did, as in a run stopped before one (Ctrl-C, ``--max-duration-s``), or whose higher steps were
cut short, under-held, unobserved (no ``/metrics`` scrape) or short of the odds' evidence. A run with
no safe level has ``L = 0``; one that broke at its lowest level ``B`` has ``H = B − 1``. After the
refinement pass bisects the gap between the last clean and the first broken level, ``L = H``.

A rule on the last safe level passes when it holds for every value the range allows, fails when it
holds for none, and is *not evaluated* otherwise: a level never judged is missing evidence, and missing
evidence neither passes nor fails a gate. ``last-safe-concurrency>=16`` on a run stopped after a clean
8 is not evaluated (it failed before); on a run whose 12 broke it fails. A rule relative to a baseline
(``last-safe>=baseline-1``) takes its bound from the level the baseline proved safe — its last safe
level, as the onset rule takes the level its baseline was judged clean up to — so two runs clean up to
the same top level pass, and a baseline without a safe level bounds nothing (not evaluated).
"""

from __future__ import annotations

from dataclasses import dataclass

from oomload.verdict.gateresult import OPERATORS, GateStatus, Op
from oomload.verdict.verdict import Verdict


@dataclass(frozen=True, slots=True)
class LastSafeRange:
    """The true last safe level lies in ``[low, high]`` (``high`` ``None``: no bound above)."""

    low: int  # the last safe concurrency found, 0 without one
    high: int | None  # one below the lowest level that broke or queued; None when none did

    @classmethod
    def of(cls, verdict: Verdict) -> LastSafeRange:
        ceilings = [verdict.first_unsafe_concurrency]
        if verdict.queueing is not None:
            ceilings.append(verdict.queueing.concurrency)
        known = [c for c in ceilings if c is not None]
        return cls(verdict.last_safe_concurrency or 0, min(known) - 1 if known else None)

    @property
    def known(self) -> bool:
        """Anything is known: a safe level, or a level that broke or queued."""
        return self.low > 0 or self.high is not None

    def words(self) -> str:
        """``8``; ``8, but 9–15 not judged (16 broke or queued)``; ``8, and no level above it broke or
        queued (none judged there)``; ``none (4 broke or queued)``; ``unknown``."""
        if self.low == 0:
            return "unknown" if self.high is None else f"none ({self.high + 1} broke or queued)"
        if self.high is None:
            return f"{self.low}, and no level above it broke or queued (none judged there)"
        if self.high == self.low:
            return str(self.low)
        gap = str(self.high) if self.high == self.low + 1 else f"{self.low + 1}–{self.high}"
        return f"{self.low}, but {gap} not judged ({self.high + 1} broke or queued)"


def judge(value: LastSafeRange, op: Op, bound: float) -> GateStatus:
    """``value OP bound`` for every value the range allows: PASS when it holds for all, FAIL when for
    none, NOT_EVALUATED otherwise (module docstring)."""
    holds = OPERATORS[op]
    low, high = value.low, value.high
    if op in (">=", ">"):
        every, none = holds(low, bound), high is not None and not holds(high, bound)
    elif op in ("<=", "<"):
        every, none = high is not None and holds(high, bound), not holds(low, bound)
    else:  # ==
        every = low == high == bound
        none = bound < low or (high is not None and bound > high)
    if every:
        return GateStatus.PASS
    return GateStatus.FAIL if none else GateStatus.NOT_EVALUATED
