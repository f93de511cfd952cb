"""Running a build on 1 and 2 workers in a fresh interpreter, for the parallel-build tests.

A fresh interpreter, because the test process may have been patched by gevent (Locust), where the
library reads in-process only. ``SPY`` (put before a runner script) records, in the main process,
which inputs were read in spans (``spans``) and what their spans sent (``kinds``: ``_Packed``
tables, or ``RenderedLines`` / ``LinesToRender`` rendered by workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from oomload.ingest.prefixes import PREFIX_SALT_ENV

SPY = r"""
from oomload.ingest import parallel as _parallel
spans, kinds = [], {}
_real_span_batches = _parallel._span_batches
def _spied(plan, *args, **kwargs):
    spans.append(str(plan.source.path))
    for item in _real_span_batches(plan, *args, **kwargs):
        kinds[type(item).__name__] = kinds.get(type(item).__name__, 0) + 1
        yield item
_parallel._span_batches = _spied
"""


def run_both(script: str, *argv: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``python -c SCRIPT ARGV…``; its last line of output is ``[single, spread]`` as JSON."""
    env = {**os.environ, PREFIX_SALT_ENV: "spreadrun"}  # two builds: one salt, so their ids compare
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env=env,
    )
    single, spread = json.loads(done.stdout.strip().splitlines()[-1])
    return single, spread
