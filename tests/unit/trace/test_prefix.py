"""Chained salted block ids (``oomload.trace.blockhash``) and the reuse a prefix cache would give
(``oomload.trace.prefix``)."""

from __future__ import annotations

import pytest

from oomload.trace.blockhash import BlockHasher
from oomload.trace.model import PrefixInfo, TraceRecord
from oomload.trace.prefix import (
    conversation_turns,
    expected_hit_tokens,
    regroup,
    shared_prefixes,
)

SALT = b"test-salt"
INFO = PrefixInfo(block_tokens=4, source="token-ids")


def _record(
    n: int, ids: tuple[int, ...], prompt_tokens: int, output_tokens: int = 1, **kw: object
) -> TraceRecord:
    return TraceRecord(f"r{n}", float(n), prompt_tokens, output_tokens, hash_ids=ids, **kw)  # type: ignore[arg-type]


def test_identical_prefixes_match_only_from_token_zero() -> None:
    h = BlockHasher(SALT, 4)
    a = h.chain_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    b = h.chain_tokens([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0])
    shifted = h.chain_tokens([0, 0, 0, 0, 5, 6, 7, 8, 9, 10, 11, 12])
    assert len(a) == 3
    assert a[:2] == b[:2] and a[2] != b[2]
    # the same blocks 1 and 2 after a different block 0 share nothing: ids are chained from token 0
    assert not set(a) & set(shifted)


def test_a_partial_last_block_gets_no_id() -> None:
    h = BlockHasher(SALT, 4)
    assert len(h.chain_tokens(list(range(7)))) == 1
    assert h.chain_tokens(list(range(7))) == h.chain_tokens([*list(range(4)), 99, 98, 97])
    assert h.chain_tokens([1, 2, 3]) == ()


def test_ids_depend_on_the_salt_and_reveal_no_token() -> None:
    tokens = [7] * 16
    one, other = (
        BlockHasher(b"salt-a", 4).chain_tokens(tokens),
        BlockHasher(b"salt-b", 4).chain_tokens(tokens),
    )
    assert not set(one) & set(other)  # not matchable across builds
    assert all(0 <= i < 2**53 and i != 7 for i in one)
    assert len(set(one)) == 4  # equal blocks at different depths differ
    assert "salt" not in repr(BlockHasher(b"salt-a", 4))


def test_token_text_and_token_list_give_the_same_chain() -> None:
    h = BlockHasher(SALT, 2)
    assert h.chain_token_text("1, 22, 333,4") == h.chain_tokens([1, 22, 333, 4])
    assert h.chain_token_text("") == ()


def test_message_chains_share_the_blocks_of_a_shared_history() -> None:
    h = BlockHasher(SALT, 4)
    system = (b"system\x00you are terse", 10)
    turn0 = h.chain_messages([system, (b"user\x00hi", 6)])
    turn1 = h.chain_messages([system, (b"user\x00hi", 6), (b"assistant\x00hello", 5), (b"user\x00more", 3)])
    other_system = h.chain_messages([(b"system\x00you are verbose", 10), (b"user\x00hi", 6)])
    assert len(turn0) == 4 and len(turn1) == 6
    assert turn1[:4] == turn0  # turn k starts with turn k-1's blocks
    assert not set(other_system) & set(turn0)
    # a block ending inside a message that differs is not shared (blocks 0, 1 end in the system prompt)
    other_user = h.chain_messages([system, (b"user\x00bye", 6)])
    assert other_user[:2] == turn0[:2] and other_user[2:] != turn0[2:]


def test_infinite_cache_counts_blocks_seen_before_capped_below_the_whole_prompt() -> None:
    records = [_record(0, (1, 2, 3), 13), _record(1, (1, 2, 9), 12), _record(2, (1, 2, 3), 12)]
    reuse = expected_hit_tokens(records, INFO)
    # r1: blocks 1, 2 hit (8 tokens); r2: all 3 blocks seen, but one token must be computed: 2 blocks
    assert reuse.hit_tokens == (0, 8, 8)
    assert reuse.prompt_tokens == 37 and reuse.share == pytest.approx(16 / 37)


def test_hits_stop_at_the_first_miss() -> None:
    records = [_record(0, (1, 2, 3), 12), _record(1, (5, 2, 3), 12)]
    assert expected_hit_tokens(records, INFO).hit_tokens == (0, 0)


def test_a_small_pool_evicts_least_recently_freed_blocks_first() -> None:
    shared = (1, 2)
    records = [
        _record(0, shared, 9, output_tokens=3),  # 3 blocks: 2 prompt + 1 private
        _record(1, (7, 8), 9, output_tokens=3),  # another 3 blocks
        _record(2, shared, 9, output_tokens=3),
    ]
    assert expected_hit_tokens(records, INFO).hit_tokens == (0, 0, 8)
    assert expected_hit_tokens(records, INFO, pool_blocks=6).hit_tokens == (0, 0, 8)
    # 4 blocks: r1 takes r0's private block and then its tail block 2; block 1 stays (freed last)
    assert expected_hit_tokens(records, INFO, pool_blocks=4).hit_tokens == (0, 0, 4)
    assert expected_hit_tokens(records, INFO, pool_blocks=3).hit_tokens == (0, 0, 0)


def test_bigger_server_blocks_regroup_the_chain() -> None:
    assert regroup((1, 2, 3, 4, 5), 2) == (2, 4)
    records = [_record(0, (1, 2, 3, 4), 17), _record(1, (1, 2, 3, 9), 17)]
    reuse = expected_hit_tokens(records, INFO, server_block_tokens=8)
    assert reuse.block_tokens == 8 and reuse.hit_tokens == (0, 8)
    with pytest.raises(ValueError, match="not a multiple"):
        expected_hit_tokens(records, INFO, server_block_tokens=6)


def test_a_source_traces_partial_last_id_is_not_a_full_block() -> None:
    info = PrefixInfo(block_tokens=4, source="source-trace")
    records = [_record(0, (1, 2), 6), _record(1, (1, 2), 6)]  # id 2 covers tokens 4-5 only
    assert expected_hit_tokens(records, info).hit_tokens == (0, 4)


def test_shared_prefixes_lists_the_longest_shared_prefix_once() -> None:
    records = [_record(i, (1, 2, 3, 10 + i), 16) for i in range(4)] + [_record(9, (5, 6), 8)]
    top = shared_prefixes(records, INFO)
    assert [(p.block_id, p.tokens, p.uses) for p in top] == [(3, 12, 4)]
    assert top[0].saved_tokens == 36


def test_conversation_turns() -> None:
    records = [_record(i, (), 4, session=s) for i, s in enumerate(["a", "a", "b", "a", "c", "c"])]
    turns = conversation_turns([*records, _record(9, (), 4)])
    assert (turns.conversations, turns.requests, turns.max_turns) == (3, 6, 3)
    assert turns.histogram == {1: 1, 2: 1, 3: 1} and turns.mean_turns == 2.0


def test_conversations_are_inferred_from_chains_when_the_trace_has_no_sessions() -> None:
    from oomload.trace.tally import PrefixTally

    tally = PrefixTally(INFO)
    # a: turn 0; b: a's whole chain then more (turn 1); c: shares only a's first block (not a turn);
    # d: b's whole chain then more (turn 2); e: no chain
    for ids in [(1, 2), (1, 2, 3, 4), (1, 9), (1, 2, 3, 4, 5), ()]:
        tally.add(ids, 16 * len(ids) + 1, 1)
    turns = tally.result().turns
    assert turns.inferred and (turns.conversations, turns.requests, turns.max_turns) == (1, 3, 3)
    with_sessions = PrefixTally(INFO)
    with_sessions.add((1, 2), 33, 1, "s")
    with_sessions.add((1, 2, 3), 49, 1, "s")
    assert not with_sessions.result().turns.inferred


def test_requests_without_ids_counted_at_once_push_the_pool_as_one_at_a_time() -> None:
    from oomload.trace.tally import PrefixTally

    def tally(bulk: bool) -> tuple[int, int, int | None]:
        t = PrefixTally(INFO, pool_blocks=5)
        t.add((1, 2, 3), 13, 3)  # 4 blocks
        if bulk:
            t.add_without_ids(2, 9, 2 + 1)  # 8 + 0 tokens, then 1 + 3 tokens: 2 blocks + 1 block
        else:
            t.add((), 8, 0)
            t.add((), 1, 3)
        t.add((1, 2, 3), 13, 3)
        r = t.result()
        return r.requests, r.prompt_tokens, r.pool_hit_tokens

    assert tally(True) == tally(False) == (4, 35, 8)  # block 3 was pushed out, blocks 1-2 stay
