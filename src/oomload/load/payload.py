"""Request bodies with exact lengths, and the order in which trace requests are replayed (pure).

``/v1/completions`` (default)
    The prompt is a list of token ids, so its length is exact without a tokenizer: ``P`` ids drawn
    uniformly from ``[token_id_low, token_id_high)`` (default 100..2000: clear of the low special ids
    every tokenizer uses and inside any vocabulary of ≥ 2,048 entries).

    *Production shape* (``prefix_sharing``, the default): the trace's ``hash_ids`` become shared
    blocks. Each id maps to ``prefix_block_tokens`` ids (the trace header's ``prefix.block_tokens``)
    drawn by a generator seeded with ``(seed, prompt_salt, pass, id)`` only — so the same id gives the
    same tokens in every step, every ``--processes`` worker and every remote worker of the run, with no
    state shared between them. Only full blocks are filled (a last id covering a partial block is left to
    the random suffix), so the prompt has exactly the trace's token count. The rest of the prompt is
    random, drawn by a generator seeded with ``(seed, prompt_salt, sequence number)``: fresh for every
    send. ``prompt_salt`` is the run's own (``ReplayConfig.prompt_salt``: random, drawn once per run and
    sent to its workers), so a replay repeated against a long-lived server does not find the prompts of
    the last one in its prefix cache; lengths and order do not depend on it.

    ``pass`` = sequence number ÷ the requests in the replayed trace (``trace_requests``; in sample order
    there is one pass, see ``RequestOrder``): the k-th time through the trace
    the ids map to new tokens. So within one pass a request shares exactly what the trace says it
    shares (a system prompt with every other request), while a request replayed again in a later pass
    does not hit blocks left in the server's cache by its own earlier copy — production sees each
    request once; a replay that cycles a short trace would otherwise warm the cache beyond it (vLLM
    #52884). A shared prefix misses once per pass, as after a cold start.

    *Worst case* (``--distinct-prompts``): no id is used, every prompt is random from token 0, so
    prefix caching cannot hide any pressure.

    Output: ``max_tokens = min_tokens = O`` with ``ignore_eos`` (vLLM's extras) unless exact output is
    switched off; ``stream_options.include_usage`` so the server's ``usage`` can be checked.

``/v1/chat/completions``
    The text comes from a ``Calibrator`` that finds, through the server's ``/tokenize`` (messages form,
    so the chat template is counted), a word sequence whose token count is exactly ``P``; it is cached
    per length. Each request shuffles the words (same multiset, so the same count for tokenizers that
    split on spaces, but a different prefix). Chat replays are therefore always the worst case:
    calibrated text cannot carry the trace's blocks.

Usage to expect. ``PreparedRequest.usage_prompt_tokens`` is the prompt count the server's
``usage.prompt_tokens`` must report (``oomload.load.classify`` holds every answer to it): the ids sent
on ``/v1/completions``, exactly; on the chat API the count the calibration measured, within
``CHAT_SLACK_TOKENS`` — a shuffle changes which word starts the text, and a byte-level BPE counts the
first word (no space before it) one token apart: −1…+1 over 200 shuffles of every length on the tiny
Llama's tokenizer (``realvllm.tinymodel``).

Bodies are built as bytes by hand: ``json.dumps`` of a 8k-id list costs more than the join below.

Bounded memory. A prompt longer than the server's ``max_model_len`` (``max_model_len`` in the options,
from ``/v1/models``) is sent as ``max_model_len + 1`` tokens: the server refuses it as a context
overflow exactly as it would refuse the trace's length, and the result row keeps the length the trace
asked for — so the verdict counts the same overflow while no token list longer than the server's
window is ever built (a trace row of 10M tokens costs what a row of ``max_model_len + 1`` does). With
no known limit the trace's own bound (``oomload.trace.model.MAX_TOKENS``) is the cap.
"""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from oomload.errors import ConfigError, EndpointError
from oomload.trace.model import MAX_TOKENS, TraceRecord, replayed

Api = Literal["completions", "chat"]
API_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book eye "
    "job word business issue side kind head house service friend father power hour game line end "
    "member law car city community name president team minute idea kid body information back parent "
    "face others level office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force "
)
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split(" ")[:-1])
CHAT_SLACK_TOKENS = 4  # a shuffled chat prompt's count may differ this much from the calibrated one


@dataclass(frozen=True, slots=True)
class PayloadOptions:
    """How request bodies are built."""

    api: Api = "completions"
    model: str = ""
    stream: bool = True
    exact_output: bool = True
    prefix_sharing: bool = True  # production shape; False: distinct prompts (the worst case)
    prefix_block_tokens: int = 512  # tokens per hash id: the trace header's prefix.block_tokens
    token_id_low: int = 100
    token_id_high: int = 2000
    seed: int = 0
    prompt_salt: int = 0  # the run's own: its prompts are not the last run's (module docstring)
    max_model_len: int | None = None  # the server's window: longer prompts are sent one token over it

    def __post_init__(self) -> None:
        if self.api not in API_PATHS:
            raise ConfigError(f"unknown API {self.api!r}; allowed: completions, chat")
        if not 0 <= self.token_id_low < self.token_id_high:
            raise ConfigError(
                f"token id range {self.token_id_low}:{self.token_id_high} must satisfy 0 ≤ LOW < HIGH"
            )
        if self.prefix_block_tokens < 1:
            raise ConfigError(f"prefix block size must be ≥ 1 token, got {self.prefix_block_tokens}")

    @property
    def path(self) -> str:
        return API_PATHS[self.api]

    def sequence_seed(self, sequence: int) -> int:
        """The seed of the ``sequence``-th request's random tokens (``seed``, ``prompt_salt``)."""
        return (self.prompt_salt << 64) + self.seed * 1_000_003 + sequence

    def sent_prompt_tokens(self, prompt_tokens: int) -> int:
        """The prompt length actually sent for a trace's ``prompt_tokens`` (module docstring)."""
        cap = MAX_TOKENS if self.max_model_len is None else min(self.max_model_len + 1, MAX_TOKENS)
        return min(prompt_tokens, cap)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One request ready to send: its id, endpoint path, JSON body, the lengths it asks for (the
    trace's), and the prompt count the server's usage must report (module docstring, "Usage to
    expect"; ``None``: not known)."""

    request_id: str
    path: str
    body: bytes
    prompt_tokens: int
    output_tokens: int
    usage_prompt_tokens: int | None = None
    usage_slack_tokens: int = 0


def parse_token_id_range(text: str) -> tuple[int, int]:
    """Parse ``LOW:HIGH`` (half-open) for token-id prompts."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high)
    except ValueError as err:
        raise ConfigError(f"token id range {text!r} must look like LOW:HIGH, e.g. 100:2000") from err
    if not sep or not 0 <= lo < hi:
        raise ConfigError(f"token id range {text!r} must look like LOW:HIGH with 0 ≤ LOW < HIGH")
    return lo, hi


def asked_lengths(record: TraceRecord) -> tuple[int, int]:
    """Prompt and output tokens to ask for: the trace's, at least 1 each (servers reject 0)."""
    return max(1, record.prompt_tokens), max(1, record.output_tokens)


class CompletionPayloads:
    """Builds ``/v1/completions`` bodies with token-id prompts of exact length."""

    def __init__(self, options: PayloadOptions, *, trace_requests: int = 0) -> None:
        self.options = options
        self.trace_requests = trace_requests  # requests per pass through the trace (0: one pass)
        self._blocks: dict[tuple[int, int], str] = {}
        self._tail = _body_tail(options)
        self._head = b'{"model":' + json.dumps(options.model).encode() + b',"prompt":['

    def build(self, record: TraceRecord, sequence: int) -> PreparedRequest:
        """The body for the ``sequence``-th request sent, replaying ``record``."""
        prompt_tokens, output_tokens = asked_lengths(record)
        sent_tokens = self.options.sent_prompt_tokens(prompt_tokens)
        rng = random.Random(self.options.sequence_seed(sequence))
        parts: list[str] = []
        filled = 0
        if self.options.prefix_sharing and record.hash_ids:
            block = self.options.prefix_block_tokens
            trace_pass = trace_pass_of(sequence, self.trace_requests)
            for hash_id in record.hash_ids:
                if filled + block > sent_tokens:
                    break
                parts.append(self._block(trace_pass, hash_id))
                filled += block
        rest = sent_tokens - filled
        if rest:
            lo, hi = self.options.token_id_low, self.options.token_id_high
            parts.append(",".join(map(str, _draw_ids(rng, lo, hi, rest))))
        body = self._head + ",".join(parts).encode() + b"]" + self._tail(output_tokens)
        return PreparedRequest(
            f"{record.id}#{sequence}", self.options.path, body, prompt_tokens, output_tokens, sent_tokens
        )

    def _block(self, trace_pass: int, hash_id: int) -> str:
        key = (trace_pass, hash_id)
        text = self._blocks.get(key)
        if text is None:
            salt = self.options.prompt_salt
            rng = random.Random(
                f"block:{self.options.seed}:{trace_pass}:{hash_id}" + (f":{salt}" if salt else "")
            )
            lo, hi = self.options.token_id_low, self.options.token_id_high
            text = ",".join(map(str, _draw_ids(rng, lo, hi, self.options.prefix_block_tokens)))
            if len(self._blocks) >= 100_000:
                self._blocks.clear()  # a bounded memo: an id's tokens are recomputed identically
            self._blocks[key] = text
        return text


def trace_pass_of(sequence: int, trace_requests: int) -> int:
    """Which pass through the trace the ``sequence``-th request belongs to (0 with no pass length)."""
    return sequence // trace_requests if trace_requests > 0 else 0


def _draw_ids(rng: random.Random, low: int, high: int, count: int) -> list[int]:
    span = high - low
    rand = rng.random
    return [low + int(rand() * span) for _ in range(count)]


def _body_tail(options: PayloadOptions) -> Callable[[int], bytes]:
    """The fixed end of every body after the prompt, parameterized by the output length."""
    stream = (
        b',"stream":true,"stream_options":{"include_usage":true}' if options.stream else b',"stream":false'
    )

    def tail(output_tokens: int) -> bytes:
        exact = b',"min_tokens":%d,"ignore_eos":true' % output_tokens if options.exact_output else b""
        return b',"max_tokens":%d%s%s,"temperature":0}' % (output_tokens, exact, stream)

    return tail


class TokenizeError(EndpointError):
    """A chat prompt's ``count_tokens`` failed (``oomload.load.preflight.tokenize_counter``): ``short``
    says how in a few words, ``refused`` when nothing answered."""

    def __init__(self, message: str, short: str, *, refused: bool) -> None:
        super().__init__(message)
        self.short = short
        self.refused = refused


class PromptBuildError(EndpointError):
    """A chat prompt could not be calibrated (``/tokenize`` failed mid-run): ``request`` is the one that
    was to be sent, with no body; ``tokenize`` says how ``/tokenize`` failed."""

    def __init__(self, request: PreparedRequest, tokenize: TokenizeError) -> None:
        super().__init__(f"{request.request_id}: /tokenize {tokenize.short}")
        self.request = request
        self.tokenize = tokenize


class ChatPayloads:
    """Builds ``/v1/chat/completions`` bodies whose prompt text is calibrated to an exact token count.
    A ``count_tokens`` that raises ``TokenizeError`` makes ``build`` raise ``PromptBuildError``."""

    def __init__(self, options: PayloadOptions, count_tokens: Callable[[str], int]) -> None:
        self.options = options
        self.calibrator = Calibrator(count_tokens, seed=options.seed)
        self._tail = _body_tail(options)
        self._head = b'{"model":' + json.dumps(options.model).encode() + b',"messages":'

    def build(self, record: TraceRecord, sequence: int) -> PreparedRequest:
        prompt_tokens, output_tokens = asked_lengths(record)
        request_id = f"{record.id}#{sequence}"
        try:
            calibrated, counted = self.calibrator.calibrated(self.options.sent_prompt_tokens(prompt_tokens))
        except TokenizeError as err:
            unbuilt = PreparedRequest(request_id, self.options.path, b"", prompt_tokens, output_tokens)
            raise PromptBuildError(unbuilt, err) from err
        words = list(calibrated)
        random.Random(self.options.sequence_seed(sequence)).shuffle(words)
        messages = json.dumps([{"role": "user", "content": " ".join(words)}]).encode()
        body = self._head + messages + self._tail(output_tokens)
        return PreparedRequest(
            request_id,
            self.options.path,
            body,
            prompt_tokens,
            output_tokens,
            counted,
            CHAT_SLACK_TOKENS,
        )


class Calibrator:
    """Finds, per prompt length, a word list whose chat prompt counts exactly that many tokens.

    ``count_tokens(text)`` returns the server's count for a one-message chat with that text (chat
    template included). The words are always the first ``n`` of one shuffled pool, cycled, so the count
    is a function of ``n`` alone that grows with it: the calibration looks for the largest ``n`` whose
    count does not exceed the target (in at most ``max_probes`` probes), then appends short fillers
    ("a", "I", "x", "1"), each once and only when it does not overshoot, until the count is exact (the
    nearest count below is kept; a template longer than the target gives no words at all).

    Every count measured is kept (``n`` → count), for every length, so a new length starts from the
    nearest counts already known on both sides; between them the next ``n`` to probe is interpolated
    from those two counts (the secant on a count that grows almost linearly) for ``SECANT_TRIES``
    probes, then bisected, so a count far from linear costs at most a bisection more. Measured on the
    first 1,500 prompt lengths of the Azure code trace (877 distinct) with the tiny Llama's tokenizer:
    1.8 probes a length, against 10.7 for a bisection per length; 1,491 of the 1,500 exact, against 810
    when fillers were appended whether or not they overshot (the 9 others are shorter than the chat
    template). ``calibrated`` returns the words with their measured count: the server's usage is held
    to it.
    """

    FILLERS = ("a", "I", "x", "1")
    SECANT_TRIES = 3  # interpolated probes per length before bisection takes over

    def __init__(self, count_tokens: Callable[[str], int], *, seed: int = 0, max_probes: int = 24) -> None:
        self._count = count_tokens
        self._cache: dict[int, tuple[tuple[str, ...], int]] = {}
        self._rng = random.Random(seed)
        self._pool = list(WORDS)
        self._rng.shuffle(self._pool)
        self.max_probes = max_probes
        self._known_n: list[int] = []  # word counts measured, ascending …
        self._known_tokens: list[int] = []  # … and their token counts (non-decreasing with them)
        self.probes = 0  # counts asked of the server, over every length
        self._filler_tokens: dict[str, int] = {}  # what each filler added when last measured

    def calibrated(self, prompt_tokens: int) -> tuple[tuple[str, ...], int]:
        """The words for ``prompt_tokens`` and the count the server gave them (cached per length)."""
        cached = self._cache.get(prompt_tokens)
        if cached is None:
            cached = self._calibrate(prompt_tokens)
            self._cache[prompt_tokens] = cached
        return cached

    def pool_words(self, n: int) -> list[str]:
        """The first ``n`` words of the shuffled pool, cycled: what ``n`` means in a calibration."""
        pool = self._pool
        return [pool[i % len(pool)] for i in range(n)]

    def _measure(self, words: Sequence[str]) -> int:
        self.probes += 1
        return self._count(" ".join(words))

    def _tokens_of(self, n: int) -> int:
        """The count of the first ``n`` pool words, measured once and kept.

        Users share one calibrator and ``count_tokens`` waits on the network, so other users' counts
        may be kept while this one is measured: the place to keep it is found after."""
        i = bisect.bisect_left(self._known_n, n)
        if i < len(self._known_n) and self._known_n[i] == n:
            return self._known_tokens[i]
        tokens = self._measure(self.pool_words(n))
        i = bisect.bisect_left(self._known_n, n)
        if i == len(self._known_n) or self._known_n[i] != n:
            self._known_n.insert(i, n)
            self._known_tokens.insert(i, tokens)
        return tokens

    def _bracket(self, target: int) -> tuple[int, int]:
        """``(lo, hi)``: the largest known ``n`` whose count fits the target (0 when none), and one less
        than the smallest known ``n`` whose count exceeds it (at most ``target``: a word costs ≥ 1)."""
        i = bisect.bisect_right(self._known_tokens, target)
        lo = self._known_n[i - 1] if i > 0 else 0
        hi = self._known_n[i] - 1 if i < len(self._known_n) else max(1, target)
        return lo, max(lo, hi)

    def _guess(self, lo: int, hi: int, target: int, bisect_now: bool) -> int:
        """The next ``n`` in ``(lo, hi]``: interpolated between the counts known at ``lo`` and
        ``hi + 1``, or the midpoint."""
        mid = (lo + hi + 1) // 2
        if bisect_now:
            return mid
        i = bisect.bisect_left(self._known_n, lo)
        j = bisect.bisect_left(self._known_n, hi + 1)
        known_lo = i < len(self._known_n) and self._known_n[i] == lo
        known_hi = j < len(self._known_n) and self._known_n[j] == hi + 1
        if not (known_lo and known_hi) or self._known_tokens[j] <= self._known_tokens[i]:
            return mid
        per_word = (self._known_tokens[j] - self._known_tokens[i]) / (hi + 1 - lo)
        guess = lo + int((target - self._known_tokens[i]) / per_word)
        return min(hi, max(lo + 1, guess))

    def _calibrate(self, target: int) -> tuple[tuple[str, ...], int]:
        lo, hi = self._bracket(target)
        tries = 0  # this length's own (other users' probes are not its budget)
        while lo < hi and tries < self.max_probes:  # largest n whose count fits
            n = self._guess(lo, hi, target, bisect_now=tries >= self.SECANT_TRIES)
            tries += 1
            tokens = self._tokens_of(n)
            if tokens == target:  # one word more costs at least one token more
                lo = hi = n
            elif tokens < target:
                lo = n
            else:
                hi = n - 1
        words, count = self.pool_words(lo), self._tokens_of(lo)
        for filler in self.FILLERS:  # each at most once, when its cost (as last measured) fits the gap
            if count >= target:
                break
            if self._filler_tokens.get(filler, 1) > target - count:
                continue
            longer = self._measure([*words, filler])
            self._filler_tokens[filler] = longer - count
            if longer <= target:
                words, count = [*words, filler], longer
        return tuple(words), count


class RequestOrder:
    """Which trace request comes next: in trace order (cycling) or sampled with replacement.

    ``fit_within`` (``--only-fitting``: the server's ``max_model_len``) keeps only the requests that fit
    it (``TraceRecord.fits``); ``tail_percentile`` then keeps only requests whose total length (prompt +
    output) is at or above that nearest-rank percentile, so KV exhaustion is reached with far fewer
    requests (``trace.model.replayed``: the selection the run's odds and arithmetic draw from too).

    Conversations. Records that name a ``session`` form one *unit*: the session's turns in ``turn``
    order (trace order where turns are missing), placed where its first turn is; so do the turns of a
    conversation found from the chains of records without a session (``conversation_units``: a
    gateway or vLLM log's turns, whose chains hold the history); every other record is a unit of its
    own. ``next_unit`` hands out whole units, so one user sends a conversation's turns
    one after the other (each after the previous one has ended, as a chat client does). A request's
    sequence number is ``pass × N + its position`` in the replayed records (N of them), so it is
    unique across the run and its pass through the trace is ``sequence // N`` (``trace_pass_of``).
    Trace order: unit ``u`` of the run (``u = offset + k × stride`` for worker ``offset`` of
    ``stride``) is unit ``u mod U`` of pass ``u // U``. Sample order draws units with replacement; the
    ``d``-th draw's requests get sequence numbers ``d × N + position`` (unique), and its ids keep their
    tokens for the whole run (one pass: the payload is built with ``trace_requests = 0``) — a request
    drawn twice is a repeat by design, and hits its earlier copy as a repeated request would. ``next``
    hands out single requests as before (the open loop, which replays the trace's arrival times once).
    """

    def __init__(
        self,
        records: Sequence[TraceRecord],
        *,
        mode: Literal["trace", "sample"] = "trace",
        seed: int = 0,
        tail_percentile: float | None = None,
        fit_within: int | None = None,
        offset: int = 0,
        stride: int = 1,
        block_tokens: int | None = None,
    ) -> None:
        if not records:
            raise ConfigError("the trace holds no requests to replay")
        if mode not in ("trace", "sample"):
            raise ConfigError(f"unknown order {mode!r}; allowed: trace, sample")
        if tail_percentile is not None and not 0.0 <= tail_percentile < 100.0:
            raise ConfigError(f"tail percentile must be within [0, 100), got {tail_percentile}")
        only_fitting = fit_within is not None
        chosen = replayed(records, fit_within, only_fitting=only_fitting, tail_percentile=tail_percentile)
        if not chosen:  # a tail of some requests is never empty: none fits
            raise ConfigError(
                f"none of the trace's {len(records)} requests fits the server's max_model_len {fit_within}"
            )
        self.records = chosen
        self.mode = mode
        self._rng = random.Random(seed * 7919 + offset)
        self._next = 0
        self._next_unit = 0
        self.offset, self.stride = offset, max(1, stride)
        self.units = conversation_units(chosen, block_tokens)

    @property
    def pass_length(self) -> int:
        """Requests per pass through the trace for the payload's ids (0: one pass, in sample order)."""
        return len(self.records) if self.mode == "trace" else 0

    @property
    def sent(self) -> int:
        """How many requests were handed out so far by ``next``."""
        return self._next

    def next(self) -> tuple[TraceRecord, int]:
        """The next record and its sequence number (0, 1, 2, … over the whole run; with several
        worker processes, worker ``k`` of ``n`` takes sequence numbers ``k, k + n, k + 2n, …``)."""
        sequence = self.offset + self._next * self.stride
        self._next += 1
        if self.mode == "sample":
            return self.records[self._rng.randrange(len(self.records))], sequence
        return self.records[sequence % len(self.records)], sequence

    def next_unit(self) -> list[tuple[TraceRecord, int]]:
        """The next conversation (or single request): its records in turn order, with sequence numbers."""
        draw = self.offset + self._next_unit * self.stride
        self._next_unit += 1
        if self.mode == "sample":
            unit, base_index = self.units[self._rng.randrange(len(self.units))], draw
        else:
            unit, base_index = self.units[draw % len(self.units)], draw // len(self.units)
        base = base_index * len(self.records)
        return [(self.records[p], base + p) for p in unit]


def conversation_units(
    records: Sequence[TraceRecord], block_tokens: int | None = None
) -> list[tuple[int, ...]]:
    """Positions of ``records`` grouped into units, each where its first turn is: a session's turns in
    turn order; the turns found from the chains of records without a session, in trace order (a
    request whose chain starts with an earlier request's whole chain and goes on past it is that
    request's next turn — the chain's last id is looked up at each depth of the new one but its own
    last, longest first; a request with the same chain is a repeat, not a turn — and each turn is
    continued at most once, so a conversation is a line of turns, not every request that shares a
    system prompt with a short one); each other record alone (``RequestOrder``). A chain is the ids
    of the prompt's *full* blocks of ``block_tokens`` (``prompt_tokens // block_tokens`` of them): a
    source whose ids also cover a partial last block (Mooncake) has that block grow in the next turn,
    so its id never reappears; ``trace stats`` counts turns by the same rule (``oomload.trace.tally``)."""
    units: list[list[int]] = []
    by_session: dict[str, list[int]] = {}
    ends: dict[int, list[int]] = {}  # last id of a chain not yet continued → its conversation
    for position, record in enumerate(records):
        if record.session is None:
            ids = (
                record.hash_ids
                if not block_tokens
                else record.hash_ids[: record.prompt_tokens // block_tokens]
            )
            unit = next((ends.pop(i) for i in reversed(ids[:-1]) if i in ends), None)
            if unit is None:
                unit = [position]
                units.append(unit)
            else:
                unit.append(position)
            if ids:
                ends[ids[-1]] = unit
            continue
        turns = by_session.get(record.session)
        if turns is None:
            turns = by_session[record.session] = []
            units.append(turns)
        turns.append(position)
    for turns in by_session.values():
        turns.sort(key=lambda p: (records[p].turn is None, records[p].turn or 0, p))
    return [tuple(u) for u in units]
