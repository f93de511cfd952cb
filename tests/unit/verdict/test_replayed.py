"""``verdict.replayed``: the trace's requests a run replayed, by the selection ``config.json`` records
(``--only-fitting``, then ``--tail-percentile``), and the lengths and shared blocks taken from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oomload.load.payload import RequestOrder
from oomload.rundir.records import RunConfig
from oomload.trace.model import PrefixInfo, TraceHeader, TraceRecord, write_trace
from oomload.verdict.replayed import kv_lengths, replayed_records, shared_prefixes
from oomload.verdict.runview import RunView, load_run
from runbuilder import StepSpec, write_run

SHARED = {"mode": "shared", "block_tokens": 512, "why_distinct": None}


def _fitting(n: int = 30) -> list[TraceRecord]:
    return [TraceRecord(f"f{i}", float(i), 3000, 1000, hash_ids=(1, 2, 3, 4, 5, 100 + i)) for i in range(n)]


def _too_long(n: int = 10) -> list[TraceRecord]:
    """Longer than max_model_len 16384."""
    return [TraceRecord(f"x{i}", float(i), 20000, 500, hash_ids=(9000 + i,)) for i in range(n)]


def _short(n: int = 20) -> list[TraceRecord]:
    return [TraceRecord(f"s{i}", float(i), 600, 100, hash_ids=(1, 500 + i)) for i in range(n)]


def _view(tmp_path: Path, records: list[TraceRecord], config: dict[str, Any]) -> RunView:
    run = write_run(
        tmp_path / "run", [StepSpec(2)], config={"max_model_len": 16384, "prefix": SHARED, **config}
    )
    write_trace(
        run / "trace.jsonl", records, TraceHeader(source=("test",), prefix=PrefixInfo(block_tokens=512))
    )
    return load_run(run)


# (only_fitting, tail) → how many of each kind are replayed: 20 short (700 tokens), 30 fitting (4,000),
# 10 too long (20,500); the tail is a nearest-rank percentile of what --only-fitting kept
EXPECTED = {
    (False, None): (20, 30, 10),
    (False, 0.0): (20, 30, 10),
    (False, 40.0): (0, 30, 10),
    (False, 90.0): (0, 0, 10),
    (True, None): (20, 30, 0),
    (True, 0.0): (20, 30, 0),
    (True, 40.0): (20, 30, 0),  # its 40th percentile of 50 is the 20th length, a short one's
    (True, 90.0): (0, 30, 0),
}


def test_the_selection_is_the_one_the_replay_made() -> None:
    records = [*_short(), *_fitting(), *_too_long()]
    for (only_fitting, tail), counts in EXPECTED.items():
        settings = RunConfig(max_model_len=16384, only_fitting=only_fitting, tail_percentile=tail)
        chosen = replayed_records(records, settings)
        assert tuple(sum(r.id[0] == kind for r in chosen) for kind in "sfx") == counts, (only_fitting, tail)
        order = RequestOrder(records, tail_percentile=tail, fit_within=16384 if only_fitting else None)
        assert chosen == order.records, (only_fitting, tail)  # the load's order sends the same


def test_the_trace_lengths_and_prefixes_are_the_replayed_ones(tmp_path: Path) -> None:
    view = _view(tmp_path, [*_fitting(), *_too_long()], {"only_fitting": True})
    totals, prompts = kv_lengths(view, 16384, of_trace=True)
    assert totals == (4000,) * 30 and prompts == (3000,) * 30
    shared = shared_prefixes(view)(16)
    assert shared is not None and len(shared.groups) == 30
    # the whole trace stays the trace's own description
    assert len(view.trace_total_tokens) == 40


def test_a_run_without_a_selection_predicts_from_its_whole_trace(tmp_path: Path) -> None:
    view = _view(tmp_path, [*_fitting(), *_too_long()], {})
    totals, _prompts = kv_lengths(view, 16384, of_trace=True)
    assert totals == (4000,) * 30 + (16384,) * 10


def test_a_tail_keeps_the_longest_of_the_fitting_ones(tmp_path: Path) -> None:
    view = _view(
        tmp_path, [*_short(), *_fitting(), *_too_long()], {"only_fitting": True, "tail_percentile": 50.0}
    )
    totals, _prompts = kv_lengths(view, 16384, of_trace=True)
    # the 10 too long are left out first; P50 of the 20 short and 30 fitting ones is a fitting one
    assert totals == (4000,) * 30
