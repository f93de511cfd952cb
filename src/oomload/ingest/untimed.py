"""Requests without a time in an OpenAI-style log: what they are given, and how long they wait for it.

A request without a time takes the previous request's time; those before the first timed request of a
file take its time, so they are held until it comes — at most ``UNTIMED_HOLD_ROWS`` of them (bounded
memory on a log with no time at all): past that, and at the end of a file with no time, they keep 0.
The record reader (``openai_log``) holds records; the column readers (``openai_fast`` for a file or a
byte range, ``parallel`` for the ranges of a file) hold whole batches of untimed rows in
``LeadingUntimed``.

A request whose time is there but cannot be read (``"2024-13-45T99:00:00Z"``, ``true``, a negative
epoch or a date before 1970) is given a time the same way — the request is kept — but it is counted
apart, so the user sees that a time was unreadable rather than missing: a reader marks a missing time
``UNTIMED_S`` and an unreadable one ``UNREADABLE_S`` (any other negative time, as read, counts as
unreadable too; ``split_untimed``), and each says both counts with ``untimed_notes``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# Requests held for the first timed one at most: past them a log with no time yet keeps 0 for them (as
# it does for a log with no time at all), so the memory a build needs does not grow with such a log.
UNTIMED_HOLD_ROWS = 100_000


UNTIMED_S = -1.0  # a reader's mark for a request without a time (replaced before a batch leaves it)
UNREADABLE_S = -2.0  # … for one whose time is there but is not a time oomload reads


def untimed_note_text(name: str, untimed: int) -> str:
    """The note on requests without a time (the same from every reader of OpenAI-style logs)."""
    return (
        f"{name}: {untimed} requests had no timestamp (each given the previous one's time, "
        "or the first timed one's when none came before)"
    )


def unreadable_note_text(name: str, unreadable: int) -> str:
    """The note on requests whose time could not be read (given a time as a request without one is)."""
    return (
        f"{name}: {unreadable} requests had a time that could not be read (not ISO-8601 or epoch "
        "s/ms/µs, or before 1970; each given the previous one's time, or the first timed one's when "
        "none came before)"
    )


def untimed_notes(name: str, untimed: int, unreadable: int) -> list[str]:
    """The notes of a file with ``untimed`` requests without a time and ``unreadable`` with a bad one."""
    return [
        *([untimed_note_text(name, untimed)] if untimed else []),
        *([unreadable_note_text(name, unreadable)] if unreadable else []),
    ]


def split_untimed(times: np.ndarray) -> tuple[int, int]:
    """``(missing, unreadable)``: how many of ``times`` are marked ``UNTIMED_S``, and how many are any
    other negative time (``UNREADABLE_S``, or a negative time as read)."""
    negative = times[times < 0]
    missing = int(np.count_nonzero(negative == UNTIMED_S))
    return missing, len(negative) - missing


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
