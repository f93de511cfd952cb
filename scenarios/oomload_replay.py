"""Plain-Locust scenario: replay an oomload trace with exact lengths.

    OOMLOAD_TRACE=traces/sample-chat.jsonl locust -f scenarios/oomload_replay.py \
        --host http://127.0.0.1:8000 --headless -u 8 -r 8 -t 30s

Configuration by environment (see docs/replay.md, "Scenarios"): OOMLOAD_TRACE (required),
OOMLOAD_API, OOMLOAD_MODEL, OOMLOAD_ORDER, OOMLOAD_SEED, OOMLOAD_TAIL_PERCENTILE, OOMLOAD_ONLY_FITTING,
OOMLOAD_RUN_DIR,
OOMLOAD_RAMP + OOMLOAD_HOLD_S (a step shape instead of -u/-r), … or OOMLOAD_SCENARIO=file.json.
All the logic lives in ``oomload.load``; this file only re-exports its Locust entry points.
"""

from oomload.run.locustfile import *  # noqa: F403  (the user class, the optional shape, the init hook)
