"""vLLM's log shape and the words of its memory deaths (``oomload.sim.vllmlog``)."""

from __future__ import annotations

import re

import pytest

from oomload.sim.vllmlog import (
    CLIENT_MESSAGE_033,
    ENGINE_DEAD_TEXT,
    cpu_alloc_failure,
    cuda_oom,
    cuda_oom_message,
    dead_client_message,
    engine_death_lines,
    format_size,
    log_lines,
)

HEADER = re.compile(r"^\((?P<process>EngineCore|APIServer|Worker) pid=4242\) ")
LOGGED = re.compile(
    r"^\((EngineCore|APIServer|Worker) pid=4242\) (ERROR|INFO) \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\] "
)


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (0, "0 bytes"),
        (1024, "1024 bytes"),  # PyTorch's boundaries are inclusive: ≤ 1 KiB is still bytes
        (1025, "1.00 KiB"),
        (1024**2, "1024.00 KiB"),
        (50 * 1024**2, "50.00 MiB"),
        (1024**3, "1024.00 MiB"),
        (int(23.56 * 1024**3), "23.56 GiB"),
    ],
)
def test_format_size_is_pytorchs(num_bytes: int, text: str) -> None:
    assert format_size(num_bytes) == text


def test_cuda_oom_message_has_pytorchs_words_and_the_callers_numbers() -> None:
    message = cuda_oom_message(
        tried_bytes=50 * 1024**2,
        total_bytes=int(23.56 * 1024**3),
        free_bytes=int(21.75 * 1024**2),
        in_use_bytes=int(23.50 * 1024**3),
        allocated_bytes=int(22.88 * 1024**3),
        private_pool_bytes=24 * 1024**2,
        reserved_unallocated_bytes=int(275.38 * 1024**2),
    )
    assert message.startswith(
        "CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which "
        "21.75 MiB is free. Including non-PyTorch memory, this process has 23.50 GiB memory in use. Of the "
        "allocated memory 22.88 GiB is allocated by PyTorch, with 24.00 MiB allocated in private pools "
        "(e.g., CUDA Graphs), and 275.38 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )
    negative = cuda_oom_message(
        tried_bytes=2048, total_bytes=1, free_bytes=-5, in_use_bytes=1, allocated_bytes=1
    )
    assert "of which 0 bytes is free" in negative and "private pools" not in negative


def test_a_multi_line_record_repeats_the_header_on_every_line() -> None:
    lines = log_lines("EngineCore", 7, "ERROR", "core.py:1586", "first\nsecond", 0.0)
    assert len(lines) == 2
    heads = {line.rsplit("] ", 1)[0] for line in lines}
    assert len(heads) == 1 and next(iter(heads)).startswith("(EngineCore pid=7) ERROR ")


def _death(error_kind: str, request_ids: tuple[str, ...] = ("cmpl-1", "cmpl-2")) -> list[str]:
    error = cuda_oom("CUDA out of memory. Tried to allocate 1.00 GiB.") if error_kind == "cuda" else (
        cpu_alloc_failure(57346048)
    )  # fmt: skip
    return engine_death_lines(
        error,
        pid=4242,
        when_s=1_764_468_000.0,
        vllm_version="0.32.0",
        model_name="tiny-model",
        max_model_len=2048,
        scheduled_requests=2,
        scheduled_tokens=4096,
        request_ids=request_ids,
    )


@pytest.mark.parametrize("kind", ["cuda", "cpu"])
def test_every_death_line_has_a_process_prefix_and_the_sequence_is_vllms(kind: str) -> None:
    lines = _death(kind)
    assert all(HEADER.match(line) for line in lines)
    text = "\n".join(lines)
    fatal = text.index("] EngineCore encountered a fatal error.")
    dead = text.index(f"] vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_TEXT}")
    failed = [text.index(f"] Request {rid} failed (engine dead).") for rid in ("cmpl-1", "cmpl-2")]
    process = text.index("(EngineCore pid=4242) Process EngineCore:")
    assert text.index("Dumping input data for V1 LLM engine (v0.32.0)") < fatal < dead < min(failed)
    assert max(failed) < process
    # the records written through vLLM's logger carry its header; the multiprocessing traceback does not
    cut = lines.index("(EngineCore pid=4242) Process EngineCore:")
    assert all(LOGGED.match(line) for line in lines[:cut])
    assert not any(LOGGED.match(line) for line in lines[cut:])
    assert text.count("Traceback (most recent call last):") == (4 if kind == "cpu" else 3)


def test_cuda_death_raises_in_the_engine_core() -> None:
    text = "\n".join(_death("cuda"))
    assert "(Worker pid=" not in text
    assert re.search(r"^\(EngineCore pid=4242\) ERROR .*\] torch\.OutOfMemoryError: CUDA out of memory\. "
                     r"Tried to allocate 1\.00 GiB\.$", text, re.M)  # fmt: skip


def test_cpu_allocator_death_raises_in_the_worker_and_the_engine_core_rethrows_it() -> None:
    text = "\n".join(_death("cpu", request_ids=()))
    allocator = (
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
        "to allocate 57346048 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert re.search(
        r"^\(Worker pid=4242\) ERROR .*\] RuntimeError: " + re.escape(allocator) + "$", text, re.M
    )
    assert f"] RuntimeError: Worker failed with error '{allocator}', please check the stack trace" in text
    assert "failed (engine dead)" not in text  # no request was in flight


def test_the_client_message_follows_the_version() -> None:
    assert dead_client_message("0.32.0") == ENGINE_DEAD_TEXT  # seen on the CPU build (oom-kinds.md)
    assert dead_client_message("0.10.2") == ENGINE_DEAD_TEXT
    assert dead_client_message("0.33.0") == CLIENT_MESSAGE_033  # EngineDeadError.CLIENT_MESSAGE
    assert dead_client_message("1.0") == CLIENT_MESSAGE_033
    assert dead_client_message("nightly") == ENGINE_DEAD_TEXT
