"""The ladders a tune searches when the user names none (pure): ``gpu_memory_utilization`` down from the
line's own value, and ``max_num_seqs`` below the target (or, without one, powers of two)."""

from __future__ import annotations

import math


def utilization_ladder(start: float, floor: float = 0.5, step: float = 0.05) -> tuple[float, ...]:
    """``start``, ``start − step``, … down to ``floor`` (two decimals)."""
    values: list[float] = []
    value = start
    while value >= floor - 1e-9 and len(values) < 20:
        values.append(round(value, 2))
        value -= step
    return tuple(values)


NO_TARGET_SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the max_num_seqs ladder without a target


def seqs_ladder(target: int) -> tuple[int, ...]:
    """The default ``max_num_seqs`` ladder: powers of two below the target, its quarters, and the target."""
    values = {target, max(1, target // 2), max(1, math.ceil(3 * target / 4)), max(1, target // 4)}
    power = 1
    while power < target:
        values.add(power)
        power *= 2
    return tuple(sorted(values))
