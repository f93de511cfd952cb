# ruff: noqa: E501  (the real server log lines are kept verbatim)
"""The start-up classifier on the real vLLM's words (reference vllm-cpu-log-excerpts.txt, vllm-facts §2.5)
and on the simulator's."""

from __future__ import annotations

from oomload.tune.search import Candidate, SearchSpace, Settings, next_proposal
from oomload.tune.startup import StartCause, classify_startup_failure, pool_from_log

# the real CPU vLLM 0.32, run6 (--kv-cache-memory-bytes 1048576 with --max-model-len 2048), verbatim
REAL_CONTEXT_LOG = """\
(EngineCore pid=17515) ERROR 11-30 02:01:08 [core.py:1510] ValueError: To serve at least one request with the model's max seq len (2048), (0.0 GiB KV cache is needed, which is larger than the available KV cache memory (0.0 GiB). Based on the available memory, the estimated maximum model length is 896. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""
REAL_STARTED_LOG = """\
(EngineCore pid=17028) INFO 11-30 01:59:43 [kv_cache_utils.py:2619] Overriding num_gpu_blocks=512 with num_gpu_blocks_override=96
(EngineCore pid=17028) INFO 11-30 01:59:43 [kv_cache_utils.py:2327] CPU KV cache size: 3,072 tokens, Maximum concurrency for 2,048 tokens per request: 1.50x
"""


def test_context_longer_than_the_pool_carries_vllms_estimated_maximum() -> None:
    failure = classify_startup_failure(REAL_CONTEXT_LOG)
    assert failure.cause is StartCause.CONTEXT_TOO_LONG
    assert (failure.max_model_len, failure.estimated_max_model_len) == (2048, 896)
    assert "Engine core initialization failed" not in failure.message  # the cause, not its consequence


def test_v0_wording_of_the_context_failure() -> None:
    log = (
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
        "stored in KV cache (21344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"
    )
    failure = classify_startup_failure(log)
    assert failure.cause is StartCause.CONTEXT_TOO_LONG
    assert failure.estimated_max_model_len == 21344


def test_free_memory_with_and_without_the_device_name() -> None:
    for text in (
        "ValueError: Free memory on device (14.2/23.99 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 21.59 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        "oomload: error: Free memory on device cuda:0 (18.49/22.49 GiB) on startup is less than desired GPU "
        "memory utilization (0.9, 20.24 GiB). Decrease GPU memory utilization",
    ):
        failure = classify_startup_failure(
            "INFO loading\n" + text + "\nRuntimeError: Engine core initialization failed"
        )
        assert failure.cause is StartCause.FREE_MEMORY
        assert failure.free_share is not None and 0.5 < failure.free_share < 0.83


def test_cuda_oom_no_kv_memory_weights_and_other() -> None:
    cases = {
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity": (
            StartCause.CUDA_OOM
        ),
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`": (
            StartCause.NO_KV_MEMORY
        ),
        "ValueError: Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization": (
            StartCause.WEIGHTS
        ),
    }
    for line, cause in cases.items():
        assert classify_startup_failure(f"INFO a\n{line}\nINFO b").cause is cause
    other = classify_startup_failure("INFO starting\nOSError: tiny-model is not a local folder\nINFO bye")
    assert other.cause is StartCause.OTHER
    assert other.message == "OSError: tiny-model is not a local folder"
    assert classify_startup_failure("").message == "the server printed nothing"


def test_pool_from_a_started_real_log() -> None:
    pool = pool_from_log(REAL_STARTED_LOG)
    assert (pool.num_gpu_blocks, pool.kv_cache_tokens) == (96, 3072)


# the real CPU vLLM 0.32 with only --num-gpu-blocks-override (reference excerpt F), verbatim
REAL_CPU_NODE_LOG = """\
(VllmWorker-0 pid=16857) ERROR 11-30 01:58:54 [multiproc_executor.py:953] ValueError: Available memory on node 0 (7.65/8.96 GiB) on startup is less than desired CPU memory utilization (0.92, 8.25 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite its name). To resolve: decrease `--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory used by other processes.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""


def test_the_cpu_builds_node_memory_refusal_is_free_memory_and_no_smaller_pool_follows() -> None:
    """A review found it classified 'other' and quoted the API server's consequence line."""
    failure = classify_startup_failure(REAL_CPU_NODE_LOG)
    assert failure.cause is StartCause.FREE_MEMORY
    assert failure.free_share is not None and abs(failure.free_share - 7.65 / 8.96) < 1e-9
    assert "decrease `--gpu-memory-utilization`" in failure.message
    pools = SearchSpace(
        memory=(Settings(num_gpu_blocks=96), Settings(num_gpu_blocks=64)), max_num_seqs=(4, 8)
    )
    failed = Candidate(1, Settings(num_gpu_blocks=96, max_num_seqs=8), "first", False, failure=failure)
    assert next_proposal(pools, 8, [failed]) is None  # a smaller pool reserves no less of the node


def test_another_error_quotes_its_cause_not_the_api_servers_consequence() -> None:
    log = (
        "(EngineCore pid=1) ERROR [core.py:1] ImportError: libcudart.so.12: cannot open shared object file\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}\n"
    )
    failure = classify_startup_failure(log)
    assert failure.cause is StartCause.OTHER and "ImportError: libcudart.so.12" in failure.message
