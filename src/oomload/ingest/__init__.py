"""Production logs → normalized traces (lengths, timing and ids only — never prompt or completion text).

Formats (auto-detected from content, see ``oomload.ingest.detect``): OpenAI-style request/response JSONL
and Batch output (``openai_fast`` reads them in columns without their text, against the schemas of
``openai_schema``, chaining prompt parts with ``openai_parts``; ``openai_log`` reads any line they
decline; ``untimed`` gives requests without a time theirs), vLLM server logs (``vllm_log``), Azure and
BurstGPT CSV and mapped CSV (``tabular``), Mooncake/Bailian JSONL (``mooncake``), mapped JSONL
(``mapping``), and oomload traces themselves. Inputs may be gzip- or zstd-compressed (``source``).
``inputs`` plans each input (format, checks) and reads it with its reader into columnar batches
(``columns``); big inputs are read by a process pool over byte spans and over files (``parallel``; what
a worker runs: ``workertasks``), with the same result; ``build`` merges them on one timeline (``clocks``
decides whether several inputs share a clock) and writes them (``writer``); ``prefixes`` gives the
build's salt and the header's prefix object; ``keepfreed`` keeps the memory a batch frees for the next
one (glibc); ``counts`` gathers what ``trace stats`` needs in constant memory (counts per length,
streamed arrivals). Unusable lines are counted by reason (``skips``). Text is counted only with a
tokenizer the user names (``tokens``).
"""

from __future__ import annotations

from oomload.ingest.build import BuildResult, build_trace, iter_records
from oomload.ingest.clocks import ClockAlignment, ClockRange, align_clocks
from oomload.ingest.counts import PoolSize, TraceColumns, TraceCounts, count_trace, load_columns
from oomload.ingest.detect import FORMATS, detect_format
from oomload.ingest.inputs import InputPlan, plan_inputs
from oomload.ingest.mapping import ColumnMapping, parse_mapping
from oomload.ingest.skips import SkipLog
from oomload.ingest.source import LogSource
from oomload.ingest.tokens import TokenCounter, load_token_counter
from oomload.ingest.writer import TraceScratch, check_output_path, write_trace_file

__all__ = [
    "FORMATS",
    "BuildResult",
    "ClockAlignment",
    "ClockRange",
    "ColumnMapping",
    "InputPlan",
    "LogSource",
    "PoolSize",
    "SkipLog",
    "TokenCounter",
    "TraceColumns",
    "TraceCounts",
    "TraceScratch",
    "align_clocks",
    "build_trace",
    "check_output_path",
    "count_trace",
    "detect_format",
    "iter_records",
    "load_columns",
    "load_token_counter",
    "parse_mapping",
    "plan_inputs",
    "write_trace_file",
]
