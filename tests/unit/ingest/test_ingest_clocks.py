"""Several inputs on one timeline: shared clocks stay, mixed or disjoint clocks are rebased per input."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.ingest import ClockRange, align_clocks, build_trace, iter_records, load_columns
from oomload.ingest.clocks import REBASED, SHARED
from oomload.trace.model import read_trace, read_trace_header

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MOONCAKE = '{"timestamp": %d, "input_length": %d, "output_length": 1}\n'
OPENAI = '{"timestamp": %s, "usage": {"prompt_tokens": %d, "completion_tokens": 2}}\n'
EPOCH_2023_S = 1_700_000_000.0


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def azure(path: Path, rows: list[tuple[str, int]]) -> Path:
    return write(path, AZURE_HEAD + "".join(f"2023-11-16 {clock},{prompt},5\n" for clock, prompt in rows))


# --- the rule (pure) ---------------------------------------------------------------------------------


def test_overlapping_wall_clock_ranges_share_one_clock() -> None:
    alignment = align_clocks(
        [ClockRange(EPOCH_2023_S, EPOCH_2023_S + 600), ClockRange(EPOCH_2023_S + 300, EPOCH_2023_S + 900)]
    )
    assert alignment.shared and alignment.offsets_s == (0.0, 0.0) and alignment.description == SHARED


def test_wall_clock_next_to_since_start_is_rebased() -> None:
    alignment = align_clocks([ClockRange(EPOCH_2023_S, EPOCH_2023_S + 3400), ClockRange(0.0, 597.0)])
    assert not alignment.shared and alignment.description == REBASED
    assert alignment.offsets_s == (-EPOCH_2023_S, 0.0)
    assert alignment.reason is not None and "wall-clock and relative" in alignment.reason


def test_ranges_further_apart_than_the_gap_are_rebased_and_adjacent_ones_are_not() -> None:
    day_s = 86_400.0
    first, next_day = (
        ClockRange(EPOCH_2023_S, EPOCH_2023_S + 100),
        ClockRange(EPOCH_2023_S + day_s, EPOCH_2023_S + day_s + 50),
    )
    apart = align_clocks([next_day, first])
    assert not apart.shared and apart.offsets_s == (-next_day.start_s, -first.start_s)
    assert apart.reason == f"inputs do not overlap in time ({day_s - 100:,.0f} s apart)"
    follows = ClockRange(EPOCH_2023_S + 100 + 3599, EPOCH_2023_S + 5000)
    assert align_clocks([first, follows]).shared


@given(st.lists(st.tuples(st.floats(0, 2e9), st.floats(0, 1e5)), min_size=1, max_size=6))
def test_aligned_inputs_start_at_zero_or_keep_their_clock(spans: list[tuple[float, float]]) -> None:
    ranges = [ClockRange(start, start + length) for start, length in spans]
    alignment = align_clocks(ranges)
    assert len(alignment.offsets_s) == len(ranges)
    if alignment.shared:
        assert set(alignment.offsets_s) == {0.0}
        assert len({r.absolute for r in ranges}) == 1
    else:
        assert [r.start_s + o for r, o in zip(ranges, alignment.offsets_s, strict=True)] == [0.0] * len(
            ranges
        )
    assert align_clocks(list(reversed(ranges))).shared == alignment.shared  # order of inputs is irrelevant


# --- builds ------------------------------------------------------------------------------------------


def test_wall_clock_and_since_start_inputs_are_each_rebased(tmp_path: Path) -> None:
    a = azure(tmp_path / "a.csv", [("18:00:00.0", 1), ("18:00:10.0", 2), ("18:00:20.0", 3)])
    m = write(tmp_path / "m.jsonl", MOONCAKE % (2000, 10) + MOONCAKE % (7000, 20) + MOONCAKE % (17000, 30))
    out = tmp_path / "out.jsonl"
    result = build_trace([a, m], out)
    assert result.alignment is not None and not result.alignment.shared
    # each input starts at 0: Azure at 0, 10, 20 s; Mooncake (first request at 2 s) at 0, 5, 15 s
    assert [(r.arrival_s, r.prompt_tokens) for r in read_trace(out)] == [
        (0.0, 1),
        (0.0, 10),
        (5.0, 20),
        (10.0, 2),
        (15.0, 30),
        (20.0, 3),
    ]
    extra = read_trace_header(out).extra
    assert extra["aligned"] == REBASED and "wall-clock and relative" in extra["aligned_reason"]
    assert result.skips.total == 0  # the second pass does not count skips twice
    columns = load_columns([a, m])
    assert sorted(columns.arrival_s.tolist()) == [0.0, 0.0, 5.0, 10.0, 15.0, 20.0]
    assert [r.prompt_tokens for r in iter_records([a, m])] == [1, 10, 20, 2, 30, 3]


def test_overlapping_shards_of_one_log_keep_absolute_time(tmp_path: Path) -> None:
    first = write(tmp_path / "gw1.jsonl", OPENAI % (EPOCH_2023_S + 0, 1) + OPENAI % (EPOCH_2023_S + 30, 3))
    second = write(tmp_path / "gw2.jsonl", OPENAI % (EPOCH_2023_S + 12, 2) + OPENAI % (EPOCH_2023_S + 45, 4))
    out = tmp_path / "out.jsonl"
    result = build_trace([first, second], out)
    assert result.alignment is not None and result.alignment.shared
    assert [(r.arrival_s, r.prompt_tokens) for r in read_trace(out)] == [
        (0.0, 1),
        (12.0, 2),
        (30.0, 3),
        (45.0, 4),
    ]
    assert read_trace_header(out).extra["aligned"] == SHARED
    assert "aligned_reason" not in read_trace_header(out).extra
    assert sorted(load_columns([first, second]).arrival_s.tolist()) == [0.0, 12.0, 30.0, 45.0]


def test_wall_clock_logs_a_year_apart_are_rebased(tmp_path: Path) -> None:
    year_s = 365 * 86_400
    old = write(tmp_path / "old.jsonl", OPENAI % (EPOCH_2023_S, 1) + OPENAI % (EPOCH_2023_S + 8, 2))
    new = write(tmp_path / "new.jsonl", OPENAI % (EPOCH_2023_S + year_s + 3, 3))
    out = tmp_path / "out.jsonl"
    build_trace([old, new], out)
    assert [(r.arrival_s, r.prompt_tokens) for r in read_trace(out)] == [(0.0, 1), (0.0, 3), (8.0, 2)]
    assert "do not overlap" in read_trace_header(out).extra["aligned_reason"]


def test_real_azure_and_mooncake_traces_are_replayed_side_by_side(shared_dir: Path) -> None:
    traces = shared_dir / "traces"
    columns = load_columns(
        [traces / "azure_code_2023.csv", traces / "mooncake_conversation_first10min.jsonl"]
    )
    assert columns.alignment is not None and not columns.alignment.shared
    assert columns.arrival_s.size == 8819 + 1750
    assert columns.arrival_s.max() == pytest.approx(3435.95, abs=0.01)  # Azure's own span (57 min)


def test_an_input_without_usable_requests_does_not_disturb_the_others(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.jsonl", '{"timestamp": 0, "input_length": -1, "output_length": 1}\n')
    good = write(tmp_path / "good.jsonl", OPENAI % (EPOCH_2023_S, 1) + OPENAI % (EPOCH_2023_S + 4, 2))
    out = tmp_path / "out.jsonl"
    result = build_trace([bad, good], out)
    assert result.alignment is not None and result.alignment.shared and result.skips.total == 1
    assert [r.arrival_s for r in read_trace(out)] == [0.0, 4.0]
    assert load_columns([bad, good]).arrival_s.tolist() == [0.0, 4.0]
