"""Where a build's prefix structure comes from: the per-build salt, and the header's ``prefix`` object.

**Salt.** Block ids are keyed hashes (``oomload.trace.blockhash.BlockHasher``), and so are the
pseudonyms of request ids, sessions and parents (``oomload.trace.pseudonyms``). ``build_salt`` draws
the key once per build in the main process (32 random bytes, never written anywhere) and the key
travels inside the input plan to the read workers, so a build on 1 or N workers writes the same
ids, while two builds of the same log share none (a trace's ids cannot be matched against another
trace's, nor tested against a guessed prompt or name). ``OOMLOAD_PREFIX_SALT`` (like
``SOURCE_DATE_EPOCH``) makes builds reproducible: its text, hashed, is the key — for tests, or to
compare two traces of one operator on purpose. Anyone who knows or guesses that text can test
guessed prompts and names against such a trace, so the header says which it was (``salt_header``:
``"salt": "fixed"`` or ``"random"``, never the value) and whether names are pseudonyms (``"ids"``).

**Header.** ``input_prefix`` says what one input's ids mean, by format: a vLLM log's token ids
(``token-ids``, exact), an OpenAI-style log's messages (``messages``, never exact: with ``--tokenizer``
a message's text and tool calls are counted, but not the tokens a chat template adds around them — its
role and format tokens — so block ends drift from the engine's by a few tokens a message; without one
its tokens are estimated from its bytes), Mooncake's 512-token or Bailian's 16-token ids as given
(``source-trace``), an oomload trace's own header, a mapped JSONL log's ``conversation=COL``
(``column``: the conversation id keys the chains, each turn taken to start with the conversation's
earlier turns; not exact), and ``none`` for formats that carry no prefix structure (Azure, BurstGPT,
other mapped logs).
``header_prefix`` combines the inputs: when they differ, the first input with structure describes
the trace and a note says that the others' ids are of another kind.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from oomload.ingest.source import LogSource
from oomload.trace.model import DEFAULT_PREFIX_BLOCK_TOKENS, PrefixInfo, read_trace_header
from oomload.trace.prefix import DEFAULT_BLOCK_TOKENS, BlockHasher

PREFIX_SALT_ENV = "OOMLOAD_PREFIX_SALT"
BAILIAN_BLOCK_TOKENS = 16
NONE = PrefixInfo(block_tokens=DEFAULT_BLOCK_TOKENS, source="none")


@dataclass(frozen=True, slots=True)
class BuildSalt:
    """The key of one build (module docstring) and whether ``OOMLOAD_PREFIX_SALT`` fixed it."""

    salt: bytes
    fixed: bool

    def __repr__(self) -> str:  # never print the salt
        return f"BuildSalt(fixed={self.fixed})"


def build_salt(environ: Mapping[str, str] | None = None) -> BuildSalt:
    """A random key, or the one ``OOMLOAD_PREFIX_SALT`` fixes."""
    env = os.environ if environ is None else environ
    fixed = env.get(PREFIX_SALT_ENV)
    if fixed:
        return BuildSalt(hashlib.blake2b(fixed.encode(), digest_size=32).digest(), fixed=True)
    return BuildSalt(secrets.token_bytes(32), fixed=False)


def build_hasher(block_tokens: int, environ: Mapping[str, str] | None = None) -> BlockHasher:
    """The hasher of one build: a random key, or the one ``OOMLOAD_PREFIX_SALT`` fixes."""
    return BlockHasher(build_salt(environ).salt, block_tokens)


def salt_header(salt: BuildSalt, *, keyed_chains: bool, pseudonyms: bool) -> dict[str, str]:
    """The header's word on the build's key: ``salt`` (``fixed``: every build with the same
    ``OOMLOAD_PREFIX_SALT`` writes the same ids, so two such traces can be matched; ``random``: no
    other trace shares an id) when anything was keyed, and ``ids`` (``pseudonyms`` or ``kept``)."""
    header = {"ids": "pseudonyms" if pseudonyms else "kept"}
    if keyed_chains or pseudonyms:
        header["salt"] = "fixed" if salt.fixed else "random"
    return header


def input_prefix(
    source: LogSource, format: str, hasher: BlockHasher | None, *, conversation: bool = False
) -> PrefixInfo:
    """What the ids of one input mean (module docstring)."""
    if format == "mooncake":
        head = source.head()
        if b'"hash_ids"' not in head:  # lengths only
            return NONE
        bailian = b'"chat_id"' in head
        return PrefixInfo(
            block_tokens=BAILIAN_BLOCK_TOKENS if bailian else DEFAULT_PREFIX_BLOCK_TOKENS,
            source="source-trace",
        )
    if format == "oomload":
        header = read_trace_header(source.path)
        return header.prefix if header.prefix is not None else PrefixInfo()
    if hasher is None:
        return NONE
    if format == "vllm-log":
        return PrefixInfo(block_tokens=hasher.block_tokens, source="token-ids")
    if format == "openai":  # never exact: a chat template's role and format tokens are not counted
        return PrefixInfo(block_tokens=hasher.block_tokens, source="messages", exact=False)
    if format == "jsonl" and conversation:  # each turn taken to start with the earlier ones
        return PrefixInfo(block_tokens=hasher.block_tokens, source="column", exact=False)
    return NONE


def header_prefix(infos: Sequence[PrefixInfo], truncated_requests: int) -> tuple[PrefixInfo, str | None]:
    """The trace's ``prefix`` object from its inputs', and a note when the inputs' kinds differ."""
    with_ids = [info for info in infos if info.source != "none"]
    if not with_ids:
        return NONE, None
    first = with_ids[0]
    note = None
    kinds = {(i.source, i.block_tokens) for i in infos}
    if len(kinds) > 1:
        listed = ", ".join(sorted(f"{s} ({b} tokens)" for s, b in kinds))
        note = (
            f"the inputs carry prefix ids of different kinds ({listed}); "
            f"the header describes the first ({first.source}): ids of the others do not measure reuse"
        )
    return (
        PrefixInfo(
            block_tokens=first.block_tokens,
            source=first.source,
            exact=all(i.exact for i in with_ids),
            truncated_requests=first.truncated_requests + truncated_requests,
        ),
        note,
    )
