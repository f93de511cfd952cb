"""Whether several inputs share one clock, and how to align them when they do not (pure).

Logs keep time on one of two kinds of clock: **absolute** (wall-clock epoch seconds: Azure,
OpenAI-style logs, vLLM logs) or **relative** (seconds since the recording started: Mooncake,
BurstGPT, oomload traces). A first timestamp at or past ``ABSOLUTE_AFTER_S`` (1e8 s after the Unix
epoch, March 1973) marks an absolute clock; anything earlier is relative.

Merging by raw time is right only when the inputs share a clock — two shards of one gateway's log,
or the days of one recording. ``align_clocks`` decides from each input's time range
``[start_s, end_s]``:

1. one input, or inputs of one kind whose ranges form one connected span (sorted by start, each
   starts no later than ``gap_s`` — one hour by default — after the latest end before it): they
   **share one clock**, every offset is 0;
2. otherwise — clocks of both kinds (2023 wall-clock next to milliseconds-since-start), or ranges
   apart by more than ``gap_s`` (a 2023 trace next to a 2025 one) — **each input is rebased to its
   own start**: its offset is ``−start_s``, so every input begins at 0 and they are replayed side
   by side. The reason is kept for the terminal and the trace header.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ABSOLUTE_AFTER_S = 1e8
ADJACENT_GAP_S = 3600.0
SHARED = "inputs share one clock"
REBASED = "each input rebased to its own start"


@dataclass(frozen=True, slots=True)
class ClockRange:
    """The earliest and latest request time of one input, on that input's own clock."""

    start_s: float
    end_s: float

    @property
    def absolute(self) -> bool:
        """True for wall-clock (epoch) time, False for time since the recording started."""
        return self.start_s >= ABSOLUTE_AFTER_S


@dataclass(frozen=True, slots=True)
class ClockAlignment:
    """Seconds to add to each input's times, and why."""

    offsets_s: tuple[float, ...]
    shared: bool
    reason: str | None = None  # why the inputs were rebased; None when they share a clock

    @property
    def description(self) -> str:
        return SHARED if self.shared else REBASED


def align_clocks(ranges: Sequence[ClockRange], *, gap_s: float = ADJACENT_GAP_S) -> ClockAlignment:
    """Offsets that put every input on one timeline (the rules are in the module docstring)."""
    shared = ClockAlignment(offsets_s=tuple(0.0 for _ in ranges), shared=True)
    if len(ranges) < 2:
        return shared
    rebased = tuple(-r.start_s for r in ranges)
    if len({r.absolute for r in ranges}) > 1:
        return ClockAlignment(
            rebased, shared=False, reason="inputs mix wall-clock and relative (since-start) timestamps"
        )
    ordered = sorted(ranges, key=lambda r: r.start_s)
    latest_end_s = ordered[0].end_s
    for item in ordered[1:]:
        if item.start_s > latest_end_s + gap_s:
            return ClockAlignment(
                rebased,
                shared=False,
                reason=f"inputs do not overlap in time ({item.start_s - latest_end_s:,.0f} s apart)",
            )
        latest_end_s = max(latest_end_s, item.end_s)
    return shared
