"""The normalized oomload trace: lengths, timing and ids only — never prompt or completion text.

File format (JSON Lines, UTF-8, version 1)::

    {"oomload_trace": 1, "source": ["logs/a.jsonl"], "format": "openai-jsonl", "tokenizer": null, ...}
    {"id": "r0", "arrival_s": 0.0, "prompt_tokens": 812, "output_tokens": 97, ...}
    {"id": "r1", "arrival_s": 0.41, "prompt_tokens": 5120, "output_tokens": 12, ...}

The first line is the header: ``oomload_trace`` is the schema version and the remaining keys describe
where the trace came from (input files, detected format, tokenizer used to count tokens when the log
carried text only, counts of skipped lines, and for a build from logs ``salt`` — ``random`` or ``fixed``,
never its value — and ``ids`` — ``pseudonyms`` or ``kept``). Every following line is one request:

=================  ========  ===========================================================================
key                type      meaning
=================  ========  ===========================================================================
``id``             str       request id (a salted pseudonym of the log's, or with ``--keep-ids`` the log's
                             own), or a generated ``r<N>``
``arrival_s``      float     seconds since the first request of the trace (≥ 0, non-decreasing)
``prompt_tokens``  int       prompt length in tokens (≥ 0)
``output_tokens``  int       generated length in tokens (≥ 0; 0 for failed requests)
``max_tokens``     int|null  the ``max_tokens`` the client asked for, when the log has it
``ok``             bool      false when the original request failed (kept, marked, never dropped)
``model``          str|null  model name, when the log has it
``hash_ids``       [int]     prefix block ids, chained (see below), empty when unknown
``session``        str|null  conversation id (Bailian ``chat_id``; a pseudonym, as ``id``), when known
``parent``         str|null  parent request / chat id, when known
``turn``           int|null  turn number within the conversation, when known
=================  ========  ===========================================================================

Prefix structure. ``hash_ids`` are block ids chained like vLLM's block hashes: block k's id depends on
blocks 0..k, so two requests share block k exactly when their prompts are identical from token 0 through
the end of block k. The header's ``prefix`` object says what they mean::

    "prefix": {"block_tokens": 16, "source": "token-ids", "exact": true, "truncated_requests": 0}

``block_tokens`` is the tokens one id stands for; ``source`` is where the chains came from
(``token-ids``: a log with prompt token ids; ``messages``: message boundaries of a gateway log;
``source-trace``: ids taken as they were, e.g. Mooncake's 512-token ``hash_ids``; ``column``: a
conversation/system-prompt id column; ``none``: the log carried no prefix structure); ``exact`` is false
when per-message token counts were estimated; ``truncated_requests`` counts requests whose chain covers
only the logged part of the prompt. Derived chains cover full blocks only (a partial last block is never
shared); a source trace's last id may cover a partial block, and the replay fills only full blocks. A
header without ``prefix`` means: ids as Mooncake/Bailian gave them (512-token blocks) when there are any.

Optional keys are omitted when empty, so a plain trace line is short. Readers ignore unknown keys
(forward compatibility within a major version) and reject a newer major version with a clear error.

Bounds. A trace is input from outside, so every value has a sane upper bound, checked where a trace
is read (``iter_trace``, ``TraceRecord.from_json``, the columnar reader) and where one is built from
logs (a log line over a bound is skipped and counted like any unusable line, or stops ``--strict``):
``prompt_tokens``, ``output_tokens`` and ``max_tokens`` at most ``MAX_TOKENS`` (10,000,000 — no model
serves a longer context; a bigger count is a corrupt line, not a request); ``id``, ``model``,
``session`` and ``parent`` at most ``MAX_ID_CHARS`` (256) characters; at most ``MAX_HASH_IDS``
(1,000,000 — 10M tokens in 10-token blocks) ``hash_ids``; ``turn`` within ±``MAX_TURN``; times finite
and within ±``MAX_TIME_S`` seconds (10¹¹ s: epoch seconds of any real log); a line at most
``MAX_LINE_BYTES`` (32 MiB). ``NaN``, ``Infinity`` and numbers that overflow a float (``1e400``) are
refused. A value over a bound is a ``TraceFormatError`` naming the file and line (exit 2).
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from oomload.errors import TraceFormatError
from oomload.trace.streams import open_decompressed, read_errors

TRACE_SCHEMA_VERSION = 1
MAX_TOKENS = 10_000_000  # prompt, output and max_tokens of one request
MAX_ID_CHARS = 256  # id, model, session, parent
MAX_HASH_IDS = 1_000_000  # prefix block ids of one request
MAX_TURN = 1_000_000
MAX_TIME_S = 1e11  # |arrival_s| in a trace, |time| in a log (epoch seconds of any real log)
MAX_LINE_BYTES = 32 * 1024 * 1024
DEFAULT_PREFIX_BLOCK_TOKENS = 512  # Mooncake's hash_ids block, assumed by headers without "prefix"
PREFIX_SOURCES = ("token-ids", "messages", "source-trace", "column", "none")


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace: how long its prompt and its output were, and when it arrived."""

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None
    ok: bool = True
    model: str | None = None
    hash_ids: tuple[int, ...] = ()
    session: str | None = None
    parent: str | None = None
    turn: int | None = None

    @property
    def total_tokens(self) -> int:
        """Prompt plus output: the KV-cache tokens the request holds at its end."""
        return self.prompt_tokens + self.output_tokens

    def fits(self, max_model_len: int) -> bool:
        """Whether the request, as it is sent (at least one prompt and one output token), fits a server's
        window: longer, vLLM refuses it (or clamps its output)."""
        return max(1, self.prompt_tokens) + max(1, self.output_tokens) <= max_model_len

    def to_json(self) -> dict[str, Any]:
        """The JSON object for one trace line (optional keys omitted when empty)."""
        obj: dict[str, Any] = {
            "id": self.id,
            "arrival_s": round(self.arrival_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.max_tokens is not None:
            obj["max_tokens"] = self.max_tokens
        if not self.ok:
            obj["ok"] = False
        if self.model is not None:
            obj["model"] = self.model
        if self.hash_ids:
            obj["hash_ids"] = list(self.hash_ids)
        if self.session is not None:
            obj["session"] = self.session
        if self.parent is not None:
            obj["parent"] = self.parent
        if self.turn is not None:
            obj["turn"] = self.turn
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TraceRecord:
        """Build a record from one trace line; ``ValueError``/``KeyError``/``TypeError`` on a bad shape
        or a value over its bound (module docstring)."""
        prompt_tokens = _nonneg_int(obj["prompt_tokens"], "prompt_tokens")
        output_tokens = _nonneg_int(obj["output_tokens"], "output_tokens")
        max_tokens = obj.get("max_tokens")
        turn = obj.get("turn")
        hash_ids = obj.get("hash_ids", ())
        if not isinstance(hash_ids, list | tuple):
            raise ValueError(f"hash_ids must be a list of integers, got {type(hash_ids).__name__}")
        if len(hash_ids) > MAX_HASH_IDS:
            raise ValueError(f"{len(hash_ids)} hash_ids are over the limit of {MAX_HASH_IDS}")
        record = cls(
            id=_text(obj["id"], "id"),
            arrival_s=float(obj.get("arrival_s", 0.0)),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            max_tokens=None if max_tokens is None else _nonneg_int(max_tokens, "max_tokens"),
            ok=bool(obj.get("ok", True)),
            model=_optional_text(obj.get("model"), "model"),
            hash_ids=tuple(_hash_id(h) for h in hash_ids),
            session=_optional_text(obj.get("session"), "session"),
            parent=_optional_text(obj.get("parent"), "parent"),
            turn=None if turn is None else _int(turn, "turn"),
        )
        reason = bounds_reason(record)
        if reason is not None:
            raise ValueError(reason)
        return record


def bounds_reason(record: TraceRecord) -> str | None:
    """Why ``record`` is over a bound of the trace format (module docstring), or ``None``."""
    return values_bounds_reason(
        time_s=record.arrival_s,
        prompt_tokens=record.prompt_tokens,
        output_tokens=record.output_tokens,
        max_tokens=record.max_tokens,
        texts={"id": record.id, "model": record.model, "session": record.session, "parent": record.parent},
        hash_ids=len(record.hash_ids),
        turn=record.turn,
    )


TIME_BOUND_REASON = f"time not finite or beyond ±{MAX_TIME_S:.0e} s"


def tokens_bound_reason(name: str) -> str:
    return f"{name} over the limit of {MAX_TOKENS:,} tokens"


def text_bound_reason(name: str) -> str:
    return f"{name} longer than {MAX_ID_CHARS} characters"


def values_bounds_reason(
    *,
    time_s: float | None = None,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    max_tokens: int | None = None,
    texts: dict[str, str | None] | None = None,
    hash_ids: int = 0,
    turn: int | None = None,
) -> str | None:
    """Why one request's values are over a bound (module docstring), or ``None``; the reason is short
    and the same for every line with that fault, so a log's skips are counted by it."""
    if time_s is not None and not (math.isfinite(time_s) and abs(time_s) <= MAX_TIME_S):
        return TIME_BOUND_REASON
    for name, count in (
        ("prompt_tokens", prompt_tokens),
        ("output_tokens", output_tokens),
        ("max_tokens", max_tokens),
    ):
        if count is not None and count > MAX_TOKENS:
            return tokens_bound_reason(name)
    for name, text in (texts or {}).items():
        if text is not None and len(text) > MAX_ID_CHARS:
            return text_bound_reason(name)
    if hash_ids > MAX_HASH_IDS:
        return f"more than {MAX_HASH_IDS:,} hash_ids"
    if turn is not None and abs(turn) > MAX_TURN:
        return f"turn beyond ±{MAX_TURN:,}"
    return None


@dataclass(frozen=True, slots=True)
class PrefixInfo:
    """What a trace's ``hash_ids`` mean: the header's ``prefix`` object (module docstring)."""

    block_tokens: int = DEFAULT_PREFIX_BLOCK_TOKENS
    source: str = "source-trace"
    exact: bool = True
    truncated_requests: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "block_tokens": self.block_tokens,
            "source": self.source,
            "exact": self.exact,
            "truncated_requests": self.truncated_requests,
        }

    @classmethod
    def from_json(cls, obj: Any) -> PrefixInfo:
        """Parse the header's ``prefix`` object; ``ValueError`` on a bad shape."""
        if not isinstance(obj, dict):
            raise ValueError(f"prefix must be an object, got {type(obj).__name__}")
        block_tokens = _nonneg_int(
            obj.get("block_tokens", DEFAULT_PREFIX_BLOCK_TOKENS), "prefix.block_tokens"
        )
        if block_tokens < 1:
            raise ValueError("prefix.block_tokens must be ≥ 1")
        source = str(obj.get("source", "source-trace"))
        if source not in PREFIX_SOURCES:
            raise ValueError(f"prefix.source must be one of {', '.join(PREFIX_SOURCES)}")
        return cls(
            block_tokens=block_tokens,
            source=source,
            exact=bool(obj.get("exact", True)),
            truncated_requests=_nonneg_int(obj.get("truncated_requests", 0), "prefix.truncated_requests"),
        )


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """The first line of a trace file: schema version and provenance."""

    source: tuple[str, ...] = ()
    format: str | None = None
    tokenizer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    prefix: PrefixInfo | None = None

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "oomload_trace": TRACE_SCHEMA_VERSION,
            "source": list(self.source),
            "format": self.format,
            "tokenizer": self.tokenizer,
            **self.extra,
        }
        if self.prefix is not None:
            obj["prefix"] = self.prefix.to_json()
        return obj

    def prefix_or_default(self) -> PrefixInfo:
        """The header's prefix info, or the Mooncake/Bailian default for traces written without one."""
        return self.prefix if self.prefix is not None else PrefixInfo()


def _nonneg_int(value: Any, name: str) -> int:
    number = _int(value, name)
    if number < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {number!r}")
    return number


def _int(value: Any, name: str) -> int:
    """An integral JSON number (``3`` or ``3.0``); anything else — ``NaN``, infinities, ``1.5``, a string,
    a bool — is a ``ValueError`` naming the key."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    shown = repr(value) if isinstance(value, int | float | None) else f"a {type(value).__name__}"  # no text
    raise ValueError(f"{name} must be an integer, got {shown}")


def _hash_id(value: Any) -> int:
    number = _int(value, "hash_ids")
    if not -(2**63) <= number < 2**63:
        raise ValueError("hash_ids must be 64-bit integers")
    return number


def _text(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{name} must be a string, got {type(value).__name__}")


def _optional_text(value: Any, name: str) -> str | None:
    return None if value is None else _text(value, name)


def _json_line(line: str) -> Any:
    """One JSON line, refusing what JSON itself does not allow but Python's parser takes: ``NaN``,
    ``Infinity``, numbers too big for a float (``1e400``) and integers of more than 20 digits."""
    return json.loads(line, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_int64ish)


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words (``"an array"``), never what it holds."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _int64ish(text: str) -> int:
    if len(text.lstrip("-")) > 20:
        raise ValueError(f"the integer {text[:20]}… has {len(text)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def write_trace(path: str | Path | IO[str], records: Iterable[TraceRecord], header: TraceHeader) -> int:
    """Write a trace file (header then one line per record); return the number of records written."""
    if isinstance(path, (str, Path)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as out:
            return write_trace(out, records, header)
    fh: IO[str] = path
    fh.write(json.dumps(header.to_json(), separators=(",", ":")) + "\n")
    count = 0
    for record in records:
        fh.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
        count += 1
    return count


def read_trace_header(path: str | Path) -> TraceHeader:
    """Read and validate only the header line of a trace file."""
    with _open_trace(path) as fh:
        for _lineno, line in _lines(fh, path):
            return _parse_header(line, path)
        return _parse_header("", path)


def iter_trace(path: str | Path) -> Iterator[TraceRecord]:
    """Stream the records of an oomload trace file, validating each line.

    Raises ``TraceFormatError`` (with path and line number) on a missing or newer header, or on a
    malformed record line; a trace is our own format, so unlike raw logs nothing is skipped silently.
    """
    with _open_trace(path) as fh:
        lines = _lines(fh, path)
        _parse_header(next(lines, (1, ""))[1], path)
        for lineno, line in lines:
            if not line.strip():
                continue
            try:
                obj = _json_line(line)
                if not isinstance(obj, dict):  # ``from_json`` would index a list or a number by name
                    raise ValueError(f"not a JSON object but {_json_kind(obj)}")
                yield TraceRecord.from_json(obj)
            except KeyError as err:
                raise TraceFormatError(f"malformed trace record (no {err})", path, lineno) from err
            except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as err:
                raise TraceFormatError(f"malformed trace record ({err})", path, lineno) from err


def fitting(records: Sequence[TraceRecord], max_model_len: int | None) -> list[TraceRecord]:
    """The records that fit a server's ``max_model_len`` (``TraceRecord.fits``; all of them without one):
    what ``--only-fitting`` replays."""
    return list(records) if max_model_len is None else [r for r in records if r.fits(max_model_len)]


def replayed(
    records: Sequence[TraceRecord],
    max_model_len: int | None,
    *,
    only_fitting: bool = False,
    tail_percentile: float | None = None,
) -> list[TraceRecord]:
    """The records a replay sends from its trace, in trace order: with ``only_fitting``
    (``--only-fitting``) those that fit ``max_model_len`` (``fitting``), then with a ``tail_percentile``
    above 0 (``--tail-percentile``) those whose total length (prompt + output) is at or above that
    nearest-rank percentile of the kept ones'. The one selection the replay's order, its odds, its
    arithmetic and its prefix-cache rate all draw from."""
    chosen = fitting(records, max_model_len) if only_fitting else list(records)
    if tail_percentile and chosen:
        from oomload.trace.stats import percentile  # numpy: only where a tail is cut

        cut = percentile([r.total_tokens for r in chosen], tail_percentile)
        chosen = [r for r in chosen if r.total_tokens >= cut]
    return chosen


def read_trace(path: str | Path) -> list[TraceRecord]:
    """All records of a trace file; raises ``TraceFormatError`` when the trace has no request."""
    records = list(iter_trace(path))
    if not records:
        raise TraceFormatError("the trace holds no requests", path)
    return records


def is_trace_file(path: str | Path) -> bool:
    """True when the file starts with an oomload trace header (cheap sniff, never raises)."""
    try:
        with _open_trace(path) as fh:
            obj = json.loads(next(_lines(fh, path), (1, ""))[1])
        return isinstance(obj, dict) and "oomload_trace" in obj
    except (OSError, ValueError, UnicodeDecodeError, TraceFormatError):
        return False


def _lines(fh: IO[bytes], path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of an open trace, decoded line by line so that undecodable text names its
    own line; that, or a damaged gzip or zstd stream, is a ``TraceFormatError``."""
    lineno = 0
    while True:
        try:
            raw = fh.readline(MAX_LINE_BYTES + 1)
        except read_errors() as err:  # gzip.BadGzipFile is an OSError
            raise TraceFormatError(_damaged(fh, err), path, lineno + 1) from err
        if not raw:
            return
        lineno += 1
        if len(raw) > MAX_LINE_BYTES:
            raise TraceFormatError(f"line longer than {MAX_LINE_BYTES // 2**20} MiB", path, lineno)
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TraceFormatError("not UTF-8 text (is it an oomload trace?)", path, lineno) from err


def _damaged(fh: IO[bytes] | None, err: BaseException) -> str:
    kind = "zstd" if fh is not None and not isinstance(fh, gzip.GzipFile) else "gzip"
    return f"damaged or not a {kind} file ({err})"


def _open_trace(path: str | Path) -> IO[bytes]:
    """The trace file, decompressed as its first bytes say (gzip or zstd, whatever its name), past a
    leading byte-order mark (``oomload.trace.streams``)."""
    try:
        return open_decompressed(path)
    except FileNotFoundError as err:
        raise TraceFormatError("no such file", path) from err
    except IsADirectoryError as err:
        raise TraceFormatError("is a directory, not a trace file", path) from err
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:  # its first bytes, read at once
        raise TraceFormatError(_damaged(None, err), path, 1) from err
    except OSError as err:
        raise TraceFormatError(f"cannot open ({err.strerror})", path) from err
    except read_errors() as err:  # zstandard's ZstdError
        raise TraceFormatError(f"damaged or not a zstd file ({err})", path, 1) from err


def _parse_header(line: str, path: str | Path) -> TraceHeader:
    if not line.strip():
        raise TraceFormatError("empty file: an oomload trace starts with a header line", path, 1)
    try:
        obj = json.loads(line)
    except ValueError as err:
        raise TraceFormatError(
            "not an oomload trace (no header line); build one with `oomload trace build`", path, 1
        ) from err
    if not isinstance(obj, dict) or "oomload_trace" not in obj:
        raise TraceFormatError(
            "not an oomload trace (no header line); build one with `oomload trace build`", path, 1
        )
    version = obj["oomload_trace"]
    if not isinstance(version, int) or version > TRACE_SCHEMA_VERSION or version < 1:
        raise TraceFormatError(
            f"trace schema version {version!r} is not supported (this oomload reads version "
            f"{TRACE_SCHEMA_VERSION}); upgrade oomload",
            path,
            1,
        )
    known = {"oomload_trace", "source", "format", "tokenizer", "prefix"}
    extra = {k: v for k, v in obj.items() if k not in known}
    source = obj.get("source") or ()
    try:
        prefix = None if obj.get("prefix") is None else PrefixInfo.from_json(obj["prefix"])
    except ValueError as err:
        raise TraceFormatError(f"bad header: {err}", path, 1) from err
    return TraceHeader(
        source=tuple(str(s) for s in source),
        format=obj.get("format"),
        tokenizer=obj.get("tokenizer"),
        extra=extra,
        prefix=prefix,
    )
