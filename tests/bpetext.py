"""Generated text and a small real ``tokenizers`` BPE trained on it, for the ``--tokenizer`` tests."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ra", "so", "ti", "vu", "ze", "qua", "xi")


def sentence(rng: random.Random, words: int) -> str:
    return " ".join("".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(words)) + "."


def train_bpe(directory: Path) -> Path:
    """A 120-token BPE (few merges, so most words split into several tokens) saved as
    ``directory/tokenizer.json``; returns ``directory``."""
    rng = random.Random(7)
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"], show_progress=False)
    tokenizer.train_from_iterator((sentence(rng, 12) for _ in range(300)), trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory
