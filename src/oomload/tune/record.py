"""``tune.json``: one typed definition of a tune's record, used by its writer and its readers (pure).

The tune's run directory holds ``tune.json`` (schema ``oomload.tune/1``), rewritten after every
candidate so that a tune cut short (Ctrl-C, the wall-time bound, a crash) still has its partial table,
and ``candidates/NN/`` per candidate: ``server.log`` (the server's own output) and, for a candidate
that started, ``run/`` — an ordinary replay run directory that ``oomload report`` re-renders.

The winner's gate rules (``gate_rules``) are the ones that keep the tune's finding true in CI: no
preemption and no engine death up to the target, and the TTFT SLO at the target when one was asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oomload.errors import ExitCode
from oomload.tune.rate import RateTarget
from oomload.tune.search import Candidate, Proof, Settings
from oomload.tune.startup import StartCause, StartupFailure

SCHEMA = "oomload.tune/1"


@dataclass(frozen=True, slots=True)
class TuneRecord:
    """Everything a tune report shows (module docstring)."""

    serve_line: str
    kind: str  # "vllm" | "sim"
    model: str | None
    target_concurrency: int | None  # None: each candidate proved at its own max_num_seqs
    trace_path: str
    max_starts: int
    max_duration_s: float
    slo_ttft_p99_s: float | None
    candidates: tuple[Candidate, ...]
    # "running" | "finished" | "interrupted" | "bounded" (the wall-time bound, or --max-starts before the
    # search was done, ended it) | "stopped" (an error ended it, e.g. a full disk: the last note says
    # which) | "no_evidence" (the last candidate's steps held neither the target nor its cap: the last note
    # says why, the load host or the server)
    status: str
    winner_index: int | None = None
    winner_line: str | None = None
    recommended_max_model_len: int | None = None
    notes: tuple[str, ...] = field(default=())
    target_rate_rps: float | None = None  # --target-rate (target_concurrency: what it measured as)

    @property
    def rate(self) -> RateTarget | None:
        """The open-loop measurement that turned the target rate into the target concurrency."""
        return next((c.rate for c in self.candidates if c.rate is not None), None)

    @property
    def winner(self) -> Candidate | None:
        return next((c for c in self.candidates if c.index == self.winner_index), None)

    def exit_code(self) -> int:
        """``oomload tune``'s exit code: ``INTERRUPTED`` for a tune a signal stopped, else what the
        record proves (``verdict_exit_code``)."""
        if self.status == "interrupted":
            return int(ExitCode.INTERRUPTED)
        return self.verdict_exit_code()

    def verdict_exit_code(self) -> int:
        """What the record proves, as ``oomload report TUNE_DIR`` exits: a winner ``OK``; a search that
        ended (``finished``, ``bounded``) with none ``GATE_FAILED`` — nothing it tried carried the
        target; one that did not end — ``interrupted``, ``stopped`` by an error, still ``running`` when
        its process died, or ``no_evidence`` (search rule 5) — ``GATE_NOT_EVALUATED``: a search that was
        not done is no finding that nothing carries, and missing evidence never passes."""
        if self.winner is not None:
            return int(ExitCode.OK)
        if self.status in ("finished", "bounded"):
            return int(ExitCode.GATE_FAILED)
        return int(ExitCode.GATE_NOT_EVALUATED)

    def gate_rules(self) -> tuple[str, ...]:
        if self.winner is None:
            return ()
        c = self.target_concurrency or self.winner.settings.max_num_seqs
        if c is None:
            return ()
        rules = [f"no-preemption-below:{c + 1}", f"no-oom-up-to:{c}"]
        if self.slo_ttft_p99_s is not None:
            rules.append(f"p99-ttft-s@{c}<={self.slo_ttft_p99_s:g}")
        return tuple(rules)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "serve_line": self.serve_line,
            "kind": self.kind,
            "model": self.model,
            "target_concurrency": self.target_concurrency,
            "target_rate_rps": self.target_rate_rps,
            "rate": None if self.rate is None else self.rate.to_json(),
            "trace_path": self.trace_path,
            "max_starts": self.max_starts,
            "max_duration_s": self.max_duration_s,
            "slo_ttft_p99_s": self.slo_ttft_p99_s,
            "status": self.status,
            "winner_index": self.winner_index,
            "winner_line": self.winner_line,
            "gate_rules": list(self.gate_rules()),
            "recommended_max_model_len": self.recommended_max_model_len,
            "notes": list(self.notes),
            "candidates": [candidate_to_json(c) for c in self.candidates],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TuneRecord:
        if obj.get("schema") != SCHEMA:
            raise ValueError(f"not an {SCHEMA} document (schema {obj.get('schema')!r})")
        return cls(
            serve_line=str(obj["serve_line"]),
            kind=str(obj.get("kind", "vllm")),
            model=obj.get("model"),
            target_concurrency=obj.get("target_concurrency"),
            trace_path=str(obj.get("trace_path", "")),
            max_starts=int(obj.get("max_starts", 0)),
            max_duration_s=float(obj.get("max_duration_s", 0.0)),
            slo_ttft_p99_s=obj.get("slo_ttft_p99_s"),
            candidates=tuple(candidate_from_json(c) for c in obj.get("candidates", [])),
            status=str(obj.get("status", "finished")),
            winner_index=obj.get("winner_index"),
            winner_line=obj.get("winner_line"),
            recommended_max_model_len=obj.get("recommended_max_model_len"),
            notes=tuple(str(n) for n in obj.get("notes", [])),
            target_rate_rps=obj.get("target_rate_rps"),
        )


def candidate_to_json(c: Candidate) -> dict[str, Any]:
    failure = c.failure
    proof = c.proof
    return {
        "index": c.index,
        "settings": c.settings.to_json(),
        "flags": c.settings.label(),
        "rule": c.rule,
        "started": c.started,
        "startup_s": c.startup_s,
        "rate": None if c.rate is None else c.rate.to_json(),
        "free_device_bytes": c.free_device_bytes,
        "num_gpu_blocks": c.num_gpu_blocks,
        "block_size": c.block_size,
        "failure": None
        if failure is None
        else {
            "cause": str(failure.cause),
            "reason": failure.reason,
            "message": failure.message,
            "free_bytes": failure.free_bytes,
            "total_bytes": failure.total_bytes,
            "max_model_len": failure.max_model_len,
            "estimated_max_model_len": failure.estimated_max_model_len,
        },
        "proof": None
        if proof is None
        else {
            "num_gpu_blocks": proof.num_gpu_blocks,
            "block_size": proof.block_size,
            "predicted_onset": proof.predicted_onset,
            "predicted_onset_worst_case": proof.predicted_onset_worst_case,
            "prompts": proof.prompts,
            "odds_safe_above": proof.odds_safe_above,
            "odds_safe_max_num_seqs": proof.odds_safe_max_num_seqs,
            "requests_for_evidence": proof.requests_for_evidence,
            "observed_onset": proof.observed_onset,
            "preempted_at_target": proof.preempted_at_target,
            "died": proof.died,
            "overflow_at_target": proof.overflow_at_target,
            "slo_met": proof.slo_met,
            "requests_at_target": proof.requests_at_target,
            "throughput_tokens_per_s": proof.throughput_tokens_per_s,
            "ttft_p99_ms": proof.ttft_p99_ms,
            "run_dir": proof.run_dir,
            "evidence": proof.evidence,
            "carries": proof.carries,
            "outcome": proof.outcome,
            "no_evidence": proof.no_evidence,
            "load_host_starved": proof.starved,
            "remeasured": proof.remeasured,
            "running_max": proof.running_max,
            "died_above": proof.died_above,
            "death_kind": proof.death_kind,
        },
    }


def candidate_from_json(obj: Mapping[str, Any]) -> Candidate:
    f = obj.get("failure")
    p = obj.get("proof")
    failure = None
    if isinstance(f, Mapping):
        failure = StartupFailure(
            cause=StartCause(f.get("cause", "other")),
            message=str(f.get("message", "")),
            free_bytes=f.get("free_bytes"),
            total_bytes=f.get("total_bytes"),
            max_model_len=f.get("max_model_len"),
            estimated_max_model_len=f.get("estimated_max_model_len"),
        )
    proof = None
    if isinstance(p, Mapping):
        proof = Proof(
            num_gpu_blocks=p.get("num_gpu_blocks"),
            block_size=p.get("block_size"),
            predicted_onset=p.get("predicted_onset"),
            odds_safe_max_num_seqs=p.get("odds_safe_max_num_seqs"),
            requests_for_evidence=p.get("requests_for_evidence"),
            observed_onset=p.get("observed_onset"),
            preempted_at_target=bool(p.get("preempted_at_target")),
            died=bool(p.get("died")),
            overflow_at_target=bool(p.get("overflow_at_target")),
            slo_met=p.get("slo_met"),
            requests_at_target=int(p.get("requests_at_target") or 0),
            throughput_tokens_per_s=p.get("throughput_tokens_per_s"),
            ttft_p99_ms=p.get("ttft_p99_ms"),
            run_dir=p.get("run_dir"),
            evidence=str(p.get("evidence", "")),
            predicted_onset_worst_case=p.get("predicted_onset_worst_case", p.get("predicted_onset")),
            prompts=str(p.get("prompts", "worst-case")),
            odds_safe_above=p.get("odds_safe_above"),
            no_evidence=bool(p.get("no_evidence")),
            starved=p.get("load_host_starved"),
            remeasured=bool(p.get("remeasured")),
            running_max=p.get("running_max"),
            died_above=p.get("died_above"),
            death_kind=p.get("death_kind"),
        )
    return Candidate(
        index=int(obj["index"]),
        settings=Settings.from_json(dict(obj.get("settings") or {})),
        rule=str(obj.get("rule", "")),
        started=bool(obj.get("started")),
        failure=failure,
        free_device_bytes=obj.get("free_device_bytes"),
        proof=proof,
        startup_s=obj.get("startup_s"),
        rate=RateTarget.from_json(obj["rate"]) if isinstance(obj.get("rate"), Mapping) else None,
        num_gpu_blocks=obj.get("num_gpu_blocks"),
        block_size=obj.get("block_size"),
    )
