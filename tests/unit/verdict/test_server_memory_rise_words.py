"""The server's memory over a step "rose" only when the figures show it rising.

Seen on a new user's pass (a server killed with kill -9): "the server's memory rose from 53 to 53 MiB".
"""

from __future__ import annotations

from oomload.verdict.servermem import ServerMemory, StepMemory

MIB = 2**20


def _memory(first_bytes: int, peak_bytes: int) -> ServerMemory:
    step = StepMemory(step=2, concurrency=4, first_bytes=first_bytes, peak_bytes=peak_bytes, samples=9)
    return ServerMemory(9, "local", first_bytes, peak_bytes, None, 0, by_step=(step,))


def test_a_rise_smaller_than_the_figures_show_is_no_rise() -> None:
    text = _memory(int(53.1 * MIB), int(53.4 * MIB)).rise_text(2)
    assert text == "the server's memory stayed at 53 MiB over step 2"


def test_a_rise_the_figures_show_is_told() -> None:
    assert (
        _memory(53 * MIB, 96 * MIB).rise_text(2) == "the server's memory rose from 53 to 96 MiB over step 2"
    )
    assert _memory(53 * MIB, 53 * MIB).rise_text(2) == "the server's memory stayed at 53 MiB over step 2"
