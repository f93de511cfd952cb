"""Requests without a time in an OpenAI-style log: what they are given, and how long they wait for it.

A request without a time takes the previous request's time; those before the first timed request of a
file take its time, so they are held until it comes — at most ``UNTIMED_HOLD_ROWS`` of them (bounded
memory on a log with no time at all): past that, and at the end of a file with no time, they keep 0.
The record reader (``openai_log``) holds records; the column readers (``openai_fast`` for a file or a
byte range, ``parallel`` for the ranges of a file) hold whole batches of untimed rows in
``LeadingUntimed``. Each says how many requests had no time with ``untimed_note_text``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# Requests held for the first timed one at most: past them a log with no time yet keeps 0 for them (as
# it does for a log with no time at all), so the memory a build needs does not grow with such a log.
UNTIMED_HOLD_ROWS = 100_000


def untimed_note_text(name: str, untimed: int) -> str:
    """The note on requests without a time (the same from every reader of OpenAI-style logs)."""
    return (
        f"{name}: {untimed} requests had no timestamp (each given the previous one's time, "
        "or the first timed one's when none came before)"
    )


def with_time(batch: pa.Table, time_s: float) -> pa.Table:
    """``batch`` with every row at ``time_s`` (its metadata kept)."""
    times = pa.array(np.full(batch.num_rows, time_s))
    return batch.set_column(batch.schema.get_field_index("time_s"), "time_s", times)


class LeadingUntimed:
    """The batches of one file read before its first timed request (every row at 0 until then)."""

    def __init__(self) -> None:
        self.seen_timed = False  # a timed request was read, or the hold gave up (0 from there on)
        self.last_s = 0.0  # the time an untimed request after ``seen_timed`` takes
        self._held: list[pa.Table] = []
        self._rows = 0

    def hold(self, batch: pa.Table) -> list[pa.Table]:
        """Hold a batch of untimed rows read before any timed one; returns what goes out now: nothing, or
        past ``UNTIMED_HOLD_ROWS`` held rows everything held, at 0 (and ``seen_timed`` from here on)."""
        self._held.append(batch)
        self._rows += batch.num_rows
        if self._rows <= UNTIMED_HOLD_ROWS:
            return []
        self.seen_timed, self.last_s = True, 0.0
        return self.finish()

    def timed(self, first_s: float, last_s: float) -> list[pa.Table]:
        """A batch with times (its first row's and its last's): the held batches at ``first_s``, to go
        out before it."""
        released = [with_time(batch, first_s) for batch in self._held]
        self._held = []
        self.seen_timed, self.last_s = True, last_s
        return released

    def finish(self) -> list[pa.Table]:
        """What is still held, at 0 (the end of a file with no time)."""
        released, self._held = self._held, []
        return released
