"""Properties of the verdict on random step series (noisy, partial, with and without metrics)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.verdict import build_verdict
from oomload.verdict.runview import load_run
from runbuilder import StepSpec, write_run

step_specs = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=128),  # concurrency
        st.integers(min_value=0, max_value=20),  # preemptions
        st.booleans(),  # metrics scraped
        st.sampled_from(["ramp", "ramp", "refine", "warmup"]),
        st.booleans(),  # the load generator held the concurrency
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=40, deadline=None)
@given(series=step_specs, cut_last=st.booleans())
def test_onset_and_last_safe_lie_inside_the_measured_range(
    series: list[tuple[int, int, bool, str, bool]], cut_last: bool
) -> None:
    specs = [
        StepSpec(
            c,
            preemptions=p if scraped else 0,
            scrapes=3 if scraped else 0,
            phase=phase,
            requests=max(c, 4),
            in_flight=None if held else max(c // 4, 1),
        )
        for c, p, scraped, phase, held in series
    ]
    specs[-1].cut_short = cut_last
    with tempfile.TemporaryDirectory() as tmp:
        v = build_verdict(load_run(write_run(Path(tmp) / "run", specs, no_status=cut_last)))
    measured = [s for s in v.steps if not s.warmup]
    levels = {s.concurrency for s in measured}
    assert set(v.levels) == levels
    if v.preemption_onset is not None:
        onset = v.preemption_onset.concurrency
        assert onset in levels
        assert min(levels) <= onset <= max(levels)
        # nothing below the onset preempted
        assert all((s.preemptions or 0) == 0 for s in measured if s.concurrency < onset)
        assert v.preemption_onset.preemptions_in_step > 0
    if v.last_safe_concurrency is not None:
        assert v.last_safe_concurrency in levels
        # a level is called safe only on a trusted step: completed and holding its concurrency
        assert any(s.concurrency == v.last_safe_concurrency and s.trusted for s in measured)
        if v.preemption_onset is not None:
            assert v.last_safe_concurrency < v.preemption_onset.concurrency
    if cut_last:
        assert v.run.cut_short
    assert v.confidence in ("high", "medium", "low")
