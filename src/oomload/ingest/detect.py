"""Which format a log is in, told from its first lines (``--format`` overrides).

Rules, first match wins:

1. The first non-blank line starts like JSON, and the first of the first ``JSON_SNIFF_LINES`` (20)
   lines that parses is a JSON object → (a line is parsed as its bytes say, else with any byte that is
   not UTF-8 replaced — text in a log may be Latin-1, and the OpenAI reader never reads it; a line
   that parses neither way, such as the cut first line of a rotated log, is passed over here and
   skipped by the reader)
   ``oomload_trace`` key: an oomload trace · ``input_length`` + ``output_length``: Mooncake/Bailian ·
   ``custom_id`` + ``response``, or any of ``request``/``response``/``usage``/``messages``/``prompt``/
   ``choices``: OpenAI-style log · otherwise unknown (use ``--map``).
2. A CSV header → ``TIMESTAMP,ContextTokens,GeneratedTokens``: Azure · ``Timestamp``, ``Request tokens``,
   ``Response tokens``: BurstGPT.
3. Lines with vLLM's log prefix (``(APIServer pid=N) INFO MM-DD HH:MM:SS``) → vLLM server log.

With ``--map`` the file is a generic CSV or JSONL, told apart by its first character.
"""

from __future__ import annotations

from typing import Any

import orjson

from oomload.errors import ConfigError, TraceFormatError, names_shown
from oomload.ingest.source import LogSource
from oomload.ingest.vllm_log import is_vllm_log

FORMATS: dict[str, str] = {
    "openai": "OpenAI-style request/response JSONL, also the OpenAI Batch API output",
    "vllm-log": "vLLM server log written with --enable-log-requests",
    "azure": "Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens[,NumImages])",
    "burstgpt": "BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,…)",
    "mooncake": "Mooncake / Bailian JSONL (timestamp ms, input_length, output_length, hash_ids)",
    "csv": "any CSV, columns named with --map",
    "jsonl": "any JSONL, columns named with --map",
    "oomload": "an oomload trace (to merge traces)",
}
OPENAI_KEYS = ("request", "response", "usage", "messages", "prompt", "choices")
AZURE_COLUMNS = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
BURSTGPT_COLUMNS = {"Timestamp", "Request tokens", "Response tokens"}


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _utf16(head: bytes) -> bool:
    """A UTF-16 byte-order mark, or ASCII written in UTF-16 without one: a NUL every other byte, and
    none between (a run of NULs, as a log truncated under its writer starts, is not UTF-16)."""
    if head.startswith(_UTF16_BOMS):
        return True
    sample = head[:64]
    even, odd = sample[0::2], sample[1::2]
    return len(sample) >= 8 and (
        (even.count(0) == len(even) and odd.count(0) == 0)
        or (odd.count(0) == len(odd) and even.count(0) == 0)
    )


def detect_format(source: LogSource, *, forced: str | None = None, mapped: bool = False) -> str:
    """The format name of ``source`` (a key of ``FORMATS``); raises ``TraceFormatError`` when unknown."""
    if forced is not None and forced not in FORMATS:
        raise ConfigError(f"unknown --format {forced!r}; allowed: {', '.join(FORMATS)}")
    if mapped and forced not in (None, "csv", "jsonl"):
        raise ConfigError(f"--map works with --format csv or jsonl, not {forced!r}")
    if forced is not None and not mapped and forced in ("csv", "jsonl"):
        raise ConfigError(f"--format {forced} needs --map input=COL,output=COL[,time=COL]")
    lines = source.head_lines(200)  # raises on an empty or unreadable file
    first = lines[0]
    if _utf16(first):
        raise TraceFormatError(
            "the log is UTF-16 text, not UTF-8: convert it first, e.g. iconv -f UTF-16 -t UTF-8", source.path
        )
    if forced is not None:
        return forced
    if mapped:
        return "jsonl" if first.startswith(b"{") else "csv"
    if first.startswith((b"{", b"[")):
        obj = _first_object(source)
        return _json_format(obj, source)
    header = [c.strip().strip('"') for c in first.decode("utf-8", errors="replace").split(",")]
    if set(header) >= AZURE_COLUMNS:
        return "azure"
    if set(header) >= BURSTGPT_COLUMNS:
        return "burstgpt"
    if is_vllm_log(lines):
        return "vllm-log"
    what = f"a CSV with {names_shown(header, 'columns')}" if len(header) > 1 else "not a known log"
    raise TraceFormatError(
        f"cannot tell the log format from its first lines ({what}); force one with --format "
        f"{'|'.join(k for k in FORMATS if k not in ('csv', 'jsonl'))}, or name the columns with "
        "--map input=COL,output=COL,time=COL",
        source.path,
    )


JSON_SNIFF_LINES = 20  # non-blank lines looked at for the first that parses


def _first_object(source: LogSource) -> dict[str, Any]:
    seen = 0
    for number, line in source.iter_lines():
        if not line.strip():
            continue
        obj = _parsed(line)
        if obj is not _UNPARSED:
            if isinstance(obj, dict):
                return obj
            raise TraceFormatError(
                "the first line that parses is JSON but not an object; no known format starts so",
                source.path,
                number,
            )
        seen += 1
        if seen == JSON_SNIFF_LINES:
            break
    raise TraceFormatError(
        f"the first line starts like JSON but none of the first {seen} lines parses; force a format "
        "with --format",
        source.path,
        1,
    )


_UNPARSED = object()


def _parsed(line: bytes) -> Any:
    """``line``'s JSON value; with any byte that is not UTF-8 replaced when only that stops it; else
    ``_UNPARSED``."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    try:
        return orjson.loads(line.decode("utf-8", errors="replace"))
    except orjson.JSONDecodeError:
        return _UNPARSED


def _json_format(obj: dict[str, Any], source: LogSource) -> str:
    if "oomload_trace" in obj:
        return "oomload"
    if "input_length" in obj and "output_length" in obj:
        return "mooncake"
    if ("custom_id" in obj and "response" in obj) or any(key in obj for key in OPENAI_KEYS):
        return "openai"
    raise TraceFormatError(
        f"JSON lines with {names_shown(list(obj), 'keys')} match no known format; name the columns with "
        "--map input=COL,output=COL,time=COL",
        source.path,
    )
