"""``oomload compare BASE_RUN NEW_RUN``: what changed between two runs, and whether it is a regression.

Both run directories are judged afresh (as ``oomload report`` judges them) and put side by side
(``oomload.report.compare``); the pages are printed and written into ``--out`` (default
``NEW_RUN/compare``: ``compare.json``, ``compare.md``, ``compare.html``, ``junit.xml``;
``oomload.report.comparepage``). Gate rules: relative ones (``onset>=baseline``, …) are judged against
the base run (a latency one also on the comparison's latency tests, those of its latency rows),
absolute ones against the new run.

Exit code, the first that applies: 2 — bad input (not a run directory, one run directory as both
runs, runs not comparable without ``--allow-different-trace``, a bad rule, an ``--out`` that is either
run directory or inside the base run, a file that cannot be written); 3 — a run has nothing to
judge (no measured step finished a request, or its requests mostly failed); 1 — a gate rule failed;
4 — a gate rule lacked evidence; 0 — otherwise (regressions without ``--gate`` are reported, not
failed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from oomload.cli.flags import add_format_flag, format_list
from oomload.errors import ConfigError, ExitCode


def register(subparsers: Any) -> None:
    """Add the ``compare`` sub-command."""
    parser = subparsers.add_parser(
        "compare",
        help="compare two run directories: what changed, and whether it is a regression",
        description=(
            "Compare a new run against a base run of the same trace: the setup (vLLM version, serve "
            "flags, KV pool, trace digest) and the result (KV pool, onsets, last safe level, latency "
            "at every common level, throughput, prefix-cache hit rate, peak memory), each difference "
            "with its evidence. Relative gate rules (onset>=baseline, kv-blocks>=baseline*0.95, "
            "p99-ttft-s@8<=baseline*1.10, no-new-death) are judged against the base run."
        ),
    )
    parser.add_argument("base_run", metavar="BASE_RUN", type=Path, help="the baseline run directory")
    parser.add_argument("new_run", metavar="NEW_RUN", type=Path, help="the run directory to judge")
    parser.add_argument(
        "--gate",
        action="append",
        default=[],
        metavar="EXPR",
        help="a gate rule, absolute or relative to the base run, e.g. 'onset>=baseline' (repeatable)",
    )
    parser.add_argument("--gate-file", type=Path, metavar="FILE", help="TOML file with [gate] rules = [...]")
    add_format_flag(parser)
    parser.add_argument(
        "--json", action="store_true", help="print compare.json to stdout instead of the terminal view"
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="where the files go (default: NEW_RUN/compare)"
    )
    parser.add_argument(
        "--allow-different-trace",
        action="store_true",
        help="compare runs of different traces or traffic, or without a common level (said on every page)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from oomload.report import run_exit_code
    from oomload.report.compare import compare_runs
    from oomload.report.comparepage import (
        COMPARE_FILES,
        COMPARE_FORMATS,
        render_compare_terminal,
        write_compare,
    )
    from oomload.report.compareside import load_side
    from oomload.verdict.gate import evaluate_gates, gate_exit_code, load_gate_file, parse_gate

    formats = format_list(args.format, COMPARE_FORMATS)
    gates: list[Any] = [parse_gate(g) for g in args.gate]
    if args.gate_file is not None:
        gates.extend(load_gate_file(args.gate_file))
    base = load_side(args.base_run)
    new = load_side(args.new_run)
    cmp = compare_runs(base, new, allow_different_trace=args.allow_different_trace)
    results = evaluate_gates(gates, new.verdict, base.verdict, cmp.latencies)
    code = gate_exit_code(results)
    for side in (base, new):
        judged = run_exit_code(side.verdict, (), reporting_only=True)
        if judged is ExitCode.UNREACHABLE:
            why = side.verdict.failed_run or "no measured step finished a request"
            print(f"oomload: {side.path} has nothing to judge: {why}", file=sys.stderr)
            code = ExitCode.UNREACHABLE
    files = [f for f in formats if f != "terminal"]
    if args.json and "json" not in files:
        files.append("json")
    out_dir = args.out if args.out is not None else new.path / "compare"
    _check_out(out_dir, base.path, new.path)
    console = Console(file=sys.stderr) if args.json else Console(stderr=False)
    written = write_compare(out_dir, cmp, results, files, exit_code=int(code))
    if "terminal" in formats and not args.json:
        render_compare_terminal(console, cmp, results)
    if args.json:
        sys.stdout.write((out_dir / COMPARE_FILES["json"]).read_text(encoding="utf-8"))
    elif written:
        print(f"oomload: wrote {', '.join(written)} in {out_dir} (exit code {int(code)})")
    return int(code)


def _check_out(out_dir: Path, base: Path, new: Path) -> None:
    """``ConfigError`` when ``--out`` would write into a run it compares: the base run (or a folder in
    it: compare writes nothing there), or a run directory itself, whose own ``junit.xml`` compare's
    would replace. The default, ``NEW_RUN/compare``, is neither."""
    out = out_dir.resolve()
    for run in (base, new):
        if out == run.resolve():
            raise ConfigError(
                f"--out {out_dir} is the run directory {run}: compare's junit.xml would replace the run's "
                f"own; name another directory (default: {new / 'compare'})"
            )
    if base.resolve() in out.parents:  # base and new are two directories: compare_runs refused one
        raise ConfigError(
            f"--out {out_dir} is inside the base run {base}: compare writes nothing into the base run; "
            f"name another directory (default: {new / 'compare'})"
        )
