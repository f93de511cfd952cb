"""The load with an arithmetic onset, shared by the replay tests that need a known answer.

Pool: 97 blocks of 16 tokens (96 usable); every request is 256 + 256 tokens = 32 blocks, so 3 fit
and the first preemption is expected at floor(96 / 32) + 1 = 4 concurrent requests: level 2 is safe
and level 8 preempts by a wide margin. ``free_port`` is the project's own (a port that was free a
moment ago), for the master's worker port and the stubs the drills start.
"""

from __future__ import annotations

from pathlib import Path

from oomload.realvllm.server import free_port
from oomload.trace.model import TraceHeader, TraceRecord, write_trace

__all__ = ["ARITHMETIC_ONSET", "SIM", "fixed_trace", "free_port"]

SIM = "--num-gpu-blocks 97 --block-size 16 --max-model-len 1024 --time-scale 0.1"
ARITHMETIC_ONSET = 4


def fixed_trace(path: Path, count: int = 40) -> Path:
    """``count`` requests of 256 + 256 tokens, 0.1 s apart."""
    records = [TraceRecord(f"r{i}", 0.1 * i, 256, 256) for i in range(count)]
    write_trace(path, records, TraceHeader(source=("fixed-256+256",)))
    return path
