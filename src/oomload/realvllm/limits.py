"""The scheduler limits a server runs with, ``max_num_seqs`` and ``max_num_batched_tokens``, as its
``--serve`` line sets them, else as its start-up log says them (pure).

vLLM exports neither in ``/metrics`` (``cache_config_info`` carries the KV pool only), and its defaults
depend on the release, the usage context and the device (vllm-facts §7: the API server takes 8192
tokens and 1024 sequences on an H100 or H200, 2048 and 256 on an A100 or a 24 GB card). The odds of a
replay simulate admission with them, so they are read where they are written:

1. the ``--serve`` line oomload started the server with (``--max-num-seqs``, ``--max-num-batched-tokens``);
2. the server's log: ``non-default args: {… 'max_num_seqs': 64 …}`` (what was asked, as vLLM parsed it;
   vLLM's API server logs it at start-up) and ``Chunked prefill is enabled with
   max_num_batched_tokens=N`` (the budget in effect). The last of each wins: a log that holds several
   starts describes the latest.

What neither says stays unknown (``None``): the caller keeps its default and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomload.errors import ConfigError
from oomload.realvllm.servecmd import parse_serve_command

_ASKED_SEQS = re.compile(r"non-default args: \{.*?'max_num_seqs': (\d+)")
_ASKED_BATCHED = re.compile(r"non-default args: \{.*?'max_num_batched_tokens': (\d+)")
_BATCHED_IN_EFFECT = re.compile(r"max_num_batched_tokens=(\d+)")


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What is known of a server's scheduler limits (``None``: said nowhere)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None


def served_limits(serve_line: str | None, server_log: str | None) -> ServerLimits:
    """The limits the serve line sets, each completed from the server's log when the line lacks it."""
    line_seqs, line_batched = _from_serve_line(serve_line)
    log_seqs, log_batched = _from_log(server_log or "")
    return ServerLimits(
        line_seqs if line_seqs is not None else log_seqs,
        line_batched if line_batched is not None else log_batched,
    )


def _from_serve_line(line: str | None) -> tuple[int | None, int | None]:
    if not line:
        return None, None
    try:
        command = parse_serve_command(line)
    except ConfigError:
        return None, None
    return _positive(command.value("--max-num-seqs")), _positive(command.value("--max-num-batched-tokens"))


def _from_log(text: str) -> tuple[int | None, int | None]:
    seqs = _last(_ASKED_SEQS, text)
    batched = _last(_BATCHED_IN_EFFECT, text)
    if batched is None:
        batched = _last(_ASKED_BATCHED, text)
    return seqs, batched


def _last(pattern: re.Pattern[str], text: str) -> int | None:
    found = pattern.findall(text)
    return _positive(found[-1]) if found else None


def _positive(value: str | None) -> int | None:
    if value is None or not value.isdigit():
        return None
    number = int(value)
    return number if number > 0 else None
