"""vLLM V1's scheduler, reduced to its memory behaviour (pure, deterministic, no I/O).

State: a pool of ``num_gpu_blocks`` KV blocks of ``block_size`` tokens, one of them the reserved null
block (so ``num_gpu_blocks − 1`` are usable), a RUNNING list and a WAITING deque. A request holds
``ceil(num_computed_tokens / block_size)`` blocks. One ``step()`` is one engine iteration
(``v1/core/sched/scheduler.py``, reference ``vllm-facts.md`` §4.1):

1. RUNNING first, in order. Each request asks for ``num_tokens − num_computed_tokens`` new tokens
   (1 when decoding; the rest of the prompt, in chunks, when prefilling or recomputing), capped by
   the step's token budget ``max_num_batched_tokens`` (chunked prefill) and by ``max_model_len − 1``.
   If the pool cannot supply the blocks, the NEWEST running request is preempted (recompute mode):
   its blocks are freed, its computed tokens reset to 0, it goes to the FRONT of WAITING and the
   preemption counter rises by one. This repeats until the allocation succeeds; when the victim is
   the request itself, no further running request is scheduled this step.
2. WAITING requests are admitted, in order, only if nothing was preempted this step, while
   ``len(running) < max_num_seqs`` and the token budget is not spent, and only if the blocks for the
   request's FULL current token count are free (``scheduler_reserve_full_isl``, vLLM ≥ 0.20). The
   first that does not fit stops admission (no skipping ahead).
3. Execution: every scheduled request advances ``num_computed_tokens``; one that has computed all its
   tokens samples one output token. A request finishes (``length``) at ``max_tokens`` output tokens or
   when ``prompt + output`` reaches ``max_model_len``; its blocks return to the pool.

Because the token just sampled is not in the cache yet, a request of ``P + O`` tokens peaks at
``ceil((P + O − 1) / block_size)`` blocks, as in vLLM.

Prefix caching (``enable_prefix_caching``; the simulator turns it on, as vLLM V1 does — the rules of
``reference/prefix-caching.md``): only FULL prompt blocks are hashed, each block's hash chained on its
parent's (block k depends on tokens 0..k·B+B−1), so a prefix is shared only when identical from token
0. At admission a request looks up its longest cached chain, stopping at the first miss and capped at
``(num_tokens − 1) // B`` blocks (the last token is always computed). Hit blocks are referenced, not
copied. A block no running request references stays cached but counts as FREE (``usage`` counts only
blocks held by live requests) and is evicted LRU-first, after the uncached free blocks, when the pool
needs it; a request frees its blocks to the LRU tail in reverse order (its chain's last block is
evicted first, block 0 last). The counters (``num_queried_tokens`` /
``num_cached_tokens``, vLLM's ``prefix_cache_queries`` / ``_hits``, in tokens) count a request's
first admission only: the re-hits of a preempted request go to vLLM's separate ``preempted_*`` stats.
Not modelled: vLLM also hashes blocks filled by decode output, which only a preempted request itself
can hit again on readmission (its recompute then starts later in the sequence).

Usage = blocks held by requests / (num_gpu_blocks − 1), vLLM's ``kv_cache_usage_perc``.

Decode runs (``skip_decode``, for callers that count steps, not time: the trace's odds). While nothing
waits and every running request only decodes, a step samples one token per request and takes a block
for each request whose computed tokens reach a new block; it cannot preempt while the pool holds every
block those steps ask for together, and it changes nothing else until a request finishes. So ``n`` such
steps are done at once — each request ``n`` tokens further, the pool ``n`` steps' blocks poorer — for
the largest ``n`` before the first step that finishes a request or could run short of blocks; that step
and every other one run through ``step()``. The state afterwards is exactly what ``n`` calls of
``step()`` leave (tests compare both, step by step).
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from oomload.capacity.blocks import usable_blocks


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The flags that decide scheduling: pool size and the per-step limits."""

    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        for name in (
            "num_gpu_blocks",
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(slots=True, eq=False)
class SimRequest:
    """One request inside the scheduler (mutable engine state; identity is the object)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float = 0.0
    prompt_ids: Sequence[int] | None = None  # only needed for prefix caching
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_blocks: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    finish_reason: str | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    prompt_counted: bool = False
    cached_hashes: list[int] = field(default_factory=list)  # hashed blocks this request references
    prompt_hashes: list[int] | None = None  # chain hashes of the full prompt blocks (computed once)
    num_cached_prompt_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_output_tokens

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass(slots=True)
class EngineStepResult:
    """What one engine step did (the engine and the metrics read this)."""

    scheduled: list[tuple[SimRequest, int]] = field(default_factory=list)  # (request, new tokens)
    sampled: list[SimRequest] = field(default_factory=list)  # requests that got one output token
    finished: list[SimRequest] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    num_batched_tokens: int = 0
    num_prefill_tokens: int = 0  # tokens of first-time prompt prefill (counted once per request)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    num_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache at admission
    kv_read_tokens: int = 0  # context tokens read by attention this step (for the step-time model)

    @property
    def idle(self) -> bool:
        return not self.scheduled


class Scheduler:
    """The block pool plus RUNNING/WAITING queues; ``step()`` runs one engine iteration."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.capacity_blocks = usable_blocks(config.num_gpu_blocks)
        self.free_blocks = self.capacity_blocks  # includes cached blocks nobody references
        self.num_preemptions = 0
        # prefix cache: hash -> reference count; evictable (ref 0) hashes kept in LRU order
        self._cache_refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    # -- queries -------------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """Blocks held by live requests (cached-but-unreferenced blocks count as free)."""
        return self.capacity_blocks - self.free_blocks

    @property
    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc`` (0..1)."""
        return self.used_blocks / self.capacity_blocks if self.capacity_blocks else 0.0

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # -- requests ------------------------------------------------------------------------------
    def add(self, request: SimRequest) -> None:
        """Queue a new request at the back of WAITING."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def abort(self, request: SimRequest, *, now_s: float = 0.0) -> bool:
        """Drop a request (client went away); frees its blocks. False if it had already finished."""
        if request.finished:
            return False
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                return False
        self._free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = "abort"
        request.finished_s = now_s
        return True

    # -- the step ------------------------------------------------------------------------------
    def step(self, now_s: float = 0.0) -> EngineStepResult:
        """Run one engine iteration (see the module docstring)."""
        cfg = self.config
        bs = cfg.block_size
        result = EngineStepResult()
        scheduled = result.scheduled
        budget = cfg.max_num_batched_tokens
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            num_new = min(num_new, cfg.max_model_len - 1 - req.num_computed_tokens)
            if num_new <= 0:
                i += 1
                continue
            needed = -(-(req.num_computed_tokens + num_new) // bs) - req.num_blocks
            scheduled_self = True
            while needed > self.free_blocks:
                victim = running.pop()
                self._preempt(victim, result)
                if victim is req:
                    scheduled_self = False
                    break
            if not scheduled_self:
                break
            if needed > 0:
                self._take(needed)
                req.num_blocks += needed
            budget -= num_new
            scheduled.append((req, num_new))
            i += 1

        if not result.preempted:
            self._admit(result, budget, now_s)

        self._execute(result, now_s)
        return result

    def skip_decode(self) -> int:
        """Run, at once, the engine steps that can only decode (module docstring, "Decode runs"); returns
        how many (0: the next step may admit, prefill, preempt or finish a request — run ``step()``).
        Their results (tokens sampled, timestamps) are not reported: only the state is advanced."""
        cfg = self.config
        running = self.running
        if self.waiting or not running or len(running) > cfg.max_num_batched_tokens:
            return 0
        steps = cfg.max_model_len  # more than any request can run
        for req in running:
            if req.num_tokens - req.num_computed_tokens != 1:
                return 0  # prefilling (or recomputing) a chunk
            if cfg.enable_prefix_caching and len(req.cached_hashes) < req.prompt_tokens // cfg.block_size:
                return 0  # full prompt blocks still to register
            steps = min(steps, req.max_tokens - req.num_output_tokens, cfg.max_model_len - req.num_tokens)
        steps -= 1  # the step that finishes a request runs through step()
        if steps <= 0:
            return 0
        bs = cfg.block_size
        free = self.free_blocks

        def blocks_for(n: int) -> int:
            return sum(max(-(-(r.num_computed_tokens + n) // bs) - r.num_blocks, 0) for r in running)

        if blocks_for(steps) > free:  # the pool runs short within the run: stop before that step
            lo, hi = 0, steps  # blocks_for(lo) <= free < blocks_for(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if blocks_for(mid) <= free else (lo, mid)
            steps = lo
            if steps == 0:
                return 0
        taken = 0
        for req in running:
            needed = -(-(req.num_computed_tokens + steps) // bs) - req.num_blocks
            if needed > 0:
                req.num_blocks += needed
                taken += needed
            req.num_computed_tokens += steps
            req.num_output_tokens += steps
        if taken:
            self._take(taken)
        return steps

    def _admit(self, result: EngineStepResult, budget: int, now_s: float) -> None:
        cfg = self.config
        bs = cfg.block_size
        waiting = self.waiting
        running = self.running
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            hits: list[int] = []
            if cfg.enable_prefix_caching and req.num_computed_tokens == 0 and req.prompt_ids is not None:
                hits = self._lookup_prefix(req)
            cached_tokens = len(hits) * bs
            full_blocks = -(-req.num_tokens // bs) - len(hits)
            reusable = sum(1 for h in hits if self._cache_refs.get(h, 0) == 0)
            if full_blocks > self.free_blocks - reusable:
                break
            waiting.popleft()
            if hits:
                self._ref_hits(hits)
                req.cached_hashes = list(hits)
                req.num_blocks = len(hits)
                req.num_computed_tokens = cached_tokens
            if req.num_preemptions == 0 and not req.prompt_counted:  # re-hits: preempted_* stats
                result.num_queried_tokens += req.num_tokens if cfg.enable_prefix_caching else 0
                result.num_cached_tokens += cached_tokens
                req.num_cached_prompt_tokens = cached_tokens
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            needed = -(-(req.num_computed_tokens + num_new) // bs) - req.num_blocks
            self._take(needed)
            req.num_blocks += needed
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now_s
            running.append(req)
            budget -= num_new
            result.scheduled.append((req, num_new))

    def _execute(self, result: EngineStepResult, now_s: float) -> None:
        cfg = self.config
        any_finished = False
        for req, num_new in result.scheduled:
            result.kv_read_tokens += req.num_computed_tokens + num_new
            if not req.prompt_counted:
                prompt_left = req.prompt_tokens - req.num_computed_tokens
                result.num_prefill_tokens += max(min(num_new, prompt_left), 0)
            req.num_computed_tokens += num_new
            result.num_batched_tokens += num_new
            if cfg.enable_prefix_caching and req.prompt_ids is not None:
                self._register_full_blocks(req)
            if req.num_computed_tokens < req.num_tokens:
                continue  # a chunk of a longer prefill: no token sampled yet
            if not req.prompt_counted:
                req.prompt_counted = True
            req.num_output_tokens += 1
            if req.first_token_s is None:
                req.first_token_s = now_s
            result.sampled.append(req)
            if req.num_output_tokens >= req.max_tokens or req.num_tokens >= cfg.max_model_len:
                req.status = RequestStatus.FINISHED
                req.finish_reason = "length"
                req.finished_s = now_s
                self._free(req)
                result.finished.append(req)
                any_finished = True
        if any_finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]

    # -- block pool ----------------------------------------------------------------------------
    def _take(self, n: int) -> None:
        """Hand out ``n`` free blocks, evicting unreferenced cached blocks first-in-LRU if needed."""
        if n > self.free_blocks:
            raise AssertionError(f"block pool overdrawn: need {n}, free {self.free_blocks}")
        self.free_blocks -= n
        uncached_free = self.free_blocks - len(self._evictable)
        while uncached_free < 0 and self._evictable:
            h, _ = self._evictable.popitem(last=False)
            del self._cache_refs[h]
            uncached_free += 1

    def _free(self, req: SimRequest) -> None:
        still_shared = 0
        # vLLM frees a request's blocks in reverse order onto the LRU tail: the chain's last block is
        # evicted first and block 0 last, so a prefix stays hittable as long as possible
        for h in reversed(req.cached_hashes):
            refs = self._cache_refs.get(h)
            if refs is None:
                continue  # an unshared duplicate (see _register_full_blocks)
            if refs > 1:
                self._cache_refs[h] = refs - 1
                still_shared += 1  # another running request still holds this block
            else:
                self._cache_refs[h] = 0
                self._evictable[h] = None  # stays cached, counts as free
        self.free_blocks += req.num_blocks - still_shared
        req.num_blocks = 0
        req.cached_hashes = []

    def _preempt(self, victim: SimRequest, result: EngineStepResult) -> None:
        self._free(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        result.preempted.append(victim)

    # -- prefix cache --------------------------------------------------------------------------
    def _block_hashes(self, req: SimRequest, upto_blocks: int) -> list[int]:
        """The chain hashes of the request's first ``upto_blocks`` full prompt blocks."""
        chain = req.prompt_hashes
        if chain is None:
            ids = req.prompt_ids
            assert ids is not None
            bs = self.config.block_size
            chain = []
            parent = 0
            for b in range(min(len(ids), req.prompt_tokens) // bs):
                parent = hash((parent, tuple(ids[b * bs : (b + 1) * bs])))
                chain.append(parent)
            req.prompt_hashes = chain
        return chain[:upto_blocks]

    def _lookup_prefix(self, req: SimRequest) -> list[int]:
        bs = self.config.block_size
        # never serve the whole sequence from cache: at least one token must be computed
        max_blocks = (req.num_tokens - 1) // bs
        hits: list[int] = []
        for h in self._block_hashes(req, max_blocks):
            if h not in self._cache_refs:
                break
            hits.append(h)
        return hits

    def _ref_hits(self, hits: list[int]) -> None:
        for h in hits:
            refs = self._cache_refs[h]
            if refs == 0:
                self._evictable.pop(h, None)
                self.free_blocks -= 1  # an evictable cached block becomes held
            self._cache_refs[h] = refs + 1

    def _register_full_blocks(self, req: SimRequest) -> None:
        bs = self.config.block_size
        full = min(req.num_computed_tokens, req.prompt_tokens) // bs
        have = len(req.cached_hashes)
        if full <= have:
            return
        for h in self._block_hashes(req, full)[have:]:
            if h in self._cache_refs:
                # identical content already cached by another request: vLLM keeps both blocks; we
                # keep the request's own block unhashed to stay consistent with the counts
                req.cached_hashes.append(_unique_marker(req, len(req.cached_hashes)))
                continue
            self._cache_refs[h] = 1
            req.cached_hashes.append(h)


def _unique_marker(req: SimRequest, index: int) -> int:
    """A hash no prompt block produces, so an unshared duplicate block is tracked but never hit."""
    return hash(("dup", id(req), index))
