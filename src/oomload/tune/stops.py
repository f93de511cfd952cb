"""Why a tune's search ended without a winner, in one sentence each (pure).

* ``evidence_stop`` — the last candidate had no evidence, even measured again (search rule 5): the
  load host limited the step (its load generator was starved) or the server held less than was sent.
  The search never steps down for want of evidence.
* ``death_stop`` — the last candidate's engine died of something no memory setting answers: a crash,
  a kill from outside, or no known cause (``Proof.died_of_memory``).
* ``starts_stop`` — ``--max-starts`` ended the search while its rules still had a next candidate (a
  boundary not yet bisected, headroom not yet seen): the winner, if any, is the best so far, not the
  boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from oomload.tune.search import Candidate, SearchSpace, next_proposal


def evidence_stop(history: Sequence[Candidate]) -> str | None:
    """Why the search stopped without a verdict, when its last candidate had no evidence (rule 5):
    one sentence naming the load host when its load generator was starved; ``None`` otherwise."""
    last = history[-1] if history else None
    proof = None if last is None else last.proof
    if last is None or proof is None or not proof.no_evidence:
        return None
    seqs = last.settings.max_num_seqs
    again = " even when measured again" if proof.remeasured else ""
    if proof.starved is not None:
        return (
            f"the load host limits: candidate {last.index} (max_num_seqs {seqs}) had no evidence{again} — "
            f"the load generator {proof.starved}. The tune stopped rather than name a smaller setting: "
            "give the load generator more CPU: the server a lower priority (`nice -n 10` in front of "
            "--serve), `oomload tune --processes N` (N load-generating processes per replay), fewer "
            "other jobs on this host, or a host with more cores"
        )
    return (
        f"no evidence: candidate {last.index} (max_num_seqs {seqs}){again}: {proof.evidence}. "
        "The tune stopped rather than name a smaller setting"
    )


def death_stop(history: Sequence[Candidate]) -> str | None:
    """Why the search stopped after its last candidate's engine died of something no memory setting
    answers (a crash, a kill from outside, no known cause); ``None`` otherwise."""
    last = history[-1] if history else None
    proof = None if last is None else last.proof
    if last is None or proof is None or not proof.died or proof.died_of_memory:
        return None
    return (
        f"candidate {last.index}'s engine died of {proof.death_kind}, not of memory ({proof.evidence}): "
        f"no memory setting answers that; the tune stopped (its server log is in {proof.run_dir})"
    )


def starts_stop(space: SearchSpace, target: int | None, history: Sequence[Candidate]) -> str | None:
    """Why the search ended before its rules did: ``--max-starts`` was reached while they still named a
    next candidate; ``None`` otherwise."""
    if not history or len(history) < space.max_starts:
        return None
    more = next_proposal(replace(space, max_starts=len(history) + 1), target, history)
    if more is None:
        return None
    return (
        f"stopped at --max-starts {space.max_starts} before the search was done: the next candidate "
        f"would have been {more.settings.label()} ({more.rule}); raise --max-starts to go on"
    )
