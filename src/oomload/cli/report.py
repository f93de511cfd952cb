"""``oomload report RUN_DIR``: re-render the verdict and reports of a saved (possibly partial) run;
``oomload report --history RUN_DIR…``: the runs in time order, and where capacity moved
(``oomload.report.history``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from oomload.cli.flags import REPORT_FORMATS, add_format_flag, format_list
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
        "run_dir",
        metavar="RUN_DIR",
        type=Path,
        nargs="+",
        help="a run directory written by oomload replay (with --history: several, or directories of them)",
    )
    history = parser.add_argument_group("history")
    history.add_argument(
        "--history",
        action="store_true",
        help="one page of the runs in time order: onset, last safe, KV blocks, P99 TTFT, what moved",
    )
    history.add_argument(
        "--level",
        type=int,
        metavar="N",
        help="--history: the P99 TTFT column's level (default: the highest level every run measured)",
    )
    history.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="--history: where history.json/.md/.html go (default ./history)",
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
    add_format_flag(parser)
    parser.add_argument(
        "--json", action="store_true", help="print summary.json to stdout instead of the terminal view"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from oomload.report import FILE_NAMES, FORMATS, finalize_run
    from oomload.report.tune import TUNE_JSON, is_tune_dir, lost_tune_json, render_tune_dir
    from oomload.rundir import RunReader
    from oomload.verdict.gate import load_gate_file, parse_gate
    from oomload.verdict.runview import config_problem

    if args.history:
        return _history(args)
    if args.level is not None or args.out is not None:
        raise ConfigError("--level and --out go with --history")
    if len(args.run_dir) != 1:
        raise ConfigError(f"give one RUN_DIR (got {len(args.run_dir)}); several make a page with --history")
    args.run_dir = args.run_dir[0]
    if is_tune_dir(args.run_dir):  # an `oomload tune` directory: its table, tune.md and tune.html
        given = [
            flag
            for flag, used in (
                ("--json", args.json),
                ("--gate", args.gate),
                ("--gate-file", args.gate_file is not None),
                ("--baseline", args.baseline is not None),
                ("--format", args.format != REPORT_FORMATS),
            )
            if used
        ]
        if given:
            raise ConfigError(
                f"{args.run_dir} is an `oomload tune` directory: {_go_with(given)} a replay's run directory "
                "(a tune's reports are its table, tune.md and tune.html; its tune.json the data)"
            )
        return render_tune_dir(args.run_dir, Console(stderr=False))
    if lost_tune_json(args.run_dir):
        raise ConfigError(
            f"{args.run_dir} looks like an `oomload tune` directory (it has candidates/) without its "
            f"{TUNE_JSON}, which its table is drawn from; each candidate's replay re-renders on its own: "
            f"oomload report {args.run_dir / 'candidates' / 'NN' / 'run'}"
        )
    formats = format_list(args.format, FORMATS)
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


def _go_with(flags: list[str]) -> str:
    """``--gate goes with`` / ``--json, --gate go with``: the flags and the verb that agrees with them."""
    return f"{', '.join(flags)} {'goes' if len(flags) == 1 else 'go'} with"


def _history(args: argparse.Namespace) -> int:
    from rich.console import Console

    from oomload.report.history import HISTORY_FILES, history_of, print_history, write_history

    if args.gate or args.gate_file or args.baseline or args.json:
        raise ConfigError(
            "--history takes no --gate, --gate-file, --baseline or --json (see oomload compare)"
        )
    if args.level is not None and args.level <= 0:
        raise ConfigError(f"--level must be a concurrency level > 0, got {args.level}")
    allowed = ("terminal", *HISTORY_FILES)
    formats = list(allowed) if args.format == REPORT_FORMATS else format_list(args.format, allowed)
    history = history_of(args.run_dir, args.level)
    out = args.out if args.out is not None else Path("history")
    if "terminal" in formats:
        print_history(Console(stderr=False), history)
    written = write_history(out, history, [f for f in formats if f != "terminal"])
    if written:
        print(f"oomload: wrote {', '.join(written)} in {out}")
    return 0
