"""A started candidate, proved: its pool, the trace's odds on it, the replay at and around the target.

``server_pool(url, log_path, candidate)``: the pool from ``/metrics`` (``vllm:cache_config_info``; the
start-up log's "KV cache size" line when the metric is missing) and the served ``max_model_len``
(``/v1/models``), read by the runner before any replay, so a candidate interrupted later keeps it.

``prove(ctx, candidate, url, pool, cand_dir)``:

* the trace's odds on that pool (``tune.guide``, through ``capacity.odds.TraceOdds`` as replay and plan):
  the predicted onset production-shaped (the trace's shared prefixes held once, when it carries them)
  and worst case (every prompt distinct), the largest ``max_num_seqs`` they call safe (the search's
  first guess), and the requests a 99 % claim needs;
* a replay at the target (``oomload replay`` in a child process, its run directory
  ``candidates/NN/run``; ``--min-requests`` is what the odds need for 99 % evidence, between
  ``2 × target`` and ``max_requests``), and at the headroom level above it only when the candidate's
  ``max_num_seqs`` admits more than the target (a server capped at the target holds the same requests
  there: a needless hold); ``--stop-on first-preemption``: the level above is not sent once the target
  preempted. Read back from its ``summary.json`` (``proof_from_summary``), judged by
  ``tune.evidence`` (a capped candidate by the cap the server ran);
* no evidence at the target (no preemption, no death, the level or cap not held): the target is
  measured again, a step ``REMEASURE_HOLD_FACTOR`` times longer (``candidates/NN/remeasure``); the
  proof is the second measurement's, marked ``remeasured`` and, when it still has no evidence, with
  the starved load generator's figures when there were any (``starved``: the search then stops and
  says the load host limits).

``measure_rate``: for ``--target-rate``, the short open-loop replay that measures the concurrency the
rate needs on this server (``oomload.tune.rate``), in ``candidates/NN/rate``.

A Ctrl-C reaches the replay child too: it writes its partial report before the tune stops.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from oomload.capacity.odds import Pool, TraceOdds
from oomload.errors import ConfigError, ExitCode
from oomload.load.preflight import preflight
from oomload.outfile import output_file
from oomload.rundir.summary import Summary, read_summary
from oomload.telemetry.scrape import fetch_text
from oomload.telemetry.vllm_metrics import parse_vllm_metrics
from oomload.trace.model import PrefixInfo, TraceRecord, read_trace_header, write_trace
from oomload.tune.context import TuneContext
from oomload.tune.evidence import judge_target
from oomload.tune.guide import OddsGuide, headroom_level, odds_guide
from oomload.tune.rate import RateTarget, arrival_scale, calibration_requests, rate_target_from_summary
from oomload.tune.search import Candidate, Proof
from oomload.tune.startup import pool_from_log

ERROR_PREFIX = "oomload: error: "
REMEASURE_HOLD_FACTOR = 3  # a step without evidence is measured again this many times longer


def prove(ctx: TuneContext, candidate: Candidate, url: str, pool: Pool | None, cand_dir: Path) -> Proof:
    """The candidate's proof on its server's pool (``server_pool``; ``None``: not known): module docstring."""
    config = ctx.config
    target = ctx.target or candidate.settings.max_num_seqs or 1  # without a target: its own max_num_seqs
    seqs = candidate.settings.max_num_seqs
    guide = None
    if pool is not None:
        guide = candidate_guide(ctx.records, ctx.prefix, pool, ctx.target, seqs)
    evidence = None if guide is None else guide.requests_for_evidence
    min_requests = min(max(evidence or 0, 2 * target), config.max_requests)
    above = headroom_level(target) or target + 1
    # a server that admits at most the target holds the same requests one level above: a needless hold
    levels = f"{target}" if seqs is not None and seqs <= target else f"{target},{above}"
    onsets = "?"
    if guide is not None:
        onsets = f"{_onset(guide.onset, target)} ({guide.shape})"
        if guide.shape == "production":
            onsets += f", {_onset(guide.onset_worst_case, target)} (worst case)"
    ctx.console.print(
        f"  pool {pool.num_gpu_blocks if pool else '?'} blocks × {pool.block_size if pool else '?'} tokens"
        f" · odds: onset {onsets} · replay {levels} with ≥ {min_requests} requests a step"
    )

    def measure(run_dir: Path, levels: str, hold_s: float, log_name: str) -> Proof:
        argv = [
            *_replay_argv(ctx, candidate, url, run_dir),
            *("--concurrency", levels, "--no-refine", "--repeats", "1", "--no-evidence"),
            *("--min-requests", str(min_requests), "--hold-s", f"{hold_s:g}"),
            *("--stop-on", "first-preemption", *config.replay_args),
        ]
        exit_code = run_replay_child(ctx, argv, cand_dir / log_name)
        return proof_from_summary(
            read_replay_summary(run_dir),
            target=target,
            pool=pool,
            guide=guide,
            slo_ttft_p99_s=config.slo_ttft_p99_s,
            run_dir=str(run_dir),
            replay_exit=exit_code,
            recommended_max_model_len=ctx.space.recommended_max_model_len,
            max_num_seqs=seqs,
        )

    proof = measure(cand_dir / "run", levels, config.hold_s, "replay.log")
    if not proof.no_evidence:
        return proof
    # no evidence is no verdict: measure the target again, a longer step (search rule 5)
    hold_s = REMEASURE_HOLD_FACTOR * config.hold_s
    ctx.console.print(f"  no evidence at {target} ({proof.evidence}): measured again, a {hold_s:g} s step")
    again = measure(cand_dir / "remeasure", str(target), hold_s, "remeasure.log")
    return replace(
        again,
        remeasured=True,
        observed_onset=again.observed_onset or proof.observed_onset,
        died_above=again.died_above or proof.died_above,
        starved=again.starved or (proof.starved if again.no_evidence else None),
        evidence=f"{again.evidence} (measured again, a {hold_s:g} s step; the first: {proof.evidence})",
    )


def candidate_guide(
    records: Sequence[TraceRecord],
    prefix: PrefixInfo,
    pool: Pool,
    target: int | None,
    max_num_seqs: int | None,
) -> OddsGuide:
    """The trace's odds on a candidate's pool (``tune.guide``), through ``TraceOdds``: the computation
    ``oomload replay`` and ``oomload plan`` use for the same trace and pool."""
    odds = TraceOdds.of_records(records, prefix, pool)
    return odds_guide(odds, target, max_num_seqs or pool.max_num_seqs)


def measure_rate(ctx: TuneContext, candidate: Candidate, url: str, cand_dir: Path) -> RateTarget | None:
    """``--target-rate``: an open-loop replay of the trace's head at the rate; its mean in-flight count."""
    config = ctx.config
    rate = config.target_rate_rps
    assert rate is not None
    count = calibration_requests(rate, len(ctx.records), config.max_requests)
    head = list(ctx.records[:count])
    rate_dir = cand_dir / "rate"
    rate_dir.mkdir(parents=True, exist_ok=True)
    trace = rate_dir / "trace-head.jsonl"
    header = read_trace_header(config.trace_path)
    with output_file(trace) as fh:  # whole or absent: OutputWriteError on a full disk
        write_trace(fh, head, header)
    argv = [
        *_replay_argv(ctx, candidate, url, rate_dir / "run", trace=trace),
        "--open-loop",
        "--arrival-scale",
        f"{arrival_scale(head, rate):.6g}",
        "--concurrency",
        str(count),  # the open loop's cap on users: never holds an arrival back
        *config.replay_args,
    ]
    ctx.console.print(f"  target rate {rate:g} req/s: an open-loop replay of {count} requests measures W")
    run_replay_child(ctx, argv, rate_dir / "replay.log")
    return rate_target_from_summary(
        read_replay_summary(rate_dir / "run"), rate_rps=rate, run_dir=str(rate_dir / "run")
    )


def _replay_argv(
    ctx: TuneContext, candidate: Candidate, url: str, run_dir: Path, *, trace: Path | None = None
) -> list[str]:
    """The replay child's common flags. ``--served-with`` gives it the candidate's line (secrets
    scrubbed): its odds then run under the candidate's ``max_num_seqs``, as the tuner's own do."""
    config = ctx.config
    return [
        sys.executable,
        "-m",
        "oomload",
        "replay",
        str(trace or config.trace_path),
        "--url",
        url,
        "--run-dir",
        str(run_dir),
        "--max-duration-s",
        f"{config.replay_max_duration_s:g}",
        "--no-live",
        "--no-html",  # the tuner reads summary.json; report.html's plots cost seconds per candidate
        "--served-with",
        config.serve.shell_line(candidate.settings),
    ]


def run_replay_child(ctx: TuneContext, argv: list[str], log_path: Path) -> int | None:
    """Run ``oomload replay`` as a child (its output in ``log_path``); its exit code.

    Exit 2 is no finding about the candidate — the child could not write its run directory (a full
    disk), or the replay flags are wrong — and every later candidate would meet it too: ``ConfigError``
    with the child's own sentence stops the tune (exit 2)."""
    env = dict(os.environ)
    secrets = ctx.config.serve.secrets()
    if secrets and not env.get("OPENAI_API_KEY"):
        env["OPENAI_API_KEY"] = secrets[-1]  # the server's own key, in the child's memory only
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            proc.wait()
        except KeyboardInterrupt:
            # a Ctrl-C reached the child too; a SIGTERM to the tune did not: pass it on, then let the
            # child write its partial report before the tune stops
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.poll() is None:
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
    if proc.returncode == ExitCode.USAGE:
        raise ConfigError(f"the replay in {log_path.parent} stopped with exit 2: {_child_error(log_path)}")
    return proc.returncode


def _child_error(log_path: Path) -> str:
    """The child's ``oomload: error: …`` sentence from its log, or where to look."""
    lines = [line for line in read_text(log_path).splitlines() if line.startswith(ERROR_PREFIX)]
    said = (
        lines[-1][len(ERROR_PREFIX) :].strip() if lines else f"{log_path} holds no error line (a full disk?)"
    )
    return f"{said} — the tune stopped with no server left running"


def proof_from_summary(
    summary: Summary | None,
    *,
    target: int,
    pool: Pool | None,
    guide: OddsGuide | None,
    slo_ttft_p99_s: float | None,
    run_dir: str,
    replay_exit: int | None,
    recommended_max_model_len: int | None = None,
    max_num_seqs: int | None = None,
) -> Proof:
    """The proof from a candidate replay's ``summary.json`` (``None``: the replay wrote no verdict);
    ``max_num_seqs`` below the target: judged as capped (``oomload.tune.evidence``)."""
    evidence = None if guide is None else guide.requests_for_evidence
    steps = [] if summary is None else [s for s in summary.steps if not s.warmup and s.concurrency == target]
    requests = sum(s.requests for s in steps)
    judged = judge_target(steps, target, max_num_seqs, None if summary is None else summary.failed_run)
    held = judged.held
    preemptions = sum(s.preemptions or 0 for s in steps)
    observed_onset = (
        None if summary is None or summary.preemption_onset is None else summary.preemption_onset.concurrency
    )
    death = None if summary is None else summary.death
    died = death is not None and (death.concurrency or 0) <= target
    died_above = None if death is None or died else death.concurrency  # at the headroom level
    overflowed = 0 if summary is None else summary.context_refused + summary.context_clamped
    sent = 0 if summary is None else summary.requests_total
    served_limit = None if summary is None else summary.context_model_limit
    # the trace's own tail beyond its recommended max_model_len overflows any setting: evidence, not a
    # rejection; a limit the tune cut below the recommendation refuses the traffic the target carries
    overflow_blocks = (
        overflowed > 0
        and recommended_max_model_len is not None
        and served_limit is not None
        and served_limit < recommended_max_model_len
    )
    ttfts = [s.ttft.p99_ms for s in steps if s.ttft.p99_ms is not None]
    ttft = max(ttfts) if ttfts else None
    tput = [s.output_tokens_per_s for s in steps if s.output_tokens_per_s is not None]
    slo_met = None
    if slo_ttft_p99_s is not None:
        slo_met = ttft is not None and ttft <= slo_ttft_p99_s * 1000.0
    if summary is None:
        evidence_text = f"the replay wrote no verdict (exit {replay_exit})"
    else:
        evidence_text = (
            f"{requests} requests at {target}: {preemptions} preemption{'s' if preemptions != 1 else ''}"
            + (f" (the odds ask {evidence} for 99 %)" if evidence else " (the odds call it safe)")
            + (
                ""
                if death is None
                else f"; the server died at {death.concurrency} ({death.kind or 'cause unknown'})"
            )
            + (f"; {judged.how}" if held else f"; the step did not hold concurrency {target} ({judged.how})")
            + _slo_clause(slo_ttft_p99_s, ttft)
            + _overflow_clause(overflowed, sent, served_limit, recommended_max_model_len, overflow_blocks)
        )
    preempted = preemptions > 0 or 0 < (observed_onset or 0) <= target
    no_evidence = not held and not preempted and not died
    if no_evidence and summary is not None:
        evidence_text += f": no evidence{'' if judged.starved is None else ' — the load host limits'}"
    return Proof(
        no_evidence=no_evidence,
        starved=judged.starved if no_evidence else None,
        running_max=judged.running_max,
        died_above=died_above,
        death_kind=None if death is None else death.kind,
        num_gpu_blocks=None if pool is None else pool.num_gpu_blocks,
        block_size=None if pool is None else pool.block_size,
        predicted_onset=None if guide is None else guide.onset,
        odds_safe_max_num_seqs=None if guide is None else guide.safe_max_num_seqs,
        requests_for_evidence=evidence,
        observed_onset=observed_onset,
        preempted_at_target=preempted,
        died=died,
        overflow_at_target=overflow_blocks,
        slo_met=slo_met,
        requests_at_target=requests if held else 0,
        throughput_tokens_per_s=sum(tput) / len(tput) if tput else None,
        ttft_p99_ms=ttft,
        run_dir=run_dir,
        evidence=evidence_text,
        predicted_onset_worst_case=None if guide is None else guide.onset_worst_case,
        prompts="worst-case" if guide is None else guide.shape,
        odds_safe_above=None if guide is None else guide.safe_above,
    )


def _slo_clause(slo_ttft_p99_s: float | None, ttft_p99_ms: float | None) -> str:
    """The SLO in the evidence, when one was asked: the measured TTFT p99 at the target against it
    (a miss rejects the candidate, so its sentence must say so)."""
    if slo_ttft_p99_s is None:
        return ""
    bound_ms = slo_ttft_p99_s * 1000.0
    slo = f"the SLO (--slo-ttft-p99-s {slo_ttft_p99_s:g}: ≤ {bound_ms:g} ms)"
    if ttft_p99_ms is None:
        return f"; no TTFT p99 at the target: {slo} is not shown met"
    digits = 0 if ttft_p99_ms >= 100 else 1
    while digits < 3 and float(f"{ttft_p99_ms:.{digits}f}") == bound_ms != ttft_p99_ms:
        digits += 1  # a value and its bound never read the same
    verb = "meets" if ttft_p99_ms <= bound_ms else "misses"
    return f"; TTFT p99 {ttft_p99_ms:.{digits}f} ms {verb} {slo}"


def _overflow_clause(
    overflowed: int, sent: int, limit: int | None, recommended: int | None, rejects: bool
) -> str:
    """Requests that overflowed the served ``max_model_len``, and whether that counts against the
    candidate: only a limit the tune cut below the trace's recommended one does."""
    if not overflowed:
        return ""
    said = f"; {overflowed} of {sent} overflowed max_model_len {limit}"
    if rejects:
        return f"{said}, below the trace's recommended {recommended}: it refuses the traffic"
    return f"{said} (the trace's own tail: shown, not held against it)"


def server_pool(url: str, log_path: Path, candidate: Candidate) -> Pool | None:
    """The started server's pool: ``cache_config_info`` on ``/metrics``, else its start-up log (its
    admission limit left at vLLM's default: the candidate's ``max_num_seqs`` is asked of the odds
    explicitly, so the onset is the pool's, the one ``oomload replay`` computes)."""
    limit = candidate.settings.max_model_len
    with contextlib.suppress(Exception):  # the served limit, as /v1/models reports it
        limit = preflight(url, model=None, api_key=None, timeout_s=10.0).max_model_len or limit
    pool: Pool | None = None
    try:
        snap = parse_vllm_metrics(fetch_text(url + "/metrics", 10.0), t_unix_s=time.time())
        pool = Pool.from_cache_config(snap.cache_config, limit)
    except Exception:
        pool = None
    if pool is None:
        logged = pool_from_log(read_text(log_path))  # numbers only: no secret leaves here
        if logged.num_gpu_blocks is not None and logged.kv_cache_tokens:
            pool = Pool(logged.num_gpu_blocks, logged.kv_cache_tokens // logged.num_gpu_blocks, limit)
    if pool is not None and candidate.settings.max_num_batched_tokens is not None:
        pool = replace(pool, max_num_batched_tokens=candidate.settings.max_num_batched_tokens)
    return pool


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def read_replay_summary(run_dir: Path) -> Summary | None:
    """A candidate replay's ``summary.json`` as typed values; ``None`` when the replay wrote none (it
    failed before its verdict) or wrote what is not one (the proof then says so)."""
    try:
        return read_summary(run_dir / "summary.json")
    except ConfigError:
        return None


def _onset(value: int | None, target: int) -> str:
    return f"none up to {2 * target}" if value is None else str(value)
