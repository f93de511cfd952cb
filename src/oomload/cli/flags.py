"""Flags several sub-commands share, and their checks: one sentence naming the flag and the value,
raised as ``ConfigError`` (exit 2) before anything runs."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from oomload.errors import ConfigError
from oomload.rundir import check_run_dir_creatable

REPORT_FORMATS = "terminal,json,md,html,junit"  # what ``report`` and ``compare`` write by default


def add_format_flag(parser: argparse.ArgumentParser) -> None:
    """``--format LIST``: the outputs ``report`` and ``compare`` write (checked by ``format_list``)."""
    parser.add_argument(
        "--format",
        default=REPORT_FORMATS,
        metavar="LIST",
        help=f"comma-separated outputs: {REPORT_FORMATS} (default: all)",
    )


def format_list(text: str, allowed: Sequence[str]) -> list[str]:
    """``--format``'s outputs, each one of ``allowed``; at least one."""
    formats = [f.strip() for f in str(text).split(",") if f.strip()]
    if not formats or any(f not in allowed for f in formats):
        raise ConfigError(f"--format {text!r}: allowed values are {', '.join(allowed)} (comma-separated)")
    return list(dict.fromkeys(formats))  # each once: "junit,junit" writes junit.xml once


def positive(flag: str, value: float) -> None:
    """``value`` > 0 and finite (NaN and infinity are not: no duration, rate or scale means them)."""
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{flag} must be a finite number > 0, got {value}")


def non_negative(flag: str, value: float) -> None:
    """``value`` ≥ 0 and finite (a seed, a warm-up: NaN, infinity and negatives mean nothing)."""
    if not (value >= 0 and math.isfinite(value)):
        what = "an integer" if isinstance(value, int) else "a finite number"
        raise ConfigError(f"{flag} must be {what} ≥ 0, got {value}")


def positive_int(flag: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{flag} must be a positive integer, got {value}")


def tcp_port(flag: str, value: int | None) -> None:
    """A TCP port, 1..65535 (``None``: not given)."""
    if value is not None and not 1 <= value <= 65535:
        raise ConfigError(f"{flag} must be a TCP port (1..65535), got {value}")


def int_list(flag: str, text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, e.g. ``4,8,16``; no empty list, no empty item (``4,,8``)."""
    items = list_items(flag, text, "positive integers")
    try:
        values = tuple(int(x) for x in items)
    except ValueError as err:
        raise ConfigError(f"{flag} {text!r}: give comma-separated positive integers") from err
    if any(v < 1 for v in values):
        raise ConfigError(f"{flag} {text!r}: give comma-separated positive integers")
    return values


def list_items(flag: str, text: str, what: str = "values") -> list[str]:
    """The stripped items of a comma-separated list; ``ConfigError`` for an empty list or an empty item
    (``4,,8``, ``4,8,``): a value lost in typing is not silently dropped."""
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise ConfigError(f"{flag} is empty; give comma-separated {what}")
    if not all(items):
        raise ConfigError(f"{flag} {text!r} has an empty item; give comma-separated {what}")
    return items


def check_new_run_dir(run_dir: Path | None) -> None:
    """``--run-dir`` of ``replay`` and ``tune``: written by one run only — a second run's requests, steps
    or candidates beside an earlier one's would mix their evidence. It may exist if it is an empty
    directory."""
    if run_dir is None:
        return
    if not run_dir.exists():
        check_run_dir_creatable(run_dir)  # e.g. a path under a regular file: exit 2 before any load
        return
    if not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} exists and is not a directory")
    if any(run_dir.iterdir()):
        raise ConfigError(
            f"--run-dir {run_dir} already holds files (an earlier run?); name a new or empty directory"
        )
