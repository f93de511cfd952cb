"""Engine model: counters like vLLM's, the step-time model, the modelled CUDA OOM, the toy tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from oomload.capacity.scheduler import SimRequest
from oomload.errors import ConfigError
from oomload.sim.build import EngineOptions, build_engine
from oomload.sim.model import EngineModel, Histogram, token_buckets
from oomload.sim.tokenizer import GENERATION_PROMPT_TOKENS, MESSAGE_OVERHEAD_TOKENS, ToyTokenizer


def run_all(engine: EngineModel, reqs: list[SimRequest]) -> float:
    now = 0.0
    for r in reqs:
        engine.add(r)
    while engine.scheduler.has_work:
        report = engine.step(now)
        now += report.duration_s
        if report.oom is not None:
            break
    return now


def test_prompt_tokens_are_counted_once_even_when_preempted() -> None:
    opts = EngineOptions(model="tiny", num_gpu_blocks=32, block_size=128, max_model_len=2048, max_num_seqs=64)
    engine = build_engine(opts).engine(opts)
    reqs = [SimRequest(str(i), 512, 512) for i in range(8)]
    run_all(engine, reqs)
    stats = engine.stats
    assert stats.num_preemptions > 0
    assert stats.prompt_tokens == 8 * 512  # as on the real server: recomputed prefill is not counted again
    assert stats.generation_tokens == 8 * 512
    assert stats.finished["length"] == 8
    assert stats.request_preemptions.total == stats.num_preemptions
    assert stats.ttft.count == 8 and stats.e2e.count == 8


def test_step_time_grows_with_batch_and_prefill() -> None:
    opts = EngineOptions(model="llama-3.1-8b", gpu="h100")
    timing = build_engine(opts).engine(opts).timing
    one = timing.step_s(1, 1, 0, 1000)
    many = timing.step_s(64, 64, 0, 64_000)
    prefill = timing.step_s(1, 8192, 8192, 8192)
    assert 0.002 < one < many < prefill
    assert timing.step_s(0, 0, 0, 0) == 0.0


def test_a_profiled_configuration_never_ooms_even_at_full_batch() -> None:
    opts = EngineOptions(model="llama-3.1-8b", gpu="l4", max_model_len=4096)
    engine = build_engine(opts).engine(opts)
    run_all(engine, [SimRequest(str(i), 4000, 8) for i in range(3)])
    assert engine.dead is None


def test_overriding_blocks_past_the_budget_ooms_on_a_big_step_only() -> None:
    opts = EngineOptions(model="llama-3.1-8b", gpu="l4", max_model_len=4096, num_gpu_blocks=3200)
    built = build_engine(opts)
    assert built.layout.num_gpu_blocks == 3200
    engine = built.engine(opts)
    run_all(engine, [SimRequest("small", 16, 4)])
    assert engine.dead is None
    run_all(engine, [SimRequest("big", 2000, 4)])
    assert engine.dead is not None
    assert engine.dead.message.startswith("CUDA out of memory. Tried to allocate")
    off = EngineOptions(model="llama-3.1-8b", gpu="l4", max_model_len=4096, num_gpu_blocks=3200, oom="off")
    quiet = build_engine(off).engine(off)
    run_all(quiet, [SimRequest("big", 2000, 4)])
    assert quiet.dead is None


def test_histogram_and_token_buckets() -> None:
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 9.0):
        h.observe(v)
    assert h.cumulative() == [("1.0", 2.0), ("2.0", 3.0), ("+Inf", 4.0)]
    assert token_buckets(2048) == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)


def test_toy_tokenizer_counts_four_characters_per_token_and_chat_overhead() -> None:
    tok = ToyTokenizer(2048)
    assert tok.count("") == 0 and tok.count("abcd") == 1 and tok.count("abcde") == 2
    ids = tok.encode("hello world!")
    assert len(ids) == 3 and all(16 <= i < 2048 for i in ids)
    assert tok.encode("hello world!") == ids  # deterministic
    text = tok.decode([100, 200, 300])
    assert len(text) == 12 and tok.count(text) == 3
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "x" * 40},
        {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]},
    ]
    expected = 10 + 2 + 2 * MESSAGE_OVERHEAD_TOKENS + GENERATION_PROMPT_TOKENS
    assert len(tok.encode_chat(msgs)) == expected
    assert tok.out_of_vocab([1, 2047, 2048]) == 2048
    with pytest.raises(TypeError):
        tok.encode_chat([{"role": "user", "content": 5}])


def test_first_token_time_is_the_end_of_the_prefill_step_not_of_a_later_one() -> None:
    opts = EngineOptions(gpu="l4")
    engine = build_engine(opts).engine(opts)
    req = SimRequest("a", 615, 5)
    engine.add(req)
    prefill_s = engine.step(0.0).duration_s
    now = prefill_s
    while engine.scheduler.has_work:
        now += engine.step(now).duration_s
    assert req.first_token_s == prefill_s
    assert req.finished_s == now > prefill_s


def _shared_prompt_engine(*flags: str) -> EngineModel:
    from oomload.cli import build_parser
    from oomload.cli.sim import engine_options

    args = build_parser().parse_args(
        [
            "sim",
            "serve",
            "--model",
            "tiny",
            "--num-gpu-blocks",
            "80",
            "--block-size",
            "32",
            "--max-model-len",
            "2048",
            *flags,
        ]
    )
    opts = engine_options(args)
    return build_engine(opts).engine(opts)


def test_prefix_caching_is_on_by_default_as_in_vllm_v1_and_counts_like_it() -> None:
    """The simulator follows V1: a shared 512-token system prompt is served from the cache (hits and
    queries in tokens, prompt_tokens counting cached tokens too); ``--no-enable-prefix-caching`` turns
    it off. Regression: the simulator used to model prefix caching only when asked."""
    system = list(range(100, 612))
    on = _shared_prompt_engine()
    assert on.scheduler.config.enable_prefix_caching
    reqs = [
        SimRequest(str(i), 600, 4, prompt_ids=[*system, *range(5000 + 88 * i, 5088 + 88 * i)])
        for i in range(3)
    ]
    run_all(on, reqs[:1])
    run_all(on, reqs[1:])  # admitted together: both hit what the first one left cached
    assert on.stats.prefix_cache_queries == 3 * 600
    assert on.stats.prefix_cache_hits == 2 * 512  # the first request computes the prompt, later ones hit it
    assert on.stats.prompt_tokens == 3 * 600
    off = _shared_prompt_engine("--no-enable-prefix-caching")
    assert not off.scheduler.config.enable_prefix_caching
    run_all(off, [SimRequest(str(i), 600, 4, prompt_ids=[*system, *range(88)]) for i in range(3)])
    assert off.stats.prefix_cache_hits == 0 and off.stats.prefix_cache_queries == 0


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"gpu_memory_gib": 1e308}, "--gpu-memory-gib must be at most 65,536 GiB"),
        ({"other_process_gib": 1e308}, "--other-process-gib must be at most 65,536 GiB"),
        ({"num_gpu_blocks": 10**20}, "--num-gpu-blocks must be an integer in 1..100,000,000"),
        ({"kv_cache_memory_bytes": 10**23}, "--kv-cache-memory-bytes must be at most 65,536 GiB"),
        ({"gpu_memory_gib": 65_536, "model": "tiny"}, "the KV pool would hold"),  # more blocks than modelled
    ],
)
def test_a_size_past_what_the_simulator_models_is_one_sentence(options: dict[str, Any], says: str) -> None:
    """``plan``, ``sim serve`` and ``tune`` crashed (exit 70) on such sizes: an integer overflowed
    (OverflowError, "negative dimensions"), or an array of the pool's blocks could not be allocated."""
    with pytest.raises(ConfigError, match=says):
        build_engine(EngineOptions(**options))
