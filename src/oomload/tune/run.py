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
     unless told otherwise, ``/health`` awaited, the log in ``candidates/NN/server.log`` — and a
     failed start is classified from that log (``oomload.tune.startup``);
   * the pool from ``/metrics`` (``vllm:cache_config_info``; the start-up log's "KV cache size" line
     when the metric is missing), the trace's odds on it (``search.odds_guide``);
   * a replay at the target and one level above (``oomload replay`` in a child process, its run
     directory ``candidates/NN/run``; ``--min-requests`` is what the odds need for 99 % evidence,
     between ``2 × target`` and ``max_requests``; ``--stop-on first-preemption``), read back from its
     ``summary.json``;
   * the server stopped — whole process group — whatever happened (``with``);
   * ``tune.json`` rewritten (``record``);
4. the winner (``search.pick_winner``) and the report (``oomload.report.tune``).

A Ctrl-C at any moment: the replay child gets it too and writes its partial report; the server is
stopped by its ``with``; ``tune.json`` says ``interrupted`` and holds every candidate so far; exit 130.

Errors that are not findings: a ``--serve`` line whose *first* start fails for a reason that is not a
memory setting (it is not vLLM, it exits at once, it never answers) is ``ServeStartError`` (exit 3,
the log's line quoted); a ``--port`` already in use is a usage error (exit 2), found before anything
starts; no candidate that carries the target is exit 1 (like a failed gate), with the table.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from oomload.credentials import scrub
from oomload.errors import ConfigError, EndpointError, ExitCode, ServeStartError
from oomload.odds import Pool
from oomload.realvllm.server import RealVllmServer, free_port, harness_env
from oomload.run.preflight import preflight
from oomload.stats import recommend_max_model_len
from oomload.telemetry.scrape import fetch_text
from oomload.telemetry.vllm_metrics import parse_vllm_metrics
from oomload.trace import read_trace
from oomload.tune.record import TuneRecord
from oomload.tune.search import Candidate, Proof, SearchSpace, next_proposal, odds_guide, pick_winner
from oomload.tune.servecmd import ServeCommand
from oomload.tune.startup import StartCause, classify_startup_failure, pool_from_log

SERVER_LOG = "server.log"


@dataclass(frozen=True)
class TuneConfig:
    trace_path: Path
    serve: ServeCommand
    target: int | None  # None: the highest preemption-free concurrency (tune.search)
    space: SearchSpace
    run_dir: Path
    host: str = "127.0.0.1"
    port: int | None = None
    max_duration_s: float = 1800.0
    startup_timeout_s: float = 300.0
    replay_max_duration_s: float = 300.0
    hold_s: float = 2.0
    max_requests: int = 400
    slo_ttft_p99_s: float | None = None
    replay_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class CandidateServe:
    """The user's line with one candidate's flags, as ``RealVllmServer`` starts it (a ``ServeSpec``)."""

    command: ServeCommand
    candidate: Candidate

    @property
    def program(self) -> str:
        return repr(self.command.argv[0])

    def serve_argv(self, host: str, port: int) -> list[str]:
        argv = list(self.command.with_settings(self.candidate.settings, host, port))
        if self.command.kind == "sim" and Path(argv[0]).name == "oomload":
            argv = [sys.executable, "-m", "oomload", *argv[1:]]
        return argv

    def serve_env(self, env: dict[str, str], tmp_dir: Path) -> dict[str, str]:
        if Path(self.command.argv[1] if len(self.command.argv) > 1 else "").name == "launcher.py":
            return harness_env(env, tmp_dir)  # oomload's own CPU-vLLM launcher: the harness's env
        out = {k: v for k, v in env.items() if k != "VLLM_PORT"}
        out["TMPDIR"] = str(tmp_dir)
        return out


def run_tune(config: TuneConfig, console: Console | None = None) -> int:
    """Run the tune (module docstring) and return the exit code; SIGTERM counts as Ctrl-C meanwhile."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run_tune(config, console)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run_tune(config: TuneConfig, console: Console | None) -> int:
    console = console or Console()
    records = read_trace(config.trace_path)
    if not records:
        raise ConfigError(f"trace {config.trace_path} has no requests: nothing to tune for")
    prompts = [r.prompt_tokens for r in records]
    outputs = [r.output_tokens for r in records]
    advice = recommend_max_model_len([p + o for p, o in zip(prompts, outputs, strict=True)])
    space = replace(config.space, recommended_max_model_len=advice.max_model_len)
    if config.port is not None:
        check_port_free(config.host, config.port)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    console.print(
        f"tune: {config.serve.kind} server {config.serve.model or ''} · {_goal(config.target)} · "
        f"at most {space.max_starts} server starts and {config.max_duration_s:.0f} s "
        f"(each: start-up ≤ {config.startup_timeout_s:.0f} s, "
        f"replay ≤ {config.replay_max_duration_s:.0f} s) · "
        f"run directory {config.run_dir}"
    )
    started_at = time.monotonic()
    history: list[Candidate] = []
    status = "running"
    notes: list[str] = []
    record = _record(config, space, history, status, notes)
    _write(config.run_dir, record)
    try:
        while True:
            proposal = next_proposal(space, config.target, history)
            if proposal is None:
                break
            left_s = config.max_duration_s - (time.monotonic() - started_at)
            if left_s < config.startup_timeout_s + config.replay_max_duration_s:
                notes.append(
                    f"stopped by the wall-time bound ({config.max_duration_s:.0f} s) "
                    "before the next candidate"
                )
                status = "bounded"
                break
            candidate = Candidate(len(history) + 1, proposal.settings, proposal.rule, started=False)
            console.print(
                f"[bold]candidate {candidate.index}[/] {escape(candidate.settings.label())} — "
                + escape(proposal.rule)
            )
            candidate = _try_candidate(config, space, candidate, prompts, outputs, console, first=not history)
            history.append(candidate)
            _say(console, candidate)
            _write(config.run_dir, _record(config, space, history, status, notes))
        if status == "running":
            status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        notes.append("interrupted (Ctrl-C): the server was stopped; the table holds the candidates so far")
    record = _record(config, space, history, status, notes)
    _write(config.run_dir, record)
    from oomload.report.tune import write_tune_reports

    write_tune_reports(config.run_dir, record, console)
    if status == "interrupted":
        return int(ExitCode.INTERRUPTED)
    return int(ExitCode.OK if record.winner is not None else ExitCode.GATE_FAILED)


def check_port_free(host: str, port: int) -> None:
    """``ConfigError`` when ``host:port`` is taken (one sentence, before anything starts)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            raise ConfigError(
                f"--port {port} on {host} is in use ({err.strerror}): pick a free port or omit --port"
            ) from err


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


def _try_candidate(
    config: TuneConfig,
    space: SearchSpace,
    candidate: Candidate,
    prompts: list[int],
    outputs: list[int],
    console: Console,
    *,
    first: bool,
) -> Candidate:
    cand_dir = config.run_dir / "candidates" / f"{candidate.index:02d}"
    cand_dir.mkdir(parents=True, exist_ok=True)
    candidate = replace(candidate, free_device_bytes=free_device_bytes())
    port = config.port if config.port is not None else free_port(config.host)
    short_tmp = tempfile.TemporaryDirectory(prefix="oomload-tune-")
    server = RealVllmServer(
        CandidateServe(config.serve, candidate),
        cand_dir,
        host=config.host,
        port=port,
        startup_timeout_s=config.startup_timeout_s,
        log_name=SERVER_LOG,
        cwd=Path.cwd(),  # the user's line may name relative paths
        tmp_dir=Path(short_tmp.name),  # short: vLLM's ZMQ IPC socket paths must fit 107 bytes
    )
    try:
        return _run_candidate(
            config, space, candidate, server, prompts, outputs, cand_dir, console, first=first
        )
    finally:
        scrub_file(server.log_path, config.serve.secrets())  # vLLM logs its non-default args, --api-key too
        short_tmp.cleanup()


def _run_candidate(
    config: TuneConfig,
    space: SearchSpace,
    candidate: Candidate,
    server: RealVllmServer,
    prompts: list[int],
    outputs: list[int],
    cand_dir: Path,
    console: Console,
    *,
    first: bool,
) -> Candidate:
    with _started(server) as start_error:
        if start_error is not None:
            secrets = config.serve.secrets()
            failure = classify_startup_failure(scrub(_read(server.log_path).strip() or start_error, secrets))
            if first and failure.cause is StartCause.OTHER:
                raise ServeStartError(
                    f"the --serve command did not start ({_exit_text(server.exit_code)}): "
                    f"{failure.message} (log: {server.log_path})"
                )
            return replace(candidate, failure=failure)
        candidate = replace(candidate, started=True, startup_s=server.startup_s)
        proof = _prove(config, space, candidate, server, prompts, outputs, cand_dir, console)
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


def _prove(
    config: TuneConfig,
    space: SearchSpace,
    candidate: Candidate,
    server: RealVllmServer,
    prompts: list[int],
    outputs: list[int],
    cand_dir: Path,
    console: Console,
) -> Proof:
    target = config.target or candidate.settings.max_num_seqs or 1  # without a target: its own max_num_seqs
    pool = _pool(server, candidate)
    onset = safe = evidence = None
    if pool is not None:
        ladder = [v for v in space.max_num_seqs if config.target is None or v <= target]
        onset, safe, evidence = odds_guide(prompts, outputs, pool, config.target, ladder)
    min_requests = min(max(evidence or 0, 2 * target), config.max_requests)
    above = target + max(1, target // 4)
    run_dir = cand_dir / "run"
    argv = [
        sys.executable,
        "-m",
        "oomload",
        "replay",
        str(config.trace_path),
        "--url",
        server.url,
        "--run-dir",
        str(run_dir),
        "--concurrency",
        f"{target},{above}",
        "--no-refine",
        "--repeats",
        "1",
        "--no-evidence",
        "--min-requests",
        str(min_requests),
        "--hold-s",
        f"{config.hold_s:g}",
        "--stop-on",
        "first-preemption",
        "--max-duration-s",
        f"{config.replay_max_duration_s:g}",
        "--no-live",
        *config.replay_args,
    ]
    console.print(
        f"  pool {pool.num_gpu_blocks if pool else '?'} blocks × {pool.block_size if pool else '?'} tokens"
        f" · odds: onset {onset or 'none up to ' + str(2 * target)}"
        f" · replay {target},{above} with ≥ {min_requests} requests a step"
    )
    env = dict(os.environ)
    if config.serve.secrets() and not env.get("OPENAI_API_KEY"):
        env["OPENAI_API_KEY"] = config.serve.secrets()[-1]  # the server's own key, in the child's memory only
    with open(cand_dir / "replay.log", "wb") as log:
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
    summary = _read_json(run_dir / "summary.json")
    return proof_from_summary(
        summary,
        target=target,
        pool=pool,
        predicted_onset=onset,
        odds_safe=safe,
        evidence=evidence,
        slo_ttft_p99_s=config.slo_ttft_p99_s,
        run_dir=str(run_dir),
        replay_exit=proc.returncode,
        recommended_max_model_len=space.recommended_max_model_len,
    )


def proof_from_summary(
    summary: dict[str, Any] | None,
    *,
    target: int,
    pool: Pool | None,
    predicted_onset: int | None,
    odds_safe: int | None,
    evidence: int | None,
    slo_ttft_p99_s: float | None,
    run_dir: str,
    replay_exit: int | None,
    recommended_max_model_len: int | None = None,
) -> Proof:
    """The proof from a candidate replay's ``summary.json`` (``None``: the replay wrote no verdict)."""
    verdict = (summary or {}).get("verdict") or {}
    steps = [s for s in verdict.get("steps") or [] if not s.get("warmup") and s.get("concurrency") == target]
    requests = sum(int(s.get("requests") or 0) for s in steps)
    held = bool(steps) and all(s.get("trusted") is not False for s in steps)
    preemptions = sum(int(s.get("preemptions") or 0) for s in steps)
    onsets = verdict.get("onsets") or {}
    pre = onsets.get("preemption") or {}
    death = onsets.get("engine_death") or {}
    died = bool(death) and int(death.get("concurrency") or 0) <= target
    overflow = verdict.get("context_overflow") or {}
    overflowed = int(overflow.get("refused") or 0) + int(overflow.get("clamped") or 0)
    sent = int((verdict.get("requests") or {}).get("total") or 0)
    served_limit = overflow.get("model_limit")
    # the trace's own tail beyond its recommended max_model_len overflows any setting: evidence, not a
    # rejection; a limit the tune cut below the recommendation refuses the traffic the target carries
    overflow_blocks = (
        overflowed > 0
        and recommended_max_model_len is not None
        and isinstance(served_limit, int)
        and served_limit < recommended_max_model_len
    )
    ttfts = [float(t) for s in steps if (t := (s.get("ttft") or {}).get("p99_ms")) is not None]
    ttft = max(ttfts) if ttfts else None
    tput = [float(s["output_tokens_per_s"]) for s in steps if s.get("output_tokens_per_s") is not None]
    slo_met = None
    if slo_ttft_p99_s is not None:
        slo_met = ttft is not None and ttft <= slo_ttft_p99_s * 1000.0
    if summary is None:
        evidence_text = f"the replay wrote no verdict (exit {replay_exit})"
    else:
        evidence_text = (
            f"{requests} requests at {target}: {preemptions} preemption{'s' if preemptions != 1 else ''}"
            + (f" (the odds ask {evidence} for 99 %)" if evidence else " (the odds call it safe)")
            + ("; the server died" if died else "")
            + ("" if held else f"; the step did not hold concurrency {target}: no evidence")
            + (f"; {overflowed} of {sent} overflowed max_model_len {served_limit}" if overflowed else "")
        )
    return Proof(
        num_gpu_blocks=None if pool is None else pool.num_gpu_blocks,
        block_size=None if pool is None else pool.block_size,
        predicted_onset=predicted_onset,
        odds_safe_max_num_seqs=odds_safe,
        requests_for_evidence=evidence,
        observed_onset=pre.get("concurrency"),
        preempted_at_target=preemptions > 0 or 0 < int(pre.get("concurrency") or 0) <= target,
        died=died,
        overflow_at_target=overflow_blocks,
        slo_met=slo_met,
        requests_at_target=requests if held else 0,
        throughput_tokens_per_s=sum(tput) / len(tput) if tput else None,
        ttft_p99_ms=ttft,
        run_dir=run_dir,
        evidence=evidence_text,
    )


def _pool(server: RealVllmServer, candidate: Candidate) -> Pool | None:
    """The started server's pool: ``cache_config_info`` on ``/metrics``, else its start-up log."""
    max_num_seqs = candidate.settings.max_num_seqs
    limit = candidate.settings.max_model_len
    with contextlib.suppress(Exception):  # the served limit, as /v1/models reports it
        limit = preflight(server.url, model=None, api_key=None, timeout_s=10.0).max_model_len or limit
    pool: Pool | None = None
    try:
        snap = parse_vllm_metrics(fetch_text(server.url + "/metrics", 10.0), t_unix_s=time.time())
        pool = Pool.from_cache_config(snap.cache_config, limit)
    except Exception:
        pool = None
    if pool is None:
        logged = pool_from_log(_read(server.log_path))  # numbers only: no secret leaves here
        if logged.num_gpu_blocks is not None and logged.kv_cache_tokens:
            pool = Pool(logged.num_gpu_blocks, logged.kv_cache_tokens // logged.num_gpu_blocks, limit)
    if pool is not None and max_num_seqs is not None:
        pool = replace(pool, max_num_seqs=max_num_seqs)
    if pool is not None and candidate.settings.max_num_batched_tokens is not None:
        pool = replace(pool, max_num_batched_tokens=candidate.settings.max_num_batched_tokens)
    return pool


def _record(
    config: TuneConfig, space: SearchSpace, history: list[Candidate], status: str, notes: list[str]
) -> TuneRecord:
    done = status != "running"
    winner = pick_winner(space, history) if done else None
    if done and winner is None and history and status == "finished":
        if not any(c.started for c in history):
            last = history[-1].failure
            why = "" if last is None else f" (the last: {last.reason})"
            notes = [
                *notes,
                f"no candidate started{why}: nothing on the ladder carries {_goal(config.target)}",
            ]
        else:
            notes = [
                *notes,
                f"no candidate carried {_goal(config.target)}: the table says why each was rejected",
            ]
    return TuneRecord(
        serve_line=scrub(shlex.join(config.serve.argv), config.serve.secrets()),
        kind=config.serve.kind,
        model=config.serve.model,
        target_concurrency=config.target,
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
    verdict = "[green]carries the target[/]" if c.proof.carries else "[red]does not carry the target[/]"
    console.print(f"  started in {c.startup_s or 0:.1f} s · {verdict}: {c.proof.evidence}")


def _write(run_dir: Path, record: TuneRecord) -> None:
    path = run_dir / "tune.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record.to_json(), indent=2, allow_nan=False, default=_finite), encoding="utf-8")
    os.replace(tmp, path)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def scrub_file(path: Path, secrets: tuple[str, ...]) -> None:
    """Rewrite ``path`` with every secret replaced by ``***`` (nothing to do without secrets)."""
    if not secrets or not path.is_file():
        return
    text = _read(path)
    cleaned = scrub(text, secrets)
    if cleaned != text:
        path.write_text(cleaned, encoding="utf-8")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _goal(target: int | None) -> str:
    return "its own max_num_seqs (no target)" if target is None else f"target concurrency {target}"


def _exit_text(code: int | None) -> str:
    return "it did not answer /health in time" if code is None else f"exit status {code}"
