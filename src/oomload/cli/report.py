"""``oomload report RUN_DIR``: re-render the verdict and reports of a saved (possibly partial) run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from oomload.errors import ConfigError


def register(subparsers: Any) -> None:
    """Add the ``report`` sub-command."""
    parser = subparsers.add_parser(
        "report",
        help="re-render the verdict and reports of a saved run directory",
        description=(
            "Re-render the verdict of a saved run (also one cut short by a dead server or Ctrl-C): "
            "terminal summary, summary.json, report.md, report.html and junit.xml, written into RUN_DIR. "
            "Without --gate/--gate-file the run's own gate rules (config.json) are evaluated."
        ),
    )
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", type=Path, help="a run directory written by oomload replay"
    )
    parser.add_argument(
        "--gate",
        action="append",
        default=[],
        metavar="EXPR",
        help=(
            "a gate rule, e.g. 'no-preemption-below:64', 'p99-ttft-s@64<=2', 'error-rate<=0.1%%' (repeatable)"
        ),
    )
    parser.add_argument("--gate-file", type=Path, metavar="FILE", help="TOML file with [gate] rules = [...]")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="RUN_DIR",
        help="the run that relative rules (onset>=baseline, kv-blocks>=baseline*0.95, …) compare with "
        "(default: the one config.json recorded)",
    )
    parser.add_argument(
        "--format",
        default="terminal,json,md,html,junit",
        metavar="LIST",
        help="comma-separated outputs: terminal,json,md,html,junit (default: all)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print summary.json to stdout instead of the terminal view"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from oomload.report import FILE_NAMES, FORMATS, finalize_run
    from oomload.report.tune import is_tune_dir, render_tune_dir
    from oomload.rundir import RunReader
    from oomload.verdict.gate import load_gate_file, parse_gate
    from oomload.verdict.runview import config_problem

    if is_tune_dir(args.run_dir):  # an `oomload tune` directory: its table, tune.md and tune.html
        return render_tune_dir(args.run_dir, Console(stderr=False))
    formats = [f.strip() for f in str(args.format).split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ConfigError(
            f"--format {args.format!r}: allowed values are {', '.join(FORMATS)} (comma-separated)"
        )
    reader = RunReader(args.run_dir)  # ConfigError with a clear sentence for a bad run dir
    problem = config_problem(reader.path)
    if problem is not None:
        print(f"oomload: warning: {problem}; rendering what the run directory holds", file=sys.stderr)
    gates: list[Any] = [parse_gate(g) for g in args.gate]
    if args.gate_file is not None:
        gates.extend(load_gate_file(args.gate_file))
    baseline = args.baseline
    if not gates:
        configured = reader.config().get("gates") or []
        if isinstance(configured, list):
            gates = [parse_gate(str(g)) for g in configured]
        recorded = reader.config().get("baseline")
        if baseline is None and isinstance(recorded, str) and recorded:
            baseline = Path(recorded)
    files = [f for f in formats if f != "terminal"]
    if args.json and "json" not in files:
        files.append("json")
    code = finalize_run(
        args.run_dir,
        gates=gates,
        console=Console(stderr=False) if not args.json else Console(file=sys.stderr),
        formats=files,
        terminal="terminal" in formats and not args.json,
        reporting_only=True,
        baseline=baseline,
    )
    if args.json:
        sys.stdout.write((args.run_dir / FILE_NAMES["json"]).read_text(encoding="utf-8"))
    elif files and "terminal" not in formats:
        names = ", ".join(FILE_NAMES[f] for f in files)
        print(f"oomload: wrote {names} in {args.run_dir} (exit code {int(code)})")
    return int(code)
