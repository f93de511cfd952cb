"""``oomload plan``: placeholder until its issue lands."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``plan`` sub-command (not yet available)."""
    del subparsers


def run(args: argparse.Namespace) -> int:
    del args
    return 2
