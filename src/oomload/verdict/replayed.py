"""The requests a run replayed from its trace, as the verdict's predictions take them (pure).

A run sends what ``trace.model.replayed`` selects from its trace — with ``--only-fitting`` the requests
within the server's ``max_model_len``, then with ``--tail-percentile`` the longest of those — and
``config.json`` records both flags and that ``max_model_len`` (``RunConfig``). The verdict applies the
same selection to the run's ``trace.jsonl`` (``replayed_records``), so a saved run is judged again on
what it sent. Everything it predicts from the trace draws from those requests only:

* the arithmetic's lengths where no request was sent, and always for the production shape, whose
  shared prefix blocks only the trace's ``hash_ids`` carry (``kv_lengths``, ``shared_prefixes``): a
  request left out never held a block, and counting it (clamped at ``max_model_len``) would put the band
  below the onset of the requests sent;
* the expected prefix-cache hit rate (``prefixrate``), whose passes cycle through these requests.

The trace's odds are computed by the run on the same selection (``oomload.run.oddsfeed``) and read back
from ``odds.jsonl``. What describes the trace itself — its length summaries, the requests over
``max_model_len``, the ``--max-model-len`` advice — stays the whole trace's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from oomload.capacity.blocks import SharedPrefixes
from oomload.capacity.odds import trace_prefixes
from oomload.outcome import Outcome
from oomload.rundir.records import RunConfig
from oomload.trace.model import TraceRecord, replayed
from oomload.verdict.runview import RunView


def replayed_records(records: Sequence[TraceRecord], settings: RunConfig) -> list[TraceRecord]:
    """The records of the run's trace that it replayed, by the selection ``config.json`` records."""
    return replayed(
        records,
        settings.max_model_len,
        only_fitting=settings.only_fitting,
        tail_percentile=settings.tail_percentile,
    )


def kv_lengths(
    view: RunView, limit: int | None, *, of_trace: bool = False
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(totals, prompts): the KV tokens each request could hold at most and its prompt tokens, for the
    ones sent without those the server refused (context overflow: they never held a block), or, with
    ``of_trace``, for the trace's requests the run replayed (``replayed_records``); both clamped at
    ``max_model_len``."""
    if of_trace:
        records = replayed_records(view.trace_records, view.settings)
        pairs = [(r.total_tokens, r.prompt_tokens) for r in records]
    else:
        pairs = [
            (r.prompt_tokens_asked + r.output_tokens_asked, r.prompt_tokens_asked)
            for r in view.requests
            if r.outcome is not Outcome.CONTEXT_OVERFLOW
        ]
    if limit is not None:
        pairs = [(min(t, limit), min(p, limit)) for t, p in pairs]
    return tuple(t for t, _ in pairs), tuple(p for _, p in pairs)


def shared_prefixes(view: RunView) -> Callable[[int], SharedPrefixes | None]:
    """The shared prefix blocks of the trace's requests the run replayed, one entry per
    ``kv_lengths(of_trace=True)`` length, for a block size (``None``: they carry no ``hash_ids``)."""
    records = replayed_records(view.trace_records, view.settings)

    def on(block_size: int) -> SharedPrefixes | None:
        if not any(r.hash_ids for r in records):
            return None
        return trace_prefixes(records, view.trace_prefix, block_size)

    return on
