"""Checks every sub-command's flags share (``replay``, ``tune``): one sentence naming the flag and the
value, raised as ``ConfigError`` (exit 2) before anything runs."""

from __future__ import annotations

from oomload.errors import ConfigError


def positive(flag: str, value: float) -> None:
    """``value`` > 0 (NaN is not)."""
    if not value > 0:
        raise ConfigError(f"{flag} must be > 0, got {value}")


def positive_int(flag: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{flag} must be a positive integer, got {value}")


def tcp_port(flag: str, value: int | None) -> None:
    """A TCP port, 1..65535 (``None``: not given)."""
    if value is not None and not 1 <= value <= 65535:
        raise ConfigError(f"{flag} must be a TCP port (1..65535), got {value}")


def int_list(flag: str, text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, e.g. ``4,8,16``."""
    try:
        values = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError as err:
        raise ConfigError(f"{flag} {text!r}: give comma-separated positive integers") from err
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{flag} {text!r}: give comma-separated positive integers")
    return values
