"""``oomload worker --master HOST[:PORT]``: a Locust worker for ``oomload replay … --workers K`` on a
load host (docs/replay.md, "Distributed load").

It connects to the master over Locust's own protocol, proves (and makes the master prove) that both
hold the worker token (``--token-file`` or ``$OOMLOAD_WORKER_TOKEN``, never a command-line value),
gets the run's options and the trace's lengths from it, refuses a target URL it was not told to trust
(``--url``), reads the API key from *this* host's environment through its own variable
(``--api-key-env``; the master's choice is ignored), runs its share of the users, and streams every
result to the master's run directory. Locust is imported only by ``oomload.run.worker_node``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from oomload.errors import ConfigError
from oomload.run.config import DEFAULT_API_KEY_ENV


def register(subparsers: Any) -> None:
    """Add the ``worker`` sub-command."""
    p = subparsers.add_parser(
        "worker",
        help="a Locust worker for `oomload replay --workers K` on another load host",
        description="Serve an `oomload replay … --workers K` master as one of its Locust workers: its share "
        "of the trace with the same exact lengths, results streamed to the master's run directory. Worker "
        "and master prove to each other that they hold the same worker token; the worker loads only the "
        "server it was told to trust (--url) with the API key of its own variable (--api-key-env), which "
        "is never sent. The link is not encrypted: use a private network or a tunnel.",
    )
    p.add_argument("--master", required=True, metavar="HOST[:PORT]", help="the master (port default 5557)")
    p.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="URL",
        help="the server this worker may load: the master's --url must be this one (repeat for several)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="the worker token the master wrote (mode 0600); default: $OOMLOAD_WORKER_TOKEN, else "
        "~/.config/oomload/worker-token",
    )
    p.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        metavar="NAME",
        help=f"this host's variable holding the API key (default {DEFAULT_API_KEY_ENV}); the master's "
        "choice is ignored",
    )
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
    trust = _trust(args)
    from oomload.run.worker_node import run_worker

    return run_worker(
        args.master,
        trust=trust,
        connect_timeout_s=args.connect_timeout_s,
        local_index=args.local_index,
        run_dir=args.local_run_dir,
        results_path=args.results,
        say=lambda text: print(text, flush=True),
    )


def _trust(args: argparse.Namespace) -> Any:
    """What this worker decides for itself: its token, the URLs it may load, its key's variable."""
    import os

    from oomload.credentials import url_credentials_error, url_has_credentials
    from oomload.load.wire import url_key
    from oomload.run.worker_node import WorkerTrust, worker_token

    if not args.url:
        raise ConfigError(
            "give the worker the server it may load with --url URL (the master's --url); it refuses "
            "any other the master names"
        )
    for url in args.url:
        if url_has_credentials(url):
            raise url_credentials_error("--url", url, args.api_key_env)
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--url {url!r} is not an http:// or https:// URL")
    name = args.api_key_env
    if not name or not all(c.isalnum() or c == "_" for c in name) or name[0].isdigit():
        raise ConfigError(f"--api-key-env {name!r} is not an environment variable name")
    token = worker_token(args.token_file, os.environ)
    return WorkerTrust(token=token, urls=tuple(url_key(u) for u in args.url), api_key_env=name)


__all__ = ["register", "run"]
