"""A tune's configuration (``TuneConfig``, from the CLI) and what every candidate of it shares
(``TuneContext``: the config, the search space, the resolved target, the trace, the console)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from oomload.capacity.blocks import SharedPrefixes
from oomload.capacity.odds import trace_prefixes
from oomload.realvllm.servecmd import ServeCommand
from oomload.trace.model import PrefixInfo, TraceRecord
from oomload.tune.search import SearchSpace


@dataclass(frozen=True)
class TuneConfig:
    trace_path: Path
    serve: ServeCommand
    target: int | None  # None: a rate target (target_rate_rps) or the highest preemption-free concurrency
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
    target_rate_rps: float | None = None  # --target-rate: translated to a concurrency (oomload.tune.rate)
    max_num_seqs_given: bool = False  # the user gave the ladder: a measured rate target keeps it

    def candidate_worst_case_s(self, *, measuring_rate: bool) -> float:
        """The longest one candidate may take: its start-up and two replays (its proof measured again),
        and first the rate's open-loop replay while the rate target is being measured."""
        replays = 2 + (1 if measuring_rate else 0)
        return self.startup_timeout_s + replays * self.replay_max_duration_s


@dataclass(frozen=True)
class TuneContext:
    """What ``_run_candidate`` and the proof of every candidate share (one value, not eight arguments)."""

    config: TuneConfig
    space: SearchSpace  # with the trace's recommended max_model_len
    target: int | None  # the concurrency to carry: --target-concurrency, or the rate's once measured
    records: tuple[TraceRecord, ...]
    prefix: PrefixInfo  # the trace's prefix block size (its hash_ids' unit)
    console: Console

    @property
    def prompts(self) -> list[int]:
        return [r.prompt_tokens for r in self.records]

    @property
    def outputs(self) -> list[int]:
        return [r.output_tokens for r in self.records]

    @property
    def waiting_for_rate(self) -> bool:
        """A rate target whose concurrency is not measured yet (the next started candidate measures it)."""
        return self.target is None and self.config.target_rate_rps is not None

    def shared(self, block_size: int) -> SharedPrefixes | None:
        """The trace's shared prefix blocks on a pool of ``block_size`` (None: the trace shares none)."""
        if not any(r.hash_ids for r in self.records):
            return None
        return trace_prefixes(self.records, self.prefix, block_size)
