"""KV-cache capacity arithmetic: how many requests of given lengths a block pool holds (pure).

vLLM's V1 scheduler gives a request ``ceil(tokens / block_size)`` blocks, where ``tokens`` is the
number of tokens whose KV is written: it grows from the prompt length as the request decodes, but the
KV of the last sampled token is never written (the request finishes first). So a request of ``P``
prompt + ``O`` output tokens holds at most

    blocks_held = ceil((P + O − 1) / block_size)

blocks (``blocks_held``, the one function every prediction uses: ``predict_preemption_onset`` for the
verdict's prediction and ``oomload plan``, ``concurrent_fit``; the simulator's scheduler reaches the
same number by allocating as it computes). Measured on the real vLLM 0.32: 129 + 128 tokens with 12
blocks of 256 ran 10 concurrent requests in one block each and never preempted. One block of the pool
is the reserved null block, so ``num_gpu_blocks - 1`` are usable (vLLM's own ``kv_cache_usage_perc``
divides by that number). When every running request holds its full length at once, ``n`` requests
fit while ``n × blocks_held ≤ usable``; the first preemption is expected at one more than that:

    onset = floor(usable_blocks / blocks_held) + 1

This is exact for fixed lengths (seen on the real CPU vLLM, reference ``vllm-cpu.md`` §6). For a mixed
trace we report the onset for a mean request (a rough centre; it lands about one level early because
requests start staggered and do not all hold their full length at once) and for the P50 / P90
requests, so the verdict can show the observed onset beside a band instead of one number.

Decode phases. ``blocks_held`` is a request's peak, at its last token; it grows into it from its prompt
blocks as it decodes. In a closed loop the requests' phases decide how many hold their peak at once: in
phase (every request at its peak together) the onset is the one above; spread evenly over their decode,
each holds its *mean* blocks over the decode (``blocks_over_decode``), and the onset is the lowest level
whose mean demand exceeds the pool (``onset_spread``, for a mean request) — at that level every phase
pattern overflows. The real vLLM lands anywhere between the two (seen on the CPU build, 80 blocks of 32,
600-token prompts sharing 512 tokens, 100 output tokens: 11 in phase, 14 spread; runs gave 11, 12 and
14), so ``onset_spread`` is the band's latest end. Where the output stays within one block the two agree.

Requests that never outgrow a full pool. vLLM admits a request only when the blocks of its whole prompt
are free, and preempts only when a running request needs a block the pool no longer has. So a pool that
admits ``k = ⌊usable / prompt blocks⌋`` prompts at most can be outgrown only when ``k`` requests at their
peak need more than it has: for fixed lengths the onset above exists only when ``k × blocks_held >
usable`` — else the request past ``k`` queues, its prompt does not fit, and the ``k`` running ones grow
into the slack the pool left. A request whose output ends in its last prompt block (one output token, as
a classifier or a scorer asks for) never grows at all; a long prompt with a short output (a summariser's
or a RAG prompt's 4–7k tokens and 1–20 output tokens) grows by a block or two that the slack holds.
``OnsetPrediction.grows`` is false (known only given the prompt lengths) when, for the mean, the P50 and
the P90 prompt, the ``k`` prompts a full pool admits, each grown by the *largest* growth of any request,
still fit. Then a full pool queues new requests and preempts none: there is no onset, and the onsets above
are where the pool fills and queueing begins. For a mix it takes the worst growth, so a few short prompts
with long outputs among long prompts with short ones keep their onset; a mix can still pack the pool
tighter than its mean prompt, and then a rare preemption is possible (the trace's odds count those).

For fixed lengths ``grows`` false means no preemption at any concurrency; ``grows`` true means the ``k``
prompts preempt when admitted before any of them grows (all prefilled in one step) — a token budget that
staggers their prefills lets the admission check see the first ones' growth, which can keep the last one
waiting. Both checked on the simulator's scheduler (tests/unit/capacity), which also showed, in bursts of up
to 24: 1000 + 1 and 1000 + 10 tokens on 799 blocks of 16 (63 prompt, 64 peak blocks: 12 fit either way) and
5000 + 20 on 799 or 2,087 blocks never preempt; 5000 + 20 on 941 blocks (3 prompts fit, 3 peaks do not) and
1000 + 100 on 799 do. Not counted: a prompt prefilled in chunks takes its blocks as it goes.

Shared prefixes (``SharedPrefixes``; reference ``prefix-caching.md``). vLLM V1 caches full prompt blocks
by a chained hash: a block is held once while any running request uses it, and a cached block no request
holds counts as free (it is evicted when a block is needed). A trace's ``hash_ids`` say which prompt
prefixes are identical: trace id ``k`` covers tokens ``[k·B_t, (k+1)·B_t)`` and, being chained, equal ids
at ``k`` mean identical prompts through the end of that trace block. A server block ``j`` of ``B_s``
tokens is shared when the trace block holding its last token is — so a trace id shares
``⌊(k+1)·B_t / B_s⌋ − ⌊k·B_t / B_s⌋`` server blocks, and a server block straddling into an unshared trace
block is not shared. Only full trace blocks count (a source trace's last id may cover a partial block),
and at most ``⌊(P − 1) / B_s⌋`` blocks are ever hits (the last prompt token is always computed). The rest
of a request — its unshared prompt blocks and every output block — is its own.

With ``n`` requests drawn at random from the trace (the odds' draw: uniformly, with replacement), a
shared group of ``w`` blocks that a share ``f`` of the requests carry is held with probability
``1 − (1 − f)^n``, so the expected blocks held are ``D(n) = n · mean(own) + Σ w · (1 − (1 − f)^n)``, and
the onset is the smallest ``n`` with ``D(n) > usable``. The P50 / P90 ends of the band use each request's
*effective* blocks at ``n`` — its own blocks plus its share of each group it carries, ``w · (1 − (1 −
f)^n) / (n·f)`` — whose mean times ``n`` is ``D(n)``. A group's share is never more than its ``w``, so
sharing never makes an onset earlier, and a trace without ``hash_ids`` gives today's numbers exactly.
Fixed lengths with one shared prefix reduce to ``onset = ⌊(usable − shared) / own⌋ + 1``: 80 blocks of
32, 600-token prompts sharing 512 tokens and 100 output tokens hold 16 shared + 6 own blocks, so 10 fit
and 11 preempts (distinct prompts: 22 blocks each, onset 4) — what the real vLLM CPU build showed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

# Which prompts a prediction assumes: the trace's own shared prefixes ("production", what vLLM's prefix
# cache sees in production) or every prompt distinct ("worst-case", nothing shared).
PromptShape = Literal["production", "worst-case"]
PROMPT_SHAPES: tuple[PromptShape, ...] = ("production", "worst-case")


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """Blocks a request of ``tokens`` KV tokens holds (``ceil``; 0 tokens → 0 blocks)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return -(-max(tokens, 0) // block_size)


def kv_tokens_held(total_tokens: int) -> int:
    """KV slots a finished request of ``total_tokens`` = prompt + output tokens held: one less, since the
    last sampled token's KV is never written (at least 1 for a non-empty request)."""
    return max(total_tokens - 1, 1) if total_tokens > 0 else 0


def blocks_held(total_tokens: int, block_size: int) -> int:
    """Blocks a request of ``total_tokens`` (prompt + output) holds at its peak: ``ceil((P+O−1)/bs)``."""
    return blocks_for_tokens(kv_tokens_held(total_tokens), block_size)


def blocks_held_array(total_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """``blocks_held`` for an array of totals (vectorised; same rule)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    held = np.where(total_tokens > 0, np.maximum(total_tokens - 1, 1), 0)
    return -(-held // block_size)


def usable_blocks(num_gpu_blocks: int) -> int:
    """Blocks a V1 scheduler can hand out (one is the reserved null block)."""
    return max(num_gpu_blocks - 1, 0)


def single_request_limit_tokens(num_gpu_blocks: int, block_size: int) -> int:
    """The longest request (in KV tokens) the pool can hold: vLLM 0.33's start-up check compares
    ``max_model_len`` with the usable blocks (the null block excluded); older versions with all blocks,
    so this is the conservative bound for every version. ``oomload plan`` and ``recommend`` both use it."""
    return usable_blocks(num_gpu_blocks) * block_size


def concurrent_fit(num_gpu_blocks: int, block_size: int, tokens_per_request: float) -> int:
    """How many requests of ``tokens_per_request`` (prompt + output) tokens fit at once in the pool."""
    per_request = max(blocks_held(math.ceil(tokens_per_request), block_size), 1)
    return usable_blocks(num_gpu_blocks) // per_request


def shared_groups(
    hash_ids: Sequence[int], prompt_tokens: int, *, block_tokens: int, block_size: int
) -> tuple[tuple[int, int], ...]:
    """The server blocks one prompt can share, grouped by the trace id that decides them:
    ``((id, server blocks), ...)`` in prompt order (module docstring: full trace blocks only, at most
    ``⌊(P − 1) / block_size⌋`` blocks, a server block belongs to the trace block of its last token)."""
    if block_tokens <= 0 or block_size <= 0:
        raise ValueError(f"block sizes must be positive, got {block_tokens} and {block_size}")
    if prompt_tokens <= 0:
        return ()
    full = min(len(hash_ids), prompt_tokens // block_tokens)
    cap = min(full * block_tokens // block_size, (prompt_tokens - 1) // block_size)
    groups: list[tuple[int, int]] = []
    done = 0
    for k in range(full):
        if done >= cap:
            break
        upto = min((k + 1) * block_tokens // block_size, cap)
        if upto > done:
            groups.append((int(hash_ids[k]), upto - done))
            done = upto
    return tuple(groups)


@dataclass(frozen=True)
class SharedPrefixes:
    """Per request of a trace, the server blocks its prompt shares (``shared_groups``), in the order of
    the lengths a prediction is given; built from the trace's ``hash_ids`` for one server block size."""

    block_size: int
    groups: tuple[tuple[tuple[int, int], ...], ...]

    @classmethod
    def from_chains(
        cls,
        chains: Sequence[Sequence[int]],
        prompt_tokens: Sequence[int],
        *,
        block_tokens: int,
        block_size: int,
    ) -> SharedPrefixes:
        if len(chains) != len(prompt_tokens):
            raise ValueError("one hash chain per prompt length is needed")
        return cls(
            block_size,
            tuple(
                shared_groups(c, p, block_tokens=block_tokens, block_size=block_size)
                for c, p in zip(chains, prompt_tokens, strict=True)
            ),
        )

    @property
    def any(self) -> bool:
        """Some request has a shareable block (without, every prediction is the worst case's)."""
        return any(self.groups)

    @cached_property
    def shared_blocks(self) -> np.ndarray:
        """Shareable server blocks per request."""
        return np.asarray([sum(w for _, w in g) for g in self.groups], dtype=np.int64)

    def effective_blocks(self, held_blocks: np.ndarray, concurrency: int) -> np.ndarray:
        """Each request's blocks when ``concurrency`` requests drawn from the trace run at once: its own
        blocks plus its share of every group it carries (module docstring); ``held_blocks`` is what
        each request holds alone (``blocks_held``)."""
        req, key, weight, share = self._entries
        n = max(concurrency, 1)
        per_block = np.minimum((1.0 - (1.0 - share) ** n) / (n * share), 1.0)
        amortized = np.bincount(req, weights=weight * per_block[key], minlength=len(self.groups))
        own = np.maximum(held_blocks - self.shared_blocks, 0)
        result: np.ndarray = own + amortized
        return result

    @cached_property
    def _entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(request index, layer index, blocks) per carried layer, and each layer's share of requests.

        A trace id's server blocks are counted once, whatever the two block sizes: a request carries
        the first ``w`` of them (fewer than the id's all when its prompt ends on that trace block and
        its last token is computed), so an id's groups ``(id, w₁) … (id, wₖ)``, ``w₁ < … < wₖ``, are cut
        into layers ``[0, w₁), [w₁, w₂), …`` and a request with ``w`` carries the layers below ``w``.
        Each layer is held with its own odds: ``(id, 31)`` beside ``(id, 32)`` is 31 blocks every such
        request holds and one only the longer ones do — 32 blocks at most, not 63."""
        widths: dict[int, set[int]] = {}
        for groups in self.groups:
            for chain_id, w in groups:
                widths.setdefault(chain_id, set()).add(w)
        layers: dict[tuple[int, int], int] = {}  # (id, layer's top) → layer index
        weights: list[int] = []
        for chain_id, tops in widths.items():
            below = 0
            for top in sorted(tops):
                layers[(chain_id, top)] = len(weights)
                weights.append(top - below)
                below = top
        req: list[int] = []
        key: list[int] = []
        for i, groups in enumerate(self.groups):
            for chain_id, w in groups:
                last = layers[(chain_id, w)]
                first = last - sum(1 for top in widths[chain_id] if top < w)
                for layer in range(first, last + 1):
                    req.append(i)
                    key.append(layer)
        keys = np.asarray(key, dtype=np.int64)
        share = np.bincount(keys, minlength=len(weights)) / max(len(self.groups), 1)
        return np.asarray(req, dtype=np.int64), keys, np.asarray(weights, dtype=np.float64)[keys], share


@dataclass(frozen=True, slots=True)
class OnsetPrediction:
    """Predicted first concurrency with preemption, for a mean, median and P90 request, for one prompt
    shape (``production``: the trace's shared prefixes held once; ``worst-case``: nothing shared)."""

    num_gpu_blocks: int
    block_size: int
    kv_cache_tokens: int
    onset_mean: int
    onset_p50: int
    onset_p90: int
    shape: PromptShape = "worst-case"
    onset_spread: int | None = None  # decode phases spread evenly (module docstring); None: no prompts
    grows: bool = True  # a full pool's prompts can outgrow it; False: a full pool only queues (no onset)
    largest_fit: int = 0  # the most requests that fit at their peak whatever the draw (``capped_at``)

    @property
    def band(self) -> tuple[int, int]:
        """(earliest, latest) plausible onset: a P90-length mix preempts first; a P50 mix, or the
        requests' decode phases spread evenly (``onset_spread``), last."""
        latest = max(self.onset_p50, self.onset_mean, self.onset_spread or 0)
        return (min(self.onset_p90, self.onset_mean), latest)

    def capped_at(self, max_num_seqs: int | None) -> int | None:
        """The server's ``max_num_seqs`` when it keeps every concurrency below the band and that many of
        the trace's largest requests fit the pool together at their peak (``largest_fit``), ``None``
        otherwise: vLLM runs at most that many at once and queues the rest, so no level preempts. The
        band alone is not enough: a mix of 95 % short requests and 5 % of 6,500–8,000 tokens (band
        17–38 on 823 blocks of 16) preempted on the simulator capped at 14, at 3.2 per 100 requests,
        whenever two long ones ran together."""
        if not self.grows or max_num_seqs is None or max_num_seqs >= self.band[0]:
            return None
        return max_num_seqs if max_num_seqs <= self.largest_fit else None


def predict_preemption_onset(
    num_gpu_blocks: int,
    block_size: int,
    total_tokens: Sequence[int] | np.ndarray,
    shared: SharedPrefixes | None = None,
    prompt_tokens: Sequence[int] | np.ndarray | None = None,
) -> OnsetPrediction:
    """Predict the preemption onset concurrency for requests of the given total (prompt + output)
    lengths, each holding ``blocks_held`` blocks — less the prefix blocks it shares with the others
    when ``shared`` (one entry per length) is given (the ``production`` shape, module docstring).
    With ``prompt_tokens`` (one per length) the onset with decode phases spread evenly is added
    (``onset_spread``: each request's mean blocks over its decode, ``blocks_over_decode``), and whether
    the prompts a full pool admits can outgrow it (``grows``; module docstring, "Requests that never
    outgrow a full pool")."""
    arr = np.asarray(total_tokens, dtype=np.int64)
    if arr.size == 0:
        raise ValueError("cannot predict an onset without request lengths")
    blocks = blocks_held_array(arr, block_size)
    usable = usable_blocks(num_gpu_blocks)
    if shared is not None and len(shared.groups) != arr.size:
        raise ValueError("shared prefixes must have one entry per request length")
    sharing = shared if shared is not None and shared.any else None
    onsets = tuple(_onset(blocks, sharing, usable, s) for s in ("mean", "p50", "p90"))
    spread: int | None = None
    grows = True
    if prompt_tokens is not None:
        prompts = np.asarray(prompt_tokens, dtype=np.int64)
        if prompts.shape != arr.shape:
            raise ValueError("prompt lengths must have one entry per request length")
        prompt_blocks = np.minimum(-(-np.maximum(prompts, 0) // block_size), blocks)
        growth = int((blocks - prompt_blocks).max())
        grows = growth > 0 and any(
            _outgrown(prompt_blocks, growth, sharing, usable, s) for s in ("mean", "p50", "p90")
        )
        # a request holds no more on average than at its peak: the max only guards float rounding
        spread = max(_onset(blocks_over_decode(prompts, arr, block_size), sharing, usable, "mean"), onsets[0])
    return OnsetPrediction(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        kv_cache_tokens=num_gpu_blocks * block_size,
        onset_mean=onsets[0],
        onset_p50=onsets[1],
        onset_p90=onsets[2],
        shape="worst-case" if shared is None else "production",
        onset_spread=spread,
        grows=grows,
        largest_fit=_largest_fit(blocks, sharing, usable),
    )


def blocks_over_decode(prompt_tokens: np.ndarray, total_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Each request's mean blocks over its decode: after its ``k``-th output token it holds the KV of
    ``P + k − 1`` tokens, so the mean of ``ceil(t / bs)`` for ``t`` in ``[P, P + O − 1]`` (module
    docstring; a request without output holds its ``blocks_held`` throughout). Closed form: with
    ``S(n) = Σ_{t=1..n} ceil(t / bs) = bs·q(q+1)/2 + r(q+1)``, ``q, r = divmod(n, bs)``, the mean is
    ``(S(b) − S(a − 1)) / (b − a + 1)``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    last = np.where(total_tokens > 0, np.maximum(total_tokens - 1, 1), 0)  # peak KV tokens
    first = np.clip(prompt_tokens, 1, np.maximum(last, 1))

    def ceil_sum(n: np.ndarray) -> np.ndarray:
        q, r = np.divmod(np.maximum(n, 0), block_size)
        result: np.ndarray = block_size * q * (q + 1) // 2 + r * (q + 1)
        return result

    count = np.maximum(last - first + 1, 1)
    mean: np.ndarray = (ceil_sum(last) - ceil_sum(first - 1)) / count
    return np.where(last > 0, mean, 0.0)


def _stat(values: np.ndarray, which: str) -> float:
    if which == "mean":
        return float(values.mean())
    return float(np.percentile(values, 50 if which == "p50" else 90, method="inverted_cdf"))


def _onset(blocks: np.ndarray, shared: SharedPrefixes | None, usable: int, which: str) -> int:
    """The onset for a ``which`` request of these per-request ``blocks`` (peak, or mean over decode)."""
    distinct = int(usable // max(float(_stat(blocks, which)), 1.0)) + 1
    if shared is None:
        return distinct
    # sharing never makes an onset earlier; the max only guards float rounding at equality
    return max(_shared_onset(blocks, shared, usable, which), distinct)


def _outgrown(
    prompt_blocks: np.ndarray, growth: int, shared: SharedPrefixes | None, usable: int, which: str
) -> bool:
    """Whether the ``which`` prompts a full pool admits — as many as fit, one fewer than where prompts alone
    overflow — each grown by ``growth`` blocks, need more than the usable blocks (module docstring)."""
    admitted = _onset(prompt_blocks, shared, usable, which) - 1
    if admitted <= 0:
        return False
    held = prompt_blocks if shared is None else shared.effective_blocks(prompt_blocks, admitted)
    return admitted * (max(_stat(held, which), 1.0) + growth) > usable


def _largest_fit(blocks: np.ndarray, shared: SharedPrefixes | None, usable: int) -> int:
    """The largest ``n`` whose ``n`` largest requests (by blocks at their peak) fit the usable blocks
    together, so that any ``n`` of the trace do; past the trace's count each length counts as often as
    ``n`` needs (one length stands for all requests of that length). With ``shared`` a request's blocks
    are its effective blocks at ``n`` (its share of the groups ``n`` requests drawn at random hold: an
    expectation, not a worst case). A bisection finds ``n``."""

    alone = np.sort(blocks)[::-1]  # without sharing, the same order at every n

    def fits(n: int) -> bool:
        descending = alone if shared is None else np.sort(shared.effective_blocks(blocks, n))[::-1]
        return float(np.repeat(descending, -(-n // descending.size))[:n].sum()) <= usable

    lo, hi = 0, usable  # fits(0); every request owns a block
    while lo < hi:
        n = (lo + hi + 1) // 2
        if fits(n):
            lo = n
        else:
            hi = n - 1
    return lo


def _shared_onset(blocks: np.ndarray, shared: SharedPrefixes, usable: int, which: str) -> int:
    """The smallest ``n`` whose ``n × stat(effective blocks at n)`` exceeds the usable blocks (that
    product rises with ``n``, so a bisection finds it; every request owns a block: ``n`` ≤ usable + 1)."""
    lo, hi = 1, usable + 1
    while lo < hi:
        n = (lo + hi) // 2
        if n * max(_stat(shared.effective_blocks(blocks, n), which), 1.0) > usable:
            hi = n
        else:
            lo = n + 1
    return lo
