"""Which prompt shape a run measured, and the server's prefix-cache hit rate beside the trace's (pure).

A replay is either *production shape* (``config.json`` ``prefix.mode`` = ``shared``: the trace's
``hash_ids`` were sent as identical token blocks, ``oomload.load.payload``) or the *worst case*
(``distinct``: every prompt distinct from token 0). The verdict says which, and checks that the server
really did what the shape implies.

Expected rate, per step: the requests of the run in the order they were sent (start time), each one
found among the trace's requests the run replayed (``replayed.replayed_records``: ``--only-fitting``,
then ``--tail-percentile``, as ``config.json`` records them); each one's replayed ids are its
``hash_ids`` that fit whole in its prompt (``block_tokens`` each), keyed by ``(pass, id)`` as the
payload seeds them (pass = sequence number ÷ requests replayed, the sequence number being the part of
the request id after the last ``#``; one pass in sample order). Its expected hit is the tokens of its
leading ids already sent earlier in the run — an infinite-cache upper bound — rounded down to whole
server blocks and capped at ``⌊(L − 1) / B⌋ · B`` (vLLM always computes the last token):
``oomload.trace.prefix.CacheModel`` (the one model of a prefix cache), with ``hit_block_tokens`` the
server's block size. The step's rate = expected hit tokens ÷
prompt tokens of its requests. In a distinct run the expected rate is 0.

Server rate, per step: the rise of ``vllm:prefix_cache_hits_total`` ÷ the rise of
``vllm:prefix_cache_queries_total`` (tokens) from the last scrape before the step to its last scrape.

Disagreement (``PrefixCheck.problem``), judged over the steps that did not preempt (their sums; all
steps when every step preempted) — under preemption vLLM evicts cached blocks, so a thrashing level
hits less than an infinite cache would, and that is the engine's behaviour, not a wrong setup: a
production-shape run whose server reports prefix caching off (``cache_config_info``
``enable_prefix_caching`` false), or whose server rate is below half the expected rate (when that is
at least ``MEANINGFUL_RATE``), did not measure production; a run whose server hit rate is
``MEANINGFUL_RATE`` above the expected one (a distinct run served from a cache: prompts were not what
oomload sent, or a proxy caches) did not measure what it claims either. Evictions under pressure and
requests admitted in the same engine step make the server's rate fall short of the expected one a
little; half is a wide margin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oomload.outcome import RequestResult
from oomload.rundir.records import CacheConfig, MetricsRow, PrefixSetting, RunConfig
from oomload.trace.model import PrefixInfo, TraceRecord
from oomload.trace.prefix import CacheModel
from oomload.verdict.replayed import replayed_records

MEANINGFUL_RATE = 0.2  # below this expected rate, a shortfall is not judged
SHORTFALL_FACTOR = 0.5  # the server's rate below this × expected is a disagreement

SHARED_WORDS = "production shape: shared prefixes"
DISTINCT_WORDS = "worst case: distinct prompts"


@dataclass(frozen=True, slots=True)
class StepPrefixRate:
    """One step's hit rates: the server's (its counters) and the trace's expected one."""

    step: int
    concurrency: int
    server_rate: float | None  # None: no counter rise (no scrape, or an old server without them)
    server_query_tokens: int | None
    expected_rate: float | None  # None: no request was sent


@dataclass(frozen=True, slots=True)
class PrefixCheck:
    """What the run measured and whether the server's prefix cache agreed (module docstring)."""

    mode: str  # "shared" or "distinct"
    why_distinct: str | None
    block_tokens: int | None
    server_caching: bool | None  # cache_config_info enable_prefix_caching (None: not reported)
    steps: tuple[StepPrefixRate, ...]
    server_rate: float | None  # the run's sums
    expected_rate: float | None
    problem: str | None

    @property
    def words(self) -> str:
        return SHARED_WORDS if self.mode == "shared" else DISTINCT_WORDS

    @property
    def line(self) -> str:
        """One line for every report: what was measured and the two rates."""
        text = f"Prompt shape: {self.words}"
        if self.why_distinct and self.why_distinct != "--distinct-prompts":
            text += f" ({self.why_distinct})"
        rates = []
        if self.server_rate is not None:
            rates.append(f"server prefix-cache hit rate {self.server_rate:.0%}")
        if self.expected_rate is not None:
            rates.append(f"trace's expected {self.expected_rate:.0%}")
        return text + (" · " + ", ".join(rates) if rates else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "measured": self.words,
            "why_distinct": self.why_distinct,
            "block_tokens": self.block_tokens,
            "server_prefix_caching": self.server_caching,
            "server_hit_rate": _round(self.server_rate),
            "expected_hit_rate": _round(self.expected_rate),
            "problem": self.problem,
            "steps": [
                {
                    "step": s.step,
                    "concurrency": s.concurrency,
                    "server_hit_rate": _round(s.server_rate),
                    "server_query_tokens": s.server_query_tokens,
                    "expected_hit_rate": _round(s.expected_rate),
                }
                for s in self.steps
            ],
        }


@dataclass(frozen=True, slots=True)
class StepWindow:
    """The part of a step this module reads."""

    index: int
    concurrency: int
    requests: Sequence[RequestResult]
    metrics: Sequence[MetricsRow]
    baseline: MetricsRow | None
    preempted: bool = False  # the step preempted (evictions may lower its hit rate)


def prefix_check(
    settings: RunConfig,
    pool: CacheConfig | None,
    records: Sequence[TraceRecord],
    steps: Sequence[StepWindow],
) -> PrefixCheck:
    """The run's ``PrefixCheck`` from ``config.json``, ``cache_config.json``, the trace and the steps."""
    prefix = settings.prefix or PrefixSetting()
    shared = prefix.mode == "shared"
    block_tokens = prefix.block_tokens
    why = prefix.why_distinct
    if settings.prefix is None:  # a run written before the shape was recorded: distinct prompts
        why = "a run from before production-shape replays"
    caching = None if pool is None else pool.enable_prefix_caching
    block_size = None if pool is None else pool.block_size
    server_block = block_size if block_size is not None and block_size > 0 else 1
    replayed = replayed_records(records, settings)
    pass_length = len(replayed) if settings.order == "trace" else 0
    expected = (
        expected_hits(steps, replayed, block_tokens, server_block, pass_length=pass_length)
        if shared and block_tokens
        else {}
    )
    rows = []
    run = _Sums()
    clean = _Sums()  # the steps that did not preempt: the judgement's basis when there are any
    for s in steps:
        server_hits, server_queries = _counter_rise(s)
        eh, ep = expected.get(s.index, (0, sum(r.prompt_tokens_asked for r in s.requests)))
        run.add(server_hits, server_queries, eh, ep)
        if not s.preempted:
            clean.add(server_hits, server_queries, eh, ep)
        rows.append(
            StepPrefixRate(
                s.index,
                s.concurrency,
                server_hits / server_queries if server_queries else None,
                server_queries,
                eh / ep if ep else None,
            )
        )
    check = PrefixCheck(
        mode="shared" if shared else "distinct",
        why_distinct=None if shared else why,
        block_tokens=block_tokens,
        server_caching=caching,
        steps=tuple(rows),
        server_rate=run.server_rate,
        expected_rate=run.expected_rate,
        problem=None,
    )
    judged = clean if clean.server_rate is not None else run
    return _with_problem(check, judged.server_rate, judged.expected_rate)


@dataclass(slots=True)
class _Sums:
    """Token sums over some steps: the server's hits and queries, the expected hits and prompt tokens."""

    hits: int = 0
    queries: int = 0
    expected_hits: int = 0
    prompt_tokens: int = 0

    def add(self, hits: int, queries: int, expected_hits: int, prompt_tokens: int) -> None:
        self.hits += hits
        self.queries += queries
        self.expected_hits += expected_hits
        self.prompt_tokens += prompt_tokens

    @property
    def server_rate(self) -> float | None:
        return self.hits / self.queries if self.queries else None

    @property
    def expected_rate(self) -> float | None:
        return self.expected_hits / self.prompt_tokens if self.prompt_tokens else None


def _with_problem(check: PrefixCheck, server: float | None, expected: float | None) -> PrefixCheck:
    """``check`` with its ``problem`` (module docstring), judged on the given rates."""
    problem = None
    if check.mode == "shared" and check.server_caching is False:
        problem = (
            "The server runs without prefix caching (cache_config_info enable_prefix_caching False), so "
            "this production-shape replay measured the worst case: start vLLM with prefix caching on "
            "(the V1 default; drop --no-enable-prefix-caching), or replay with --distinct-prompts to "
            "measure the worst case on purpose."
        )
    elif (
        check.mode == "shared"
        and expected is not None
        and server is not None
        and expected >= MEANINGFUL_RATE
        and server < SHORTFALL_FACTOR * expected
    ):
        problem = (
            f"The server's prefix-cache hit rate was {server:.0%} where the trace's shared prefixes "
            f"should give {expected:.0%}, so this run did not measure production's prefix reuse: check "
            f"that the server has prefix caching on and that nothing between oomload and vLLM changes "
            f"the prompts (a proxy, another tokenizer, a cache_salt)."
        )
    elif expected is not None and server is not None and server > expected + MEANINGFUL_RATE:
        problem = (
            f"The server's prefix-cache hit rate was {server:.0%} where this replay's prompts should give "
            f"{expected:.0%}, so the server did not see the prompts oomload sent (another client sharing "
            f"the server, or a proxy that rewrites them): run on a server of its own."
        )
    return PrefixCheck(
        check.mode,
        check.why_distinct,
        check.block_tokens,
        check.server_caching,
        check.steps,
        check.server_rate,
        check.expected_rate,
        problem,
    )


def expected_hits(
    steps: Sequence[StepWindow],
    replayed: Sequence[TraceRecord],
    block_tokens: int,
    server_block: int,
    *,
    pass_length: int | None = None,
) -> dict[int, tuple[int, int]]:
    """Per step index: (expected hit tokens, prompt tokens) of its requests (module docstring);
    ``pass_length``: requests per pass (default: all replayed records; 0: one pass, sample order)."""
    by_id: dict[str, TraceRecord] = {}
    for r in replayed:
        by_id.setdefault(r.id, r)
    pass_requests = len(replayed) if pass_length is None else pass_length
    sent = sorted(((r, s.index) for s in steps for r in s.requests), key=lambda pair: pair[0].start_unix_s)
    cache = CacheModel(PrefixInfo(block_tokens=block_tokens), hit_block_tokens=server_block)
    out: dict[int, tuple[int, int]] = {}
    for request, step in sent:
        record_id, _sep, seq_text = request.request_id.rpartition("#")
        record = by_id.get(record_id)
        prompt = request.prompt_tokens_asked
        hit = 0
        if record is not None and seq_text.isdigit():
            trace_pass = int(seq_text) // pass_requests if pass_requests else 0
            hit = cache.admit([(trace_pass, h) for h in record.hash_ids], prompt, 0)
        h, p = out.get(step, (0, 0))
        out[step] = (h + hit, p + prompt)
    return out


def _counter_rise(step: StepWindow) -> tuple[int, int]:
    """(hit tokens, query tokens) the server counted during the step; (0, 0) when unknown."""
    ok = [m for m in step.metrics if m.ok and m.prefix_cache_queries_total is not None]
    base = step.baseline
    if not ok or base is None or base.prefix_cache_queries_total is None:
        return 0, 0
    last = ok[-1]
    queries = (last.prefix_cache_queries_total or 0) - base.prefix_cache_queries_total
    hits = (last.prefix_cache_hits_total or 0) - (base.prefix_cache_hits_total or 0)
    if queries <= 0 or hits < 0:  # no query, or a restarted server
        return 0, 0
    return hits, queries


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
