"""The tuner's search: which server settings to start next, and which one wins (pure).

``oomload tune`` starts the user's server once per candidate, one at a time, and each start costs
tens of seconds (minutes for a large model), so the search asks for as few starts as it can. A
candidate is a ``Settings`` value: the memory knob (``gpu_memory_utilization`` on a GPU; on vLLM's CPU
build, whose stand-in for it is an explicit pool, ``--num-gpu-blocks-override`` or
``--kv-cache-memory-bytes``), ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``,
prefix caching and eager mode. The user gives the memory ladder (most memory first) and the
``max_num_seqs`` ladder (ascending, capped at the target: a server never holds more than the target's
requests); a knob the user fixed is never moved.

The rules, in order — every candidate records the rule that produced it, and the report prints it:

1. **First candidate**: the most memory on the ladder and ``max_num_seqs`` at the target (the
   largest ladder value ≤ the target; with ``--fix max-num-seqs`` the line's own, and the rule says
   which value it is) — the setting with the most headroom, if it starts.
2. **A failed start** moves by its cause (``oomload.tune.startup``):

   * not enough free device memory → the highest utilization on the ladder that the free memory the
     server reported allows (free / total, less half a point), skipping the ones that cannot start;
     with a pool-sized knob (the CPU build) none: a smaller pool reserves no less of the node;
   * CUDA OOM at start-up (graph capture, profiling) → the same candidate in eager mode (no graph
     capture); already eager → the next smaller memory step;
   * no memory left for the KV cache → half the ``max_num_batched_tokens`` (the profile run's
     activations scale with it), not below ``MIN_BATCHED_TOKENS``;
   * ``max_model_len`` longer than the pool can hold → ``max_model_len`` cut to the trace's
     recommended value (P99 + margin, ``stats.recommend_max_model_len``), or to the server's
     "estimated maximum model length" when even that does not fit;
   * the weights do not fit, or any other error → no next candidate (nothing oomload can tune).
3. **A started candidate** is proved on load at the target and at the headroom level above it (a
   quarter more, ``headroom_level``) and judged (``oomload.tune.evidence``): a candidate whose
   ``max_num_seqs`` is below the target is judged as capped — the server ran its cap (running at the
   cap, the rest waiting) with no preemption — not by the client's concurrency. Then:

   * it carried the target (no preemption, no death, no overflow, the SLO met, the level or cap
     held): the search seeks the most headroom within its bounds —

     - a larger ``max_num_seqs`` that preempted at the same memory → rule 4, the bisection;
     - a larger ``max_num_seqs`` on the ladder not tried yet → the next one, to show where the headroom
       ends (the search stops for a reason: the next setting preempts, or the ladder ends);
     - at the target itself, the top of the ladder → ``max_num_seqs`` raised to the headroom level,
       above the target, but only when the trace's odds on *this* pool (that many admitted) call it
       safe: no restart is spent on a level the odds already say preempts;
     - above the target (a headroom candidate, or ``--target-rate``'s first one, which ran at the
       ladder's top): it held the level above too → stop, headroom seen; it preempted there, within
       what it admits → back to ``max_num_seqs`` at the target (which queues such bursts instead);
   * its engine died of an activation peak (``cuda_oom``, ``cpu_oom``: an allocation failed at
     runtime) → the same candidate with ``max_num_batched_tokens`` halved (not below
     ``MIN_BATCHED_TOKENS``) before any ``max_num_seqs`` cut; of something no memory setting answers
     (a crash, a kill from outside, no known cause) → the search stops and says so
     (``oomload.tune.stops.death_stop``);
     a death above the target, at the headroom level, counts there as a preemption does;
   * it preempted (or the server died) and nothing smaller carried yet → the first guess: the largest
     ``max_num_seqs`` the trace's odds on *this* pool call safe at the target (``tune.guide``); the
     odds seed the search, they do not end it: when the guess preempts too, the next is 1 below it,
     then 2, 4 … below (the odds are usually off by a level or two: a step of one finds such a
     boundary in one more start, the doubling bounds the rest) until one carries;
   * a missed SLO without any preemption moves up instead (queueing, not memory, was the limit).
4. **The boundary, on the server**: between the largest ``max_num_seqs`` that carried and the smallest
   that preempted (``bracket``, at one memory setting; a candidate without evidence bounds nothing),
   the midpoint — any integer, not only the ladder's — until the two are one apart. The winner is then
   the largest cap that does not preempt on this server, whatever the odds said: they are a model of
   the engine, the counter is the engine.
5. **No evidence is no verdict**: a step that did not hold the target (or its cap) and saw no
   preemption says nothing about the memory. The proof measures it again (a longer step, ``prove``);
   still without evidence, the search stops — it never moves to a smaller setting for want of evidence
   — and ``oomload.tune.stops.evidence_stop`` says why: the load host limits (the load generator was starved,
   ``verdict.loadgen``: add ``--processes``, ``--workers`` or a separate load host), or the server
   held less than was sent. No winner is named then (exit 4: missing evidence never passes).
6. **Bounds**: at most ``max_starts`` candidates (the runner also stops at its wall-time bound); both
   are printed before the first start.

Without a target the question is the highest preemption-free concurrency: every candidate is proved
at its own ``max_num_seqs`` (the most requests it holds at once), the ladder is not capped, and the
same rules find the largest ``max_num_seqs`` that carries itself, next to a larger one that preempts.

The winner (``pick_winner``): among the candidates that carried the target, the one with the most
memory (ladder order: the most KV headroom), then the most concurrency carried (``min(max_num_seqs,
target)``: the requests it runs at once — a lower cap that happened to pass never beats a higher one
that carried), then one whose replay saw no preemption at the level above either (headroom seen, not
assumed: a ``max_num_seqs`` above the target that preempted there loses to the capped one), then the
largest ``max_num_seqs``, then the higher throughput. No candidate carried the target → no winner,
and the CLI says so (exit 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from oomload.realvllm.servecmd import flag_text
from oomload.tune.guide import headroom_level
from oomload.tune.rate import RateTarget
from oomload.tune.startup import StartCause, StartupFailure
from oomload.verdict.deathcause import DeathKind

MIN_BATCHED_TOKENS = 512
MEMORY_DEATHS = frozenset(k.value for k in DeathKind if k.memory)  # the kinds a memory setting answers
ACTIVATION_DEATHS = (DeathKind.CUDA_OOM.value, DeathKind.CPU_OOM.value)  # the prefill batch sizes them
DEFAULT_BATCHED_TOKENS = 2048  # vLLM V1's API-server default on most GPUs (vllm-facts §7)
FREE_MEMORY_MARGIN = 0.005
KNOBS = (
    "gpu_memory_utilization",
    "num_gpu_blocks",
    "kv_cache_memory_bytes",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "enforce_eager",
)
_FLAG = {
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "num_gpu_blocks": "--num-gpu-blocks-override",
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
}


@dataclass(frozen=True, slots=True)
class Settings:
    """One candidate's server settings (``None``: the command's own value, untouched)."""

    gpu_memory_utilization: float | None = None
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None

    def flags(self) -> tuple[tuple[str, str | None], ...]:
        """The vLLM flags this candidate sets: ``(flag, value)``; value ``None`` for a bare switch,
        and prefix caching as ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``."""
        out: list[tuple[str, str | None]] = []
        for name, flag in _FLAG.items():
            value = getattr(self, name)
            if value is not None:
                out.append((flag, flag_text(value)))
        if self.enable_prefix_caching is not None:
            out.append(
                (
                    "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching",
                    None,
                )
            )
        if self.enforce_eager:
            out.append(("--enforce-eager", None))
        return tuple(out)

    def label(self) -> str:
        """The flags as one short string, for tables."""
        return " ".join(flag if value is None else f"{flag} {value}" for flag, value in self.flags())

    def memory_key(self) -> tuple[float | None, int | None, int | None]:
        return (self.gpu_memory_utilization, self.num_gpu_blocks, self.kv_cache_memory_bytes)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in KNOBS if getattr(self, name) is not None}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Settings:
        return cls(**{k: obj[k] for k in KNOBS if k in obj})


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """What the search may move, and its bound on starts."""

    memory: tuple[Settings, ...]  # most memory first; each sets one memory knob
    max_num_seqs: tuple[int, ...]  # ascending
    base: Settings = Settings()  # the fixed knobs and the user's starting values
    recommended_max_model_len: int | None = None
    fixed: frozenset[str] = frozenset()
    max_starts: int = 8


@dataclass(frozen=True, slots=True)
class Proof:
    """What a started candidate's pool and replay showed (the runner fills it from the run directory)."""

    num_gpu_blocks: int | None
    block_size: int | None
    predicted_onset: int | None  # the odds' first non-negligible level, production-shaped when shared
    odds_safe_max_num_seqs: int | None  # the largest ladder value the odds call safe at the target
    requests_for_evidence: int | None
    observed_onset: int | None  # the replay's preemption onset (None: none seen)
    preempted_at_target: bool
    died: bool
    overflow_at_target: bool
    slo_met: bool | None  # None: no SLO asked
    requests_at_target: int
    throughput_tokens_per_s: float | None
    ttft_p99_ms: float | None
    run_dir: str | None
    evidence: str  # one sentence: what the replay saw and how much it sent
    predicted_onset_worst_case: int | None = None  # the same odds with every prompt distinct
    prompts: str = "worst-case"  # the shape the odds and the replay used: "production" or "worst-case"
    odds_safe_above: bool | None = None  # the odds at the headroom level, max_num_seqs raised to it
    # no preemption, no death, and the step did not hold the target (or the cap): neither verdict
    no_evidence: bool = False
    starved: str | None = None  # the load generator's figures when it was starved (verdict.loadgen)
    remeasured: bool = False  # the target was measured again after a step without evidence
    running_max: int | None = None  # vLLM's most requests running at once at the target
    died_above: int | None = None  # the level above the target where the engine died (the headroom's)
    death_kind: str | None = None  # the death's kind (``DeathKind``'s value), at or above the target

    @property
    def broke_above(self) -> int | None:
        """The lowest level above the target that preempted or killed the engine (``None``: none)."""
        levels = [c for c in (self.observed_onset, self.died_above) if c is not None]
        return min(levels) if levels else None

    @property
    def died_of_memory(self) -> bool:
        """The engine died of memory (or of a cause not recorded): a smaller setting may carry. A crash,
        a kill from outside or no known cause is nothing a memory setting answers."""
        return self.death_kind is None or self.death_kind in MEMORY_DEATHS

    @property
    def outcome(self) -> str:
        """``carried``, ``preempted``, ``died``, ``no evidence``, or ``rejected`` (SLO, overflow)."""
        if self.preempted_at_target:
            return "preempted"
        if self.died:
            return "died"
        if self.no_evidence:
            return "no evidence"
        return "carried" if self.carries else "rejected"

    @property
    def carries(self) -> bool:
        return (
            not self.preempted_at_target
            and not self.died
            and not self.overflow_at_target
            and self.slo_met is not False
            and self.requests_at_target > 0
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """One start: its settings, the rule that chose them, and what happened."""

    index: int
    settings: Settings
    rule: str
    started: bool
    failure: StartupFailure | None = None
    free_device_bytes: int | None = None  # NVML, just before the start (None: not measured)
    proof: Proof | None = None
    startup_s: float | None = None
    rate: RateTarget | None = None  # --target-rate: the open-loop replay on this candidate (tune.rate)
    # the pool the started server got, read before its replays: an interrupted candidate keeps it too
    num_gpu_blocks: int | None = None
    block_size: int | None = None

    @property
    def carries(self) -> bool:
        return self.started and self.proof is not None and self.proof.carries


@dataclass(frozen=True, slots=True)
class Proposal:
    settings: Settings
    rule: str


def first_proposal(space: SearchSpace, target: int | None) -> Proposal:
    """Rule 1: the most memory, ``max_num_seqs`` at the target; its rule says the value it set."""
    seqs = _seqs_at_most(space, target)
    settings = _merge(space.base, space.memory[0] if space.memory else Settings())
    if "max_num_seqs" not in space.fixed and seqs is not None:
        settings = replace(settings, max_num_seqs=seqs)
    return Proposal(settings, f"first: the most memory on the ladder, {_first_seqs(space, target, seqs)}")


def _first_seqs(space: SearchSpace, target: int | None, seqs: int | None) -> str:
    """Rule 1's ``max_num_seqs`` in words: at the target, or the value it is instead and why (a knob
    the user fixed, or a ladder with no value at the target)."""
    if "max_num_seqs" in space.fixed:
        own = space.base.max_num_seqs
        if own is None:
            return "max_num_seqs left at the server's default (--fix max-num-seqs)"
        return f"max_num_seqs {own} kept from your line (--fix max-num-seqs){_beside(own, target)}"
    if seqs is None:
        return "max_num_seqs as your line has it"
    if target is None:
        return "the largest max_num_seqs (no target)"
    if seqs == target:
        return "max_num_seqs at the target"
    end = "largest" if seqs < target else "smallest"  # the ladder has nothing at the target
    return f"max_num_seqs {seqs}, the ladder's {end}{_beside(seqs, target)}"


def _beside(seqs: int, target: int | None) -> str:
    if target is None or seqs == target:
        return ""
    return f", {'below' if seqs < target else 'above'} the target {target}"


def next_proposal(space: SearchSpace, target: int | None, history: Sequence[Candidate]) -> Proposal | None:
    """The next candidate after ``history`` (rules 2-4), or ``None`` when the search is over."""
    if not history:
        return first_proposal(space, target)
    if len(history) >= space.max_starts:
        return None
    last = history[-1]
    proposal = _after_failure(space, last) if not last.started else _after_proof(space, target, history, last)
    tried = {c.settings for c in history}
    if proposal is None or proposal.settings in tried:
        return None
    return proposal


def pick_winner(
    space: SearchSpace, history: Sequence[Candidate], target: int | None = None
) -> Candidate | None:
    """The carrying candidate with the most memory, then the most concurrency carried (the requests it
    runs at once at the target: ``min(max_num_seqs, target)``), then no preemption at the level above
    either, then the largest max_num_seqs, then throughput. ``None`` when the search stopped without
    evidence (``stops.evidence_stop``): the boundary is not known, and a smaller setting that carried
    is no answer."""
    carriers = [c for c in history if c.carries]
    last = history[-1].proof if history else None
    if not carriers or (last is not None and last.no_evidence):  # ``stops.evidence_stop``'s case
        return None

    def key(c: Candidate) -> tuple[int, int, bool, int, float]:
        rank = _memory_rank(space, c.settings)
        seqs = c.settings.max_num_seqs or 0
        assert c.proof is not None
        carried = seqs if target is None or not seqs else min(seqs, target)
        clean = c.proof.broke_above is None  # the level above held too: headroom seen, not assumed
        return (-rank, carried, clean, seqs, c.proof.throughput_tokens_per_s or 0.0)

    return max(carriers, key=key)


def _after_failure(space: SearchSpace, last: Candidate) -> Proposal | None:
    failure = last.failure
    if failure is None:
        return None
    s = last.settings
    cause = failure.cause
    if cause is StartCause.FREE_MEMORY:
        return _lower_memory(space, s, failure)
    if cause is StartCause.CUDA_OOM:
        if "enforce_eager" not in space.fixed and not s.enforce_eager:
            return Proposal(
                replace(s, enforce_eager=True), "CUDA OOM at start-up: eager mode (no CUDA-graph capture)"
            )
        return _lower_memory(space, s, None)
    if cause is StartCause.NO_KV_MEMORY:
        return _halve_batched_tokens(
            space, s, "no memory left for the KV cache", "smaller profiled activations"
        )
    if cause is StartCause.CONTEXT_TOO_LONG:
        if "max_model_len" in space.fixed:
            return None
        estimated = failure.estimated_max_model_len
        recommended = space.recommended_max_model_len
        if recommended is not None and (estimated is None or recommended <= estimated):
            value, why = recommended, "the trace's recommended value (P99 + margin)"
        elif estimated is not None and estimated > 0:
            value, why = estimated, "the server's estimated maximum (the trace's P99 does not fit this pool)"
        else:
            return None
        if s.max_model_len is not None and value >= s.max_model_len:
            return None
        return Proposal(
            replace(s, max_model_len=value),
            f"max_model_len longer than the KV cache holds: cut to {value}, {why}",
        )
    return None


def _halve_batched_tokens(space: SearchSpace, s: Settings, what: str, why: str) -> Proposal | None:
    """``max_num_batched_tokens`` halved (not below ``MIN_BATCHED_TOKENS``), unless the user fixed it."""
    current = s.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS
    halved = max(current // 2, MIN_BATCHED_TOKENS)
    if "max_num_batched_tokens" in space.fixed or halved >= current:
        return None
    return Proposal(
        replace(s, max_num_batched_tokens=halved),
        f"{what}: max_num_batched_tokens halved to {halved} ({why})",
    )


def _lower_memory(space: SearchSpace, s: Settings, failure: StartupFailure | None) -> Proposal | None:
    """The next memory step down the ladder (for free memory: the highest the device's free share allows)."""
    if _memory_fixed(space):
        return None
    rank = _memory_rank(space, s)
    share = None if failure is None else failure.free_share
    for step in space.memory[rank + 1 :]:
        util = step.gpu_memory_utilization
        if share is not None and (util is None or util > share - FREE_MEMORY_MARGIN):
            continue  # a pool-sized step reserves no less of the node than the share that failed
        settings = _merge(s, step)
        if (
            share is not None
            and failure is not None
            and failure.free_bytes is not None
            and failure.total_bytes
        ):
            free_gib = failure.free_bytes / 1024**3
            total_gib = failure.total_bytes / 1024**3
            rule = (
                f"free device memory {free_gib:.2f} of {total_gib:.2f} GiB at start-up: "
                f"{_memory_text(step)} (the most the free memory allows)"
            )
        else:
            rule = f"start-up failed: {_memory_text(step)} (next step down)"
        return Proposal(settings, rule)
    return None


def _after_proof(
    space: SearchSpace, target: int | None, history: Sequence[Candidate], last: Candidate
) -> Proposal | None:
    """Rules 3-5 after a proved candidate (module docstring)."""
    if "max_num_seqs" in space.fixed or last.proof is None:
        return None
    s = last.settings
    seqs = s.max_num_seqs
    proof = last.proof
    if seqs is None or proof.no_evidence:  # no evidence is no verdict: never a step down (rule 5)
        return None
    ladder = [v for v in space.max_num_seqs if target is None or v <= target]
    same_memory = [c for c in history if c.started and c.settings.memory_key() == s.memory_key()]
    tried = {c.settings.max_num_seqs for c in same_memory}
    lo, hi = bracket(same_memory, target)
    if proof.carries:
        if hi is not None and lo is not None and hi > seqs == lo:
            return _bisect(s, lo, hi, proof, tried, f"carried the target with max_num_seqs {seqs}")
        return _after_carry(target, s, seqs, proof, ladder, tried)
    if not proof.preempted_at_target and not proof.died and proof.slo_met is False:
        larger = [v for v in ladder if v > seqs and v not in tried]
        if not larger:
            return None
        return Proposal(
            replace(s, max_num_seqs=larger[0]),
            f"SLO missed without preemption (queueing): max_num_seqs raised to {larger[0]}",
        )
    if target is not None and seqs > target:  # above the target the target's level is the capped one's
        return None
    if proof.died and not proof.preempted_at_target:
        if not proof.died_of_memory:  # a crash or a kill: no memory setting answers it
            return None
        peak = f"an activation peak ({proof.death_kind}) killed the engine at {target or seqs}"
        halved = _halve_batched_tokens(space, s, peak, "the prefill batch sizes that peak")
        if proof.death_kind in ACTIVATION_DEATHS and halved is not None:
            return replace(halved, rule=f"{halved.rule} before max_num_seqs is cut")
    if hi is None or hi != seqs:  # rejected (an overflow), or not the smallest that failed: stop
        return None
    what = (
        f"{'preempted' if proof.preempted_at_target else 'died'} at {target or seqs} with max_num_seqs {seqs}"
    )
    if lo is None:  # nothing carried yet: the odds seed the first guess, the server decides
        guess = proof.odds_safe_max_num_seqs
        if guess is not None and 1 <= guess < seqs and guess not in tried:
            return Proposal(
                replace(s, max_num_seqs=guess),
                f"{what}: lowered to {guess}, the first guess — the trace's odds on "
                f"{proof.num_gpu_blocks} blocks call {guess} safe (the server decides)",
            )
        if guess is not None and seqs <= guess:  # the guess preempted: step down, doubling each time
            missed = sum(1 for c in same_memory if _failed(c) and (c.settings.max_num_seqs or 0) <= guess)
            step = 2 ** max(missed - 1, 0)
            lower = max(seqs - step, 1)
            if lower < seqs and lower not in tried:
                return Proposal(
                    replace(s, max_num_seqs=lower),
                    f"{what}, below the odds' guess {guess}: lowered by {step} to {lower} "
                    "(doubling the step until one carries, then bisect)",
                )
        lo = 0
    return _bisect(s, lo, hi, proof, tried, what)


def _failed(c: Candidate) -> bool:
    return c.proof is not None and (c.proof.preempted_at_target or c.proof.died)


def bracket(same_memory: Sequence[Candidate], target: int | None) -> tuple[int | None, int | None]:
    """``(lo, hi)`` at one memory setting: the largest ``max_num_seqs`` (≤ the target) that carried,
    and the smallest above it that preempted or died (``None``: none yet). A candidate without
    evidence bounds nothing."""
    carried = [
        c.settings.max_num_seqs
        for c in same_memory
        if c.carries
        and c.settings.max_num_seqs is not None
        and (target is None or c.settings.max_num_seqs <= target)
    ]
    lo = max(carried) if carried else None
    failed = [
        c.settings.max_num_seqs
        for c in same_memory
        if c.proof is not None
        and (c.proof.preempted_at_target or c.proof.died)
        and c.settings.max_num_seqs is not None
        and (lo is None or c.settings.max_num_seqs > lo)
    ]
    return lo, (min(failed) if failed else None)


def _bisect(
    s: Settings, lo: int, hi: int, proof: Proof, tried: set[int | None], what: str
) -> Proposal | None:
    """Rule 4: the midpoint of ``(lo, hi)`` (``lo`` carried, ``hi`` preempted), on the real server;
    the search ends when they are one apart (``lo`` is then the largest cap that does not preempt)."""
    if hi - lo <= 1:
        return None
    mid = (lo + hi) // 2
    if mid in tried:
        return None
    below = f"max_num_seqs {lo} carried" if lo else "nothing smaller proved yet"
    return Proposal(
        replace(s, max_num_seqs=mid),
        f"{what}: bisect — {below}, {hi} preempted: max_num_seqs {mid}",
    )


def _after_carry(
    target: int | None, s: Settings, seqs: int, proof: Proof, ladder: Sequence[int], tried: set[int | None]
) -> Proposal | None:
    """Rule 3, a carrier: seek the most headroom (module docstring)."""
    capped = [v for v in ladder if v not in tried]
    if target is not None and seqs > target:  # above the target: did it hold what it admits?
        onset = proof.broke_above
        top = max(ladder, default=None)
        if onset is None or onset > seqs or top is None or top in tried:
            return None  # headroom seen; or the capped setting was proved already
        broke = "died" if onset == proof.died_above else "preempted"
        return Proposal(
            replace(s, max_num_seqs=top),
            f"carried the target with max_num_seqs {seqs} but {broke} at {onset}, above the target: "
            f"max_num_seqs {top} (at most the target) queues such bursts instead",
        )
    larger = [v for v in capped if v > seqs]
    if larger:
        return Proposal(
            replace(s, max_num_seqs=larger[0]),
            f"carried the target with max_num_seqs {seqs}: try {larger[0]} (where does the headroom end?)",
        )
    above = headroom_level(target)
    if above is None or above in tried or seqs < (target or 0) or not proof.odds_safe_above:
        return None
    return Proposal(
        replace(s, max_num_seqs=above),
        f"carried the target with max_num_seqs {seqs}, the top of the ladder, and the trace's odds on "
        f"{proof.num_gpu_blocks} blocks call {above} safe: max_num_seqs {above}, above the target, "
        "for headroom over bursts",
    )


def _seqs_at_most(space: SearchSpace, target: int | None) -> int | None:
    if space.base.max_num_seqs is not None and "max_num_seqs" in space.fixed:
        return space.base.max_num_seqs
    fitting = [v for v in space.max_num_seqs if target is None or v <= target]
    return fitting[-1] if fitting else (space.max_num_seqs[0] if space.max_num_seqs else None)


def _memory_rank(space: SearchSpace, s: Settings) -> int:
    for rank, step in enumerate(space.memory):
        if _merge(s, step).memory_key() == s.memory_key():
            return rank
    return len(space.memory)


def _memory_fixed(space: SearchSpace) -> bool:
    return len(space.memory) <= 1


def _memory_text(step: Settings) -> str:
    if step.gpu_memory_utilization is not None:
        return f"gpu_memory_utilization lowered to {step.gpu_memory_utilization:g}"
    if step.num_gpu_blocks is not None:
        return f"KV pool lowered to {step.num_gpu_blocks} blocks"
    if step.kv_cache_memory_bytes is not None:
        return f"KV cache memory lowered to {step.kv_cache_memory_bytes} bytes"
    return "less memory"


def _merge(s: Settings, memory: Settings) -> Settings:
    """``s`` with the memory knobs that ``memory`` sets."""
    knobs = ("gpu_memory_utilization", "num_gpu_blocks", "kv_cache_memory_bytes")
    return replace(s, **{k: getattr(memory, k) for k in knobs if getattr(memory, k) is not None})
