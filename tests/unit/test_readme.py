"""The README's command table lists exactly the commands the CLI has (docs that drift are defects)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from oomload.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _cli_commands(parser: argparse.ArgumentParser, prefix: str = "oomload") -> set[str]:
    commands: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _cli_commands(sub, f"{prefix} {name}")
                commands |= nested or {f"{prefix} {name}"}
    return commands


def test_readme_command_table_matches_the_cli() -> None:
    table = re.findall(r"^\| `(oomload [a-z ]+?)(?: [A-Z\[\-].*)?` \|", README.read_text(), re.MULTILINE)
    assert set(table) == _cli_commands(build_parser())


def test_readme_gives_the_two_fresh_machine_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text
