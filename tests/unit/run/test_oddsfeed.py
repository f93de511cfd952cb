"""The live run's odds: the bisection order of the levels computed in the background, and the child."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.capacity.odds import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    LevelOdds,
    Pool,
    level_odds,
)
from oomload.run.oddsfeed import OddsFeed, bisection_order, main
from oomload.trace.model import PrefixInfo, TraceHeader, TraceRecord, write_trace


def test_bisection_order_puts_each_gaps_midpoint_first() -> None:
    assert bisection_order([1, 2, 4, 8, 16]) == [3, 6, 12, 5, 7, 10, 14, 9, 11, 13, 15]
    assert sorted(bisection_order([1, 2, 4, 8, 16])) == [3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]
    assert bisection_order([2, 3]) == []
    assert bisection_order([5]) == []


def _lengths_trace(path: Path, lengths: list[tuple[int, int]]) -> Path:
    """A trace of requests of these (prompt, output) lengths, no shared prefix."""
    write_trace(path, [TraceRecord(f"r{i}", 0.0, p, o) for i, (p, o) in enumerate(lengths)], TraceHeader())
    return path


def test_the_child_prints_the_odds_the_parent_would_compute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lengths = [(100, 155), (300, 60), (40, 400)]
    trace = _lengths_trace(tmp_path / "trace.jsonl", lengths)
    argv = ["--trace", str(trace), "--num-gpu-blocks", "40", "--block-size", "16", "--levels", "6,3"]
    assert main([*argv, "--max-model-len", "1024", "--seed", "2"]) == 0
    lines = [LevelOdds.from_json(json.loads(x)) for x in capsys.readouterr().out.splitlines()]
    pool = Pool(40, 16, 1024)
    prompts, outputs = [p for p, _ in lengths], [o for _, o in lengths]
    assert lines == [level_odds(prompts, outputs, pool, c, seed=2) for c in (6, 3)]


def test_the_child_computes_under_the_servers_limits_and_the_defaults_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lengths = [(400, 300), (900, 60), (200, 500)]
    trace = _lengths_trace(tmp_path / "trace.jsonl", lengths)
    argv = ["--trace", str(trace), "--num-gpu-blocks", "60", "--block-size", "16", "--levels", "8"]
    prompts, outputs = [p for p, _ in lengths], [o for _, o in lengths]
    pool = Pool(60, 16)
    assert (pool.max_num_seqs, pool.max_num_batched_tokens) == (
        DEFAULT_MAX_NUM_SEQS,
        DEFAULT_MAX_NUM_BATCHED_TOKENS,
    )
    assert pool.with_limits(None, None) == pool

    assert main(argv) == 0
    default = LevelOdds.from_json(json.loads(capsys.readouterr().out))
    assert default == level_odds(prompts, outputs, pool, 8)

    assert main([*argv, "--max-num-seqs", "2", "--max-num-batched-tokens", "512"]) == 0
    served = LevelOdds.from_json(json.loads(capsys.readouterr().out))
    assert served == level_odds(prompts, outputs, pool.with_limits(2, 512), 8)
    assert served != default  # two running at a time on 60 blocks preempt less than eight


def test_the_feed_computes_the_ramp_levels_once_and_reports_each(tmp_path: Path) -> None:
    """Adjacent ramp levels leave no gap: no child process, both levels known before any load."""
    seen: list[int] = []
    records = [TraceRecord("r0", 0.0, 100, 155)]
    feed = OddsFeed(records, Pool(81, 16, 1024), [5, 6], trace_path=tmp_path / "unused.jsonl", seed=0,
                    record=lambda o: seen.append(o.concurrency))  # fmt: skip
    assert feed.requests_for(5) is None
    assert feed.requests_for(6) is not None
    assert feed.requests_for(7) is None  # not computed: not asked for
    assert seen == [5, 6]
    feed.stop()


def test_the_child_computes_the_runs_shape_then_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace sharing one 512-token prefix: the run's own shape first, the worst case after it."""
    trace = tmp_path / "trace.jsonl"
    records = [TraceRecord(f"r{i}", 0.0, 600, 100, hash_ids=(7, 100 + i)) for i in range(20)]
    write_trace(trace, records, TraceHeader(prefix=PrefixInfo(block_tokens=512)))
    argv = ["--trace", str(trace), "--num-gpu-blocks", "80", "--block-size", "32", "--max-model-len", "2048"]
    assert main([*argv, "--levels", "6", "--prompts", "production", "--other-levels", "4,6"]) == 0
    lines = [LevelOdds.from_json(json.loads(x)) for x in capsys.readouterr().out.splitlines()]
    assert [(o.shape, o.concurrency) for o in lines if o is not None] == [
        ("production", 6),
        ("worst-case", 4),
        ("worst-case", 6),
    ]
    production, worst4, worst6 = lines
    assert production is not None and production.negligible  # 16 shared + 6 × 6 own blocks ≤ 79
    assert worst4 is not None and worst6 is not None and not worst4.negligible and not worst6.negligible


def test_the_feed_answers_with_the_odds_of_the_prompts_the_run_sends(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    records = [TraceRecord(f"r{i}", 0.0, 600, 100, hash_ids=(7, 100 + i)) for i in range(20)]
    write_trace(trace, records, TraceHeader(prefix=PrefixInfo(block_tokens=512)))
    seen: list[tuple[str, int]] = []
    pool = Pool(80, 32, 2048)
    for shape in ("production", "worst-case"):
        feed = OddsFeed(records, pool, [5, 6], trace_path=trace, seed=0, shape=shape,
                        record=lambda o: seen.append((o.shape, o.concurrency)))  # fmt: skip
        needed = feed.requests_for(6)
        assert (needed is None) == (shape == "production")  # shared: 6 fit; distinct: 3 fit
        feed.stop()
    assert ("production", 6) in seen and ("worst-case", 6) in seen


def test_the_feed_places_the_ramp_where_the_odds_put_the_onset(tmp_path: Path) -> None:
    """One fixed length holding 16 of 81 blocks: 5 fit, the odds' onset is 6. Between the ramp's 4
    (safe) and 7 (not) the feed bisects 5 and 6 before any load; the ramp becomes 4 (a short check),
    5, 6 and 7, with no gap left for the child process."""
    seen: list[int] = []
    records = [TraceRecord("r0", 0.0, 100, 155)]
    feed = OddsFeed(records, Pool(81, 16, 1024), [4, 7], trace_path=tmp_path / "unused.jsonl", seed=0,
                    record=lambda o: seen.append(o.concurrency), place=True)  # fmt: skip
    assert (feed.onset, feed.levels, feed.checks) == (6, (4, 5, 6, 7), frozenset({4}))
    assert seen == [4, 7, 5, 6] and feed._child is None
    assert feed.requests_for(5) is None and feed.requests_for(6) is not None
    feed.stop()


@pytest.mark.parametrize("child_done", [False, True], ids=["stopped-mid-way", "after-its-last-line"])
def test_stop_leaves_no_pipe_to_the_child_open(tmp_path: Path, child_done: bool) -> None:
    """The reader's end of the child's pipe is closed by ``stop`` whether the child was still computing
    or had printed everything (an open one was left to the garbage collector: a ResourceWarning in
    whatever test or run happened to collect it)."""
    import gevent

    trace = tmp_path / "trace.jsonl"
    records = [TraceRecord(f"r{i}", 0.0, 100 + 50 * i, 155) for i in range(4)]
    write_trace(trace, records, TraceHeader())
    feed = OddsFeed(records, Pool(81, 16, 1024), [2, 9], trace_path=trace, seed=0, record=lambda o: None)
    child = feed._child
    assert child is not None and not child.stdout.closed  # the gap 3..8 goes to the child
    if child_done:
        child.wait(timeout=60)
        gevent.sleep(0.05)  # the reader reads to the end of the pipe
    feed.stop()
    assert child.stdout.closed and child.poll() is not None
