"""Synthetic traces from length distributions, for users who have no production logs yet (pure, seeded).

A length distribution is written as a short spec string (``parse_length_spec``):

====================================  =====================================================================
spec                                  meaning
====================================  =====================================================================
``fixed:N``                           every request has exactly ``N`` tokens
``uniform:LO:HI``                     integers drawn uniformly from ``[LO, HI]``
``lognormal:P50:P99[:MAX]``           log-normal whose median is ``P50`` and 99th percentile ``P99``,
                                      rounded to integers ≥ 1 and capped at ``MAX`` (≥ ``P50``) when given
``A@W1+B@W2+…``                       a mix: each request draws from part ``A`` with weight ``W1``, …
====================================  =====================================================================

Token counts are whole (``fixed:1.5`` is refused, not rounded; a log-normal's ``P50`` and ``P99`` are
quantiles and may have a fraction). Every length is at least 1 token: a request needs a prompt token
(vLLM rejects an empty prompt) and an output of 0 tokens generates nothing, so ``fixed:0`` and
``uniform:0:HI`` are refused.

Every synthetic trace is one ``oomload trace stats`` and ``replay`` read, so it stays within the trace
format's bounds (``oomload.trace.model``): a spec that names a length over ``MAX_TOKENS`` (10,000,000 —
``fixed:N``, ``uniform``'s ``HI``, ``lognormal``'s ``P50``, ``P99`` or ``MAX``) is refused, log-normal
draws without a ``MAX`` are capped at ``MAX_TOKENS`` (far in the tail of any spec under it), and
arrivals that would pass ``MAX_TIME_S`` (10¹¹ s: a very low rate over many requests) are refused. At
most ``MAX_REQUESTS`` (1,000,000) requests: the trace is drawn and held in memory whole (about 400 MB
at the bound).

Log-normal from two quantiles: if ``ln X ~ N(μ, σ²)`` then ``P50 = e^μ`` and ``P99 = e^(μ + z·σ)`` with
``z = Φ⁻¹(0.99) ≈ 2.3263``, so ``μ = ln P50`` and ``σ = (ln P99 − ln P50) / z``. The sample's own
nearest-rank percentiles converge to the targets as the count grows (for a few hundred requests the
P99 is within roughly ±20 %).

Arrivals follow a Poisson process at ``rate_rps`` (exponential gaps with mean ``1 / rate_rps``, the
first request at 0 s); without a rate every request arrives at 0 s (a closed-loop replay ignores
arrival times anyway). Everything is drawn from one ``numpy.random.Generator`` seeded by ``seed``, so
the same arguments always give the same trace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from oomload.errors import ConfigError
from oomload.trace.model import MAX_TIME_S, MAX_TOKENS, TraceRecord

Z_99 = 2.3263478740408408  # Φ⁻¹(0.99)
MAX_REQUESTS = 1_000_000  # --count: every record is held in memory (~400 MB RSS at this bound)

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class FixedLength:
    tokens: int


@dataclass(frozen=True, slots=True)
class UniformLength:
    low_tokens: int
    high_tokens: int


@dataclass(frozen=True, slots=True)
class LogNormalLength:
    p50_tokens: float
    p99_tokens: float
    max_tokens: int | None = None

    @property
    def mu(self) -> float:
        return math.log(self.p50_tokens)

    @property
    def sigma(self) -> float:
        return (math.log(self.p99_tokens) - math.log(self.p50_tokens)) / Z_99


LengthPart = FixedLength | UniformLength | LogNormalLength


@dataclass(frozen=True, slots=True)
class LengthMix:
    """A weighted mix of length distributions (a single distribution is a mix of one)."""

    parts: tuple[LengthPart, ...]
    weights: tuple[float, ...]


SPEC_HELP = (
    "fixed:N, uniform:LO:HI, lognormal:P50:P99[:MAX], or a mix such as lognormal:600:6000@0.9+fixed:16000@0.1"
)


ZERO_LENGTH_REASONS = {
    "--input": "a request needs at least one prompt token; vLLM rejects empty prompts",
    "--output": "a request that generates 0 tokens puts no decode load on the server",
}


def parse_length_spec(text: str, *, name: str = "length spec") -> LengthMix:
    """Parse a length spec (see the module docstring); raises ``ConfigError`` naming the bad part.

    ``name`` (e.g. ``"--input"``) starts the message about a length below 1 token.
    """
    parts: list[LengthPart] = []
    weights: list[float] = []
    pieces = [p.strip() for p in text.split("+")]
    for piece in pieces:
        spec, _, weight_text = piece.partition("@")
        if weight_text:
            try:
                weight = float(weight_text)
            except ValueError as err:
                raise ConfigError(f"bad mix weight {weight_text!r} in {text!r}; use {SPEC_HELP}") from err
            if not weight > 0 or not math.isfinite(weight):
                raise ConfigError(f"mix weights must be positive numbers, got {weight_text!r} in {text!r}")
        elif len(pieces) > 1:
            raise ConfigError(f"every part of a mix needs a weight (PART@WEIGHT), {piece!r} has none")
        else:
            weight = 1.0
        part = _parse_part(spec, text)
        if _min_tokens(part) < 1:
            why = ZERO_LENGTH_REASONS.get(name, " and ".join(ZERO_LENGTH_REASONS.values()))
            raise ConfigError(
                f"{name} {text!r}: {spec!r} allows 0-token requests; lengths must be ≥ 1 ({why})"
            )
        if _max_tokens(part) > MAX_TOKENS:
            raise ConfigError(
                f"{name} {text!r}: {spec!r} allows requests of {_max_tokens(part):,.0f} tokens, over the "
                f"limit of {MAX_TOKENS:,} tokens a trace holds (no model serves a longer context)"
            )
        parts.append(part)
        weights.append(weight)
    if not math.isfinite(sum(weights)):  # each finite, their sum past a float: no share to draw by
        raise ConfigError(f"mix weights must add up to a finite number, got {text!r}")
    return LengthMix(tuple(parts), tuple(weights))


def _parse_part(spec: str, text: str) -> LengthPart:
    kind, *args = spec.split(":")
    try:
        numbers = [float(a) for a in args]
    except ValueError as err:
        raise ConfigError(f"bad number in length spec {text!r}; use {SPEC_HELP}") from err
    if any(not math.isfinite(n) or n < 0 for n in numbers):
        raise ConfigError(f"lengths must be non-negative numbers in {text!r}")
    whole = numbers if kind != "lognormal" else numbers[2:]  # token counts (a log-normal's quantiles: any)
    if any(n != int(n) for n in whole):
        raise ConfigError(f"lengths are whole tokens: {spec!r} in {text!r} has a fraction")
    if kind == "fixed" and len(numbers) == 1:
        return FixedLength(int(numbers[0]))
    if kind == "uniform" and len(numbers) == 2:
        low, high = int(numbers[0]), int(numbers[1])
        if low > high:
            raise ConfigError(f"uniform:LO:HI needs LO ≤ HI, got {spec!r}")
        return UniformLength(low, high)
    if kind == "lognormal" and len(numbers) in (2, 3):
        p50, p99 = numbers[0], numbers[1]
        if not 0 < p50 <= p99:
            raise ConfigError(f"lognormal:P50:P99 needs 0 < P50 ≤ P99, got {spec!r}")
        cap = int(numbers[2]) if len(numbers) == 3 else None
        if cap is not None and cap < p50:  # every draw at the cap: a fixed length in disguise
            raise ConfigError(f"lognormal:P50:P99:MAX needs MAX ≥ P50, got {spec!r}")
        return LogNormalLength(p50, p99, cap)
    raise ConfigError(f"unknown length spec {spec!r}; use {SPEC_HELP}")


def _min_tokens(part: LengthPart) -> float:
    if isinstance(part, FixedLength):
        return part.tokens
    if isinstance(part, UniformLength):
        return part.low_tokens
    return 1  # log-normal draws are rounded to integers ≥ 1


def _max_tokens(part: LengthPart) -> float:
    """The longest length a spec names (draws of a log-normal without ``MAX`` are capped at
    ``MAX_TOKENS``, which its ``P99`` must not pass)."""
    if isinstance(part, FixedLength):
        return part.tokens
    if isinstance(part, UniformLength):
        return part.high_tokens
    return max(part.p50_tokens, part.p99_tokens, part.max_tokens or 0)


def sample_lengths(mix: LengthMix, count: int, rng: np.random.Generator) -> IntArray:
    """``count`` integer lengths drawn from ``mix``."""
    if count < 0:
        raise ValueError(f"count must be ≥ 0, got {count}")
    weights = np.asarray(mix.weights, dtype=np.float64)
    choice = (
        np.zeros(count, dtype=np.int64)
        if len(mix.parts) == 1
        else rng.choice(len(mix.parts), size=count, p=weights / weights.sum())
    )
    out = np.zeros(count, dtype=np.int64)
    for index, part in enumerate(mix.parts):
        mask = choice == index
        out[mask] = _sample_part(part, int(mask.sum()), rng)
    return out


def _sample_part(part: LengthPart, count: int, rng: np.random.Generator) -> IntArray:
    if isinstance(part, FixedLength):
        return np.full(count, part.tokens, dtype=np.int64)
    if isinstance(part, UniformLength):
        return rng.integers(part.low_tokens, part.high_tokens, size=count, endpoint=True, dtype=np.int64)
    draws = np.clip(np.rint(rng.lognormal(part.mu, part.sigma, size=count)), 1, MAX_TOKENS)
    values = draws.astype(np.int64)
    if part.max_tokens is not None:
        values = np.minimum(values, part.max_tokens)
    return values


def poisson_arrivals(count: int, rate_rps: float | None, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Arrival times (s) of a Poisson process at ``rate_rps``, the first at 0; all zero without a rate."""
    if rate_rps is None or count == 0:
        return np.zeros(count, dtype=np.float64)
    if not rate_rps > 0 or not math.isfinite(rate_rps):
        raise ConfigError(f"--rate must be a positive number of requests per second, got {rate_rps}")
    gaps = rng.exponential(1.0 / rate_rps, size=count)
    gaps[0] = 0.0
    arrivals = np.cumsum(gaps)
    if not arrivals[-1] <= MAX_TIME_S:
        raise ConfigError(
            f"--rate {rate_rps:g} spreads {count:,} requests over {arrivals[-1]:.3g} s, past the limit of "
            f"{MAX_TIME_S:.0e} s a trace holds; give a higher --rate or a lower --count"
        )
    return arrivals


def synthesize(
    count: int,
    prompt: LengthMix,
    output: LengthMix,
    *,
    rate_rps: float | None = None,
    seed: int = 0,
) -> list[TraceRecord]:
    """A synthetic trace of ``count`` requests (ids ``r0``…), reproducible for a given ``seed``."""
    if count < 1:
        raise ConfigError(f"--count must be ≥ 1, got {count}")
    if count > MAX_REQUESTS:
        raise ConfigError(
            f"--count must be at most {MAX_REQUESTS:,} requests (a synthetic trace is held in memory whole), "
            f"got {count:,}"
        )
    rng = np.random.default_rng(seed)
    prompt_tokens = sample_lengths(prompt, count, rng)
    output_tokens = sample_lengths(output, count, rng)
    arrivals = poisson_arrivals(count, rate_rps, rng)
    return [
        TraceRecord(
            id=f"r{i}",
            arrival_s=round(float(arrivals[i]), 6),
            prompt_tokens=int(prompt_tokens[i]),
            output_tokens=int(output_tokens[i]),
        )
        for i in range(count)
    ]


def describe_spec(mix: LengthMix) -> str:
    """The canonical spec string of a mix (recorded in the synthetic trace's header)."""
    return "+".join(
        _describe_part(part) + ("" if len(mix.parts) == 1 else f"@{weight:g}")
        for part, weight in zip(mix.parts, mix.weights, strict=True)
    )


def _describe_part(part: LengthPart) -> str:
    if isinstance(part, FixedLength):
        return f"fixed:{part.tokens}"
    if isinstance(part, UniformLength):
        return f"uniform:{part.low_tokens}:{part.high_tokens}"
    cap = "" if part.max_tokens is None else f":{part.max_tokens}"
    return f"lognormal:{part.p50_tokens:g}:{part.p99_tokens:g}{cap}"


__all__: Sequence[str] = (
    "MAX_REQUESTS",
    "FixedLength",
    "LengthMix",
    "LogNormalLength",
    "UniformLength",
    "describe_spec",
    "parse_length_spec",
    "poisson_arrivals",
    "sample_lengths",
    "synthesize",
)
