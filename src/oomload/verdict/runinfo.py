"""The run as a whole, for the verdict: what was run, whether and where it was cut short, and the
context overflow (pure).

``RunInfo`` gathers the run's settings (``config.json``) and status (``status.json``): the run was cut
short when ``status.json`` is missing, says ``finished: false`` or ends with a reason in
``CUT_SHORT_REASONS``, when a step was cut short, or when the engine died; ``cut_short_detail`` says
where (step, concurrency, seconds from the first step's start). ``ContextOverflow`` counts the refusals
(``context_overflow`` outcomes) and the clamped answers (a ``truncated`` answer whose prompt + asked
output exceeds ``max_model_len``); other truncated answers that were not casualties of an engine death
are short responses. The rules and their reasons: ``oomload.verdict.verdict``'s module docstring.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oomload.outcome import Outcome, RequestResult
from oomload.realvllm.limits import ServerLimits, served_limits
from oomload.rundir.records import CUT_SHORT_REASONS, RunStatus
from oomload.verdict.death import EngineDeath
from oomload.verdict.deathcause import DeathKind
from oomload.verdict.runview import RunView
from oomload.verdict.stepfacts import END_REASON_WORDS, StepFacts


@dataclass(frozen=True, slots=True)
class ContextOverflow:
    refused: int
    clamped: int  # truncated answers whose prompt + asked output exceeds max_model_len
    refused_total_tokens_min: int | None
    refused_total_tokens_max: int | None
    clamped_total_tokens_min: int | None
    clamped_total_tokens_max: int | None
    model_limit: int | None
    trace_over_limit: int  # trace requests whose total length exceeds the model limit
    trace_count: int
    short_responses: int = 0  # other truncated answers (not clamped, not casualties of a death)
    left_out: bool = False  # --only-fitting: the trace's requests over the limit were not sent


@dataclass(frozen=True, slots=True)
class RunInfo:
    path: str
    model: str | None
    url: str | None
    simulated: bool | None
    trace_path: str | None
    started_unix_s: float | None
    finished: bool
    end_reason: str | None
    cut_short: bool
    cut_short_detail: str | None
    cache_config: Mapping[str, Any] | None
    max_model_len: int | None
    tail_percentile: float | None = None  # the order replayed only the trace's tail (config.json)
    open_loop: bool = False  # the trace's arrival times were replayed, not fixed concurrency levels
    api: str = "completions"  # "chat": calibrated text over the chat API (config.json)
    exact_output: bool = True  # False: --no-exact-output
    config_note: str | None = None  # why config.json could not be read
    # the server's prefill budget: the cache config's, else the --serve line's, else its log's words
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None  # the server's cap on running sequences: its serve line's, else its log's
    serve_args: tuple[str, ...] = ()  # what ``vllm serve`` was given for the model (config.json)
    served_line: str | None = None  # ``--serve``'s line, else ``--served-with``'s, secrets as ``***``
    trace_sha256: str | None = None  # the trace file's digest (provenance.json; None: an older run)


def run_info(view: RunView, steps: Sequence[StepFacts], death: EngineDeath | None) -> RunInfo:
    config = view.settings
    status = view.status
    finished = status is not None and status.finished
    end_reason = None if status is None else status.end_reason
    cut_steps = [s for s in steps if s.cut_short]
    cut_short = (
        status is None
        or not finished
        or end_reason in CUT_SHORT_REASONS
        or bool(cut_steps)
        or death is not None
    )
    detail = _cut_short_detail(view, steps, death, status, end_reason) if cut_short else None
    served = served_scheduler(view)
    batched = None if view.pool is None else view.pool.max_num_batched_tokens
    if batched is None:
        batched = served.max_num_batched_tokens
    limit = config.max_model_len  # from /v1/models, else the cache config
    if limit is None and view.pool is not None:
        limit = view.pool.max_model_len
    return RunInfo(
        path=str(view.path),
        model=config.model,
        serve_args=config.serve_args,
        served_line=served_line(view.config),
        url=config.url,
        simulated=config.simulated,
        trace_path=config.trace_path,
        started_unix_s=config.started_unix_s,
        finished=finished,
        end_reason=end_reason,
        cut_short=cut_short,
        cut_short_detail=detail,
        cache_config=view.cache_config,
        max_model_len=limit,
        max_num_batched_tokens=batched,
        max_num_seqs=served.max_num_seqs,
        tail_percentile=config.tail_percentile,
        open_loop=config.open_loop,
        api=config.api,
        exact_output=config.exact_output,
        config_note=view.config_note,
        trace_sha256=view.trace_sha256,
    )


def cut_only_by_death(run: RunInfo, steps: Sequence[StepFacts], death: EngineDeath | None) -> bool:
    """The run finished its own way and nothing but the engine's death cut it short — a death that is a
    finding of the load: not a kill from outside (``DeathKind.KILLED``), which only ended the run."""
    if death is None or not run.finished or death.kind is DeathKind.KILLED:
        return False
    return all(s.after_death or s.index == death.step for s in steps if s.cut_short)


def _cut_short_detail(
    view: RunView,
    steps: Sequence[StepFacts],
    death: EngineDeath | None,
    status: RunStatus | None,
    end_reason: str | None,
) -> str:
    """Where and why the run was cut short: the step, its concurrency, and the seconds from the first step's
    start — the clock ``--max-duration-s`` counts (``load.shape``: the server's start-up, the preflight
    and the odds computed before the load are not on it); the run directory's start without steps."""
    starts = [s.start_unix_s for s in steps]
    t0 = min(starts) if starts else view.settings.started_unix_s
    since = "the first step's start" if starts else "the run's start"

    def at(t: float | None) -> str:
        return "" if t is None or t0 is None else f" at {max(t - t0, 0.0):.1f} s from {since}"

    parts = []
    if status is None and (view.path / "status.json").exists():
        parts.append("status.json is unreadable (not the JSON oomload writes)")
    elif status is None:
        parts.append("no status.json (oomload itself stopped before writing it)")
    first_cut = min((s for s in steps if s.cut_short), key=lambda s: s.start_unix_s, default=None)
    if death is not None:
        where = "" if death.step is None else f" in step {death.step} (concurrency {death.concurrency})"
        parts.append(f"the server died{where}{at(death.t_unix_s)}")
    elif first_cut is not None:
        where = f"step {first_cut.index} (concurrency {first_cut.concurrency})"
        if first_cut.end_reason is None:
            parts.append(f"{where} started but never ended")
        else:
            cause = END_REASON_WORDS.get(
                first_cut.end_reason, f"the step ended with reason {first_cut.end_reason}"
            )
            parts.append(f"{cause} in {where}{at(first_cut.end_unix_s)}")
    elif status is not None:
        last = max(steps, key=lambda s: s.start_unix_s, default=None)
        after = "" if last is None else f" after step {last.index} (concurrency {last.concurrency})"
        parts.append(f"the run ended with reason {end_reason or 'unknown'}{after}")
    return "; ".join(parts) or "the run ended early"


def context_overflow(view: RunView, limit: int | None, death: EngineDeath | None) -> ContextOverflow:
    refused = [_total(r) for r in view.requests if r.outcome is Outcome.CONTEXT_OVERFLOW]
    casualties = frozenset() if death is None else death.casualty_ids
    truncated = [
        r for r in view.requests if r.outcome is Outcome.TRUNCATED and r.request_id not in casualties
    ]
    clamped = [_total(r) for r in truncated if limit is not None and _total(r) > limit]
    totals = view.trace_total_tokens
    return ContextOverflow(
        refused=len(refused),
        clamped=len(clamped),
        refused_total_tokens_min=min(refused, default=None),
        refused_total_tokens_max=max(refused, default=None),
        clamped_total_tokens_min=min(clamped, default=None),
        clamped_total_tokens_max=max(clamped, default=None),
        model_limit=limit,
        trace_over_limit=0 if limit is None else sum(1 for t in totals if t > limit),
        trace_count=len(totals),
        short_responses=len(truncated) - len(clamped),
        left_out=view.settings.only_fitting and limit is not None,
    )


def _total(r: RequestResult) -> int:
    return r.prompt_tokens_asked + r.output_tokens_asked


def served_scheduler(view: RunView) -> ServerLimits:
    """The server's scheduler limits as the line it was started with set them (``--serve``,
    ``--served-with``, the simulator's flags), each else as its log said it at start-up
    (``realvllm.limits``); ``None`` where neither says."""
    return config_limits(view.config, view.server_log)


def config_limits(config: Mapping[str, Any], server_log: str | None) -> ServerLimits:
    """``served_scheduler`` from ``config.json`` and the server's log (the replay's odds use it live)."""
    return served_limits(served_line(config) or sim_line(config), server_log)


def served_line(config: Mapping[str, Any]) -> str | None:
    """The line ``config.json`` says the server was started with: ``serve``, else ``served_with``."""
    for key in ("serve", "served_with"):
        value = config.get(key)
        if isinstance(value, str):
            return value
    return None


def sim_line(config: Mapping[str, Any]) -> str | None:
    """The simulator's command line when ``config.json`` says oomload started one (``sim_args``)."""
    sim_args = config.get("sim_args")
    if not isinstance(sim_args, list) or not sim_args:
        return None
    return shlex.join(["oomload", "sim", "serve", *map(str, sim_args)])
