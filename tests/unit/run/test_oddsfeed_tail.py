"""The live run's odds draw from the requests the replay sends: ``--tail-percentile`` keeps the trace's
longest, so the odds, the ramp they place and the evidence they ask for are the tail's, not the whole
trace's (``trace.model.replayed``, the selection the replay's order makes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.capacity.odds import LevelOdds, Pool, TraceOdds, level_odds
from oomload.load.payload import RequestOrder
from oomload.run.oddsfeed import OddsFeed, main
from oomload.trace.model import PrefixInfo, TraceHeader, TraceRecord, write_trace

# 94 short requests (100 + 100 tokens) and 6 long ones (1500 + 1100): P95 of the totals is a long one
SHORT, LONG = (100, 100), (1500, 1100)
POOL = Pool(600, 16, 4096)


def _records() -> list[TraceRecord]:
    lengths = [SHORT] * 94 + [LONG] * 6
    return [TraceRecord(f"r{i}", float(i), p, o) for i, (p, o) in enumerate(lengths)]


def _tail() -> list[TraceRecord]:
    return RequestOrder(_records(), tail_percentile=95.0).records  # what the replay sends


def test_the_tail_is_the_long_requests() -> None:
    assert {(r.prompt_tokens, r.output_tokens) for r in _tail()} == {LONG} and len(_tail()) == 6


def test_the_feed_draws_the_odds_of_the_tail(tmp_path: Path) -> None:
    """Adjacent levels: both computed at once, in this process. Each is the long requests' odds: 600
    blocks hold 3 of them at their peak (163 blocks each), where the whole trace's mean takes 18."""
    seen: list[LevelOdds] = []
    feed = OddsFeed(_records(), POOL, [4, 5], trace_path=tmp_path / "unused.jsonl", seed=0,
                    record=seen.append, tail_percentile=95.0)  # fmt: skip
    feed.stop()
    tail = [(r.prompt_tokens, r.output_tokens) for r in _tail()]
    expected = [level_odds([p for p, _ in tail], [o for _, o in tail], POOL, c, seed=0) for c in (4, 5)]
    assert seen == expected
    whole = TraceOdds.of_records(_records(), PrefixInfo(), POOL)
    assert whole.at(4).negligible and not seen[0].negligible  # the whole trace's odds call 4 safe
    assert feed.requests_for(4) == expected[0].requests_for() is not None


def test_the_feed_places_the_ramp_where_the_tails_odds_put_the_onset(tmp_path: Path) -> None:
    """The ramp 2, 6: the tail's odds put the onset at 4 (3 long requests fit), where the whole trace's
    call both levels safe (its onset is 7); the placed ramp is measured around the tail's onset."""
    assert TraceOdds.of_records(_records(), PrefixInfo(), POOL).onset([2, 6]) is None
    feed = OddsFeed(_records(), POOL, [2, 6], trace_path=tmp_path / "unused.jsonl", seed=0,
                    record=lambda _o: None, place=True, tail_percentile=95.0)  # fmt: skip
    try:
        assert feed.onset == 4
        assert feed.levels == (2, 3, 4, 6) and feed.checks == frozenset({2})
    finally:
        feed.stop()


def test_a_tail_at_0_is_the_whole_trace(tmp_path: Path) -> None:
    seen: list[LevelOdds] = []
    feed = OddsFeed(_records(), POOL, [4, 5], trace_path=tmp_path / "unused.jsonl", seed=0,
                    record=seen.append, tail_percentile=0.0)  # fmt: skip
    feed.stop()
    whole = TraceOdds.of_records(_records(), PrefixInfo(), POOL)
    assert seen == [whole.at(4), whole.at(5)]


def test_the_child_draws_from_the_tail_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, _records(), TraceHeader())
    argv = ["--trace", str(trace), "--num-gpu-blocks", "600", "--block-size", "16", "--max-model-len", "4096"]
    assert main([*argv, "--levels", "4", "--tail-percentile", "95"]) == 0
    printed = LevelOdds.from_json(json.loads(capsys.readouterr().out))
    assert printed == TraceOdds.of_records(_tail(), PrefixInfo(), POOL).at(4)
    assert printed != TraceOdds.of_records(_records(), PrefixInfo(), POOL).at(4)


def test_the_child_applies_only_fitting_then_the_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two requests over max_model_len 4096 are left out first; the tail is then cut from the rest."""
    trace = tmp_path / "trace.jsonl"
    records = [*_records(), TraceRecord("x0", 0.0, 5000, 100), TraceRecord("x1", 0.0, 3000, 2000)]
    write_trace(trace, records, TraceHeader())
    argv = ["--trace", str(trace), "--num-gpu-blocks", "600", "--block-size", "16", "--max-model-len", "4096"]
    assert main([*argv, "--levels", "4", "--only-fitting", "--tail-percentile", "95"]) == 0
    printed = LevelOdds.from_json(json.loads(capsys.readouterr().out))
    sent = RequestOrder(records, tail_percentile=95.0, fit_within=4096).records
    assert {r.id for r in sent} == {r.id for r in _tail()}
    assert printed == TraceOdds.of_records(sent, PrefixInfo(), POOL).at(4)
