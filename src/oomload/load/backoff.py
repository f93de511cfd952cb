"""How long a user waits after the server failed its requests again and again (pure).

After a user's second request in a row that the server failed (``user.server_failed``: an error status
oomload has no other name for, or a stream the server broke), it waits ``FAILING_BACKOFF_FIRST_S``,
doubled after each next failure up to ``FAILING_BACKOFF_MAX_S``; any other ending starts the count again,
so a lone failure among answers costs no wait (``oomload.load.user``). Apart from the user so that the
tests that check the pauses read them without importing Locust.
"""

from __future__ import annotations

FAILING_BACKOFF_FIRST_S = 0.05  # pause after a user's second server failure in a row, doubled after each next
FAILING_BACKOFF_MAX_S = 0.25  # ... up to this: one request in four a second, ten in under 2 s


def failing_backoff_s(failures_in_a_row: int) -> float:
    """The pause after a user's ``failures_in_a_row``-th server failure in a row (the first: none)."""
    if failures_in_a_row < 2:
        return 0.0
    doubled_s: float = FAILING_BACKOFF_FIRST_S * 2.0 ** min(failures_in_a_row - 2, 16)
    return min(doubled_s, FAILING_BACKOFF_MAX_S)
