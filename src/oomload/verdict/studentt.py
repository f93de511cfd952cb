"""Student's t distribution for integer degrees of freedom, exact, without scipy (pure).

``t_cdf`` is the closed-form series of Abramowitz & Stegun 26.7.3–4 (even and odd degrees of freedom);
``t_quantile`` inverts it by bisection to 1e-12. The soak trend's slope interval uses them
(``oomload.verdict.trend``).
"""

from __future__ import annotations

import math


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with integer ``df`` ≥ 1 (Abramowitz & Stegun 26.7.3–4, exact)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:
        term = total = 1.0
        for k in range(1, (df - 2) // 2 + 1):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total  # P(|T| ≤ |t|)
    else:
        total = 0.0
        if df > 1:
            term = total = math.cos(theta)
            for k in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
        inside = 2.0 / math.pi * (theta + math.sin(theta) * total)
    return 0.5 + math.copysign(inside / 2.0, t)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with integer ``df``: ``t_cdf`` inverted by bisection (to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0
