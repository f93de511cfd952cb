"""``oomload tune``, wired: per candidate start the server → read the pool → odds → replay → proof.

``run_tune(config, console)``:

1. reads the trace (lengths only) and derives the recommended ``max_model_len``
   (``stats.recommend_max_model_len``: the cut the start-up rule uses);
2. prints the bounds before anything starts: at most ``max_starts`` server starts and
   ``max_duration_s`` of wall time (a candidate is not started when the time left is below its
   start-up timeout plus its replay bound);
3. per candidate (``search.next_proposal``), one at a time:

   * the free device memory (NVML, when there is a GPU) just before the start;
   * start the user's ``--serve`` line with the candidate's flags (``servecmd``) through
     ``oomload.realvllm.server.RealVllmServer`` — its own process group, loopback and a free port
     unless told otherwise, ``/health`` awaited, the log in ``candidates/NN/server.log`` (copied there
     without the line's ``--api-key`` as it grows, so that file never holds it) — and a failed start
     is classified from that log (``oomload.tune.startup``);
   * the pool the server got (``prove.server_pool``), kept on the candidate before any replay, so
     an interrupted one still shows it;
   * with ``--target-rate`` and no concurrency measured yet: the short open-loop replay that turns
     the rate into a concurrency (``oomload.tune.rate``; the tune goes on with that target);
   * the proof (``oomload.tune.prove``): the trace's odds on that pool (production-shaped and
     worst case), a replay at the target (and above it) in ``candidates/NN/run``;
   * the server stopped — whole process group — whatever happened (``with``);
   * ``tune.json`` rewritten (``record``);
4. the winner (``search.pick_winner``) and the report (``oomload.report.tune``).

A Ctrl-C at any moment: the replay child gets it too and writes its partial report; the server is
stopped by its ``with``; ``tune.json`` says ``interrupted`` and holds every candidate so far, the one
that was running included (started or not, with no proof; a note says how far it got); exit 130. A
SIGTERM does the same (the replay child gets it passed on), and the note names it.

A disk that refuses a write (full, read-only, gone, a file size limit) stops the tune at once, with the
server stopped and one sentence naming the file, exit 2: ``tune.json`` (written whole, so the last one
that fit stays readable), a candidate's replay that exited 2 (``prove.run_replay_child``: its own sentence
quoted — a replay that cannot write is no finding about the candidate), ``tune.md`` / ``tune.html``
(``oomload.report.tune``). An error that ends the tune before its last candidate (these, a
``ServeStartError``) leaves ``tune.json`` saying ``stopped`` and why, when that still fits.

Errors that are not findings: a ``--serve`` line whose *first* start fails for a reason that is not a
memory setting (it is not vLLM, it exits at once, it never answers) or of weights that do not fit the
ladder's most memory (``_UNTUNABLE``) is ``ServeStartError`` (exit 3,
the log's line quoted); a ``--host`` this machine cannot listen on (not one of its addresses, no
such name) or a ``--port`` already in use is a usage error (exit 2), found before anything starts
(``realvllm.server.check_listen_address``, which ``oomload tune`` runs on its flags before it calls
``run_tune``);
no candidate that carries the target is exit 1 (like a failed gate), with the table.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from oomload.credentials import scrub
from oomload.errors import (
    ConfigError,
    EndpointError,
    OomloadError,
    OutputWriteError,
    ServeStartError,
)
from oomload.outfile import write_text
from oomload.realvllm.serveline import ServeLine
from oomload.realvllm.server import RealVllmServer, free_port
from oomload.trace.model import read_trace, read_trace_header
from oomload.trace.stats import recommend_max_model_len
from oomload.tune.context import TuneConfig, TuneContext
from oomload.tune.ladder import seqs_ladder
from oomload.tune.prove import measure_rate, prove, server_pool
from oomload.tune.rate import RateTarget
from oomload.tune.record import TuneRecord
from oomload.tune.search import Candidate, next_proposal, pick_winner
from oomload.tune.startup import StartCause, classify_startup_failure
from oomload.tune.stops import death_stop, evidence_stop, starts_stop

__all__ = ["TuneConfig", "run_tune"]

SERVER_LOG = "server.log"
# a first start that fails of these fails on every candidate: the first has the ladder's most memory
_UNTUNABLE = frozenset({StartCause.OTHER, StartCause.WEIGHTS})


def run_tune(config: TuneConfig, console: Console | None = None) -> TuneRecord:
    """Run the tune (module docstring) and return its record (also in ``tune.json``); SIGTERM stops it
    as Ctrl-C does meanwhile (``_Terminated``), and its note names the signal it got. The caller
    renders the record (``oomload.report.tune``) and picks the exit code (``tune_exit_code``)."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run_tune(config, console)
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where a Ctrl-C's ``KeyboardInterrupt`` would be: every path that stops the tune
    on a Ctrl-C stops it the same way, and the note can tell the two apart (``_signal_text``)."""


def _interrupt(signum: int, frame: object) -> None:
    raise _Terminated


def _signal_text(err: BaseException) -> str:
    """The signal that stopped the tune: SIGTERM when a ``_Terminated`` is in ``err``'s chain (a
    candidate's interruption wraps it), else SIGINT, a Ctrl-C."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, _Terminated):
            return "SIGTERM"
        seen = seen.__cause__ or seen.__context__
    return "Ctrl-C (SIGINT)"


def _run_tune(config: TuneConfig, console: Console | None) -> TuneRecord:
    console = console or Console()
    records = read_trace(config.trace_path)
    if not records:
        raise ConfigError(f"trace {config.trace_path} has no requests: nothing to tune for")
    advice = recommend_max_model_len([r.total_tokens for r in records])
    ctx = TuneContext(
        config=config,
        space=replace(config.space, recommended_max_model_len=advice.max_model_len),
        target=config.target,
        records=tuple(records),
        prefix=read_trace_header(config.trace_path).prefix_or_default(),
        console=console,
    )
    config.run_dir.mkdir(parents=True, exist_ok=True)
    console.print(
        f"tune: {config.serve.kind} server {config.serve.model or ''} · {_goal(ctx)} · "
        f"at most {ctx.space.max_starts} server starts and {config.max_duration_s:.0f} s "
        f"(each: start-up ≤ {config.startup_timeout_s:.0f} s, "
        f"replay ≤ {config.replay_max_duration_s:.0f} s) · "
        f"run directory {config.run_dir}"
    )
    started_at = time.monotonic()
    history: list[Candidate] = []
    status = "running"
    notes: list[str] = []
    _write(config.run_dir, _record(ctx, history, status, notes))
    try:
        while True:
            proposal = next_proposal(ctx.space, ctx.target, history)
            if proposal is None:
                break
            left_s = config.max_duration_s - (time.monotonic() - started_at)
            if left_s < config.candidate_worst_case_s(measuring_rate=ctx.waiting_for_rate):
                notes.append(
                    f"stopped by the wall-time bound ({config.max_duration_s:.0f} s) "
                    "before the next candidate"
                )
                status = "bounded"
                break
            rule = proposal.rule
            if ctx.waiting_for_rate:
                rule += f"; it measures the concurrency {config.target_rate_rps:g} req/s needs"
            candidate = Candidate(len(history) + 1, proposal.settings, rule, started=False)
            console.print(
                f"[bold]candidate {candidate.index}[/] {escape(candidate.settings.label())} — " + escape(rule)
            )
            try:
                candidate = _try_candidate(ctx, candidate, first=not history)
            except _CandidateInterrupted as halt:  # counted and listed: its files are on disk
                history.append(halt.candidate)
                if halt.candidate.rate is not None and ctx.target is None:
                    ctx = with_rate_target(ctx, halt.candidate.rate)
                raise
            history.append(candidate)
            if candidate.rate is not None and ctx.target is None:
                ctx = with_rate_target(ctx, candidate.rate)
                console.print(f"  target rate {escape(candidate.rate.sentence())}")
            elif ctx.waiting_for_rate and candidate.started:
                notes.append(
                    f"the open-loop replay at {config.target_rate_rps:g} req/s measured nothing "
                    f"(candidate {candidate.index}: see its rate/replay.log): no concurrency to tune for"
                )
            _say(console, candidate)
            _write(config.run_dir, _record(ctx, history, status, notes))
        if status == "running":
            stop = evidence_stop(history)  # no evidence is no verdict: say why, name no winner
            status = "finished" if stop is None else "no_evidence"
            if stop is not None:
                notes.append(stop)
            elif (died := death_stop(history)) is not None:
                notes.append(died)
            elif (cut := starts_stop(ctx.space, ctx.target, history)) is not None:
                status = "bounded"  # the winner, if any, is the best so far, not the boundary
                notes.append(cut)
    except KeyboardInterrupt as err:
        status = "interrupted"
        stopped = f"interrupted by {_signal_text(err)}: the server was stopped"
        notes.append(f"{stopped}; the table holds the candidates so far")
        if isinstance(err, _CandidateInterrupted):
            notes.append(_interrupted_note(err.candidate))
    except OomloadError as err:  # said by the CLI; tune.json says so too when it still fits
        with contextlib.suppress(OutputWriteError):
            _write(config.run_dir, _record(ctx, history, "stopped", [*notes, f"stopped: {err}"]))
        raise
    record = _record(ctx, history, status, notes)
    _write(config.run_dir, record)
    return record


def tune_exit_code(record: TuneRecord) -> int:
    """The tune's exit code (``TuneRecord.exit_code``)."""
    return record.exit_code()


def with_rate_target(ctx: TuneContext, rate: RateTarget) -> TuneContext:
    """The tune once the rate's concurrency is measured: it goes on as ``--target-concurrency C`` would
    (the default ``max_num_seqs`` ladder becomes the target's quarters, plus the values above it)."""
    space = ctx.space
    if not ctx.config.max_num_seqs_given and "max_num_seqs" not in space.fixed:
        space = replace(space, max_num_seqs=seqs_ladder(rate.concurrency))
    return replace(ctx, target=rate.concurrency, space=space)


def free_device_bytes() -> int | None:
    """NVML's free memory on device 0 just now; ``None`` without a usable GPU."""
    try:
        from oomload.telemetry.nvml import load_pynvml

        nvml = load_pynvml()
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).free)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


class _CandidateInterrupted(KeyboardInterrupt):
    """A Ctrl-C (or SIGTERM) while a candidate ran: ``candidate`` is what it had reached — started or
    not, its rate when measured — and has no proof."""

    def __init__(self, candidate: Candidate) -> None:
        super().__init__()
        self.candidate = candidate


def _interrupted_note(c: Candidate) -> str:
    if not c.started:
        return f"candidate {c.index} was interrupted before its server answered: not started, not proved"
    return (
        f"candidate {c.index} was interrupted after its server started: not proved "
        f"(its partial replay, if it began: candidates/{c.index:02d}/run)"
    )


def _try_candidate(ctx: TuneContext, candidate: Candidate, *, first: bool) -> Candidate:
    """Start, prove and stop one candidate; a Ctrl-C meanwhile is ``_CandidateInterrupted`` (the
    candidate as far as it got: not started when its server had not answered yet)."""
    try:
        return _start_and_prove(ctx, candidate, first=first)
    except _CandidateInterrupted:
        raise
    except KeyboardInterrupt as err:
        raise _CandidateInterrupted(candidate) from err


def _start_and_prove(ctx: TuneContext, candidate: Candidate, *, first: bool) -> Candidate:
    config = ctx.config
    cand_dir = config.run_dir / "candidates" / f"{candidate.index:02d}"
    cand_dir.mkdir(parents=True, exist_ok=True)
    candidate = replace(candidate, free_device_bytes=free_device_bytes())
    port = config.port if config.port is not None else free_port(config.host)
    short_tmp = tempfile.TemporaryDirectory(prefix="oomload-tune-")
    server = RealVllmServer(
        ServeLine(config.serve, candidate.settings),
        cand_dir,
        host=config.host,
        port=port,
        startup_timeout_s=config.startup_timeout_s,
        log_name=SERVER_LOG,
        cwd=Path.cwd(),  # the user's line may name relative paths
        tmp_dir=Path(short_tmp.name),  # short: vLLM's ZMQ IPC socket paths must fit 107 bytes
        secrets=config.serve.secrets(),  # vLLM logs its non-default args, --api-key too: never copied
        on_log_problem=lambda sentence: ctx.console.print(f"  [yellow]note:[/] {escape(sentence)}"),
    )
    try:
        return _run_candidate(ctx, candidate, server, cand_dir, first=first)
    finally:
        short_tmp.cleanup()


def _run_candidate(
    ctx: TuneContext, candidate: Candidate, server: RealVllmServer, cand_dir: Path, *, first: bool
) -> Candidate:
    with _started(server) as start_error:
        if start_error is not None:  # stopped: its whole log, without secrets (so is the error)
            failure = classify_startup_failure(server.log_text().strip() or start_error)
            if first and failure.cause in _UNTUNABLE:
                raise ServeStartError(
                    f"the --serve command did not start ({_exit_text(server.exit_code)}): "
                    f"{failure.message} (log: {server.log_path})"
                )
            return replace(candidate, failure=failure)
        candidate = replace(candidate, started=True, startup_s=server.startup_s)
        return _prove_candidate(ctx, candidate, server, cand_dir)


def _prove_candidate(
    ctx: TuneContext, candidate: Candidate, server: RealVllmServer, cand_dir: Path
) -> Candidate:
    """A started candidate: its pool, its rate (``--target-rate``, the first time), then its proof; a
    Ctrl-C meanwhile (the replay child got it too and wrote its partial report) is
    ``_CandidateInterrupted`` with the candidate so far, its pool and rate kept when they were read."""
    try:
        pool = server_pool(server.url, server.log_path, candidate)
        if pool is not None:
            candidate = replace(candidate, num_gpu_blocks=pool.num_gpu_blocks, block_size=pool.block_size)
        if ctx.waiting_for_rate:
            rate = measure_rate(ctx, candidate, server.url, cand_dir)
            if rate is None:
                return candidate  # started, not proved: the tune stops with a note
            candidate = replace(candidate, rate=rate)
            ctx = with_rate_target(ctx, rate)
        proof = prove(ctx, candidate, server.url, pool, cand_dir)
    except KeyboardInterrupt as err:
        raise _CandidateInterrupted(candidate) from err
    if candidate.rate is not None and candidate.rate.preemptions > 0:
        # the open loop at the rate is the traffic itself: its bursts preempted this setting
        proof = replace(
            proof,
            preempted_at_target=True,
            evidence=f"{proof.evidence}; the open-loop replay at {candidate.rate.rate_rps:g} req/s "
            f"preempted {candidate.rate.preemptions} times (bursts above the mean)",
        )
    return replace(candidate, proof=proof)


@contextlib.contextmanager
def _started(server: RealVllmServer) -> Any:
    """Start the server; yield ``None`` once ready or the error text when it did not start; always stop."""
    try:
        try:
            server.start()
        except EndpointError as err:
            yield str(err)
            return
        yield None
    finally:
        server.stop()


def _record(ctx: TuneContext, history: list[Candidate], status: str, notes: list[str]) -> TuneRecord:
    config, space = ctx.config, ctx.space
    done = status != "running"
    winner = pick_winner(space, history, ctx.target) if done else None
    if done and winner is None and history and status == "finished":  # no_evidence: its note says why
        if not any(c.started for c in history):
            last = history[-1].failure
            why = "" if last is None else f" (the last: {last.reason})"
            notes = [
                *notes,
                f"no candidate started{why}: nothing on the ladder carries {_goal(ctx)}",
            ]
        else:
            notes = [
                *notes,
                f"no candidate carried {_goal(ctx)}: the table says why each was rejected",
            ]
    return TuneRecord(
        serve_line=scrub(shlex.join(config.serve.argv), config.serve.secrets()),
        kind=config.serve.kind,
        model=config.serve.model,
        target_concurrency=ctx.target,
        target_rate_rps=config.target_rate_rps,
        trace_path=str(config.trace_path),
        max_starts=space.max_starts,
        max_duration_s=config.max_duration_s,
        slo_ttft_p99_s=config.slo_ttft_p99_s,
        candidates=tuple(history),
        status=status,
        winner_index=None if winner is None else winner.index,
        winner_line=None if winner is None else config.serve.shell_line(winner.settings),
        recommended_max_model_len=space.recommended_max_model_len,
        notes=tuple(notes),
    )


def _say(console: Console, c: Candidate) -> None:
    if not c.started:
        assert c.failure is not None
        console.print(f"  [red]did not start[/]: {c.failure.reason} — {c.failure.message}")
        return
    assert c.proof is not None
    verdict = (
        "[green]carries the target[/]"
        if c.proof.carries
        else "[yellow]no evidence[/]"
        if c.proof.no_evidence
        else "[red]does not carry the target[/]"
    )
    console.print(f"  started in {c.startup_s or 0:.1f} s · {verdict}: {c.proof.evidence}")


def _write(run_dir: Path, record: TuneRecord) -> None:
    """``tune.json``, whole or not at all; ``OutputWriteError`` stops the tune (module docstring)."""
    text = json.dumps(record.to_json(), indent=2, allow_nan=False, default=_finite)
    try:
        write_text(run_dir / "tune.json", text)
    except OutputWriteError as err:
        raise OutputWriteError(
            f"cannot write tune.json in the tune directory {run_dir} ({err.reason}); the tune stopped "
            "with no server left running, and what it wrote before is kept as it was",
            err.path,
            err.reason,
        ) from err


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _goal(ctx: TuneContext) -> str:
    rate = ctx.config.target_rate_rps
    if rate is not None:
        return f"target rate {rate:g} req/s" + ("" if ctx.target is None else f" (concurrency {ctx.target})")
    return "its own max_num_seqs (no target)" if ctx.target is None else f"target concurrency {ctx.target}"


def _exit_text(code: int | None) -> str:
    return "it did not answer /health in time" if code is None else f"exit status {code}"
