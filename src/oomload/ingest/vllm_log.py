"""vLLM server logs written with request logging (``--enable-log-requests``).

Lines used (see reference vllm-facts §2; prefix ``(APIServer pid=N) LEVEL MM-DD HH:MM:SS [file:line]``,
or ``LEVEL MM-DD HH:MM:SS file:line]`` in older releases):

- ``Request <id> details: prompt: …, prompt_token_ids: [...]`` (DEBUG, vLLM ≥ 0.10 with
  ``VLLM_LOGGING_LEVEL=DEBUG``) — the prompt length is the number of token ids;
- ``Received request <id>: params: SamplingParams(…max_tokens=N…)`` (INFO) — one request; older
  releases put ``prompt: …, params: …, prompt_token_ids: [...]`` all on this line, so
  ``max_tokens`` is looked for only inside the line's last ``SamplingParams(`` (the prompt's text
  before it may hold ``max_tokens=5``);
- ``Aborted request <id>`` (before 0.10) or ``Aborted request(s) <id>[,<id>…].`` (the V1 engine,
  ``v1/engine/async_llm.py``) — each request named is kept with ``ok=false`` (found in a first
  pass, so the file is read twice; vLLM logs are files on disk);
- uvicorn access lines (``"POST /v1/completions HTTP/1.1" 200 OK``) carry no request id; their
  non-2xx count is reported as a note.

vLLM writes no per-request completion count, so **the output length is the request's ``max_tokens``**
— exact for replays made with ``ignore_eos`` / ``min_tokens``, an upper bound otherwise; the trace
header says so. A request without ``max_tokens`` (or without its prompt ids and no ``--tokenizer``
for its prompt text) is skipped with the reason. The log's timestamps have no year and 1 s
resolution; arrival times are therefore to the second, and a year is added where the month steps
back (a log crossing New Year: ``_Years``).

**Prompts cut by ``--max-log-len N``.** vLLM cuts ``prompt_token_ids`` (and a prompt's text) in its
request log to ``N`` ids (characters), with no marker on the line; only the start-up line
``non-default args: {… 'max_log_len': N …}`` names the setting. A cut length is never recorded as a
prompt length: after such a banner (each server start in the file sets it anew), a prompt logged with
exactly ``N`` ids — a 900-token prompt, or one of exactly ``N`` tokens: the two look the same — is
skipped with the reason ``prompt ids cut at --max-log-len N``, and a note says how to log full
lengths. Without the banner (a log that starts after it), when at least ``SUSPECT_MIN_PROMPTS``
prompts and ``SUSPECT_MIN_SHARE`` of them sit at one identical maximum length, a note warns that the
log was probably written with ``--max-log-len`` at that length.

**Reading.** Lines are taken as bytes; the markers are looked for in a line's first KB only (the log
prefix and the start of the message), never in a 100 KB id list. The requests are gathered into
batches of about 2 MB of id lists (``_Rows``), whose ids are counted — and, with a hasher, chained —
for the whole batch at once (``oomload.trace.blockhash``): a prompt's length is known, and its token bound
checked, when its batch is done (at once under ``--strict``, so that the first fault is the first
line). The first pass finds aborted requests and failed access lines with ``bytes.find`` over
whole chunks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from oomload.ingest.columns import make_batch
from oomload.ingest.skips import NO_TOKEN_COUNTS, SkipLog
from oomload.ingest.source import LogSource
from oomload.ingest.tokens import TokenCounter
from oomload.trace.model import MAX_TOKENS, tokens_bound_reason, values_bounds_reason
from oomload.trace.prefix import BlockHasher, count_token_texts

LOG_PREFIX = re.compile(
    rb"^(?:\(\w+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +\d\d-\d\d \d\d:\d\d:\d\d "
)
_TIME = re.compile(rb"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
_DETAILS = re.compile(rb"Request (\S+) details: ")
_RECEIVED = re.compile(rb"Received request (\S+?): ")
_ABORTED = re.compile(rb"Aborted request(?:\(s\))? (\S+?)\.?$")  # V1 (0.10+): ``request(s) a,b.``
_MAX_TOKENS = re.compile(rb"\bmax_tokens=(\d+|None)")  # looked for from ``_PARAMS`` on
_PARAMS = b"SamplingParams("
_ACCESS = re.compile(rb'"(?:POST|GET) [^"]*" (\d{3})')
_MAX_LOG_LEN = re.compile(rb"'max_log_len': (\d+)")
_IDS = b"prompt_token_ids: ["
_NO_TEXT_IDS = b"prompt: None, " + _IDS  # vLLM ≥ 0.10 with ids only: the ids follow at once
_HEAD_BYTES = 1024  # a line's log prefix and the start of its message
SUSPECT_MIN_PROMPTS = 5
BATCH_ROWS = 1024  # requests per batch: their chains are computed together (vectorized)
BATCH_ID_BYTES = 2 << 20  # … and fewer when their id lists pass this many bytes (the arrays stay in cache)
SUSPECT_MIN_SHARE = 0.05
YEAR_S = 366 * 86400  # a year of the log's calendar (``_Years``)
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
    """A prompt logged as token ids, as the log wrote them (``"1, 2, 3"``)."""

    text: bytes

    def tokens(self) -> int:
        """How many ids: its commas and one (none for a blank list)."""
        return self.text.count(b",") + 1 if self.text.strip() else 0


@dataclass
class _Rows:
    """The requests of the batch being gathered, as columns.

    A prompt logged as ids is counted with the whole batch (``count_token_texts``, or the chain's own
    count), not line by line: ``prompt_tokens`` is ``None`` for it until then. Its bound, and the
    prompt-length tally behind the ``--max-log-len`` warning, are checked then too, in line order.
    """

    lines: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)
    prompt_tokens: list[int | None] = field(default_factory=list)
    max_tokens: list[int] = field(default_factory=list)
    ok: list[bool] = field(default_factory=list)
    id_texts: list[bytes | None] = field(default_factory=list)  # None: prompt counted from its text
    tallied: list[bool] = field(default_factory=list)  # its id count goes into the length tally
    id_bytes: int = 0

    def full(self) -> bool:
        return len(self.ids) >= BATCH_ROWS or self.id_bytes >= BATCH_ID_BYTES

    def batch(
        self, hasher: BlockHasher | None, skips: SkipLog, name: str, id_lengths: dict[int, int]
    ) -> pa.Table | None:
        """The gathered requests as a batch (``None`` when none is left); with ``hasher``, each prompt
        logged as ids gets its chain."""
        texts = [b"" if t is None else t for t in self.id_texts]
        chains = None
        if hasher is not None:
            flat, offsets, counts = hasher.token_text_chains(texts)
            chains = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat))
        else:
            counts = count_token_texts(texts)
        logged = np.array([t is not None for t in self.id_texts])
        prompt_tokens = np.where(logged, counts, np.array([t or 0 for t in self.prompt_tokens]))
        tally = logged & np.array(self.tallied)
        for length, n in zip(*np.unique(counts[tally], return_counts=True), strict=True):
            id_lengths[int(length)] = id_lengths.get(int(length), 0) + int(n)
        over = prompt_tokens > MAX_TOKENS
        for row in np.flatnonzero(over).tolist():
            skips.skip(tokens_bound_reason("prompt_tokens"), name, self.lines[row])
        columns: dict[str, object] = {
            "id": self.ids,
            "time_s": self.times_s,
            "prompt_tokens": prompt_tokens,
            "output_tokens": self.max_tokens,
            "max_tokens": self.max_tokens,
        }
        if not all(self.ok):
            columns["ok"] = self.ok
        if chains is not None:
            columns["hash_ids"] = chains
        table = make_batch(len(self.ids), **columns)
        if over.any():
            table = table.filter(pa.array(~over))
        return table if table.num_rows else None


def read_vllm_batches(
    source: LogSource, skips: SkipLog, counter: TokenCounter | None, hasher: BlockHasher | None = None
) -> Iterator[pa.Table]:
    """Batches (``time_s`` = log time in seconds, year-less) of the requests of a vLLM server log.

    With ``hasher``, a prompt logged as token ids gets its chained block ids (``hash_ids``).
    """
    aborted, access_failures = _first_pass(source)
    prompts: dict[bytes, _Ids | str | None] = {}  # details seen, Received not yet: id → ids or text
    text_only = 0  # requests counted from prompt text: no prefix structure
    rows = _Rows()
    years = _Years()
    emitted = 0
    max_log_len: int | None = None  # from the last start-up banner
    id_lengths: dict[int, int] = {}  # prompt length (counted from ids) → how many
    for number, line in source.iter_lines():
        head = line[:_HEAD_BYTES]  # the markers open the message: no need to scan a 100 KB id list
        if b"non-default args" in head:
            banner = _MAX_LOG_LEN.search(line)
            max_log_len = None if banner is None else int(banner.group(1))
            continue
        if b"equest " not in head:
            continue
        details = _DETAILS.search(line)
        if details is not None:
            prompts[details.group(1)] = _prompt_from(line, details.end())
            continue
        received = _RECEIVED.search(line)
        if received is None:
            continue
        request_id = received.group(1)
        prompt = prompts.pop(request_id, None)
        inline = _prompt_from(line, received.end())  # older releases log the prompt on this line
        if inline is not None:
            prompt = inline
        params_at = line.rfind(_PARAMS)  # the last: a prompt's text (before it) may hold the words
        max_match = None if params_at < 0 else _MAX_TOKENS.search(line, params_at)
        time_s = years.time_s(line)
        if time_s is None:
            skips.skip("no timestamp in the log line prefix", source.name, number)
            continue
        if max_match is None or max_match.group(1) == b"None":
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
        prompt_tokens: int | None = None  # ids: counted with the batch (_Rows), at once under --strict
        if isinstance(prompt, str):
            if counter is None:
                skips.skip(NO_TOKEN_COUNTS, source.name, number)
                continue
            prompt_tokens = counter.count(prompt)
            text_only += 1
        else:
            ids_text = prompt.text
            if skips.strict:  # the first fault stops the build: find it in line order
                prompt_tokens = prompt.tokens()
        max_tokens = int(max_match.group(1))
        name = request_id.decode("utf-8", errors="replace")
        reason = values_bounds_reason(
            time_s=time_s,
            prompt_tokens=prompt_tokens,
            output_tokens=max_tokens,
            max_tokens=max_tokens,
            texts={"id": name},
        )
        if reason is not None:
            skips.skip(reason, source.name, number)
            continue
        rows.lines.append(number)
        rows.ids.append(name)
        rows.times_s.append(time_s)
        rows.prompt_tokens.append(prompt_tokens)
        rows.max_tokens.append(max_tokens)
        rows.ok.append(name not in aborted)
        rows.id_texts.append(ids_text)
        rows.tallied.append(max_log_len is None)
        rows.id_bytes += 0 if ids_text is None else len(ids_text)
        if rows.full():
            batch = rows.batch(hasher, skips, source.name, id_lengths)
            rows = _Rows()
            if batch is not None:
                emitted += batch.num_rows
                yield batch
    if rows.ids:
        batch = rows.batch(hasher, skips, source.name, id_lengths)
        if batch is not None:
            emitted += batch.num_rows
            yield batch
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


def _cut(prompt: _Ids | str, max_log_len: int) -> bool:
    """True when the logged prompt (id count or text) is as long as vLLM's cut: it may be cut."""
    return (prompt.tokens() if isinstance(prompt, _Ids) else len(prompt)) >= max_log_len


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
    """The ids of aborted requests, and the count of non-2xx access lines: only the lines that hold
    either marker are looked at, found with ``bytes.find`` over whole chunks (no per-line work)."""
    aborted: set[str] = set()
    failures = 0
    for _, chunk in source.iter_chunks():
        for line in _lines_with(chunk, (b"Aborted request", b'HTTP/1.1" ')):
            if b"Aborted request" in line:
                match = _ABORTED.search(line.rstrip())
                if match is not None:
                    ids = match.group(1).split(b",")
                    aborted.update(i.decode("utf-8", errors="replace") for i in ids if i)
            else:
                access = _ACCESS.search(line)
                if access is not None and not access.group(1).startswith(b"2"):
                    failures += 1
    return aborted, failures


def _lines_with(chunk: bytes, markers: tuple[bytes, ...]) -> list[bytes]:
    """The lines of ``chunk`` (whole lines) that hold any of ``markers``, each once, in order."""
    starts: set[int] = set()
    for marker in markers:
        at = chunk.find(marker)
        while at >= 0:
            start = chunk.rfind(b"\n", 0, at) + 1
            starts.add(start)
            end = chunk.find(b"\n", at)
            at = -1 if end < 0 else chunk.find(marker, end)
    lines = []
    for start in sorted(starts):
        end = chunk.find(b"\n", start)
        lines.append(chunk[start : len(chunk) if end < 0 else end].rstrip(b"\r"))
    return lines


def _prompt_from(line: bytes, at: int) -> _Ids | str | None:
    """The prompt's token ids or text in ``line`` from ``at`` on; ``None`` when neither is logged."""
    # the last marker: a prompt's text (before its ids) may hold the words; the usual line has none
    ids_at = at + len(_NO_TEXT_IDS) - len(_IDS) if line.startswith(_NO_TEXT_IDS, at) else line.rfind(_IDS, at)
    if ids_at >= 0:
        start = ids_at + len(_IDS)
        end = line.find(b"]", start)
        body = line[start : len(line) if end < 0 else end]
        return _Ids(body)
    if not line.startswith(b"prompt: ", at) or line[at + 8 : at + 9] not in (b"'", b'"'):
        return None
    segment = line[at:].decode("utf-8", errors="replace")
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


@dataclass
class _Years:
    """The year of each year-less stamp, read in file order: the year that puts its month nearest
    the line before's (a step back of 6 months or more is the next year: ``12-31`` → ``01-01``; a
    step forward of 7 or more, a line of the year before written late). So a log may cross New
    Year (or several) as long as no two requests in a row are half a year apart.

    The calendar is 2000's (a leap year, so ``02-29`` parses) and each year counts 366 days: only
    differences matter, and the same date a year later is then always ``YEAR_S`` later."""

    year: int = 0
    month: int = 0  # the month of the line before (0: none yet)

    def time_s(self, line: bytes) -> float | None:
        match = _TIME.search(line)
        if match is None:
            return None
        month, day, hour, minute, second = (int(g) for g in match.groups())
        try:
            in_2000_s = datetime(2000, month, day, hour, minute, second, tzinfo=UTC).timestamp()
        except ValueError:
            return None
        if self.month and month - self.month <= -6:
            self.year += 1
        elif self.month and month - self.month >= 7:
            self.year -= 1
        self.month = month
        return in_2000_s + self.year * YEAR_S


def is_vllm_log(lines: list[bytes]) -> bool:
    """True when any of a log's first lines carries vLLM's log prefix (``detect_format``'s rule)."""
    return any(LOG_PREFIX.match(line) for line in lines)
