"""One input of a build: found, its format detected, its columns checked, and read into batches.

``plan_inputs`` opens every input *before* anything is written — an unknown format, an empty or
unreadable file, or a mapping naming a missing column fails fast with one sentence — and gives an
``InputPlan`` per file (its source, format, CSV layout or column mapping, and the build's
``BlockHasher``). ``iter_source_batches`` reads one planned input with the reader of its format,
in this process; ``oomload.ingest.parallel`` runs the very same function in its workers (over a
byte range of the file, or the whole file), and ``oomload.ingest.build`` merges what either gives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from oomload.errors import TraceFormatError
from oomload.ingest.columns import batches_from_records
from oomload.ingest.detect import detect_format
from oomload.ingest.mapping import ColumnMapping, check_jsonl_mapping, csv_layout, read_mapped_jsonl_records
from oomload.ingest.mooncake import read_mooncake_batches
from oomload.ingest.openai_fast import read_openai_batches
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import LogSource
from oomload.ingest.tabular import AZURE, BURSTGPT, CsvLayout, check_layout, read_csv_batches
from oomload.ingest.tokens import TokenCounter
from oomload.ingest.vllm_log import read_vllm_batches
from oomload.trace.model import iter_trace
from oomload.trace.prefix import BlockHasher


@dataclass(frozen=True, slots=True)
class InputPlan:
    """One input file, its format and (for CSV formats) its column layout."""

    source: LogSource
    format: str
    layout: CsvLayout | None = None
    mapping: ColumnMapping | None = None
    hasher: BlockHasher | None = None  # chains prompts into prefix block ids (salt shared by all workers)


def plan_inputs(
    paths: Sequence[str | Path],
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    hasher: BlockHasher | None = None,
) -> list[InputPlan]:
    """Detect and check every input up front (see the module docstring)."""
    if not paths:
        raise TraceFormatError("no input files given")
    plans = []
    for path in paths:
        source = LogSource(Path(path))
        fmt = detect_format(source, forced=format, mapped=mapping is not None)
        layout = None
        if fmt == "azure":
            layout = AZURE
            check_layout(source, layout, "an Azure trace")
        elif fmt == "burstgpt":
            layout = BURSTGPT
            check_layout(source, layout, "a BurstGPT trace")
        elif fmt == "csv":
            assert mapping is not None
            layout = csv_layout(source, mapping)
        elif fmt == "jsonl":
            assert mapping is not None
            check_jsonl_mapping(source, mapping)
        plans.append(InputPlan(source, fmt, layout, mapping, hasher))
    return plans


def iter_source_batches(plan: InputPlan, skips: SkipLog, counter: TokenCounter | None) -> Iterator[pa.Table]:
    """The batches of one input, ``time_s`` on that log's clock."""
    source = plan.source
    if plan.layout is not None:
        yield from read_csv_batches(source, plan.layout, skips)
    elif plan.format == "mooncake":
        yield from read_mooncake_batches(source, skips)
    elif plan.format == "openai":
        yield from read_openai_batches(source, skips, counter, hasher=plan.hasher)
    elif plan.format == "vllm-log":
        yield from read_vllm_batches(source, skips, counter, plan.hasher)
    elif plan.format == "jsonl":
        assert plan.mapping is not None
        yield from batches_from_records(read_mapped_jsonl_records(source, plan.mapping, skips, plan.hasher))
    elif plan.format == "oomload":
        yield from batches_from_records(iter_trace(source.path))
    else:  # pragma: no cover - plan_inputs only yields known formats
        raise TraceFormatError(f"no reader for format {plan.format!r}", source.path)
