"""The tuner's search rules (oomload.tune.search's docstring), one scenario per rule, on typed candidates."""

from __future__ import annotations

from dataclasses import replace

from oomload.tune.ladder import seqs_ladder, utilization_ladder
from oomload.tune.search import Candidate, Proof, SearchSpace, Settings, next_proposal, pick_winner
from oomload.tune.startup import StartCause, StartupFailure
from oomload.tune.stops import starts_stop

GIB = 1024**3
SPACE = SearchSpace(
    memory=tuple(Settings(gpu_memory_utilization=u) for u in (0.95, 0.9, 0.85, 0.8, 0.75)),
    max_num_seqs=(2, 4, 6, 8),
    recommended_max_model_len=4352,
)


def _proof(*, preempted: bool, blocks: int = 800, safe: int | None = None) -> Proof:
    return Proof(
        num_gpu_blocks=blocks,
        block_size=16,
        predicted_onset=7,
        odds_safe_max_num_seqs=safe,
        requests_for_evidence=100,
        observed_onset=8 if preempted else None,
        preempted_at_target=preempted,
        died=False,
        overflow_at_target=False,
        slo_met=None,
        requests_at_target=120,
        throughput_tokens_per_s=500.0,
        ttft_p99_ms=900.0,
        run_dir=None,
        evidence="",
    )


def _failed(index: int, settings: Settings, failure: StartupFailure) -> Candidate:
    return Candidate(index, settings, "r", started=False, failure=failure)


def _proved(index: int, settings: Settings, proof: Proof) -> Candidate:
    return Candidate(index, settings, "r", started=True, proof=proof)


def test_first_candidate_is_the_most_memory_with_max_num_seqs_at_the_target() -> None:
    first = next_proposal(SPACE, 8, [])
    assert first is not None
    assert first.settings == Settings(gpu_memory_utilization=0.95, max_num_seqs=8)


def test_free_memory_failure_jumps_to_the_highest_utilization_the_free_share_allows() -> None:
    first = Settings(gpu_memory_utilization=0.95, max_num_seqs=8)
    free = StartupFailure(
        StartCause.FREE_MEMORY, "Free memory…", free_bytes=int(18.49 * GIB), total_bytes=int(22.49 * GIB)
    )
    nxt = next_proposal(SPACE, 8, [_failed(1, first, free)])
    assert nxt is not None
    # 18.49 / 22.49 = 0.822: 0.9 and 0.85 cannot start, 0.8 is the most that can
    assert nxt.settings == Settings(gpu_memory_utilization=0.8, max_num_seqs=8)
    assert "18.49 of 22.49 GiB" in nxt.rule


def test_cuda_oom_turns_on_eager_mode_then_lowers_memory() -> None:
    first = Settings(gpu_memory_utilization=0.95, max_num_seqs=8)
    oom = StartupFailure(StartCause.CUDA_OOM, "CUDA out of memory")
    nxt = next_proposal(SPACE, 8, [_failed(1, first, oom)])
    assert nxt is not None and nxt.settings == replace(first, enforce_eager=True)
    again = next_proposal(SPACE, 8, [_failed(1, first, oom), _failed(2, nxt.settings, oom)])
    assert again is not None and again.settings.gpu_memory_utilization == 0.9 and again.settings.enforce_eager


def test_context_failure_cuts_max_model_len_to_the_traces_recommendation_or_the_estimate() -> None:
    first = Settings(gpu_memory_utilization=0.95, max_num_seqs=8)
    roomy = StartupFailure(
        StartCause.CONTEXT_TOO_LONG, "…", max_model_len=32768, estimated_max_model_len=21344
    )
    nxt = next_proposal(SPACE, 8, [_failed(1, first, roomy)])
    assert nxt is not None and nxt.settings.max_model_len == 4352
    tight = StartupFailure(StartCause.CONTEXT_TOO_LONG, "…", max_model_len=2048, estimated_max_model_len=896)
    cut = next_proposal(SPACE, 8, [_failed(1, first, tight)])
    assert cut is not None and cut.settings.max_model_len == 896


def test_no_kv_memory_halves_batched_tokens_and_unknown_errors_end_the_search() -> None:
    first = Settings(gpu_memory_utilization=0.95, max_num_seqs=8)
    no_kv = StartupFailure(StartCause.NO_KV_MEMORY, "No available memory for the cache blocks")
    nxt = next_proposal(SPACE, 8, [_failed(1, first, no_kv)])
    assert nxt is not None and nxt.settings.max_num_batched_tokens == 1024
    other = StartupFailure(StartCause.OTHER, "OSError: no such model")
    assert next_proposal(SPACE, 8, [_failed(1, first, other)]) is None
    weights = StartupFailure(StartCause.WEIGHTS, "Failed to load model")
    assert next_proposal(SPACE, 8, [_failed(1, first, weights)]) is None


def test_a_preempting_candidate_moves_to_the_seqs_the_odds_call_safe_and_the_search_stops_for_a_reason() -> (
    None
):
    at8 = Settings(gpu_memory_utilization=0.8, max_num_seqs=8)
    history = [_proved(1, at8, _proof(preempted=True, safe=4))]
    nxt = next_proposal(SPACE, 8, history)
    assert nxt is not None and nxt.settings.max_num_seqs == 4  # the odds skip 6
    assert "odds" in nxt.rule
    history.append(_proved(2, nxt.settings, _proof(preempted=False)))
    up = next_proposal(SPACE, 8, history)
    assert up is not None and up.settings.max_num_seqs == 6  # where does the headroom end?
    history.append(_proved(3, up.settings, _proof(preempted=True)))
    mid = next_proposal(SPACE, 8, history)  # 4 carried, 6 preempted: the boundary is bisected, off the ladder
    assert mid is not None and mid.settings.max_num_seqs == 5 and "bisect" in mid.rule
    history.append(_proved(4, mid.settings, _proof(preempted=True)))
    assert next_proposal(SPACE, 8, history) is None  # 4 carried, 5 preempted: one apart, stop
    winner = pick_winner(SPACE, history, 8)
    assert winner is not None and winner.index == 2


def test_the_start_bound_is_respected_and_no_carrier_means_no_winner() -> None:
    bounded = replace(SPACE, max_starts=1)
    first = Settings(gpu_memory_utilization=0.95, max_num_seqs=8)
    history = [_proved(1, first, _proof(preempted=True, safe=2))]
    assert next_proposal(bounded, 8, history) is None
    assert pick_winner(bounded, history, 8) is None


def test_max_starts_in_the_middle_of_a_bisection_is_said_not_hidden() -> None:
    """`tune --max-starts 4` without a target: 256 preempted, 5 carried, 130 and 67 preempted — the
    bisection between 5 and 67 was not done, yet the tune said "status finished" with no note, and its
    winner (5) read as the boundary. ``starts_stop`` names the bound and the next candidate."""
    space = replace(SPACE, max_num_seqs=(1, 2, 4, 8, 16, 32), max_starts=3)
    at = Settings(gpu_memory_utilization=0.95)
    history = [
        _proved(1, replace(at, max_num_seqs=32), _proof(preempted=True, safe=4)),
        _proved(2, replace(at, max_num_seqs=4), _proof(preempted=False)),
        _proved(3, replace(at, max_num_seqs=18), _proof(preempted=True)),
    ]
    assert next_proposal(space, None, history) is None  # the bound ends the search …
    said = starts_stop(space, None, history)
    assert said is not None and said.startswith("stopped at --max-starts 3 before the search was done: ")
    assert "the next candidate would have been --gpu-memory-utilization 0.95 --max-num-seqs 11" in said
    assert starts_stop(replace(space, max_starts=8), None, history) is None  # … not its own rules
    done = [*history[:2], _proved(3, replace(at, max_num_seqs=5), _proof(preempted=True))]
    assert starts_stop(space, None, done) is None  # 4 carried, 5 preempted: the boundary is found


def test_the_winner_prefers_more_memory_then_more_seqs() -> None:
    a = _proved(1, Settings(gpu_memory_utilization=0.8, max_num_seqs=6), _proof(preempted=False))
    b = _proved(2, Settings(gpu_memory_utilization=0.9, max_num_seqs=4), _proof(preempted=False))
    c = _proved(3, Settings(gpu_memory_utilization=0.9, max_num_seqs=6), _proof(preempted=False))
    winner = pick_winner(SPACE, [a, b, c], 8)
    assert winner is not None and winner.index == 3


def test_ladders() -> None:
    assert utilization_ladder(0.9, floor=0.75) == (0.9, 0.85, 0.8, 0.75)
    assert seqs_ladder(8) == (1, 2, 4, 6, 8)


def test_without_a_target_each_setting_is_proved_at_its_own_max_num_seqs() -> None:
    space = replace(SPACE, max_num_seqs=(1, 2, 4, 8, 16, 32))
    first = next_proposal(space, None, [])
    assert first is not None and first.settings.max_num_seqs == 32  # the ladder is not capped
    history = [_proved(1, first.settings, _proof(preempted=True, safe=4))]
    nxt = next_proposal(space, None, history)
    assert nxt is not None and nxt.settings.max_num_seqs == 4 and "at 32 with max_num_seqs 32" in nxt.rule
    history.append(_proved(2, nxt.settings, _proof(preempted=False)))
    up = next_proposal(space, None, history)
    assert up is not None and up.settings.max_num_seqs == 18  # bisect 4 (carried) … 32 (preempted)
    history.append(_proved(3, up.settings, _proof(preempted=True)))
    for seqs in (11, 7, 5):  # each preempts: the bracket narrows to 4 … 5
        nxt = next_proposal(space, None, history)
        assert nxt is not None and nxt.settings.max_num_seqs == seqs
        history.append(_proved(len(history) + 1, nxt.settings, _proof(preempted=True)))
    assert next_proposal(space, None, history) is None
    winner = pick_winner(space, history, None)
    assert winner is not None and winner.settings.max_num_seqs == 4


def test_a_carrier_at_the_target_seeks_headroom_above_it_while_the_odds_call_it_safe() -> None:
    at8 = Settings(gpu_memory_utilization=0.95, max_num_seqs=8)
    safe = replace(_proof(preempted=False), odds_safe_above=True)
    history = [_proved(1, at8, safe)]
    up = next_proposal(SPACE, 8, history)
    assert up is not None and up.settings == replace(at8, max_num_seqs=10)  # the level above: 8 + 8 // 4
    assert "odds on 800 blocks call 10 safe" in up.rule and "headroom" in up.rule
    # the odds do not call the level above safe: no restart spent on it
    unsafe = replace(safe, odds_safe_above=False)
    assert next_proposal(SPACE, 8, [_proved(1, at8, unsafe)]) is None


def test_headroom_above_the_target_wins_only_when_the_level_above_held() -> None:
    at8 = Settings(gpu_memory_utilization=0.95, max_num_seqs=8)
    first = _proved(1, at8, replace(_proof(preempted=False), odds_safe_above=True))
    held = _proved(2, replace(at8, max_num_seqs=10), _proof(preempted=False))
    assert next_proposal(SPACE, 8, [first, held]) is None  # headroom shown: stop
    assert pick_winner(SPACE, [first, held], 8) == held
    # carried 8 but preempted at 10, the level it admits: the capped setting wins, the search stops
    burst = _proved(2, replace(at8, max_num_seqs=10), replace(_proof(preempted=False), observed_onset=10))
    assert next_proposal(SPACE, 8, [first, burst]) is None
    assert pick_winner(SPACE, [first, burst], 8) == first


def test_a_rate_target_measured_above_the_ladder_falls_back_to_the_target_after_a_burst() -> None:
    """--target-rate: the first candidate ran at the ladder's top (256) and measured concurrency 8."""
    space = replace(SPACE, max_num_seqs=seqs_ladder(8))
    wide = _proved(1, Settings(gpu_memory_utilization=0.95, max_num_seqs=256), _proof(preempted=False))
    assert next_proposal(space, 8, [wide]) is None  # clean at 8 and 10: headroom seen
    burst = _proved(
        1, Settings(gpu_memory_utilization=0.95, max_num_seqs=256), replace(wide.proof, observed_onset=10)
    )  # type: ignore[arg-type]
    nxt = next_proposal(space, 8, [burst])
    assert nxt is not None and nxt.settings.max_num_seqs == 8 and "queues such bursts" in nxt.rule


def test_the_first_rule_says_the_max_num_seqs_it_set() -> None:
    """``--fix max-num-seqs`` with ``--max-num-seqs 64`` in the line, target 48: the rule read "max_num_seqs
    at the target" beside ``--max-num-seqs 64``."""
    fixed = replace(SPACE, base=Settings(max_num_seqs=64), fixed=frozenset({"max_num_seqs"}))
    first = next_proposal(fixed, 48, [])
    assert first is not None and first.settings.max_num_seqs == 64
    assert first.rule.endswith(
        "max_num_seqs 64 kept from your line (--fix max-num-seqs), above the target 48"
    )
    default = next_proposal(replace(fixed, base=Settings()), 48, [])
    assert default is not None and default.settings.max_num_seqs is None
    assert default.rule.endswith("max_num_seqs left at the server's default (--fix max-num-seqs)")
    below = next_proposal(SPACE, 12, [])  # the ladder 2, 4, 6, 8 has nothing at 12
    assert below is not None and below.settings.max_num_seqs == 8
    assert below.rule.endswith("max_num_seqs 8, the ladder's largest, below the target 12")
    above = next_proposal(replace(SPACE, max_num_seqs=(64, 128)), 48, [])
    assert above is not None and above.rule.endswith(
        "max_num_seqs 64, the ladder's smallest, above the target 48"
    )
    at = next_proposal(SPACE, 8, [])
    assert at is not None and at.rule.endswith("max_num_seqs at the target")
