"""Recommendations from hand-built verdicts, and the P99 floor as a property."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.outcome import Outcome
from oomload.trace.stats import percentile
from oomload.verdict import Verdict, build_verdict
from oomload.verdict.recommend import recommend
from oomload.verdict.runview import load_run
from runbuilder import CPU_CACHE, GIB, StepSpec, cpu_knee_steps, write_run


def verdict_of(path: Path) -> Verdict:
    return build_verdict(load_run(path))


def test_preemption_run_caps_max_num_seqs_and_max_model_len(tmp_path: Path) -> None:
    lengths = [(200 + 10 * i, 100) for i in range(100)]  # totals 300..1290, P99 = 1280
    rec = recommend(
        verdict_of(write_run(tmp_path / "r", cpu_knee_steps(), cache_config=CPU_CACHE, lengths=lengths))
    )
    assert rec.max_num_seqs.value == 5
    # ceil(1280 * 1.1) = 1409 → lcm(256, 32) = 256 → 1536
    assert rec.max_model_len.value == 1536
    advice = rec.max_model_len_advice
    assert advice is not None and advice.basis_tokens == 1280 and advice.refused_count == 0
    assert advice.current_max_model_len == 4096
    # the usable pool: (96 blocks − the null block) × 32 tokens = 3040, as `oomload plan` counts it
    assert advice.max_concurrency == 3040 / 1536 and advice.current_max_concurrency == 3040 / 4096
    assert advice.freed_concurrency == pytest.approx(3040 / 1536 - 3040 / 4096)
    assert rec.gpu_memory_utilization.value is None  # preemption is not an OOM
    assert rec.max_num_batched_tokens.value is None
    assert rec.flag_line == "vllm serve tiny-model --max-model-len 1536 --max-num-seqs 5"
    assert "preemption began at concurrency 6" in rec.reasoning
    # the limit is no preemption fix: vLLM takes blocks for the tokens held, not for max_model_len
    assert "(vLLM's maximum concurrency for full-length requests: 0.7x → 2.0x)" in rec.reasoning
    assert "It bounds the longest request, not preemption" in rec.reasoning
    assert "lets the KV pool hold" not in rec.reasoning


@pytest.mark.parametrize(
    ("config", "current"),
    [
        ({}, None),  # nothing says the server's cap
        ({"sim_args": ["--model", "m", "--max-num-seqs", "64"]}, 64),  # the simulator's flags
        ({"served_with": "vllm serve m --max-num-seqs 32 --api-key ***"}, 32),  # --served-with
        ({"serve": "vllm serve m --max-num-seqs 16", "sim_args": ["--max-num-seqs", "64"]}, 16),
    ],
)
def test_the_cap_shows_the_servers_own_max_num_seqs(
    tmp_path: Path, config: dict[str, object], current: int | None
) -> None:
    rec = recommend(
        verdict_of(write_run(tmp_path / "r", cpu_knee_steps(), cache_config=CPU_CACHE, config=config))
    )
    assert (rec.max_num_seqs.value, rec.max_num_seqs.current) == (5, current)


def test_a_server_already_capped_at_the_safe_level_gets_no_cap(tmp_path: Path) -> None:
    # the server ran at most 4 at once; preemption began at 6 all the same: a cap at 5 would not lower it
    config = {"served_with": "vllm serve m --max-num-seqs 4"}
    rec = recommend(
        verdict_of(write_run(tmp_path / "r", cpu_knee_steps(), cache_config=CPU_CACHE, config=config))
    )
    assert (rec.max_num_seqs.value, rec.max_num_seqs.current) == (None, 4)
    assert rec.flag_line == "vllm serve m --max-num-seqs 4 --max-model-len 768"  # its line, no cap added
    assert (
        "already runs at most 4 sequences at once, so a cap at 5 changes nothing" in rec.max_num_seqs.reason
    )


def test_the_line_is_the_servers_own_or_what_vllm_serve_was_given_for_the_model(tmp_path: Path) -> None:
    served = {"served_with": "prlimit --data=2G -- vllm serve /m --served-model-name m --max-num-seqs=64"}
    rec = recommend(
        verdict_of(write_run(tmp_path / "a", cpu_knee_steps(), cache_config=CPU_CACHE, config=served))
    )
    assert rec.flag_line == (
        "prlimit --data=2G -- vllm serve /m --served-model-name m --max-model-len 768 --max-num-seqs 5"
    )
    # a name given with --served-model-name (or a LoRA adapter's) is not the model to load
    alias = {"model": "llama", "serve_args": ["/models/llama", "--served-model-name", "llama"]}
    rec = recommend(
        verdict_of(write_run(tmp_path / "b", cpu_knee_steps(), cache_config=CPU_CACHE, config=alias))
    )
    assert rec.flag_line.startswith("vllm serve /models/llama --served-model-name llama --max-model-len 768")


def test_real_oom_advises_gpu_memory_utilization_and_a_prefill_bound_not_a_cap(tmp_path: Path) -> None:
    """An activation peak (a CUDA allocation that failed at runtime) is bounded by the prefill batch:
    a quarter of what the last safe level prefilled at once, on multiples of 256."""
    oom = "CUDA out of memory. Tried to allocate 1.00 GiB"
    lengths = [(3000, 256)] * 20
    died = StepSpec(8, failures={Outcome.ENGINE_DEAD: 8}, error_text=oom)
    steps = [StepSpec(1), StepSpec(2), StepSpec(4), died]
    cache = {**CPU_CACHE, "gpu_memory_utilization": 0.92, "max_num_batched_tokens": 16384}
    rec = recommend(verdict_of(write_run(tmp_path / "r", steps, cache_config=cache, lengths=lengths)))
    assert rec.gpu_memory_utilization.value == 0.87
    # concurrency 4 prefilled up to min(16384, 4 × 3000) = 12000 tokens and survived: a quarter, on 256s
    assert rec.max_num_batched_tokens.value == 2816
    assert rec.max_num_seqs.value is None  # the death is answered by the prefill bound
    assert "--gpu-memory-utilization 0.87" in rec.flag_line
    assert "--max-num-batched-tokens 2816" in rec.flag_line
    assert "an activation peak: CUDA could not allocate 1.0 GiB) at concurrency 8" in rec.reasoning
    assert "concurrency 4 prefilled up to 12000 tokens at once" in rec.max_num_batched_tokens.reason


def test_an_activation_peak_within_a_small_prefill_budget_caps_concurrency_instead(tmp_path: Path) -> None:
    oom = "CUDA out of memory. Tried to allocate 1.00 GiB"
    steps = [StepSpec(1), StepSpec(2), StepSpec(4, failures={Outcome.ENGINE_DEAD: 4}, error_text=oom)]
    cache = {**CPU_CACHE, "max_num_batched_tokens": 2048}
    rec = recommend(verdict_of(write_run(tmp_path / "r", steps, cache_config=cache)))
    assert rec.max_num_batched_tokens.value is None
    assert "already at 2048 tokens: cap max_num_seqs instead" in rec.max_num_batched_tokens.reason
    # and the cap it points to is given: the death is the cap's to answer now
    assert rec.max_num_seqs.value == 2 and "--max-num-seqs 2" in rec.flag_line
    assert "Limit max_num_seqs to the last safe concurrency, 2." in rec.reasoning


def test_an_activation_peak_on_a_server_of_unknown_budget_is_bounded_in_words(tmp_path: Path) -> None:
    """No cache config, serve line or start-up log says the server's prefill budget (a --url run whose
    --server-log began after start-up): 12000 tokens carried at 4 allows 2816, but a server running
    vLLM's 2048 would be *raised* by it. The bound goes in words, never in the flag line."""
    oom = "CUDA out of memory. Tried to allocate 1.00 GiB"
    died = StepSpec(8, failures={Outcome.ENGINE_DEAD: 8}, error_text=oom)
    steps = [StepSpec(1), StepSpec(2), StepSpec(4), died]
    run = write_run(tmp_path / "r", steps, cache_config=CPU_CACHE, lengths=[(3000, 256)] * 20)
    rec = recommend(verdict_of(run))
    batched = rec.max_num_batched_tokens
    assert (batched.value, batched.current) == (None, None)
    assert batched.shown == "at most 2816, below the server's value"
    assert "--max-num-batched-tokens" not in rec.flag_line
    assert "bound it at a quarter of that, at most 2816 and below the server's own value" in rec.reasoning
    assert "vLLM does not export the server's value" in batched.reason
    assert rec.max_num_seqs.value is None  # still answered by the prefill bound, not a cap


def test_an_activation_peak_on_a_capped_server_is_not_called_a_cap_question(tmp_path: Path) -> None:
    # the death is the prefill bound's to answer: no "a cap would not lower what broke" beside it
    oom = "CUDA out of memory. Tried to allocate 1.00 GiB"
    steps = [
        StepSpec(1),
        StepSpec(2),
        StepSpec(4),
        StepSpec(8, failures={Outcome.ENGINE_DEAD: 8}, error_text=oom),
    ]
    cache = {**CPU_CACHE, "max_num_batched_tokens": 16384}
    config = {"served_with": "vllm serve m --max-num-seqs 2"}
    run = write_run(tmp_path / "r", steps, cache_config=cache, lengths=[(3000, 256)] * 20, config=config)
    rec = recommend(verdict_of(run))
    assert rec.max_num_batched_tokens.value == 2816 and rec.max_num_seqs.value is None
    assert rec.max_num_seqs.reason.startswith("only the activation peak at 8 broke, and the prefill bound")
    assert "nothing broke" not in rec.max_num_seqs.reason
    assert "already runs at most" not in rec.reasoning


def test_engine_death_without_oom_text_gets_no_memory_advice(tmp_path: Path) -> None:
    steps = [StepSpec(1), StepSpec(2, failures={Outcome.ENGINE_DEAD: 2}, error_text="connection refused")]
    rec = recommend(verdict_of(write_run(tmp_path / "r", steps, cache_config=CPU_CACHE)))
    assert rec.gpu_memory_utilization.value is None
    assert "without CUDA OOM evidence" in rec.gpu_memory_utilization.reason


def test_rising_device_memory_implicates_transient_spikes(tmp_path: Path) -> None:
    steps = [
        StepSpec(1, used_bytes=60 * GIB),
        StepSpec(2, used_bytes=60 * GIB),
        StepSpec(4, used_bytes=66 * GIB),
    ]
    rec = recommend(verdict_of(write_run(tmp_path / "r", steps)))
    # vLLM does not export the current value: no number (a guess might raise it), the reason says what to do
    assert rec.max_num_batched_tokens.value is None and "--max-num-batched-tokens" not in rec.flag_line
    assert rec.max_num_batched_tokens.reason.startswith("device memory rising 7.5% of the device")
    # said in one place: the recommended cell reads the action, the reason does not repeat it
    assert rec.max_num_batched_tokens.shown == "half the server's value, not below 2048"
    reason = rec.max_num_batched_tokens.reason
    assert "halve" not in reason and "8192 on H100" in reason
    assert rec.gpu_memory_utilization.value is None
    known = {**CPU_CACHE, "max_num_batched_tokens": 2048}
    floor = recommend(verdict_of(write_run(tmp_path / "k", steps, cache_config=known))).max_num_batched_tokens
    assert floor.value is None and floor.reason == "already at 2048; shrink prefill chunks no further"


def test_clean_run_advises_no_cap(tmp_path: Path) -> None:
    rec = recommend(verdict_of(write_run(tmp_path / "r", [StepSpec(1), StepSpec(2), StepSpec(4)])))
    assert rec.max_num_seqs.value is None
    assert "up to the highest level judged (4)" in rec.max_num_seqs.reason


def test_trace_needing_the_full_window_keeps_the_limit(tmp_path: Path) -> None:
    lengths = [(3900, 190)] * 50
    rec = recommend(verdict_of(write_run(tmp_path / "r", [StepSpec(1)], lengths=lengths)))
    assert rec.max_model_len.value is None
    assert rec.max_model_len_advice is not None and rec.max_model_len_advice.capped_by_model_limit
    assert "--max-model-len" not in rec.flag_line
    assert rec.max_model_len.reason.startswith("the current 4096 already covers the trace's P99")


def test_a_trace_longer_than_the_current_limit_is_told_what_is_refused(tmp_path: Path) -> None:
    lengths = [(3900, 190)] * 90 + [(5000, 100)] * 10
    rec = recommend(verdict_of(write_run(tmp_path / "r", [StepSpec(1)], lengths=lengths)))
    assert rec.max_model_len.value is None and "--max-model-len" not in rec.flag_line
    assert rec.max_model_len.reason.startswith(
        "the trace's P99 total length (5100 tokens) exceeds the current max_model_len 4096: "
        "10 requests (10.00%) are refused at it"
    )


lengths_strategy = st.lists(
    st.tuples(st.integers(min_value=1, max_value=20_000), st.integers(min_value=0, max_value=4_000)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=30, deadline=None)
@given(
    lengths=lengths_strategy,
    block_size=st.sampled_from([16, 32, 64]),
    limit=st.one_of(st.none(), st.integers(min_value=512, max_value=65_536)),
)
def test_recommended_max_model_len_is_never_below_the_p99_it_came_from(
    lengths: list[tuple[int, int]], block_size: int, limit: int | None
) -> None:
    cache = {"num_gpu_blocks": 500, "block_size": block_size}
    with tempfile.TemporaryDirectory() as tmp:
        v = build_verdict(
            load_run(
                write_run(
                    Path(tmp) / "r",
                    [StepSpec(1)],
                    lengths=lengths,
                    cache_config=cache,
                    config={"max_model_len": limit},
                )
            )
        )
    rec = recommend(v)
    advice = rec.max_model_len_advice
    assert advice is not None
    p99 = percentile([p + o for p, o in lengths], 99)
    assert advice.basis_tokens == p99
    if not (advice.capped_by_model_limit or advice.capped_by_kv_cache):
        assert advice.max_model_len >= p99
        assert advice.max_model_len % block_size == 0 and advice.max_model_len % 256 == 0
    if limit is not None:
        assert advice.max_model_len <= limit
    if rec.max_model_len.value is not None and not advice.capped_by_kv_cache:
        assert rec.max_model_len.value >= p99
        assert f"--max-model-len {rec.max_model_len.value}" in rec.flag_line


def test_recommendation_json_is_plain(tmp_path: Path) -> None:
    rec = recommend(verdict_of(write_run(tmp_path / "r", cpu_knee_steps(), cache_config=CPU_CACHE)))
    doc = rec.to_json()
    assert [s["flag"] for s in doc["settings"]] == [
        "--max-model-len",
        "--max-num-seqs",
        "--gpu-memory-utilization",
        "--max-num-batched-tokens",
    ]
    assert doc["max_model_len"]["freed_concurrency"] is not None
    assert dataclasses.is_dataclass(rec)


def test_kv_pool_too_small_for_the_p99_advises_more_kv_memory_not_a_limit(tmp_path: Path) -> None:
    """The QA case: P99 8001 tokens, a pool of 8000 — no max_model_len both starts and covers it.
    The limit is the usable pool, as in `oomload plan`: (250 − the null block) × 32 = 7968 tokens."""
    lengths = [(7000, 1001)] * 50
    cache = {"num_gpu_blocks": 250, "block_size": 32, "kv_cache_size_tokens": 8000}
    config = {"max_model_len": None}  # a server that does not say its limit
    rec = recommend(
        verdict_of(
            write_run(tmp_path / "r", [StepSpec(1)], lengths=lengths, cache_config=cache, config=config)
        )
    )
    advice = rec.max_model_len_advice
    assert advice is not None and advice.capped_by_kv_cache and advice.max_model_len == 7968
    assert rec.max_model_len.value is None and "--max-model-len" not in rec.flag_line
    assert rec.max_model_len.reason.startswith(
        "the usable KV pool (7968 tokens) cannot hold one request of the trace's P99 total length "
        "(8001 tokens)"
    )
    assert "--gpu-memory-utilization, a bigger GPU or tensor parallelism" in rec.reasoning
    assert "Capping max_model_len" not in rec.reasoning and "covers the trace's P99" not in rec.reasoning


def test_a_current_limit_that_covers_the_p99_is_kept(tmp_path: Path) -> None:
    lengths = [(2500, 500)] * 50  # P99 3000 + 10 % → 3328 would exceed the current 3072
    v = verdict_of(write_run(tmp_path / "r", [StepSpec(1)], lengths=lengths, config={"max_model_len": 3072}))
    rec = recommend(v)
    assert rec.max_model_len_advice is not None and rec.max_model_len_advice.max_model_len == 3072
    assert rec.max_model_len.value is None and "--max-model-len" not in rec.flag_line
    assert rec.max_model_len.reason == (
        "the current 3072 already covers the trace's P99 total length (3000 tokens); "
        "raising it would only shrink the KV concurrency — keep it"
    )


def test_flag_line_is_shell_quoted_so_a_hostile_model_name_stays_one_argument(tmp_path: Path) -> None:
    import shlex

    model = "evil model; rm -rf ~ $(touch x) 'q'"
    run = write_run(tmp_path / "r", cpu_knee_steps(), cache_config=CPU_CACHE, config={"model": model})
    rec = recommend(verdict_of(run))
    argv = shlex.split(rec.flag_line)
    assert argv[:3] == ["vllm", "serve", model]
    assert argv[3:] == ["--max-model-len", "768", "--max-num-seqs", "5"]


def test_a_window_the_pool_could_not_hold_either_is_told_so(tmp_path: Path) -> None:
    """Seen on the simulator: a Mooncake trace (P99 100,333 total tokens) at max_model_len 8192 on a
    pool of 12,768 tokens. "A longer window needs a model that allows it" was not all: the pool could
    not hold one such request either. With --only-fitting the long ones were left out, not refused."""
    lengths = [(3900, 190)] * 90 + [(5000, 100)] * 10
    cache = {**CPU_CACHE, "num_gpu_blocks": 150, "kv_cache_size_tokens": 4800}  # 4768 usable: under 5100
    config = {"max_model_len": 4096, "only_fitting": True}
    run = write_run(tmp_path / "r", [StepSpec(1)], lengths=lengths, cache_config=cache, config=config)
    rec = recommend(verdict_of(run))
    assert rec.max_model_len.value is None
    assert rec.max_model_len.reason == (
        "the trace's P99 total length (5100 tokens) exceeds the current max_model_len 4096: 10 requests "
        "(10.00%) would be refused at it (left out of this replay: --only-fitting); a longer window needs "
        "a model that allows it and a KV pool that holds one such request (the usable pool holds 4768 "
        "tokens: more memory for the KV cache, a bigger GPU or tensor parallelism)"
    )


@pytest.mark.parametrize(
    ("level", "said"),
    [
        (1, "one request at a time already broke: no cap avoids it"),
        (2, "the lowest level tested already broke: test lower concurrency first"),
    ],
)
def test_a_death_at_the_first_level_is_told_whether_a_lower_one_exists(
    tmp_path: Path, level: int, said: str
) -> None:
    # the real vLLM under a data limit died at concurrency 1 of distinct prompt shapes (tests/e2e)
    oom = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 2000000 bytes"
    died = StepSpec(level, failures={Outcome.ENGINE_DEAD: level}, error_text=oom)
    cache = {**CPU_CACHE, "max_num_batched_tokens": 65536}  # known: no prefill bound in words either
    rec = recommend(verdict_of(write_run(tmp_path / "r", [died], cache_config=cache)))
    assert rec.max_num_seqs.value is None and rec.max_num_seqs.reason.startswith(said)


def test_vllms_queue_limit_turning_requests_away_is_no_reason_for_a_cap(tmp_path: Path) -> None:
    """vLLM's own 503 ("engine is currently busy": ``--max-num-queued-reqs``) at 8, nothing else broken:
    the advice read "--max-num-seqs 6" (the last safe level), though a cap on the running sequences turns
    more away, not fewer. No cap now, and the reason names the queue limits. Preemption beside the
    rejections still gets its cap."""
    rejected = StepSpec(8, failures={Outcome.ADMISSION_REJECTED: 5}, error_text="http 503")
    steps = [StepSpec(2), StepSpec(4), StepSpec(6), rejected]
    rec = recommend(verdict_of(write_run(tmp_path / "r", steps, cache_config=CPU_CACHE)))
    assert rec.max_num_seqs.value is None and "--max-num-seqs" not in rec.flag_line
    assert rec.max_num_seqs.reason.startswith(
        "what broke, from 8, was vLLM's own queue limit turning requests away (5 admission rejections)"
    )
    assert "raise --max-num-queued-reqs / --max-num-queued-tokens" in rec.max_num_seqs.reason
    preempted = dataclasses.replace(rejected, preemptions=3)
    rec = recommend(verdict_of(write_run(tmp_path / "p", [*steps[:3], preempted], cache_config=CPU_CACHE)))
    assert rec.max_num_seqs.value == 6
