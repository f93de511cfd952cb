"""``oomload compare BASE_RUN NEW_RUN``: what changed between two runs, and whether it is a regression.

Each run directory is judged afresh, as ``oomload report`` judges it (``load_run`` → ``build_verdict``;
a missing or stale ``summary.json`` changes nothing: both runs are judged by the same rules), then read
as a typed ``Summary`` (``oomload.report.summary``). ``compare_runs`` puts two of them side by side:

* **Setup** — the server's version (``provenance.json``, else ``config.json``'s ``vllm_version``), the
  model, the ``--serve`` line or the simulator's flags, the pool the server reported
  (``cache_config.json``: KV blocks, block size, memory utilization, …), ``max_model_len``, the trace's
  digest, the traffic sent from it (``Verdict.traffic``: the prompts — the trace's shared prefixes
  or distinct, calibrated chat text, outputs the model ended — and which requests, how: the whole
  trace, ``--only-fitting``, ``--tail-percentile``, ``--open-loop``), the levels and repeats,
  oomload's version. A row says whether it changed.
* **Result** — each row with a status: ``regression`` / ``improvement`` (with evidence), ``not
  separated`` (a change the evidence does not carry), ``changed`` (a figure that is one number per
  run and has no test: shown, not judged), ``unchanged``, or ``not measured``.

  - KV pool: the block counts; fewer blocks is a regression (the count is the server's own, exact).
  - Preemption onset: ``oomload.verdict.shift.onset_shift`` — separated by the repeats of both runs
    (Fisher's exact test on the steps between the two onsets) or not; *not measured* ("—", or "none
    up to 2") for a run without an onset that judged no level for preemption, or none as high as the
    other run's onset (no ``/metrics`` scrape, cut short, levels that stopped below it): its "none"
    is no rise.
  - Engine death: a death in the new run at a level where the base survived is a regression (as the
    ``no-new-death`` rule); its kind is named.
  - Last safe concurrency: lower is a regression when the onset's fall is separated or the engine
    died anew; otherwise it is not separated (it moves with the onset).
  - Queueing and KV-saturation onsets, throughput, prefix-cache hit rate, peak memory (the device's,
    the server process's on the device, the server's host memory): changed or not, not judged; a
    figure is *changed* only where the change it shows is not zero (throughput to the percent, the
    hit rate to a tenth of a point, memory to the MiB).
  - Latency — TTFT, TPOT (mean inter-token latency) and end-to-end P50 and P99 at every level both
    runs measured, on the per-request samples (the ok requests of the trusted steps at that level):
    ``oomload.verdict.shift.level_shifts``, which the relative latency rules read too
    (``shift.latency_shift``: Mann–Whitney U for P50, bootstrap for P99; p < 0.01 and
    a change of ≥ 10 %; a change of ≥ 10 % at p ≥ 0.01 is *not separated*, a smaller one
    *unchanged*); a statistic that moved both ways across the levels, by moves of like size, is
    the host's run-to-run noise and not separated at any of them (``shift.across_levels``). When
    latencies moved one way only, a caveat says that a slower (or faster) host moves them alike — the
    tests tell a shift from the scatter within each run, not a slower release from a slower host
    (docs/compare.md, "Latency needs a quiet host"; ``host_caveat``).

Caveats, one sentence each: a run cut short (compared on what it measured), a run with nothing to
judge, a level that did not load the engine, the host caveat above, and the run's own caveats on what
its directory lacks (``RUN_CAVEATS``: no ``/metrics`` scrape, request records lost, an unreadable
``config.json``, impossible ``/metrics`` values), as its ``oomload report`` names them.

One run. A run compared with itself passes every relative rule: the same directory as both runs is
``ConfigError`` (exit 2), and a copy — two directories whose ``provenance.json`` started at the same
instant — is compared with a caveat that says so (``one_replay``).

Comparable. Two runs are comparable when they replayed the same trace (the SHA-256 of the trace file
as read, from ``provenance.json``; for a run from before that file, of its ``trace.jsonl`` copy, on
both sides) as the same traffic (distinct prompts preempt levels earlier than shared prefixes, a
trace's tail earlier than the whole of it) and measured at least one level in common. Otherwise
``compare_runs`` raises ``ConfigError`` with one sentence (exit 2), unless ``allow_different_trace``:
then the comparison is made and says why it may mislead.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from oomload import __version__
from oomload.errors import ConfigError
from oomload.report.compareside import (
    RunSide,
    SetupRow,
    comparability,
    setup_rows,
)
from oomload.rundir.summary import Summary
from oomload.verdict.levels import broke_at_lowest
from oomload.verdict.relative import onset_steps
from oomload.verdict.shift import (
    LatencyShift,
    OnsetShift,
    format_ms,
    level_shifts,
    onset_cell,
    onset_shift,
)

# The run's own caveats that compare repeats: what its directory lacks or holds wrong, run-wide (no
# /metrics scrape, request records lost, an unreadable config.json, impossible /metrics values), so every
# row of that run reads from less than it seems. Its cut-short and nothing-to-judge sentences are
# compare's own (above); the notes on one step or on the onset's evidence stay in its report.
RUN_CAVEATS = frozenset({"metrics_missing", "requests_missing", "config_unreadable", "metrics_invalid"})

Status = Literal["regression", "improvement", "not separated", "changed", "unchanged", "not measured"]


@dataclass(frozen=True, slots=True)
class ResultRow:
    key: str
    label: str
    base: str
    new: str
    status: Status
    evidence: str


@dataclass(frozen=True, slots=True)
class Comparison:
    base: RunSide
    new: RunSide
    setup: tuple[SetupRow, ...]
    results: tuple[ResultRow, ...]
    onset: OnsetShift
    latencies: tuple[LatencyShift, ...]
    common_levels: tuple[int, ...]
    caveats: tuple[str, ...]  # sentences: cut short, another trace allowed, …

    @property
    def regressions(self) -> tuple[ResultRow, ...]:
        return tuple(r for r in self.results if r.status == "regression")

    @property
    def headline(self) -> str:
        """One sentence: the regressions found, or that none was."""
        found = self.regressions
        if not found:
            return f"no regression found in {self.new.label} against {self.base.label}"
        names = ", ".join(r.label for r in found)
        return f"{len(found)} regression(s) in {self.new.label} against {self.base.label}: {names}"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "oomload.compare/1",
            "oomload_version": __version__,
            "base": str(self.base.path),
            "new": str(self.new.path),
            "headline": self.headline,
            "regressions": len(self.regressions),
            "common_levels": list(self.common_levels),
            "caveats": list(self.caveats),
            "setup": [
                {"label": r.label, "base": r.base, "new": r.new, "changed": r.changed} for r in self.setup
            ],
            "results": [
                {
                    "key": r.key,
                    "label": r.label,
                    "base": r.base,
                    "new": r.new,
                    "status": r.status,
                    "evidence": r.evidence,
                }
                for r in self.results
            ],
            "onset": {
                "base": self.onset.base,
                "new": self.onset.new,
                "direction": self.onset.direction,
                "separated": self.onset.separated,
                "p_value": self.onset.p_value,
                "judged_up_to": {"base": self.onset.base_top, "new": self.onset.new_top},
                "steps": {
                    "lower_run": [self.onset.low_hits, self.onset.low_steps],
                    "higher_run": [self.onset.high_hits, self.onset.high_steps],
                },
            },
            "latency": [
                {
                    "metric": s.metric,
                    "stat": s.stat,
                    "concurrency": s.concurrency,
                    "base_ms": s.base_ms,
                    "new_ms": s.new_ms,
                    "base_n": s.base_n,
                    "new_n": s.new_n,
                    "ratio": s.ratio,
                    "p_value": s.p_value,
                    "test": s.test,
                    "judgement": s.judgement,
                }
                for s in self.latencies
            ],
        }


def compare_runs(base: RunSide, new: RunSide, *, allow_different_trace: bool = False) -> Comparison:
    """Put two judged runs side by side (module docstring); ``ConfigError`` when they are one run
    directory, or not comparable and ``allow_different_trace`` is not set."""
    if base.path.resolve() == new.path.resolve():
        raise ConfigError(
            f"BASE_RUN and NEW_RUN are one run directory ({new.path}): a run compared with itself passes "
            "every relative rule and proves nothing; give the baseline's own run directory"
        )
    caveats = [*comparability(base, new, allow_different_trace)]
    same = one_replay(base, new)
    if same is not None:
        caveats.append(same)
    for side, name in ((base, "base"), (new, "new")):
        if side.summary.cut_short:
            caveats.append(
                f"the {name} run {side.label} was cut short ({side.summary.cut_short_detail}): "
                "what it did not measure is not compared"
            )
        caveats += [
            f"the {name} run {side.label}: {note.message}"
            for note in side.verdict.notes
            if note.kind in RUN_CAVEATS and note.step is None
        ]
        if side.summary.failed_run is not None:
            caveats.append(f"the {name} run {side.label}: {side.summary.failed_run}")
        elif unloaded := side.verdict.unloaded_steps:  # its level, and any above it, measured nothing
            caveats.append(f"in the {name} run {side.label}, {unloaded[0]}: no evidence at that level")
    common = tuple(sorted(set(base.summary.levels) & set(new.summary.levels)))
    onset = onset_shift(
        onset_steps(base.verdict), _onset(base.summary), onset_steps(new.verdict), _onset(new.summary)
    )
    latencies = level_shifts(base.samples, new.samples, common)
    results = (
        *_pool_rows(base.summary, new.summary),
        _onset_row(onset),
        death_row(base.summary, new.summary),
        _last_safe_row(base.summary, new.summary, onset),
        _plain_row("queueing", "queueing onset", base.summary.queueing_onset, new.summary.queueing_onset),
        _plain_row(
            "kv_saturation",
            "KV saturation onset",
            base.summary.kv_saturation_onset,
            new.summary.kv_saturation_onset,
        ),
        *(_latency_row(s) for s in latencies),
        *_throughput_rows(base.summary, new.summary, common),
        _rate_row(base.summary.prefix_hit_rate, new.summary.prefix_hit_rate),
        _bytes_row(
            "device_peak",
            "device memory used, peak",
            base.summary.device_used_peak_bytes,
            new.summary.device_used_peak_bytes,
        ),
        _bytes_row(
            "server_device_peak",
            "server process device memory, peak",
            base.summary.server_device_peak_bytes,
            new.summary.server_device_peak_bytes,
        ),
        _bytes_row(
            "server_host_peak",
            "server host memory, peak",
            base.summary.server_host_peak_bytes,
            new.summary.server_host_peak_bytes,
        ),
    )
    host = host_caveat(latencies)
    if host is not None:
        caveats.append(host)
    return Comparison(
        base=base,
        new=new,
        setup=setup_rows(base, new),
        results=results,
        onset=onset,
        latencies=latencies,
        common_levels=common,
        caveats=tuple(caveats),
    )


def one_replay(base: RunSide, new: RunSide) -> str | None:
    """One sentence when two run directories hold one replay (a copy): their ``provenance.json`` says
    both started at the same instant. Every relative rule passes on it, as on one directory twice."""
    b, n = (None if s.provenance is None else s.provenance.started_unix_s for s in (base, new))
    if b is None or b != n:
        return None
    when = dt.datetime.fromtimestamp(b, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"{base.label} and {new.label} are one replay (both started at {when}, provenance.json): a copy of "
        "a run compared with itself proves nothing about a release"
    )


def host_caveat(latencies: Sequence[LatencyShift]) -> str | None:
    """One sentence when the latencies that moved (not ``mixed``) all moved one way: a host slower or
    faster than the other run's moves them alike, so they are no proof of the server's change alone.
    Two runs of one configuration on this 2-core host moved P50 TPOT and E2E +10…+37 % at three of six
    levels (p ≤ 0.005), all slower."""
    moved = [s for s in latencies if s.moved and not s.mixed]
    ratios = [s.ratio for s in moved if s.ratio is not None]
    if not ratios or (min(ratios) < 1.0 < max(ratios)):
        return None
    slower = ratios[0] > 1.0
    way = "slower" if slower else "faster"
    levels = ", ".join(map(str, sorted({s.concurrency for s in moved})))
    return (
        f"every latency that moved was {way} ({_span_pct(ratios)} at {levels}): a {way} host moves latency "
        "alike, so compare runs made on the same quiet host, or rerun the baseline there, before "
        "calling it the server's change (docs/compare.md, 'Latency needs a quiet host')"
    )


def _span_pct(ratios: Sequence[float]) -> str:
    """``+10…+37 %`` (or one figure): the moves as changes in percent."""
    pcts = sorted(round((r - 1.0) * 100) for r in ratios)
    low, high = pcts[0], pcts[-1]
    return f"{low:+d} %" if low == high else f"{low:+d}…{high:+d} %"


def _onset(summary: Summary) -> int | None:
    return None if summary.preemption_onset is None else summary.preemption_onset.concurrency


def _text(value: object) -> str:
    return "none" if value is None else str(value)


def _pool_rows(base: Summary, new: Summary) -> list[ResultRow]:
    b = None if base.pool is None else base.pool.num_gpu_blocks
    n = None if new.pool is None else new.pool.num_gpu_blocks
    if b is None or n is None:
        return [
            ResultRow(
                "kv_blocks", "KV pool (blocks)", _text(b), _text(n), "not measured", "no cache_config_info"
            )
        ]
    if n == b:
        return [
            ResultRow("kv_blocks", "KV pool (blocks)", str(b), str(n), "unchanged", "the same block count")
        ]
    change = f"{n - b:+d} blocks ({(n - b) / b:+.0%})" if b else f"{n - b:+d} blocks"
    status: Status = "regression" if n < b else "improvement"
    word = "shrank" if n < b else "grew"
    return [ResultRow("kv_blocks", "KV pool (blocks)", str(b), str(n), status, f"the pool {word}: {change}")]


def _onset_row(shift: OnsetShift) -> ResultRow:
    status: Status
    if shift.direction == "not measured":
        status = "not measured"
    elif shift.direction == "same":
        status = "unchanged"
    elif shift.separated:
        status = "regression" if shift.direction == "lower" else "improvement"
    else:
        status = "not separated"
    base, new = onset_cell(shift.base, shift.base_top), onset_cell(shift.new, shift.new_top)
    return ResultRow("preemption_onset", "preemption onset", base, new, status, shift.sentence)


def _death_text(summary: Summary) -> str:
    death = summary.death
    if death is None:
        return "none"
    return f"at {_text(death.concurrency)} ({death.kind or 'cause unknown'})"


def death_row(base: Summary, new: Summary) -> ResultRow:
    """The engine-death row (module docstring); ``oomload report --history`` reads its moves from it too.
    A death counts only where the other run measured: a new run that survived only up to a level below
    the base's death, or one that died above the base's highest level tested, is *not measured*."""
    b, n = base.death, new.death
    bt, nt = _death_text(base), _death_text(new)

    def row(status: Status, evidence: str) -> ResultRow:
        return ResultRow("engine_death", "engine death", bt, nt, status, evidence)

    if b is None and n is None:
        return row("unchanged", "neither engine died")
    if n is None:
        top = new.max_tested_concurrency
        if b is not None and b.concurrency is not None and (top is None or top < b.concurrency):
            return row(
                "not measured",
                f"the new run's engine survived, but only up to {_text(top)}, below the base's death",
            )
        return row("improvement", "the new run's engine survived")
    top = base.max_tested_concurrency
    if b is None and n.concurrency is not None and top is not None and n.concurrency > top:
        return row("not measured", f"the new run's engine died above the base's highest level tested ({top})")
    if b is None or (
        b.concurrency is not None and n.concurrency is not None and n.concurrency < b.concurrency
    ):
        where = "survived" if b is None else f"died only at {b.concurrency}"
        return row("regression", f"the new run's engine died; the base's {where}")
    same_kind = b.kind == n.kind
    return row(
        "unchanged" if same_kind and b.concurrency == n.concurrency else "changed",
        "both engines died" + ("" if same_kind else f"; the kind changed ({b.kind} → {n.kind})"),
    )


def _last_safe_row(base: Summary, new: Summary, onset: OnsetShift) -> ResultRow:
    b, n = base.last_safe_concurrency, new.last_safe_concurrency
    label = "last safe concurrency"
    n_text = _text(n)
    lowest = broke_at_lowest(n, new.first_unsafe_concurrency, new.levels)
    if b is not None and lowest is not None and lowest <= b:
        n, n_text = lowest - 1, f"none (broke at {lowest})"  # below its lowest level: under the base's
    if b is None or n is None:
        return ResultRow("last_safe", label, _text(b), n_text, "not measured", "a run has no last safe level")
    if b == n:
        return ResultRow("last_safe", label, str(b), str(n), "unchanged", "the same level")
    new_death = new.death is not None and (
        base.death is None or (base.death.concurrency or 0) > (new.death.concurrency or 0)
    )
    if n < b:
        carried = onset.regression or new_death
        status: Status = "regression" if carried else "not separated"
        why = (
            "with the onset's separated fall"
            if onset.regression
            else "with a new engine death"
            if new_death
            else ("but the onset's move is not separated by the repeats")
        )
        return ResultRow("last_safe", label, str(b), n_text, status, f"fell from {b} to {n_text}, {why}")
    carried = onset.direction == "higher" and onset.separated is True
    return ResultRow(
        "last_safe",
        label,
        str(b),
        str(n),
        "improvement" if carried else "not separated",
        f"rose from {b} to {n}",
    )


def _plain_row(key: str, label: str, b: int | None, n: int | None) -> ResultRow:
    status: Status = "unchanged" if b == n else "changed"
    evidence = "the same" if b == n else "one level per run: shown, not tested"
    return ResultRow(key, label, _text(b), _text(n), status, evidence)


def _latency_row(shift: LatencyShift) -> ResultRow:
    judgement = shift.judgement
    status: Status
    if (shift.moved and shift.mixed) or judgement == "not separated":  # moved, but not by the evidence
        status = "not separated"
    elif judgement == "slower":
        status = "regression"
    elif judgement == "faster":
        status = "improvement"
    elif judgement == "too few samples" or shift.base_ms is None or shift.new_ms is None:
        status = "not measured"
    else:
        status = "unchanged"
    return ResultRow(
        f"{shift.stat}_{shift.metric}@{shift.concurrency}",
        f"{shift.stat.upper()} {shift.metric.upper()} @ {shift.concurrency}",
        _ms(shift.base_ms),
        _ms(shift.new_ms),
        status,
        shift.sentence,
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else format_ms(value)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _throughput_rows(base: Summary, new: Summary, levels: Sequence[int]) -> list[ResultRow]:
    rows = []
    for c in levels:
        b = _mean([s.output_tokens_per_s for s in base.steps_at(c) if s.trusted])
        n = _mean([s.output_tokens_per_s for s in new.steps_at(c) if s.trusted])
        bt = "—" if b is None else f"{b:.0f} tok/s"
        nt = "—" if n is None else f"{n:.0f} tok/s"
        if b is None or n is None:
            rows.append(
                ResultRow(f"throughput@{c}", f"throughput @ {c}", bt, nt, "not measured", "no trusted step")
            )
            continue
        change = (n - b) / b if b else 0.0
        status: Status = "unchanged" if abs(change) < 0.005 else "changed"
        rows.append(
            ResultRow(
                f"throughput@{c}",
                f"throughput @ {c}",
                bt,
                nt,
                status,
                f"{change:+.0%} (output tokens per second of the trusted steps; not tested)",
            )
        )
    return rows


def _rate_row(b: float | None, n: float | None) -> ResultRow:
    bt = "—" if b is None else f"{b:.1%}"
    nt = "—" if n is None else f"{n:.1%}"
    if b is None or n is None:
        return ResultRow(
            "prefix_hit_rate", "prefix-cache hit rate", bt, nt, "not measured", "no prefix-cache counters"
        )
    points = (n - b) * 100
    status: Status = "unchanged" if abs(points) < 0.05 else "changed"
    return ResultRow(
        "prefix_hit_rate", "prefix-cache hit rate", bt, nt, status, f"{points:+.1f} points (not tested)"
    )


def _bytes_row(key: str, label: str, b: int | None, n: int | None) -> ResultRow:
    bt = "—" if b is None else _gib(b)
    nt = "—" if n is None else _gib(n)
    if b is None or n is None:
        return ResultRow(key, label, bt, nt, "not measured", "not sampled in both runs")
    if b == n:
        return ResultRow(key, label, bt, nt, "unchanged", "the same peak")
    share = f" ({(n - b) / b:+.1%})" if b else ""
    if round((n - b) / 2**20) == 0:  # "changed" only where the change shown is not zero
        return ResultRow(key, label, bt, nt, "unchanged", f"the same peak to the MiB{share}")
    change = f"{(n - b) / 2**20:+.0f} MiB{share}"
    return ResultRow(key, label, bt, nt, "changed", f"{change}; one peak per run: shown, not tested")


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"
