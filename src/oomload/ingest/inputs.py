"""One input of a build: found, its format detected, its columns checked, and read into batches.

``plan_inputs`` opens every input *before* anything is written — an unknown format, an empty or
unreadable file, or a mapping naming a missing column fails fast with one sentence — and gives an
``InputPlan`` per file (its source, format, CSV layout or column mapping, and the build's
``BlockHasher`` and, unless ``--keep-ids``, its ``Pseudonyms``). ``iter_source_batches`` reads one
planned input with the reader of its format, in this process, and gives each batch's ``id``, ``session``
and ``parent`` as salted pseudonyms (``with_pseudonyms``; ``oomload.trace.pseudonyms``);
``oomload.ingest.parallel`` runs the very same function in its workers (over a byte range of the file,
or the whole file), and ``oomload.ingest.build`` merges what either gives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
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
from oomload.trace.model import iter_trace, read_trace_header
from oomload.trace.prefix import BlockHasher
from oomload.trace.pseudonyms import Pseudonyms

NAME_COLUMNS = ("id", "session", "parent")  # the names a trace carries: pseudonyms unless --keep-ids


@dataclass(frozen=True, slots=True)
class InputPlan:
    """One input file, its format and (for CSV formats) its column layout."""

    source: LogSource
    format: str
    layout: CsvLayout | None = None
    mapping: ColumnMapping | None = None
    hasher: BlockHasher | None = None  # chains prompts into prefix block ids (salt shared by all workers)
    pseudonyms: Pseudonyms | None = None  # None: the log's ids, sessions and parents kept as they are


def plan_inputs(
    paths: Sequence[str | Path],
    *,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    hasher: BlockHasher | None = None,
    pseudonyms: Pseudonyms | None = None,
) -> list[InputPlan]:
    """Detect and check every input up front (see the module docstring)."""
    if not paths:
        raise TraceFormatError("no input files given")
    _refuse_repeats(paths)
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
        names = pseudonyms
        if fmt == "oomload" and read_trace_header(source.path).extra.get("ids") == "pseudonyms":
            names = None  # a trace whose names are pseudonyms already keeps them (a merge, a re-sort)
        plans.append(InputPlan(source, fmt, layout, mapping, hasher, names))
    return plans


def _refuse_repeats(paths: Sequence[str | Path]) -> None:
    """One file given twice (the same name, or two names of it: a link, a relative and an absolute path)
    would have its requests read twice: refused, naming both."""
    seen: dict[tuple[int, int], str | Path] = {}
    for path in paths:
        try:
            stat = Path(path).stat()
        except OSError:
            continue  # ``LogSource`` says why it cannot be read
        first = seen.get((stat.st_dev, stat.st_ino))
        if first is not None:
            same = f"{path} is given twice" if str(first) == str(path) else f"{first} and {path} are one file"
            raise TraceFormatError(f"{same}: its requests would be read twice")
        seen[(stat.st_dev, stat.st_ino)] = path


def iter_source_batches(plan: InputPlan, skips: SkipLog, counter: TokenCounter | None) -> Iterator[pa.Table]:
    """The batches of one input, ``time_s`` on that log's clock, its names as the plan says
    (``with_pseudonyms``)."""
    return with_pseudonyms(plan.pseudonyms, _read_batches(plan, skips, counter))


def with_pseudonyms(pseudonyms: Pseudonyms | None, batches: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """``batches`` with every ``id``, ``session`` and ``parent`` replaced by its pseudonym (a null stays
    null: a generated ``r<N>`` id stays generated); as they are when ``pseudonyms`` is ``None``."""
    for batch in batches:
        if pseudonyms is not None:
            for name in NAME_COLUMNS:
                index = batch.schema.get_field_index(name)
                if index >= 0 and batch.column(index).null_count < batch.num_rows:
                    batch = batch.set_column(
                        index, batch.schema.field(index), pseudonyms.of(batch.column(index))
                    )
        yield batch


def _read_batches(plan: InputPlan, skips: SkipLog, counter: TokenCounter | None) -> Iterator[pa.Table]:
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
