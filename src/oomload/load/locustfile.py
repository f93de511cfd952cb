"""A Locust entry file: ``locust -f`` loads it in worker processes and in ``scenarios/``.

Configured from the environment, never from code:

* ``OOMLOAD_WORKER_JSON``: set by ``oomload replay --processes N`` for its worker processes (the
  runner's options plus ``worker``/``workers``/``run_dir``);
* otherwise the scenario variables (see ``scenario_options``): ``OOMLOAD_TRACE`` (required),
  ``OOMLOAD_API``, ``OOMLOAD_MODEL``, ``OOMLOAD_STREAM``, ``OOMLOAD_EXACT_OUTPUT``, ``OOMLOAD_ORDER``,
  ``OOMLOAD_SEED``, ``OOMLOAD_TAIL_PERCENTILE``, ``OOMLOAD_PREFIX_SHARING``, ``OOMLOAD_TOKEN_ID_RANGE``,
  ``OOMLOAD_REQUEST_TIMEOUT_S``, ``OOMLOAD_API_KEY_ENV``, ``OOMLOAD_RUN_DIR``, or
  ``OOMLOAD_SCENARIO=file.json`` holding the same keys in lower case without the prefix;
  with ``OOMLOAD_RAMP`` (a level list or ramp) and ``OOMLOAD_HOLD_S`` the file also defines a step
  shape, which Locust then uses instead of ``-u``/``-r``.

The user class is configured when Locust fires ``init`` (the host is known by then).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from locust import events

from oomload.load.scenario import ScenarioUser, configure, make_env_shape, scenario_options

__all__ = ["ScenarioUser", "StepShape"]

_WORKER = os.environ.get("OOMLOAD_WORKER_JSON")
_OPTIONS: dict[str, Any] = json.loads(_WORKER) if _WORKER else scenario_options(os.environ)

StepShape: Any = make_env_shape(_OPTIONS) if not _WORKER and _OPTIONS.get("ramp") else None


def _on_init(environment: Any, **_kw: Any) -> None:
    configure(environment, _OPTIONS, Path(__file__))


events.init.add_listener(_on_init)  # type: ignore[no-untyped-call]
