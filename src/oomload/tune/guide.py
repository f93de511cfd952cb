"""The trace's odds on a started candidate's pool, as the search reads them (pure).

One computation: ``capacity.odds.TraceOdds``, the same object ``oomload replay`` and ``oomload plan``
build for a trace and a pool, so the three agree on the same inputs (same requests per level, seed,
shared prefixes and prompt shape). The guide asks it four things:

* **the onset**, twice: the first level (1 … ``max_level``, default twice the target) whose odds are
  not negligible, production-shaped (the trace's shared prefix blocks held once, as the replay sends
  them) and worst case (every prompt distinct); without shared prefixes the two are one. The pool's
  own admission limit is not the candidate's ``max_num_seqs`` here: the onset belongs to the pool and
  the traffic, so every candidate on one pool shows the one onset the replay shows;
* **the safe ``max_num_seqs``**: the largest cap (1 … the target) whose odds at the target, that many
  sequences admitted, are negligible — found by bisection (the odds only grow with the admitted
  sequences). It seeds the search's first guess below a setting that preempted; the bisection on the
  real server decides (``oomload.tune.search``);
* **the evidence**: the requests a 99 % claim at the target needs, all its requests admitted (None:
  negligible);
* **the headroom level** (a quarter above the target, ``headroom_level``), ``max_num_seqs`` raised to
  it: negligible or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomload.capacity.blocks import PromptShape
from oomload.capacity.odds import TraceOdds


@dataclass(frozen=True, slots=True)
class OddsGuide:
    """The trace's odds on one started candidate's pool (``odds_guide``)."""

    onset: int | None  # the first non-negligible level, the production shape (prefix reuse) when shared
    onset_worst_case: int | None  # the same with every prompt distinct
    safe_max_num_seqs: int | None  # the largest cap ≤ the target negligible at the target (replayed shape)
    requests_for_evidence: int | None  # what a 99 % claim at the target needs (None: negligible)
    shape: PromptShape  # the replayed shape: "production" when the trace carries shared prefixes
    safe_above: bool | None = None  # the headroom level, max_num_seqs raised to it, negligible?


def headroom_level(target: int | None) -> int | None:
    """The level above the target a proof also replays (a quarter more, at least one): the headroom."""
    return None if target is None else target + max(1, target // 4)


def odds_guide(
    odds: TraceOdds, target: int | None, max_num_seqs: int, *, max_level: int | None = None
) -> OddsGuide:
    """The guide for a candidate with ``max_num_seqs`` on ``odds``' pool (module docstring)."""
    top = target or max_num_seqs  # without a target each setting is proved at its own max_num_seqs
    hi = max_level or 2 * top
    levels = (1, hi) if hi > 1 else (1,)
    worst = odds.onset(levels, shape="worst-case")
    onset = odds.onset(levels) if odds.shape == "production" else worst

    def safe(cap: int) -> bool:
        return odds.at(target or cap, max_num_seqs=cap).negligible

    safe_seqs: int | None
    if safe(top):
        safe_seqs = top
    else:  # bisection: the largest cap in 1 … top the odds call safe (they only grow with the cap)
        lo, bad = 0, top
        while bad - lo > 1:
            mid = (lo + bad) // 2
            lo, bad = (mid, bad) if safe(mid) else (lo, mid)
        safe_seqs = lo or None
    level = target or max_num_seqs
    at_target = odds.at(level, max_num_seqs=max(max_num_seqs, level))
    above = headroom_level(target)
    safe_above = None
    if above is not None and target is not None and max_num_seqs >= target:  # the search's headroom step
        safe_above = odds.at(above, max_num_seqs=above).negligible
    return OddsGuide(
        onset=onset,
        onset_worst_case=worst,
        safe_max_num_seqs=safe_seqs,
        requests_for_evidence=at_target.requests_for(),
        shape=odds.shape,
        safe_above=safe_above,
    )
