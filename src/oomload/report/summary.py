"""``summary.json``: the verdict, the recommendation and the gate results in one versioned document.

Schema ``oomload.summary/1`` (documented in docs/report.md). Within major version 1 keys are only
ever added; a reader must ignore keys it does not know. A breaking change bumps the schema string.

Every reader reads it back through ``oomload.rundir.summary.read_summary`` (typed values).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, TypedDict

from oomload import __version__
from oomload.rundir.summary import SUMMARY_SCHEMA
from oomload.verdict import Verdict
from oomload.verdict.gate import GateResult
from oomload.verdict.recommend import Recommendation


class SummaryDoc(TypedDict):
    schema: str
    oomload_version: str
    generated_unix_s: float
    verdict: dict[str, Any]
    recommendation: dict[str, Any]
    gates: list[dict[str, object]]
    exit_code: int


def build_summary(
    verdict: Verdict,
    recommendation: Recommendation,
    gate_results: Sequence[GateResult],
    *,
    exit_code: int,
    generated_unix_s: float,
) -> SummaryDoc:
    """The ``summary.json`` document (plain JSON values; non-finite floats become null)."""
    doc: SummaryDoc = {
        "schema": SUMMARY_SCHEMA,
        "oomload_version": __version__,
        "generated_unix_s": generated_unix_s,
        "verdict": verdict.to_json(),
        "recommendation": recommendation.to_json(),
        "gates": [r.to_json() for r in gate_results],
        "exit_code": int(exit_code),
    }
    return _finite(doc)  # type: ignore[no-any-return]


def dump_summary(doc: SummaryDoc) -> str:
    return json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n"


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
