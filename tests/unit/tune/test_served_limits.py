"""A server's max_num_seqs and max_num_batched_tokens, read from its serve line, else its log
(``oomload.realvllm.limits``); the odds child computing under them is tested with the child
(``tests/unit/run/test_oddsfeed.py``)."""

from __future__ import annotations

import pytest

from oomload.realvllm.limits import ServerLimits, served_limits
from oomload.verdict.runinfo import served_line

# as vLLM's CPU build wrote them here (0.x, the e2e harness): its start-up lines
STARTED = (
    "(APIServer pid=1498) INFO 12-04 12:36:50 [api_utils.py:286] non-default args: {'model_tag': 'tiny', "
    "'host': '127.0.0.1', 'port': 49457, 'model': 'tiny', 'max_model_len': 4096, 'enforce_eager': True, "
    "'block_size': 256, 'max_num_batched_tokens': 3840, 'max_num_seqs': 64}\n"
    "(APIServer pid=1498) INFO 12-04 12:36:50 [scheduler.py:307] Chunked prefill is enabled with "
    "max_num_batched_tokens=3840.\n"
)


def test_the_serve_line_says_them() -> None:
    line = "vllm serve m --max-num-seqs 12 --max-num-batched-tokens=4096 --port 8000"
    assert served_limits(line, None) == ServerLimits(12, 4096)
    assert served_limits("oomload sim serve --max-num-seqs 3", None) == ServerLimits(3, None)


def test_the_log_completes_what_the_line_does_not_say() -> None:
    assert served_limits(None, STARTED) == ServerLimits(64, 3840)
    assert served_limits("vllm serve m --max-num-seqs 10", STARTED) == ServerLimits(10, 3840)
    # the budget in effect: vLLM may change what was asked (the chunked-prefill line wins)
    changed = STARTED.replace("max_num_batched_tokens=3840.", "max_num_batched_tokens=2048.")
    assert served_limits(None, changed) == ServerLimits(64, 2048)
    # a log of several starts describes the latest
    again = STARTED + STARTED.replace("'max_num_seqs': 64", "'max_num_seqs': 8").replace("=3840", "=8192")
    assert served_limits(None, again) == ServerLimits(8, 8192)


@pytest.mark.parametrize(
    ("line", "log"),
    [
        (None, None),
        ("", ""),
        ("not a server at all", "no start-up line here"),
        ("vllm serve m --max-num-seqs 0 --max-num-batched-tokens many", None),
        (None, "non-default args: {'model': 'm'}"),
    ],
)
def test_nothing_said_is_nothing_known(line: str | None, log: str | None) -> None:
    assert served_limits(line, log) == ServerLimits()


def test_config_json_gives_the_started_line_before_the_described_one() -> None:
    assert served_line({"serve": "vllm serve a", "served_with": "vllm serve b"}) == "vllm serve a"
    assert served_line({"serve": None, "served_with": "vllm serve b"}) == "vllm serve b"
    assert served_line({"serve": None}) is None and served_line({}) is None
