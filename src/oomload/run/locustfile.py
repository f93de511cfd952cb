"""A Locust entry file: ``locust -f`` loads it for the plain ``scenarios/`` runs.

Configured from the environment, never from code (see ``ScenarioSettings``): ``OOMLOAD_TRACE``
(required), ``OOMLOAD_API``, ``OOMLOAD_MODEL``, ``OOMLOAD_STREAM``, ``OOMLOAD_EXACT_OUTPUT``,
``OOMLOAD_ORDER``, ``OOMLOAD_SEED``, ``OOMLOAD_TAIL_PERCENTILE``, ``OOMLOAD_DISTINCT_PROMPTS``,
``OOMLOAD_TOKEN_ID_RANGE``, ``OOMLOAD_REQUEST_TIMEOUT_S``, ``OOMLOAD_API_KEY_ENV``,
``OOMLOAD_RUN_DIR``, or ``OOMLOAD_SCENARIO=file.json`` holding the same keys in lower case without
the prefix; with ``OOMLOAD_RAMP`` (a level list or ramp) and ``OOMLOAD_HOLD_S`` the file also defines
a step shape, which Locust then uses instead of ``-u``/``-r``.

The workers of ``oomload replay`` do not use this file: they are ``oomload worker`` processes
(``oomload.run.worker_node``), configured by their master.

The user class is configured when Locust fires ``init`` (the host is known by then).
"""

from __future__ import annotations

import os
from typing import Any

from locust import events

from oomload.run.scenario import ScenarioUser, configure, make_env_shape, scenario_settings

__all__ = ["ScenarioUser", "StepShape"]

_SETTINGS = scenario_settings(os.environ)

StepShape: Any = make_env_shape(_SETTINGS) if _SETTINGS.ramp else None


def _on_init(environment: Any, **_kw: Any) -> None:
    configure(environment, _SETTINGS)


events.init.add_listener(_on_init)  # type: ignore[no-untyped-call]
