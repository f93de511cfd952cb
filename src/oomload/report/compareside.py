"""One run as ``oomload compare`` reads it (``RunSide``, ``load_side``), and what two runs are compared on
before their results: whether they are comparable (``comparability``) and the setup rows side by side
(``setup_rows``). ``oomload.report.compare`` has the rules; they are read there.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from oomload.errors import ConfigError
from oomload.outcome import Outcome
from oomload.report.summary import build_summary
from oomload.rundir.provenance import Provenance, file_sha256, read_provenance
from oomload.rundir.summary import Summary, summary_from_doc
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.recommend import recommend
from oomload.verdict.runinfo import served_line, sim_line
from oomload.verdict.runview import RunView, load_run
from oomload.verdict.shift import LATENCIES

POOL_KEYS = ("num_gpu_blocks", "block_size", "gpu_memory_utilization", "cache_dtype", "enable_prefix_caching")


@dataclass(frozen=True, slots=True)
class RunSide:
    """One run as the comparison reads it."""

    path: Path
    view: RunView
    verdict: Verdict
    summary: Summary
    provenance: Provenance | None
    trace_digest: str | None
    digest_of: str  # "trace file" (provenance.json) | "trace.jsonl copy" | "none"
    samples: Mapping[int, Mapping[str, tuple[float, ...]]]  # level → latency → ms of ok requests

    @property
    def label(self) -> str:
        return self.path.name or str(self.path)


def load_side(path: str | Path) -> RunSide:
    """Read and judge one run directory (``ConfigError`` with one sentence when it is not one)."""
    view = load_run(path)
    verdict = build_verdict(view)
    doc = build_summary(verdict, recommend(verdict), (), exit_code=0, generated_unix_s=time.time())
    provenance = read_provenance(view.path)
    digest, digest_of = _digest(view.path, provenance)
    return RunSide(
        path=view.path,
        view=view,
        verdict=verdict,
        summary=summary_from_doc(doc, source=f"the verdict of {view.path}"),
        provenance=provenance,
        trace_digest=digest,
        digest_of=digest_of,
        samples=latency_samples(view, verdict),
    )


def _digest(run_dir: Path, provenance: Provenance | None) -> tuple[str | None, str]:
    if provenance is not None:
        return provenance.trace_sha256, "trace file"
    try:
        return file_sha256(run_dir / "trace.jsonl"), "trace.jsonl copy"
    except OSError:
        return None, "none"


def latency_samples(view: RunView, verdict: Verdict) -> dict[int, dict[str, tuple[float, ...]]]:
    """Per level, the per-request latencies (ms) of the ok requests in its trusted measured steps."""
    trusted = {s.index for s in verdict.measured_steps if s.trusted}
    out: dict[int, dict[str, list[float]]] = {}
    for step in view.steps:
        if step.boundary.index not in trusted:
            continue
        level = out.setdefault(step.boundary.concurrency, {k: [] for k in LATENCIES})
        for r in step.requests:
            if r.outcome is not Outcome.OK:
                continue
            for key, value in (("ttft", r.ttft_ms), ("tpot", r.tpot_ms), ("e2e", r.e2e_ms)):
                if value is not None:
                    level[key].append(float(value))
    return {c: {k: tuple(v) for k, v in by.items()} for c, by in out.items()}


@dataclass(frozen=True, slots=True)
class SetupRow:
    label: str
    base: str
    new: str

    @property
    def changed(self) -> bool:
        return self.base != self.new


def comparability(base: RunSide, new: RunSide, allow: bool) -> list[str]:
    problems = []
    if base.trace_digest is None or new.trace_digest is None:
        missing = base.label if base.trace_digest is None else new.label
        problems.append(f"{missing} holds no trace digest and no trace.jsonl: the traces cannot be compared")
    elif base.trace_digest != new.trace_digest:
        kind = "trace files" if base.digest_of == new.digest_of == "trace file" else "trace copies"
        problems.append(
            f"{base.label} and {new.label} replayed different traces (sha256 of the {kind}: "
            f"{base.trace_digest[:12]}… and {new.trace_digest[:12]}…)"
        )
    if base.verdict.traffic != new.verdict.traffic:
        problems.append(
            f"{base.label} and {new.label} sent different traffic from the trace ({base.verdict.traffic} "
            f"against {new.verdict.traffic})"
        )
    if not set(base.summary.levels) & set(new.summary.levels):
        problems.append(
            f"{base.label} and {new.label} measured no level in common "
            f"({_levels(base.summary.levels)} against {_levels(new.summary.levels)})"
        )
    if problems and not allow:
        raise ConfigError(
            "; ".join(problems) + ": their onsets and latencies are not comparable "
            "(--allow-different-trace compares them anyway)"
        )
    return [p + " (compared anyway: --allow-different-trace)" for p in problems]


def _levels(levels: Sequence[int]) -> str:
    return ",".join(map(str, levels)) or "none"


def setup_rows(base: RunSide, new: RunSide) -> tuple[SetupRow, ...]:
    def version(side: RunSide) -> str:
        recorded = side.provenance.server_version if side.provenance else side.view.config.get("vllm_version")
        return str(recorded) if recorded else "not reported"

    def oomload_version(side: RunSide) -> str:  # provenance.json's, else (an older run) config.json's
        provenance = side.provenance
        recorded = provenance.oomload_version if provenance else side.view.config.get("oomload_version")
        return str(recorded) if recorded and recorded != "?" else "not recorded"

    def serve(side: RunSide) -> str:
        line = side.provenance.serve if side.provenance else served_line(side.view.config)
        return str(line or sim_line(side.view.config) or "not started by oomload")

    def pool(side: RunSide, key: str) -> str:
        cache = side.view.cache_config or {}
        value = cache.get(key)
        return "not reported" if value is None else str(value)

    def schedule(side: RunSide, key: str) -> str:
        sched = side.view.config.get("schedule")
        value = sched.get(key) if isinstance(sched, Mapping) else None
        if isinstance(value, list):
            return _levels([int(v) for v in value if isinstance(v, int)])
        return "not recorded" if value is None else str(value)

    def digest(side: RunSide) -> str:
        return (
            "not recorded"
            if side.trace_digest is None
            else f"sha256 {side.trace_digest[:16]}… ({side.digest_of})"
        )

    rows = [
        SetupRow("vLLM version", version(base), version(new)),
        SetupRow("model", base.summary.model or "?", new.summary.model or "?"),
        SetupRow("serve line", serve(base), serve(new)),
        *(SetupRow(key, pool(base, key), pool(new, key)) for key in POOL_KEYS),
        SetupRow("max_model_len", str(base.summary.max_model_len), str(new.summary.max_model_len)),
        SetupRow("trace", digest(base), digest(new)),
        SetupRow("traffic", base.verdict.traffic, new.verdict.traffic),
        SetupRow("levels", schedule(base, "levels"), schedule(new, "levels")),
        SetupRow("repeats", schedule(base, "repeats"), schedule(new, "repeats")),
        SetupRow("oomload version", oomload_version(base), oomload_version(new)),
    ]
    return tuple(rows)
