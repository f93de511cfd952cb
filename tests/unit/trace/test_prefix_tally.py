"""``trace stats``' prefix reuse in bounded memory (``oomload.trace.tally``): today's figures exactly up to
the bound, past it an approximation whose stated error holds.

The oracle (``_Unbounded``) is the tally as it was before it was bounded: every block id in a set, every
node of the chain tree, every conversation in a counter, with no limit. A small ``exact_blocks`` makes a
small trace go past the bound.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from oomload.ingest import PoolSize, build_trace, count_trace
from oomload.report.tracestats import prefix_lines
from oomload.trace.model import PrefixInfo, read_trace
from oomload.trace.prefix import CacheModel, PrefixTree
from oomload.trace.tally import PrefixStats, PrefixTally, _Bloom
from sharedtraces import FIXTURES, SHARED, shared_traces_missing

INFO = PrefixInfo(block_tokens=16, source="token-ids")
Request = tuple[tuple[int, ...], int, int, str | None]


class _Unbounded:
    """The unbounded tally (the figures ``trace stats`` gave before its memory was bounded)."""

    def __init__(self, info: PrefixInfo, pool_blocks: int | None = None, server: int | None = None) -> None:
        self.seen = CacheModel(info, None, server)
        self.pool = None if pool_blocks is None else CacheModel(info, pool_blocks, server)
        self.tree = PrefixTree(info.block_tokens)
        self.prompt = self.seen_hits = self.pool_hits = 0
        self.sessions: Counter[str] = Counter()
        self.ends: dict[int, int] = {}
        self.turns: Counter[int] = Counter()

    def add(self, ids: Sequence[int], prompt: int, output: int, session: str | None) -> None:
        self.prompt += prompt
        self.seen_hits += self.seen.admit(ids, prompt, output)
        if self.pool is not None:
            self.pool_hits += self.pool.admit(ids, prompt, output)
        self.tree.add(ids, prompt)
        if session is not None:
            self.sessions[session] += 1
        elif not self.sessions:
            full = self.tree.full(ids, prompt)
            if full:
                conversation = len(self.turns)
                for block_id in reversed(full[:-1]):  # the same chain again is a repeat
                    if block_id in self.ends:
                        conversation = self.ends.pop(block_id)  # continued once
                        break
                self.turns[conversation] += 1
                self.ends[full[-1]] = conversation

    def conversations(self) -> Counter[int]:
        """Requests → conversations (a lone inferred request is no conversation)."""
        if self.sessions:
            return Counter(self.sessions.values())
        return Counter(v for v in self.turns.values() if v > 1)


def _chained(seed: int, requests: int, *, sessions: bool = False) -> list[Request]:
    """Requests of chat-like conversations: one of 4 system prompts, then each turn the conversation so
    far plus new blocks; now and then an unrelated prompt. Ids are chained: a new block gets a new id."""
    rng = random.Random(seed)
    fresh = iter(range(1, 1 << 40))
    systems = [tuple(next(fresh) for _ in range(rng.randint(1, 12))) for _ in range(4)]
    open_chats: list[tuple[str, tuple[int, ...]]] = []
    out: list[Request] = []
    for n in range(requests):
        roll = rng.random()
        if open_chats and roll < 0.6:
            k = rng.randrange(len(open_chats))
            name, chain = open_chats[k]
            chain = chain + tuple(next(fresh) for _ in range(rng.randint(1, 20)))
            open_chats[k] = (name, chain)
        elif roll < 0.9:
            chain = rng.choice(systems) + tuple(next(fresh) for _ in range(rng.randint(0, 30)))
            name = f"s{n}"
            open_chats.append((name, chain))
            if len(open_chats) > 40:
                open_chats.pop(0)
        else:
            chain, name = tuple(next(fresh) for _ in range(rng.randint(0, 8))), f"s{n}"
        prompt = 16 * len(chain) + rng.choice([0, 1, 7, 15])
        out.append((chain, prompt, rng.randint(1, 300), name if sessions else None))
    return out


def _tally(requests: list[Request], exact_blocks: int, **kw: int | None) -> PrefixStats:
    tally = PrefixTally(INFO, exact_blocks=exact_blocks, exact_conversations=exact_blocks, **kw)  # type: ignore[arg-type]
    for ids, prompt, output, session in requests:
        tally.add(ids, prompt, output, session)
        assert len(tally.tree.depth) <= exact_blocks
        assert len(tally.chains.keys) <= exact_blocks and len(tally.sessions.keys) <= exact_blocks
    return tally.result()


def _oracle(requests: list[Request], **kw: int | None) -> _Unbounded:
    oracle = _Unbounded(INFO, kw.get("pool_blocks"), kw.get("server_block_tokens"))
    for request in requests:
        oracle.add(*request)
    return oracle


@pytest.mark.parametrize("sessions", [False, True])
@pytest.mark.parametrize(
    "kw",
    [{}, {"pool_blocks": 200}, {"server_block_tokens": 64}, {"pool_blocks": 50, "server_block_tokens": 32}],
)
def test_under_the_bound_every_figure_is_the_unbounded_tallys(sessions: bool, kw: dict[str, int]) -> None:
    requests = _chained(1, 600, sessions=sessions)
    got = _tally(requests, 1_000_000, **kw)
    want = _oracle(requests, **kw)
    assert got.sample_step_blocks == 1 and not got.approximate
    assert (got.seen_hit_tokens, got.seen_hit_tokens_error) == (want.seen_hits, 0)
    assert got.pool_hit_tokens == (want.pool_hits if "pool_blocks" in kw else None)
    assert got.shared == tuple(want.tree.top(5)) and got.shared_tokens_error == 0
    counts = want.conversations()
    assert got.turns.histogram == dict(sorted(counts.items())) and got.turns.inferred is not sessions
    assert got.conversations_error == 0 and got.turns.conversations == sum(counts.values()) > 10


@pytest.fixture
def small_filter_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks go into the seen filter every 200 (not every 262,144): its answers are then "maybe"."""
    monkeypatch.setattr("oomload.trace.tally.PENDING_BLOCKS", 200)


@pytest.mark.usefixtures("small_filter_fill")
@pytest.mark.parametrize("sessions", [False, True])
@pytest.mark.parametrize("limit", [3000, 800, 30])
def test_past_the_bound_the_stated_error_holds(sessions: bool, limit: int) -> None:
    requests = _chained(2, 1500, sessions=sessions)
    want = _oracle(requests, pool_blocks=300)
    got = _tally(requests, limit, pool_blocks=300)
    assert got.approximate and got.sample_step_blocks > 1
    # seen earlier: within the stated error of the exact figure, and the error is not vacuous
    assert abs(got.seen_hit_tokens - want.seen_hits) <= got.seen_hit_tokens_error
    assert 0 < got.seen_hit_tokens_error < want.prompt // 2
    assert (
        got.as_dict()["approximation"]["seen_hit_fraction_error"] == got.seen_hit_tokens_error / want.prompt
    )
    assert got.pool_hit_tokens == want.pool_hits  # the pool is bounded by its own size: always exact
    # shared prefixes: each a real node with its exact uses, up to the stated error shorter than it is
    for shared in got.shared:
        assert want.tree.uses[shared.block_id] == shared.uses
        assert shared.tokens == want.tree.depth[shared.block_id] * 16
        longest = max(
            (
                d
                for b, d in want.tree.depth.items()
                if want.tree.uses[b] == shared.uses and _under(want, b, shared)
            ),
        )
        assert shared.tokens <= longest * 16 <= shared.tokens + got.shared_tokens_error
    # conversations: off by at most the stated error (with sessions: only ever too many)
    exact = sum(want.conversations().values())
    assert abs(got.turns.conversations - exact) <= got.conversations_error
    assert got.turns.conversations >= exact or not sessions
    if limit == 30:  # fewer keys than the 40 conversations open at once: some are given up and return
        assert got.conversations_error > 0 and got.turns.conversations != exact


def _under(oracle: _Unbounded, block_id: int, shared: object) -> bool:
    """Whether ``block_id`` is ``shared``'s node or below it in the chain tree."""
    node: int | None = block_id
    while node is not None:
        if node == shared.block_id:  # type: ignore[attr-defined]
            return True
        node = oracle.tree.parent[node]
    return False


def test_the_bloom_filter_never_forgets() -> None:
    bloom = _Bloom(1 << 12)
    keys = [random.Random(k).getrandbits(60) for k in range(300)] + [-5, hash("session-a")]
    assert not any(bloom.maybe(k) for k in keys)
    for k in keys:
        bloom.add(k)
    assert all(bloom.maybe(k) for k in keys)
    assert sum(bloom.maybe(k) for k in range(10_000, 11_000)) < 200


@pytest.mark.usefixtures("small_filter_fill")
def test_the_terminal_states_the_approximation() -> None:
    requests = _chained(3, 800)
    doc = _tally(requests, 200).as_dict()
    text = "\n".join(prefix_lines(doc, 800))
    approx = doc["approximation"]
    assert isinstance(approx, dict) and approx["approximate"]
    assert (
        f"± {approx['seen_hit_fraction_error']:.1%}" in text
        and "approximate: more than 200 distinct blocks" in text
    )
    exact_text = "\n".join(prefix_lines(_tally(requests, 100_000).as_dict(), 800))
    assert "±" not in exact_text and "approximate" not in exact_text


def _figures(counts_prefix: PrefixStats | None) -> dict[str, object]:
    assert counts_prefix is not None
    doc = counts_prefix.as_dict()
    doc.pop("source"), doc.pop("description"), doc.pop("exact"), doc.pop("truncated_requests")
    return doc


def _through_build(log: Path, tmp_path: Path, exact_blocks: int, **pool: int) -> list[dict[str, object]]:
    """The prefix figures of ``trace stats`` on the log and on the trace built from it."""
    trace = tmp_path / "t.jsonl"
    build_trace([log], trace)
    size = PoolSize(exact_blocks=exact_blocks, exact_conversations=exact_blocks, **pool)
    return [_figures(count_trace([p], kv_pool=size).prefix) for p in (log, trace)]


@pytest.mark.parametrize(
    "name",
    [
        "mooncake_conversation_first10min.jsonl",
        "vllm-request-log-shared.txt",
        "sample-chat.jsonl",
        "sample-fixed.jsonl",
    ],
)
def test_real_logs_give_todays_figures_through_build_and_stats(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = FIXTURES / name if not name.startswith("sample") else FIXTURES.parents[1] / "traces" / name
    if name.startswith("mooncake"):
        missing = shared_traces_missing(SHARED)
        if missing:
            pytest.skip(missing)
        log = SHARED / "traces" / name
    monkeypatch.setenv("OOMLOAD_PREFIX_SALT", "tally-test")
    for pool in ({}, {"blocks": 3000, "block_tokens": 1024}):
        on_log, on_trace = _through_build(log, tmp_path, 10_000_000, **pool)
        assert on_log == on_trace
        records = read_trace(tmp_path / "t.jsonl")
        info = PrefixInfo(on_log["trace_block_tokens"], "token-ids")  # type: ignore[arg-type]
        server = pool.get("block_tokens")
        oracle = _Unbounded(
            info, pool.get("blocks"), server if server and server % info.block_tokens == 0 else None
        )
        for r in records:
            oracle.add(r.hash_ids, r.prompt_tokens, r.output_tokens, r.session)
        assert on_log["seen_hit_tokens"] == oracle.seen_hits and on_log["pool_hit_tokens"] == (
            oracle.pool_hits if pool else None
        )
        top = [
            {"block_id": p.block_id, "tokens": p.tokens, "uses": p.uses, "tokens_error": 0}
            for p in oracle.tree.top(5)
        ]
        assert on_log["largest_shared_prefixes"] == top
        conversations = on_log["conversations"]
        assert isinstance(conversations, dict)
        assert conversations["turns_histogram"] == {
            str(k): v for k, v in sorted(oracle.conversations().items())
        }


def test_the_mooncake_trace_gives_the_figures_trace_stats_printed_before_the_bound() -> None:
    """``trace stats --json --kv-blocks 3000 --block-size 1024`` on the real Mooncake trace, as printed
    by the unbounded tally (main at 04bf83a)."""
    missing = shared_traces_missing(SHARED)
    if missing:
        pytest.skip(missing)
    log = SHARED / "traces" / "mooncake_conversation_first10min.jsonl"
    prefix = count_trace([log], kv_pool=PoolSize(blocks=3000, block_tokens=1024)).prefix
    assert prefix is not None and not prefix.approximate
    assert (prefix.seen_hit_tokens, prefix.pool_hit_tokens, prefix.prompt_tokens) == (
        6303744,
        2380800,
        24486514,
    )
    assert [(p.block_id, p.tokens, p.uses) for p in prefix.shared] == [
        (0, 512, 1750),
        (9525, 74240, 6),
        (2930, 120320, 3),
        (22220, 112640, 3),
        (9777, 24576, 13),
    ]
    # turns: each continued once, by full blocks, a chain equal to an earlier one a repeat (as the
    # replay sends them); before that rule every request behind the shared system prompt was one
    # conversation of 1,728 turns
    assert prefix.turns.histogram == {2: 308, 3: 49, 4: 11, 5: 3, 7: 1}


def test_trace_stats_counts_the_conversations_the_replay_sends(tmp_path: Path) -> None:
    """The real Mooncake trace: the turns ``trace stats`` finds from the chains are the units the
    replay sends from one user each (``conversation_units``), conversation for conversation."""
    from oomload.load.payload import conversation_units
    from oomload.trace.model import read_trace_header

    missing = shared_traces_missing(SHARED)
    if missing:
        pytest.skip(missing)
    log = SHARED / "traces" / "mooncake_conversation_first10min.jsonl"
    prefix = count_trace([log]).prefix
    assert prefix is not None
    out = tmp_path / "t.jsonl"
    build_trace([log], out)
    records = read_trace(out)
    block = read_trace_header(out).prefix_or_default().block_tokens
    units = Counter(len(u) for u in conversation_units(records, block) if len(u) > 1)
    assert dict(sorted(units.items())) == prefix.turns.histogram


def test_a_log_past_the_bound_gives_the_same_approximation_through_build_and_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = shared_traces_missing(SHARED)
    if missing:
        pytest.skip(missing)
    monkeypatch.setenv("OOMLOAD_PREFIX_SALT", "tally-test")
    log = SHARED / "traces" / "mooncake_conversation_first10min.jsonl"
    on_log, on_trace = _through_build(log, tmp_path, 2000, blocks=1000)
    assert on_log == on_trace
    exact = count_trace([log]).prefix
    assert exact is not None
    approx = on_log["approximation"]
    assert isinstance(approx, dict) and approx["approximate"] and approx["sample_step_blocks"] > 1
    assert abs(on_log["seen_hit_tokens"] - exact.seen_hit_tokens) <= approx["seen_hit_tokens_error"]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("shared_blocks", "run_low", "run_high"), [(4, 4, 4), (6, 4, 6), (7, 4, 7), (8, 8, 8), (0, 0, 0)]
)
def test_a_sampled_run_lies_between_the_blocks_held_and_the_first_never_seen(
    shared_blocks: int, run_low: int, run_high: int
) -> None:
    """16 blocks in a tree of 6 keep depths 4, 8, 12, 16 (and every block in the Bloom filter): a prompt
    sharing n of them shares at least the deepest kept depth among them and at most n (its next block
    was never seen); the figure is the middle, the error half the width, attained when the run is n."""
    tally = PrefixTally(INFO, exact_blocks=6)
    tally.add(tuple(range(1, 17)), 16 * 16 + 1, 1)
    assert tally.tree.step == 4 and sorted(tally.tree.depth.values()) == [4, 8, 12, 16]
    ids = tuple(range(1, shared_blocks + 1)) + tuple(range(100, 100 + 16 - shared_blocks))
    assert tally.tree.run_bounds(ids) == (run_low, run_high)
    tally.add(ids, 16 * 16 + 1, 1)
    got = tally.result()
    assert got.seen_hit_tokens == (run_low + run_high) * 16 // 2
    assert got.seen_hit_tokens_error == (run_high - run_low) * 8
    assert abs(got.seen_hit_tokens - shared_blocks * 16) == got.seen_hit_tokens_error


def test_the_seen_filter_answers_one_key_as_it_was_filled_a_batch_at_a_time() -> None:
    import numpy as np

    from oomload.trace.tally import _SeenBloom

    bloom = _SeenBloom(1 << 16)
    keys = [random.Random(k).getrandbits(53) for k in range(500)] + [0, (1 << 64) - 1]
    bloom.add(np.array(keys, dtype=np.uint64))
    assert all(bloom.maybe(k) for k in keys)
    assert sum(bloom.maybe(k) for k in range(1, 2001)) < 40
    bloom.pending.add(7)
    assert bloom.maybe(7)


@pytest.mark.usefixtures("small_filter_fill")
def test_past_the_bound_a_gateway_log_gives_one_figure_however_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process or byte ranges read by two workers, the log or the trace built from it: the same
    approximate figures (the filter is filled by request count, not by batch), within the stated error."""
    import importlib
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: bench/
    logshapes = importlib.import_module("bench.logshapes")
    monkeypatch.setenv("OOMLOAD_PREFIX_SALT", "tally-test")
    log = tmp_path / "gateway.jsonl"
    log.write_text("\n".join(logshapes.lines("gateway", 3000, seed=4)) + "\n", encoding="utf-8")
    size = PoolSize(exact_blocks=3000, exact_conversations=300, blocks=500)
    one = _figures(count_trace([log], workers=1, kv_pool=size).prefix)
    ranges = _figures(
        count_trace([log], workers=2, parallel_min_bytes=0, span_bytes=50_000, kv_pool=size).prefix
    )
    build_trace([log], tmp_path / "t.jsonl")
    trace = _figures(count_trace([tmp_path / "t.jsonl"], kv_pool=size).prefix)
    assert one == ranges == trace
    exact = count_trace([log], kv_pool=PoolSize(blocks=500)).prefix
    assert exact is not None and not exact.approximate
    approx = one["approximation"]
    assert isinstance(approx, dict) and approx["approximate"] and approx["sample_step_blocks"] > 1
    assert abs(one["seen_hit_tokens"] - exact.seen_hit_tokens) <= approx["seen_hit_tokens_error"]  # type: ignore[operator]
    assert one["pool_hit_tokens"] == exact.pool_hit_tokens
