"""A worker's results on their way to the master's run directory, in batches.

``ResultStream`` is the ``ResultSink`` of a Locust worker: each finished request (``cancelled``
included) becomes its JSON row at once — written to the worker's own ``--results`` file when one is
given — and waits in a buffer. The buffer goes to the master as one ``oomload_results`` message
(``oomload.load.wire``) when it holds ``max_rows`` rows, and otherwise whenever ``flush`` is called:
the worker calls it every ``interval_s`` (0.25 s), before it says it drained, and before it leaves.
Each message carries a sequence number per worker, so the master can tell a gap from a duplicate.

What a worker loses if it dies: nothing when it is stopped (SIGTERM, Ctrl-C, the master's stop: it
flushes first); after a SIGKILL or a lost host, the rows of the last unsent batch (at most
``interval_s`` of results) and its requests in flight — those rows are still in its ``--results``
file. No clock or socket here: ``send`` is injected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from oomload.load import wire
from oomload.outcome import RequestResult

BATCH_INTERVAL_S = 0.25
BATCH_MAX_ROWS = 256


class RowCopy(Protocol):
    def append(self, stream: str, obj: dict[str, Any]) -> None: ...


class ResultStream:
    """Buffers result rows and sends them to the master in ``oomload_results`` messages."""

    def __init__(
        self,
        send: Callable[[str, dict[str, Any]], None],
        worker: int,
        *,
        max_rows: int = BATCH_MAX_ROWS,
        copy: RowCopy | None = None,
    ) -> None:
        self.send = send
        self.worker = worker
        self.max_rows = max_rows
        self.copy = copy
        self.buffer: list[dict[str, Any]] = []
        self.seq = 0
        self.rows_sent = 0

    def request(self, result: RequestResult) -> None:
        row = result.to_json()
        self.buffer.append(row)  # first: a copy that fails must not cost the master the row
        if self.copy is not None:
            self.copy.append("requests", row)
        if len(self.buffer) >= self.max_rows:
            self.flush()

    def flush(self) -> int:
        """Send what is buffered (nothing when empty); returns the number of rows sent."""
        if not self.buffer:
            return 0
        rows, self.buffer = self.buffer, []
        self.send(wire.RESULTS, {"worker": self.worker, "seq": self.seq, "rows": rows})
        self.seq += 1
        self.rows_sent += len(rows)
        return len(rows)
