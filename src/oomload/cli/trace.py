"""``oomload trace build | stats | synth``: production logs → length-only traces, and what they imply.

The handlers only parse flags, call ``oomload.ingest`` / ``oomload.stats`` / ``oomload.synth`` and
print; heavy imports (pyarrow, rich, matplotlib) happen inside them so ``oomload --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from oomload.errors import ExitCode


def register(subparsers: Any) -> None:
    """Add ``trace`` with its ``build``, ``stats`` and ``synth`` sub-commands."""
    parser = subparsers.add_parser(
        "trace",
        help="build, describe or synthesize length-only request traces",
        description="Turn production logs into length-only traces, describe them, or synthesize one.",
    )
    actions = parser.add_subparsers(dest="trace_command", metavar="ACTION")
    parser.set_defaults(func=_missing_action(parser))

    synth = actions.add_parser(
        "synth",
        help="generate a trace from length distributions",
        description="Generate a trace from length distributions (log-normal from P50/P99, fixed, mixes).",
    )
    synth.add_argument("-o", "--out", required=True, help="trace file to write")
    synth.add_argument("--count", type=int, required=True, help="number of requests")
    synth.add_argument(
        "--input",
        default="lognormal:600:6000",
        help="prompt length spec: fixed:N | uniform:LO:HI | lognormal:P50:P99[:MAX] | A@W+B@W "
        "(default lognormal:600:6000)",
    )
    synth.add_argument(
        "--output", default="lognormal:200:1000", help="output length spec (default lognormal:200:1000)"
    )
    synth.add_argument("--rate", type=float, default=None, help="Poisson arrival rate, requests/s")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.set_defaults(func=run_synth)


def _missing_action(parser: argparse.ArgumentParser) -> Any:
    def run(args: argparse.Namespace) -> int:
        del args
        parser.print_help()
        return int(ExitCode.USAGE)

    return run


def run_synth(args: argparse.Namespace) -> int:
    from oomload.synth import describe_spec, parse_length_spec, synthesize
    from oomload.trace import TraceHeader, write_trace

    prompt = parse_length_spec(args.input)
    output = parse_length_spec(args.output)
    records = synthesize(args.count, prompt, output, rate_rps=args.rate, seed=args.seed)
    header = TraceHeader(
        source=(),
        format="synth",
        extra={
            "synth": {
                "input": describe_spec(prompt),
                "output": describe_spec(output),
                "rate_rps": args.rate,
                "seed": args.seed,
                "count": args.count,
            }
        },
    )
    written = write_trace(args.out, records, header)
    print(f"wrote {written} synthetic requests to {args.out}")
    return int(ExitCode.OK)
