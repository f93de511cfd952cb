"""Odds asked for the production shape of requests that share no full block are the worst case's loop,
named as asked: a replay sending a trace's ``hash_ids`` (``config.json`` ``prefix.mode`` shared) looks its
odds up by that shape, whatever the requests it replays share (a ``--tail-percentile`` cut may keep
none of the trace's shared blocks)."""

from __future__ import annotations

from pathlib import Path

from oomload.capacity.odds import Pool, TraceOdds
from oomload.run.oddsfeed import OddsFeed
from oomload.trace.model import PrefixInfo, TraceRecord

POOL = Pool(81, 16, 1024)


def _records() -> list[TraceRecord]:
    """300-token prompts under one 512-token id each: no full block to share."""
    return [TraceRecord(f"r{i}", 0.0, 300, 400, hash_ids=(1,)) for i in range(10)]


def test_the_odds_carry_the_shape_asked() -> None:
    odds = TraceOdds.of_records(_records(), PrefixInfo(block_tokens=512), POOL)
    assert odds.shared is None and odds.shape == "worst-case"
    production, worst = odds.at(6, shape="production"), odds.at(6, shape="worst-case")
    assert (production.shape, worst.shape) == ("production", "worst-case")
    assert (production.preemptions, production.episodes) == (worst.preemptions, worst.episodes)


def test_a_production_run_finds_the_odds_of_its_levels(tmp_path: Path) -> None:
    """44 blocks a request at its peak: 81 blocks hold one, so 3 preempt at every round and ask for
    evidence."""
    feed = OddsFeed(_records(), POOL, [2, 3], trace_path=tmp_path / "unused.jsonl", seed=0,
                    record=lambda _o: None, shape="production")  # fmt: skip
    feed.stop()
    assert feed.requests_for(3) is not None
