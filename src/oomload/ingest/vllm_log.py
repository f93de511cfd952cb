"""vLLM server logs written with request logging (``--enable-log-requests``).

Lines used (see reference vllm-facts §2; prefix ``(APIServer pid=N) LEVEL MM-DD HH:MM:SS [file:line]``,
or ``LEVEL MM-DD HH:MM:SS file:line]`` in older releases):

- ``Request <id> details: prompt: …, prompt_token_ids: [...]`` (DEBUG, vLLM ≥ 0.10 with
  ``VLLM_LOGGING_LEVEL=DEBUG``) — the prompt length is the number of token ids;
- ``Received request <id>: params: SamplingParams(…max_tokens=N…)`` (INFO) — one request; older
  releases put ``prompt: …, params: …, prompt_token_ids: [...]`` all on this line;
- ``Aborted request <id>`` — the request is kept with ``ok=false`` (found in a first pass, so the
  file is read twice; vLLM logs are files on disk);
- uvicorn access lines (``"POST /v1/completions HTTP/1.1" 200 OK``) carry no request id; their
  non-2xx count is reported as a note.

vLLM writes no per-request completion count, so **the output length is the request's ``max_tokens``**
— exact for replays made with ``ignore_eos`` / ``min_tokens``, an upper bound otherwise; the trace
header says so. A request without ``max_tokens`` (or without its prompt ids and no ``--tokenizer``
for its prompt text) is skipped with the reason. The log's timestamps have no year and 1 s
resolution; arrival times are therefore to the second.

**Prompts cut by ``--max-log-len N``.** vLLM cuts ``prompt_token_ids`` (and a prompt's text) in its
request log to ``N`` ids (characters), with no marker on the line; only the start-up line
``non-default args: {… 'max_log_len': N …}`` names the setting. A cut length is never recorded as a
prompt length: after such a banner (each server start in the file sets it anew), a prompt logged with
exactly ``N`` ids — a 900-token prompt, or one of exactly ``N`` tokens: the two look the same — is
skipped with the reason ``prompt ids cut at --max-log-len N``, and a note says how to log full
lengths. Without the banner (a log that starts after it), when at least ``SUSPECT_MIN_PROMPTS``
prompts and ``SUSPECT_MIN_SHARE`` of them sit at one identical maximum length, a note warns that the
log was probably written with ``--max-log-len`` at that length.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import NamedTuple

from oomload.ingest.skips import NO_TOKEN_COUNTS, SkipLog
from oomload.ingest.source import LogSource
from oomload.ingest.tokens import TokenCounter
from oomload.prefix import BlockHasher
from oomload.trace import TraceRecord, bounds_reason

LOG_PREFIX = re.compile(
    rb"^(?:\(\w+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +\d\d-\d\d \d\d:\d\d:\d\d "
)
_TIME = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
_DETAILS = re.compile(r"Request (\S+) details: ")
_RECEIVED = re.compile(r"Received request (\S+?): ")
_ABORTED = re.compile(rb"Aborted request (\S+?)\.?$")
_MAX_TOKENS = re.compile(r"\bmax_tokens=(\d+|None)")
_ACCESS = re.compile(rb'"(?:POST|GET) [^"]*" (\d{3})')
_MAX_LOG_LEN = re.compile(r"'max_log_len': (\d+)")
SUSPECT_MIN_PROMPTS = 5
CHAIN_BATCH = 256  # records whose chains are computed together
SUSPECT_MIN_SHARE = 0.05
OUTPUT_NOTE = (
    "vLLM logs carry no completion counts: output_tokens is each request's max_tokens "
    "(exact for ignore_eos/min_tokens replays, an upper bound otherwise)"
)
NO_IDS_REASON = (
    "no prompt_token_ids for the request (start vLLM with VLLM_LOGGING_LEVEL=DEBUG and --enable-log-requests)"
)


def cut_reason(max_log_len: int) -> str:
    """The skip reason for a prompt whose logged ids may have been cut."""
    return f"prompt ids cut at --max-log-len {max_log_len}"


def full_length_note(max_log_len: int) -> str:
    return (
        f"vLLM was started with --max-log-len {max_log_len}: its request log cuts prompts to "
        f"{max_log_len} ids, so prompts logged with exactly {max_log_len} ids were skipped; to log full "
        "lengths, restart vLLM without --max-log-len (or with one above the longest prompt)"
    )


class _Ids(NamedTuple):
    """A prompt logged as token ids: how many, and the ids as the log wrote them (for the chain)."""

    tokens: int
    text: str


def read_vllm_records(
    source: LogSource, skips: SkipLog, counter: TokenCounter | None, hasher: BlockHasher | None = None
) -> Iterator[TraceRecord]:
    """Records (``arrival_s`` = log time in seconds, year-less) from a vLLM server log.

    With ``hasher``, a prompt logged as token ids gets its chained block ids (``hash_ids``).
    """
    aborted, access_failures = _first_pass(source)
    prompts: dict[str, _Ids | str | None] = {}  # details seen, Received not yet: id → ids or text
    text_only = 0  # requests counted from prompt text: no prefix structure
    pending: list[tuple[TraceRecord, str | None]] = []  # records waiting for their chains
    emitted = 0
    max_log_len: int | None = None  # from the last start-up banner
    id_lengths: dict[int, int] = {}  # prompt length (counted from ids) → how many
    for number, raw in source.iter_lines():
        if b"non-default args" in raw:
            banner = _MAX_LOG_LEN.search(raw.decode("utf-8", errors="replace"))
            max_log_len = None if banner is None else int(banner.group(1))
            continue
        if b"equest " not in raw:
            continue
        line = raw.decode("utf-8", errors="replace")
        details = _DETAILS.search(line)
        if details is not None:
            prompts[details.group(1)] = _prompt_from(line[details.end() :])
            continue
        received = _RECEIVED.search(line)
        if received is None:
            continue
        request_id = received.group(1)
        prompt = prompts.pop(request_id, None)
        inline = _prompt_from(line[received.end() :])  # older releases log the prompt on this line
        if inline is not None:
            prompt = inline
        max_match = _MAX_TOKENS.search(line)
        time_s = _time_s(line)
        if time_s is None:
            skips.skip("no timestamp in the log line prefix", source.name, number)
            continue
        if max_match is None or max_match.group(1) == "None":
            skips.skip("no max_tokens in the request: output length unknown", source.name, number)
            continue
        if prompt is None:
            skips.skip(NO_IDS_REASON, source.name, number)
            continue
        if max_log_len is not None and _cut(prompt, max_log_len):
            skips.skip(cut_reason(max_log_len), source.name, number)
            skips.note(full_length_note(max_log_len))
            continue
        ids_text = None
        if isinstance(prompt, str):
            if counter is None:
                skips.skip(NO_TOKEN_COUNTS, source.name, number)
                continue
            prompt_tokens = counter.count(prompt)
            text_only += 1
        else:
            prompt_tokens = prompt.tokens
            if max_log_len is None:
                id_lengths[prompt_tokens] = id_lengths.get(prompt_tokens, 0) + 1
            ids_text = prompt.text
        max_tokens = int(max_match.group(1))
        record = TraceRecord(
            id=request_id,
            arrival_s=time_s,
            prompt_tokens=prompt_tokens,
            output_tokens=max_tokens,
            max_tokens=max_tokens,
            ok=request_id not in aborted,
        )
        reason = bounds_reason(record)
        if reason is not None:
            skips.skip(reason, source.name, number)
            continue
        emitted += 1
        pending.append((record, ids_text))
        if len(pending) >= CHAIN_BATCH:
            yield from _chained(pending, hasher)
            pending = []
    yield from _chained(pending, hasher)
    if emitted:
        skips.note(OUTPUT_NOTE)
    if hasher is not None and text_only:
        skips.note(
            f"{source.name}: {text_only} requests logged their prompt as text, not token ids: they carry "
            "no prefix structure (log with VLLM_LOGGING_LEVEL=DEBUG for the ids)"
        )
    suspect = suspected_max_log_len(id_lengths)
    if suspect is not None:
        if hasher is not None:
            skips.truncated_requests += id_lengths[suspect]  # their chains cover the logged part only
        skips.note(
            f"{source.name}: {id_lengths[suspect]} of {sum(id_lengths.values())} prompts have exactly "
            f"{suspect} token ids, the longest in the log: was vLLM started with --max-log-len {suspect}? "
            "(the log holds no start-up 'non-default args' line to say) Cut prompts would be recorded "
            "too short; log full lengths by restarting vLLM without --max-log-len"
        )
    if access_failures:
        skips.note(
            f"{source.name}: the access log shows {access_failures} non-2xx responses "
            "(access lines carry no request id, so they are not matched to requests)"
        )


def _chained(
    pending: list[tuple[TraceRecord, str | None]], hasher: BlockHasher | None
) -> Iterator[TraceRecord]:
    """The records with their ``hash_ids`` (prompts logged as ids), chained together (vectorized)."""
    if hasher is None:
        yield from (record for record, _ in pending)
        return
    with_ids = [i for i, (_, text) in enumerate(pending) if text is not None]
    chains = dict(
        zip(with_ids, hasher.chain_token_texts([pending[i][1] or "" for i in with_ids]), strict=True)
    )
    for i, (record, _) in enumerate(pending):
        chain = chains.get(i)
        yield record if not chain else dataclasses.replace(record, hash_ids=chain)


def _cut(prompt: _Ids | str, max_log_len: int) -> bool:
    """True when the logged prompt (id count or text) is as long as vLLM's cut: it may be cut."""
    return (prompt.tokens if isinstance(prompt, _Ids) else len(prompt)) >= max_log_len


def suspected_max_log_len(id_lengths: dict[int, int]) -> int | None:
    """The longest prompt length when suspiciously many prompts share it (a cut without a banner)."""
    total = sum(id_lengths.values())
    if not id_lengths or total < SUSPECT_MIN_PROMPTS:
        return None
    longest = max(id_lengths)
    at_max = id_lengths[longest]
    if at_max >= max(3, SUSPECT_MIN_SHARE * total):
        return longest
    return None


def _first_pass(source: LogSource) -> tuple[set[str], int]:
    aborted: set[str] = set()
    failures = 0
    for _, raw in source.iter_lines():
        if b"Aborted request" in raw:
            match = _ABORTED.search(raw.rstrip())
            if match is not None:
                aborted.add(match.group(1).decode("utf-8", errors="replace"))
        elif b'HTTP/1.1" ' in raw:
            access = _ACCESS.search(raw)
            if access is not None and not access.group(1).startswith(b"2"):
                failures += 1
    return aborted, failures


def _prompt_from(segment: str) -> _Ids | str | None:
    """The prompt's token ids or text in ``segment``; ``None`` when neither is logged."""
    ids_at = segment.rfind("prompt_token_ids: [")
    if ids_at >= 0:
        rest = segment[ids_at + len("prompt_token_ids: [") :]
        body = rest[: rest.find("]")]
        return _Ids(0 if not body.strip() else body.count(",") + 1, body)
    if not segment.startswith("prompt: ") or segment[8:9] not in ("'", '"'):
        return None
    quote = segment[8]
    ends = [segment.find(quote + end, 9) for end in (", prompt_token_ids: ", ", params: ", ", prompt_embeds")]
    found = [e for e in ends if e > 0]
    if not found:
        return None
    try:
        text = ast.literal_eval(segment[8 : min(found) + 1])
    except (ValueError, SyntaxError):
        return None
    return text if isinstance(text, str) else None


def _time_s(line: str) -> float | None:
    match = _TIME.search(line)
    if match is None:
        return None
    month, day, hour, minute, second = (int(g) for g in match.groups())
    try:
        # The log has no year; 2000 is a leap year, so 02-29 parses. Only differences matter.
        return datetime(2000, month, day, hour, minute, second, tzinfo=UTC).timestamp()
    except ValueError:
        return None


def is_vllm_log(lines: list[bytes]) -> bool:
    """True when any of a log's first lines carries vLLM's log prefix (``detect_format``'s rule)."""
    return any(LOG_PREFIX.match(line) for line in lines)
