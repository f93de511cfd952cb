"""The observed preemption onset beside the arithmetic one from the KV pool (pure).

``capacity.predict_preemption_onset`` on the total lengths of the requests actually sent, less those the
server refused (context overflow) and clamped at ``max_model_len`` (or, when none was sent, the trace's) and
the pool from ``cache_config.json`` gives a band of plausible onsets — a P90-length mix preempts first; a
P50-length mix, or the requests' decode phases spread evenly (``onset_spread``), last. Each end of the band is
placed on the measured grid (the lowest measured level ≥ it) and the observed onset's distance from the band
is counted in grid levels. With no onset observed, the distance is the number of trusted clean levels at or
above the band's top (clean at the top puts the onset above the band); when the highest of them is still below
the band, the run never reached the prediction and there is nothing to compare (``reached`` false,
``levels_apart`` None). More than one level apart is flagged (``disagrees``): the measured knee moves 1–2
levels between repeats on real vLLM, so one level is noise, more is a finding in itself.

When the prompts a full pool admits leave room for their output (``OnsetPrediction.grows`` false: the output
ends in the last prompt block, or grows into the slack the admitted prompts leave) the arithmetic expects no
onset at all: a full pool queues. Then no onset observed on a
trusted clean level agrees (0 levels apart), and any observed onset disagrees (``levels_apart`` None: there
is no band to count from). The same holds when the server's own ``max_num_seqs`` (its serve line's, the
simulator's flags or its log: ``RunInfo.max_num_seqs``) is below the band's low end (``capped``): vLLM runs
at most that many requests at once and queues the rest, and that many of the largest requests sent fit
the pool together at their peak (``OnsetPrediction.capped_at``: P90-length ones fitting is not enough for a
heavy-tailed mix), so no concurrency reaches the band.

Prompt shape. The arithmetic is for the prompts the run sent (``shape``): with the trace's shared
prefixes (``production``, the replay's default) the trace's ``hash_ids`` say which prompt blocks the
server holds once (``capacity.SharedPrefixes``), so the lengths are the trace's (only the trace carries
the chains); with distinct prompts (``worst-case``) nothing is shared and the lengths are those sent.
The other shape's onset is computed beside it (``other``), so the report says what prefix caching buys
at this traffic; ``None`` when the trace carries no ``hash_ids`` (both shapes then agree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from oomload.capacity.blocks import OnsetPrediction, PromptShape, SharedPrefixes, predict_preemption_onset
from oomload.rundir.records import CacheConfig

DISAGREE_LEVELS = 1


@dataclass(frozen=True, slots=True)
class Prediction:
    """The arithmetic onset (``arithmetic``) beside the observed one."""

    arithmetic: OnsetPrediction
    observed_onset: int | None
    levels_apart: int | None
    basis: str  # "requests" (the lengths sent) or "trace"
    highest_clean: int | None = None  # highest trusted level measured without preemption
    other: OnsetPrediction | None = None  # the other prompt shape's arithmetic (module docstring)
    capped: int | None = None  # the server's max_num_seqs, below the band's low end (module docstring)

    @property
    def expects_onset(self) -> bool:
        """Some request outgrows a full pool, and the server runs as many at once as the band needs."""
        return self.arithmetic.grows and self.capped is None

    @property
    def no_onset_cause(self) -> str:
        """Why the arithmetic expects no onset (``expects_onset`` false)."""
        return no_onset_cause(self.capped)

    def no_onset_reason(self, band: str) -> str:
        """``no_onset_cause``, then what happens past it, with the band it replaces."""
        return no_onset_reason(self.capped, band)

    @property
    def reached(self) -> bool:
        """An onset was observed, or a clean level at or above the band's low end was measured (any clean
        level when the arithmetic expects no onset)."""
        if self.observed_onset is not None:
            return True
        low = self.band_low if self.expects_onset else 0
        return self.highest_clean is not None and self.highest_clean >= low

    @property
    def band_low(self) -> int:
        return self.arithmetic.band[0]

    @property
    def band_high(self) -> int:
        return self.arithmetic.band[1]

    @property
    def disagrees(self) -> bool:
        if not self.expects_onset:
            return self.observed_onset is not None
        return self.levels_apart is not None and self.levels_apart > DISAGREE_LEVELS

    def to_json(self) -> dict[str, Any]:
        """Flat: the ``OnsetPrediction`` fields, the band, the observation (docs/report.md)."""
        return {
            **asdict(self.arithmetic),
            "band_low": self.band_low,
            "band_high": self.band_high,
            "observed_onset": self.observed_onset,
            "levels_apart": self.levels_apart,
            "disagrees": self.disagrees,
            "basis": self.basis,
            "block_size_tokens": self.arithmetic.block_size,
            "highest_clean": self.highest_clean,
            "reached": self.reached,
            "capped": self.capped,
            "other": None if self.other is None else {**asdict(self.other), "band": list(self.other.band)},
        }


def no_onset_cause(capped: int | None) -> str:
    """Why block counts expect no onset: the server's cap (``OnsetPrediction.capped_at``), else prompts
    that never outgrow a full pool (``OnsetPrediction.grows`` false). ``oomload plan`` says it too."""
    if capped is not None:
        return (
            f"the server runs at most {capped} requests at once (max_num_seqs) and {capped} fit the pool at "
            "their peak"
        )
    return "the prompts a full pool admits leave room for their output"


def no_onset_reason(capped: int | None, band: str) -> str:
    """``no_onset_cause``, then what happens past it, with the band it replaces."""
    if capped is not None:
        return f"{no_onset_cause(capped)}, so more queue (onset {band} without the cap)"
    return f"{no_onset_cause(capped)}, so it queues new requests (from {band}) and preempts none"


def compare_prediction(
    pool: CacheConfig | None,
    totals: Sequence[int],
    *,
    basis: str,
    observed_onset: int | None,
    levels: Sequence[int],
    clean_levels: Sequence[int],
    shape: PromptShape = "worst-case",
    trace_totals: Sequence[int] = (),
    trace_prefixes: Callable[[int], SharedPrefixes | None] | None = None,
    prompts: Sequence[int] | None = None,
    trace_prompts: Sequence[int] | None = None,
    max_num_seqs: int | None = None,
) -> Prediction | None:
    """The prediction beside ``observed_onset`` on the measured ``levels`` (module docstring).

    ``clean_levels`` are the trusted levels measured with metrics and no preemption; they count
    when no onset was observed. ``shape`` is the prompts the run sent; ``trace_prefixes`` gives the
    trace's shared blocks for a block size, one entry per ``trace_totals`` (the trace's lengths).
    ``prompts`` and ``trace_prompts`` (one per total) give the band's spread end (``onset_spread``).
    ``max_num_seqs`` is the server's own cap where known (``capped`` when below the band).
    ``None`` without a pool size or lengths.
    """
    if pool is None or not totals:
        return None
    blocks, block_size = pool.num_gpu_blocks, pool.block_size
    if not blocks or not block_size or block_size < 0:
        return None
    distinct = predict_preemption_onset(blocks, block_size, list(totals), prompt_tokens=prompts)
    shared = None if trace_prefixes is None or not trace_totals else trace_prefixes(block_size)
    production = (
        None
        if shared is None
        else predict_preemption_onset(
            blocks, block_size, list(trace_totals), shared, prompt_tokens=trace_prompts
        )
    )
    other: OnsetPrediction | None
    if shape == "worst-case":
        arithmetic, other = distinct, production
    elif production is None:  # no hash_ids in the trace: nothing shared, both shapes agree
        arithmetic, other = replace(distinct, shape="production"), None
    else:
        arithmetic, other = production, distinct
    low, high = arithmetic.band
    capped = arithmetic.capped_at(max_num_seqs)
    apart: int | None = None
    if not arithmetic.grows or capped is not None:
        # no onset expected: none observed agrees, one observed has no band to count from
        apart = 0 if observed_onset is None and clean_levels else None
    elif levels and observed_onset is not None and observed_onset in levels:
        lo_i, hi_i = _grid_index(levels, low), _grid_index(levels, high)
        i = list(levels).index(observed_onset)
        apart = 0 if lo_i <= i <= hi_i else min(abs(i - lo_i), abs(i - hi_i))
    elif observed_onset is None and clean_levels and max(clean_levels) >= low:
        apart = sum(1 for c in set(clean_levels) if c >= high)  # clean at the band's top: onset above it
    return Prediction(
        arithmetic=arithmetic,
        observed_onset=observed_onset,
        levels_apart=apart,
        basis="trace" if arithmetic is production else basis,
        highest_clean=max(clean_levels, default=None),
        other=other,
        capped=capped,
    )


def _grid_index(levels: Sequence[int], value: int) -> int:
    """Index of the lowest measured level ≥ value (one past the end when none is)."""
    for i, level in enumerate(levels):
        if level >= value:
            return i
    return len(levels)
