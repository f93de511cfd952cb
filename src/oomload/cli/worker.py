"""``oomload worker --master HOST[:PORT]``: a Locust worker for ``oomload replay … --workers K`` on a
load host (docs/replay.md, "Distributed load").

It connects to the master over Locust's own protocol, gets the run's options and the trace's lengths
from it, reads the API key from *this* host's environment (the variable the master names), runs its
share of the users, and streams every result to the master's run directory. Locust is imported only
by ``oomload.run.worker``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from oomload.errors import ConfigError


def register(subparsers: Any) -> None:
    """Add the ``worker`` sub-command."""
    p = subparsers.add_parser(
        "worker",
        help="a Locust worker for `oomload replay --workers K` on another load host",
        description="Serve an `oomload replay … --workers K` master as one of its Locust workers: its share "
        "of the trace with the same exact lengths, results streamed to the master's run directory. The API "
        "key comes from this host's environment and is never sent. The protocol has no authentication: "
        "use it on a private network.",
    )
    p.add_argument("--master", required=True, metavar="HOST[:PORT]", help="the master (port default 5557)")
    p.add_argument(
        "--connect-timeout-s",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to keep trying to reach the master (default 60)",
    )
    p.add_argument(
        "--results",
        type=Path,
        metavar="FILE",
        help="also keep this worker's result rows in FILE (JSON Lines) on this host",
    )
    # set by `oomload replay --processes N` for the workers it starts itself
    p.add_argument("--local-index", type=int, help=argparse.SUPPRESS)
    p.add_argument("--local-run-dir", type=Path, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oomload.load.wire import parse_master_address

    parse_master_address(args.master)  # ConfigError before anything is imported
    if not (args.connect_timeout_s > 0 and math.isfinite(args.connect_timeout_s)):
        raise ConfigError(
            f"--connect-timeout-s must be a number of seconds > 0, got {args.connect_timeout_s}"
        )
    if args.results is not None and args.results.is_dir():
        raise ConfigError(f"--results {args.results} is a directory; name a file")
    from oomload.run.worker import run_worker

    return run_worker(
        args.master,
        connect_timeout_s=args.connect_timeout_s,
        local_index=args.local_index,
        run_dir=args.local_run_dir,
        results_path=args.results,
        say=lambda text: print(text, flush=True),
    )


__all__ = ["register", "run"]
