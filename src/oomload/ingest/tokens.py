"""Counting tokens of logged text with a tokenizer the user names — never an estimate.

``--tokenizer`` takes one of:

- ``tiktoken:ENCODING`` — a tiktoken encoding by name (``cl100k_base``, ``o200k_base``); tiktoken
  fetches the encoding file once and caches it (``TIKTOKEN_CACHE_DIR``), so offline machines need the
  cache filled or the next form;
- ``tiktoken:PATH.tiktoken`` — a local tiktoken BPE file (the same file tiktoken downloads);
- ``hf:DIR`` or plain ``DIR`` — a local Hugging Face tokenizer directory holding ``tokenizer.json``,
  read with the ``tokenizers`` package (``pip install tokenizers``).

The chosen name is recorded in the trace header. Chat messages are counted as the sum of their text
contents; the few template tokens a chat template adds per message are not included (say so where
exactness matters). Logs that carry token counts never need a tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from oomload.errors import ConfigError

# The splitting pattern tiktoken uses for cl100k_base; applied to local .tiktoken files.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)


class TokenCounter(Protocol):
    """Counts the tokens of a text; ``name`` is what the trace header records."""

    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int: ...


@dataclass(frozen=True, slots=True)
class _EncodeCounter:
    name: str
    encoder: Any

    def count(self, text: str) -> int:
        return len(self.encoder.encode(text, disallowed_special=()))


@dataclass(frozen=True, slots=True)
class _HfCounter:
    name: str
    tokenizer: Any

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def load_token_counter(spec: str) -> TokenCounter:
    """The counter named by a ``--tokenizer`` value; raises ``ConfigError`` with a sentence otherwise."""
    kind, sep, rest = spec.partition(":")
    if sep and kind == "tiktoken":
        return _load_tiktoken(rest, spec)
    if sep and kind == "hf":
        return _load_hf(Path(rest), spec)
    if Path(spec).is_dir():
        return _load_hf(Path(spec), f"hf:{spec}")
    raise ConfigError(
        f"unknown --tokenizer {spec!r}; use tiktoken:ENCODING (e.g. tiktoken:cl100k_base), "
        "tiktoken:PATH.tiktoken, or a local Hugging Face tokenizer directory (hf:DIR)"
    )


def _load_tiktoken(name: str, spec: str) -> TokenCounter:
    try:
        import tiktoken
        import tiktoken.load
    except ImportError as err:
        raise ConfigError(f"--tokenizer {spec} needs the tiktoken package (pip install tiktoken)") from err
    if name.endswith(".tiktoken") or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"--tokenizer {spec}: no such tiktoken file {path}")
        try:
            ranks = tiktoken.load.load_tiktoken_bpe(str(path))
        except (OSError, ValueError) as err:
            raise ConfigError(f"--tokenizer {spec}: {path} is not a tiktoken BPE file ({err})") from err
        encoding = tiktoken.Encoding(
            name=path.stem, pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens={}
        )
        return _EncodeCounter(spec, encoding)
    try:
        encoding = tiktoken.get_encoding(name)
    except ValueError as err:
        raise ConfigError(f"--tokenizer {spec}: tiktoken has no encoding {name!r} ({err})") from err
    except Exception as err:  # tiktoken's download raises requests/urllib errors of many kinds
        raise ConfigError(
            f"--tokenizer {spec}: tiktoken could not load encoding {name!r} (it downloads the encoding "
            f"file on first use: {type(err).__name__}). Offline, point TIKTOKEN_CACHE_DIR at a filled "
            "cache or pass tiktoken:PATH.tiktoken"
        ) from err
    return _EncodeCounter(spec, encoding)


def _load_hf(directory: Path, spec: str) -> TokenCounter:
    file = directory / "tokenizer.json"
    if not file.is_file():
        raise ConfigError(f"--tokenizer {spec}: {directory} has no tokenizer.json")
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise ConfigError(
            f"--tokenizer {spec} needs the tokenizers package (pip install tokenizers)"
        ) from err
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises its own Exception subclass
        raise ConfigError(f"--tokenizer {spec}: cannot load {file} ({err})") from err
    return _HfCounter(spec, tokenizer)


def reload_spec(counter: TokenCounter) -> str | None:
    """The ``--tokenizer`` value that loads ``counter`` again (in a worker process), or ``None`` for a
    counter not loaded by ``load_token_counter`` (which must then be picklable to reach a worker)."""
    return counter.name if isinstance(counter, _EncodeCounter | _HfCounter) else None
