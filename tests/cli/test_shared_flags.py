"""The flags several commands share (``oomload.cli.flags``): one sentence and exit 2 for a bad value."""

from __future__ import annotations

import pytest

from clirun import oomload
from oomload.cli.flags import format_list, int_list
from oomload.errors import ConfigError, ExitCode
from oomload.report import FORMATS


def test_format_list_takes_the_allowed_outputs_and_refuses_the_rest() -> None:
    assert format_list(" json, md ", FORMATS) == ["json", "md"]
    for bad in ("pdf", ",", "json,pdf"):
        with pytest.raises(ConfigError, match=r"--format '.*': allowed values are terminal, json, md"):
            format_list(bad, FORMATS)


def test_int_list_takes_positive_integers_only() -> None:
    assert int_list("--concurrency", "4, 8,16") == (4, 8, 16)
    for bad in ("", "0", "4,x"):
        with pytest.raises(ConfigError, match="comma-separated positive integers"):
            int_list("--concurrency", bad)


@pytest.mark.parametrize("command", ["report", "compare"])
def test_report_and_compare_say_one_sentence_for_an_unknown_format(command: str) -> None:
    dirs = ["no-such-run"] * (2 if command == "compare" else 1)
    result = oomload(command, *dirs, "--format", "pdf")
    assert result.returncode == ExitCode.USAGE
    assert result.stderr.strip() == (
        "oomload: error: --format 'pdf': allowed values are terminal, json, md, html, junit (comma-separated)"
    )
