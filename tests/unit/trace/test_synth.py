"""Synthetic traces: spec parsing, reproducibility, and distributions that hit their targets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.errors import ConfigError
from oomload.trace.synth import (
    FixedLength,
    LogNormalLength,
    UniformLength,
    describe_spec,
    parse_length_spec,
    poisson_arrivals,
    sample_lengths,
    synthesize,
)


def test_parse_specs_round_trip() -> None:
    for spec in (
        "fixed:256",
        "uniform:10:20",
        "lognormal:600:6000",
        "lognormal:600:6000:16384",
        "lognormal:600:6000@0.9+fixed:16000@0.1",
    ):
        assert describe_spec(parse_length_spec(spec)) == spec
    mix = parse_length_spec("fixed:1@3+fixed:2@1")
    assert mix.parts == (FixedLength(1), FixedLength(2)) and mix.weights == (3.0, 1.0)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "gamma:1:2",
        "fixed",
        "fixed:x",
        "lognormal:600",
        "lognormal:6000:600",
        "uniform:5:1",
        "fixed:1+fixed:2",
        "fixed:1@0+fixed:2@1",
        "fixed:-3",
    ],
)
def test_bad_specs_are_config_errors(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_length_spec(spec)


@pytest.mark.parametrize(
    ("name", "spec", "why"),
    [
        ("--input", "fixed:0", "vLLM rejects empty prompts"),
        ("--input", "lognormal:600:6000@0.9+uniform:0:4@0.1", "vLLM rejects empty prompts"),
        ("--output", "fixed:0", "no decode load"),
    ],
)
def test_zero_token_lengths_are_refused(name: str, spec: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"^{name} .*allows 0-token requests; lengths must be ≥ 1 .*{why}"):
        parse_length_spec(spec, name=name)
    assert parse_length_spec("uniform:1:4").parts == (UniformLength(1, 4),)


def test_lognormal_hits_its_quantiles_at_scale() -> None:
    rng = np.random.default_rng(0)
    values = sample_lengths(parse_length_spec("lognormal:600:6000"), 200_000, rng)
    assert np.percentile(values, 50, method="inverted_cdf") == pytest.approx(600, rel=0.02)
    assert np.percentile(values, 99, method="inverted_cdf") == pytest.approx(6000, rel=0.03)
    capped = sample_lengths(parse_length_spec("lognormal:600:6000:2000"), 10_000, rng)
    assert capped.max() == 2000 and capped.min() >= 1


def test_mix_weights_are_respected() -> None:
    values = sample_lengths(parse_length_spec("fixed:1@0.8+fixed:2@0.2"), 50_000, np.random.default_rng(1))
    assert np.mean(values == 2) == pytest.approx(0.2, abs=0.01)


def test_poisson_arrivals_have_the_asked_rate() -> None:
    arrivals = poisson_arrivals(50_000, 4.0, np.random.default_rng(2))
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    assert (len(arrivals) - 1) / arrivals[-1] == pytest.approx(4.0, rel=0.03)
    assert poisson_arrivals(3, None, np.random.default_rng(0)).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ConfigError):
        poisson_arrivals(3, -1.0, np.random.default_rng(0))


@given(st.integers(1, 50), st.integers(0, 2**32 - 1))
def test_synthesize_is_deterministic_and_valid(count: int, seed: int) -> None:
    prompt, output = parse_length_spec("lognormal:100:1000"), parse_length_spec("uniform:1:50")
    first = synthesize(count, prompt, output, rate_rps=2.0, seed=seed)
    assert first == synthesize(count, prompt, output, rate_rps=2.0, seed=seed)
    assert [r.id for r in first] == [f"r{i}" for i in range(count)]
    assert all(r.prompt_tokens >= 1 and 1 <= r.output_tokens <= 50 for r in first)
    arrivals = [r.arrival_s for r in first]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)


def test_lognormal_parameters() -> None:
    part = LogNormalLength(600, 6000)
    assert np.exp(part.mu) == pytest.approx(600)
    assert np.exp(part.mu + 2.3263478740408408 * part.sigma) == pytest.approx(6000)
    with pytest.raises(ConfigError):
        synthesize(0, parse_length_spec("fixed:1"), parse_length_spec("fixed:1"))


def test_mix_weights_whose_sum_is_past_a_float_are_refused() -> None:
    """Each weight finite, their sum infinite: the draw's shares were NaN and numpy raised (exit 70)."""
    with pytest.raises(ConfigError, match="mix weights must add up to a finite number"):
        parse_length_spec("fixed:10@1e308+fixed:20@1e308")
    assert parse_length_spec("fixed:10@1e300+fixed:20@1e-300").weights == (1e300, 1e-300)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("fixed:1.5", "lengths are whole tokens: 'fixed:1.5'"),  # was written as fixed:1, silently
        ("uniform:10:20.5", "lengths are whole tokens"),
        ("lognormal:600:6000:300", "needs MAX ≥ P50"),  # every draw was 300
    ],
)
def test_a_spec_that_would_be_silently_changed_is_refused(spec: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_length_spec(spec)
    assert parse_length_spec("lognormal:600.5:6000:6000").parts  # a quantile may have a fraction
