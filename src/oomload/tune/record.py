"""``tune.json``: one typed definition of a tune's record, used by its writer and its readers (pure).

The tune's run directory holds ``tune.json`` (schema ``oomload.tune/1``), rewritten after every
candidate so that a tune cut short (Ctrl-C, the wall-time bound, a crash) still has its partial table,
and ``candidates/NN/`` per candidate: ``server.log`` (the server's own output) and, for a candidate
that started, ``run/`` — an ordinary replay run directory that ``oomload report`` re-renders.

The winner's gate rules (``gate_rules``) are the ones that keep the tune's finding true in CI: no
preemption and no engine death up to the target, and the TTFT SLO at the target when one was asked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oomload.errors import ExitCode
from oomload.tune.rate import RateTarget
from oomload.tune.search import KNOBS, Candidate, Proof, Settings
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
    def from_json(cls, obj: object) -> TuneRecord:
        """The record from ``tune.json``'s document; a damaged one is ``ValueError`` with one clause
        that says where and what (``_Fields``): "it has no serve_line", "candidates[0].settings is
        "x", not an object"."""
        top = _Fields(obj, "")
        if top.obj.get("schema") != SCHEMA:
            raise ValueError(f"its schema is {_shown(top.obj.get('schema'))}, not {SCHEMA!r}")
        status = top.text("status") or "finished"
        if status not in STATUSES:
            raise ValueError(f"status is {_shown(status)}, not one of {', '.join(STATUSES)}")
        return cls(
            serve_line=top.required_text("serve_line"),
            kind=top.text("kind") or "vllm",
            model=top.text("model"),
            target_concurrency=top.whole("target_concurrency"),
            trace_path=top.text("trace_path") or "",
            max_starts=top.whole("max_starts") or 0,
            max_duration_s=top.number("max_duration_s") or 0.0,
            slo_ttft_p99_s=top.number("slo_ttft_p99_s"),
            candidates=tuple(
                candidate_from_json(c, f"candidates[{n}]") for n, c in enumerate(top.items("candidates"))
            ),
            status=status,
            winner_index=top.whole("winner_index"),
            winner_line=top.text("winner_line"),
            recommended_max_model_len=top.whole("recommended_max_model_len"),
            notes=tuple(str(n) for n in top.items("notes")),
            target_rate_rps=top.number("target_rate_rps"),
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


def candidate_from_json(obj: object, where: str = "candidate") -> Candidate:
    """One candidate of ``tune.json`` (``where``: its place there, for a damaged one's sentence)."""
    c = _Fields(obj, where)
    f = c.fields("failure")
    failure = None
    if f is not None:
        cause = f.text("cause") or "other"
        if cause not in set(StartCause):
            raise ValueError(f"{f.where}.cause is {_shown(cause)}, not one of {', '.join(StartCause)}")
        failure = StartupFailure(
            cause=StartCause(cause),
            message=f.text("message") or "",
            free_bytes=f.whole("free_bytes"),
            total_bytes=f.whole("total_bytes"),
            max_model_len=f.whole("max_model_len"),
            estimated_max_model_len=f.whole("estimated_max_model_len"),
        )
    p = c.fields("proof")
    proof = None
    if p is not None:
        proof = Proof(
            num_gpu_blocks=p.whole("num_gpu_blocks"),
            block_size=p.whole("block_size"),
            predicted_onset=p.whole("predicted_onset"),
            odds_safe_max_num_seqs=p.whole("odds_safe_max_num_seqs"),
            requests_for_evidence=p.whole("requests_for_evidence"),
            observed_onset=p.whole("observed_onset"),
            preempted_at_target=bool(p.flag("preempted_at_target")),
            died=bool(p.flag("died")),
            overflow_at_target=bool(p.flag("overflow_at_target")),
            slo_met=p.flag("slo_met"),
            requests_at_target=p.whole("requests_at_target") or 0,
            throughput_tokens_per_s=p.number("throughput_tokens_per_s"),
            ttft_p99_ms=p.number("ttft_p99_ms"),
            run_dir=p.text("run_dir"),
            evidence=p.text("evidence") or "",
            predicted_onset_worst_case=p.whole(
                "predicted_onset_worst_case" if "predicted_onset_worst_case" in p.obj else "predicted_onset"
            ),
            prompts=p.text("prompts") or "worst-case",
            odds_safe_above=p.flag("odds_safe_above"),
            no_evidence=bool(p.flag("no_evidence")),
            starved=p.text("load_host_starved"),
            remeasured=bool(p.flag("remeasured")),
            running_max=p.whole("running_max"),
            died_above=p.whole("died_above"),
            death_kind=p.text("death_kind"),
        )
    return Candidate(
        index=c.required_whole("index"),
        settings=_settings(c.fields("settings")),
        rule=c.text("rule") or "",
        started=bool(c.flag("started")),
        failure=failure,
        free_device_bytes=c.whole("free_device_bytes"),
        proof=proof,
        startup_s=c.number("startup_s"),
        rate=_rate(c.fields("rate")),
        num_gpu_blocks=c.whole("num_gpu_blocks"),
        block_size=c.whole("block_size"),
    )


STATUSES = ("running", "finished", "interrupted", "bounded", "stopped", "no_evidence")
_SWITCHES = ("enable_prefix_caching", "enforce_eager")


def _settings(s: _Fields | None) -> Settings:
    """A candidate's settings, each knob's kind checked before ``Settings.from_json``."""
    if s is None:
        return Settings()
    for knob in KNOBS:
        if knob in _SWITCHES:
            s.flag(knob)
        elif knob == "gpu_memory_utilization":
            s.number(knob)
        else:
            s.whole(knob)
    return Settings.from_json(dict(s.obj))


def _rate(r: _Fields | None) -> RateTarget | None:
    """A candidate's rate measurement, each field's kind checked before ``RateTarget.from_json``."""
    if r is None:
        return None
    for name in ("rate_rps", "in_flight_mean"):
        r.required_number(name)
    r.required_whole("concurrency")
    r.number("achieved_rps")
    r.whole("requests")
    r.whole("preemptions")
    r.text("run_dir")
    return RateTarget.from_json(r.obj)


class _Fields:
    """One JSON object of ``tune.json``, read with the kind of each value checked: a missing or wrong
    one is ``ValueError`` saying where it is (``candidates[1].proof.num_gpu_blocks``) and what it holds,
    never a bare key name or Python's own words."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where or 'the document'} is {_shown(value)}, not an object")
        self.obj: Mapping[str, Any] = value
        self.where = where

    def _raw(self, key: str, required: bool = False) -> object:
        value = self.obj.get(key)
        if value is None and required:
            raise ValueError(f"{self.where or 'it'} has no {key}")
        return value

    def _wrong(self, key: str, value: object, kind: str) -> ValueError:
        return ValueError(f"{self.where + '.' if self.where else ''}{key} is {_shown(value)}, not {kind}")

    def text(self, key: str) -> str | None:
        value = self._raw(key)
        if value is None or isinstance(value, str):
            return value
        raise self._wrong(key, value, "a text")

    def required_text(self, key: str) -> str:
        value = self._raw(key, required=True)
        if isinstance(value, str):
            return value
        raise self._wrong(key, value, "a text")

    def whole(self, key: str, *, required: bool = False) -> int | None:
        value = self._raw(key, required)
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise self._wrong(key, value, "a whole number")

    def required_whole(self, key: str) -> int:
        value = self.whole(key, required=True)
        assert value is not None
        return value

    def number(self, key: str, *, required: bool = False) -> float | None:
        value = self._raw(key, required)
        if value is None:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise self._wrong(key, value, "a number")

    def required_number(self, key: str) -> float:
        value = self.number(key, required=True)
        assert value is not None
        return value

    def flag(self, key: str) -> bool | None:
        value = self._raw(key)
        if value is None or isinstance(value, bool):
            return value
        raise self._wrong(key, value, "true or false")

    def fields(self, key: str) -> _Fields | None:
        value = self._raw(key)
        return None if value is None else _Fields(value, f"{self.where + '.' if self.where else ''}{key}")

    def items(self, key: str) -> list[object]:
        value = self._raw(key)
        if value is None:
            return []
        if isinstance(value, list):
            return value
        raise self._wrong(key, value, "a list")


def _shown(value: object) -> str:
    """A JSON value as the file has it, cut to 40 characters: ``"x"``, ``[1, 2]``, ``null``."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 40 else text[:39] + "…"
