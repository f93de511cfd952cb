"""Production logs → normalized traces (lengths, timing and ids only — never prompt or completion text).

Formats (auto-detected from content, see ``oomload.ingest.detect``): OpenAI-style request/response
JSONL and Batch output (``openai_fast`` reads the usual line in columns without its text,
``openai_log`` any other line), vLLM server logs (``vllm_log``), Azure and BurstGPT CSV and
mapped CSV (``tabular``), Mooncake/Bailian JSONL (``mooncake``), mapped JSONL (``mapping``), and
oomload traces themselves. Inputs may be gzip- or zstd-compressed (``source``). Every reader turns
its input into columnar batches (``columns``); big inputs are read by a process pool over byte
spans and over files (``parallel``), with the same result; ``build`` merges them on one timeline
(``clocks`` decides whether several inputs share a clock) and writes them (``writer``); ``arrays``
gathers what ``trace stats`` needs in constant memory (counts per length, streamed arrivals).
Unusable lines are counted by reason (``skips``). Text is counted only with a tokenizer the user
names (``tokens``).
"""

from __future__ import annotations

from oomload.ingest.arrays import PoolSize, TraceColumns, TraceCounts, count_trace, load_columns
from oomload.ingest.build import BuildResult, InputPlan, build_trace, iter_records, plan_inputs
from oomload.ingest.clocks import ClockAlignment, ClockRange, align_clocks
from oomload.ingest.detect import FORMATS, detect_format
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
