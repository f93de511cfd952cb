"""The simulated server's toy tokenizer: deterministic, four characters per token (pure).

Text → tokens: the string is cut into consecutive pieces of 4 characters (the last may be shorter);
each piece is one token, so a text of ``n`` characters has ``ceil(n / 4)`` tokens and a client can
build a prompt of exactly ``k`` tokens from ``4k`` characters. The id of a piece is a stable hash
(CRC-32) modulo the vocabulary, avoiding the special ids below. No BOS token is added.

Tokens → text: id ``i`` decodes to a fixed 4-character piece (a space and three letters derived from
``i``), so generated text re-tokenizes to the same number of tokens.

Chat template (ChatML-like, applied at the token level so the count is additive)::

    for each message:  <|im_start|> role \\n  content-tokens…  <|im_end|> \\n      (5 + content tokens)
    generation prompt: <|im_start|> assistant \\n                                      (3 tokens)

so ``chat_prompt_tokens = Σ (5 + ceil(len(content)/4)) + 3``; ``/tokenize`` with ``messages`` returns
exactly that count, which is how clients calibrate chat prompts.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from typing import Any

CHARS_PER_TOKEN = 4
SPECIAL = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_start|>": 4, "<|im_end|>": 5, "\n": 6}
ROLE_IDS = {"system": 7, "user": 8, "assistant": 9, "tool": 10}
FIRST_ORDINARY_ID = 16
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
MESSAGE_OVERHEAD_TOKENS = 5
GENERATION_PROMPT_TOKENS = 3


class ToyTokenizer:
    """Four characters per token; see the module docstring."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size <= FIRST_ORDINARY_ID:
            raise ValueError(f"vocab_size must exceed {FIRST_ORDINARY_ID}, got {vocab_size}")
        self.vocab_size = vocab_size
        self._span = vocab_size - FIRST_ORDINARY_ID

    @staticmethod
    def count(text: str) -> int:
        return -(-len(text) // CHARS_PER_TOKEN)

    def encode(self, text: str) -> list[int]:
        span = self._span
        base = FIRST_ORDINARY_ID
        return [
            base + zlib.crc32(text[i : i + CHARS_PER_TOKEN].encode("utf-8")) % span
            for i in range(0, len(text), CHARS_PER_TOKEN)
        ]

    def piece(self, token_id: int) -> str:
        """The 4-character text of one token id."""
        if token_id < FIRST_ORDINARY_ID:
            for text, sid in SPECIAL.items():
                if sid == token_id:
                    return text
            for role, rid in ROLE_IDS.items():
                if rid == token_id:
                    return role
            return ""
        n = token_id
        return " " + _LETTERS[n % 26] + _LETTERS[(n // 26) % 26] + _LETTERS[(n // 676) % 26]

    def decode(self, token_ids: Iterable[int]) -> str:
        return "".join(self.piece(t) for t in token_ids)

    def out_of_vocab(self, token_ids: Sequence[int]) -> int | None:
        """The first id outside ``[0, vocab_size)``, or None."""
        for t in token_ids:
            if not 0 <= t < self.vocab_size:
                return t
        return None

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the chat template applied to ``messages`` (see the module docstring)."""
        ids: list[int] = []
        for message in messages:
            role = str(message.get("role", "user"))
            ids += [SPECIAL["<|im_start|>"], ROLE_IDS.get(role, ROLE_IDS["user"]), SPECIAL["\n"]]
            ids += self.encode(message_text(message.get("content")))
            ids += [SPECIAL["<|im_end|>"], SPECIAL["\n"]]
        if add_generation_prompt:
            ids += [SPECIAL["<|im_start|>"], ROLE_IDS["assistant"], SPECIAL["\n"]]
        return ids


def message_text(content: Any) -> str:
    """The text of an OpenAI message ``content`` (a string, or a list of ``{"type":"text"}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(str(p) for p in parts)
    raise TypeError("message content must be a string or a list of text parts")
