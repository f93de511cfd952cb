"""vLLM's log lines and the words of its runtime memory deaths, as the simulated server writes them (pure).

Every line the simulator logs has the shape of vLLM V1's (0.10 – 0.33)::

    (EngineCore pid=N) ERROR 11-30 01:59:43 [core.py:1586] EngineCore encountered a fatal error.

— the process prefix vLLM's multiprocessing adds to each line its children write, the level, the time
as ``%m-%d %H:%M:%S`` (local time), ``[file.py:line]`` and the message. A multi-line message (a
traceback) repeats the whole header on every line, as vLLM's ``NewLineFormatter`` does; the bare
``Process EngineCore:`` traceback that Python's ``multiprocessing`` prints when the engine process
ends carries only the prefix. The simulator is one process playing vLLM's three (API server, engine
core, worker), so every prefix carries its own pid. The ``File "…"`` lines of a traceback name
``<oomload-sim>/vllm/…`` paths: the shape of vLLM's frames, never a claim that the code ran.
Classifiers should key on the words below, not on line numbers.

The deaths (reference ``oom-kinds.md``, "V1's sequence when the engine dies"):

- **CUDA OOM** (the activation peak): EngineCore dumps the step's input, logs "EngineCore
  encountered a fatal error." with a traceback ending in PyTorch's ``torch.OutOfMemoryError: CUDA out
  of memory. Tried to allocate X MiB. GPU 0 has a total capacity of Y GiB of which Z MiB is free.
  Including non-PyTorch memory, this process has W GiB memory in use. …`` (``cuda_oom_message``,
  sizes in PyTorch's ``format_size``); the API server logs "AsyncLLM output_handler failed." with a
  traceback ending in ``vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
  See stack trace (above) for the root cause.`` and "Request … failed (engine dead)." per request in
  flight; then the engine process's own ``Process EngineCore:`` traceback.
- **CPU allocator failure** (the CPU build, or any host allocation under a per-process limit, as seen
  on this project's CPU harness under ``prlimit --data``): the worker logs "WorkerProc hit an
  exception." ending in ``RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0.
  DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code 12 (Cannot
  allocate memory)``; EngineCore's fatal error ends in ``RuntimeError: Worker failed with error '…',
  please check the stack trace above for the root cause``; the API server's lines follow as above.

What a client reads after the death (``dead_client_message``): the observed 0.32 CPU build answered
every request with HTTP 500 and the message "EngineCore encountered an issue. See stack trace (above)
for the root cause." (type ``InternalServerError``); 0.33's sources answer "The server had an error
while processing your request." (``EngineDeadError.CLIENT_MESSAGE``). Neither carries the cause: only
the log does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

ENGINE_DEAD_TEXT = "EngineCore encountered an issue. See stack trace (above) for the root cause."
CLIENT_MESSAGE_033 = "The server had an error while processing your request."
SIM_ROOT = "<oomload-sim>"
KIB = 1024
MIB = 1024**2
GIB = 1024**3


def format_size(num_bytes: int) -> str:
    """A size as PyTorch's CUDA caching allocator writes it (``c10`` ``format_size``)."""
    if num_bytes <= KIB:
        return f"{num_bytes} bytes"
    if num_bytes <= MIB:
        return f"{num_bytes / KIB:.2f} KiB"
    if num_bytes <= GIB:
        return f"{num_bytes / MIB:.2f} MiB"
    return f"{num_bytes / GIB:.2f} GiB"


def cuda_oom_message(
    *,
    tried_bytes: int,
    total_bytes: int,
    free_bytes: int,
    in_use_bytes: int,
    allocated_bytes: int,
    private_pool_bytes: int = 0,
    reserved_unallocated_bytes: int = 0,
) -> str:
    """PyTorch's ``torch.OutOfMemoryError`` text (2.4+), every number from the caller's model."""
    pools = (
        f", with {format_size(private_pool_bytes)} allocated in private pools (e.g., CUDA Graphs),"
        if private_pool_bytes
        else ","
    )
    return (
        f"CUDA out of memory. Tried to allocate {format_size(tried_bytes)}. GPU 0 has a total capacity of "
        f"{format_size(total_bytes)} of which {format_size(max(free_bytes, 0))} is free. Including "
        f"non-PyTorch memory, this process has {format_size(in_use_bytes)} memory in use. Of the allocated "
        f"memory {format_size(allocated_bytes)} is allocated by PyTorch{pools} and "
        f"{format_size(reserved_unallocated_bytes)} is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
        "avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def cpu_alloc_message(tried_bytes: int) -> str:
    """PyTorch's CPU allocator failure (``c10/core/impl/alloc_cpu.cpp``), as the CPU build logs it."""
    return (
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
        f"tried to allocate {tried_bytes} bytes. Error code 12 (Cannot allocate memory)"
    )


def dead_client_message(vllm_version: str) -> str:
    """The error message of every request a dead engine answers (module docstring)."""
    return CLIENT_MESSAGE_033 if _version(vllm_version) >= (0, 33) else ENGINE_DEAD_TEXT


@dataclass(frozen=True, slots=True)
class FatalError:
    """The exception that kills the engine.

    ``in_worker``: raised in a multiproc worker and re-raised by EngineCore as "Worker failed with
    error …" (the CPU build's shape); otherwise raised inside EngineCore (one GPU, uniproc executor).
    """

    exception: str  # "torch.OutOfMemoryError", "RuntimeError"
    message: str
    in_worker: bool = False

    @property
    def line(self) -> str:
        return f"{self.exception}: {self.message}"


def cuda_oom(message: str) -> FatalError:
    return FatalError("torch.OutOfMemoryError", message)


def cpu_alloc_failure(tried_bytes: int) -> FatalError:
    return FatalError("RuntimeError", cpu_alloc_message(tried_bytes), in_worker=True)


def header(process: str, pid: int, level: str, where: str, when_s: float) -> str:
    """``(Process pid=N) LEVEL MM-DD HH:MM:SS [where] `` — vLLM's prefix and log header."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(when_s))
    return f"({process} pid={pid}) {level} {stamp} [{where}] "


def log_lines(process: str, pid: int, level: str, where: str, message: str, when_s: float) -> list[str]:
    """One log record: the header repeated on each line of ``message`` (vLLM's ``NewLineFormatter``)."""
    head = header(process, pid, level, where, when_s)
    return [head + line for line in message.split("\n")]


Frame = tuple[str, int, str, str]
# The tracebacks' frames: (path, line, function, code), after vLLM 0.33's call paths
ENGINE_FRAMES = (
    ("vllm/v1/engine/core.py", 1577, "run_engine_core", "engine_core.run_busy_loop()"),
    ("vllm/v1/engine/core.py", 1610, "run_busy_loop", "self._process_engine_step()"),
    ("vllm/v1/engine/core.py", 1647, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
    (
        "vllm/v1/engine/core.py",
        470,
        "step",
        "model_output = self.model_executor.execute_model(scheduler_output)",
    ),
)
GPU_RUNNER_FRAME = (
    "vllm/v1/worker/gpu_model_runner.py",
    2468,
    "execute_model",
    "output = self._model_forward(",
)
COLLECTIVE_RPC_FRAME = (
    "vllm/v1/executor/multiproc_executor.py",
    361,
    "collective_rpc",
    "raise RuntimeError(",
)
WORKER_FRAMES = (
    ("vllm/v1/executor/multiproc_executor.py", 817, "worker_busy_loop", "output = func(*args, **kwargs)"),
    (
        "vllm/v1/worker/cpu_model_runner.py",
        112,
        "execute_model",
        "hidden_states = self.model(**model_inputs)",
    ),
)
API_FRAMES = (
    ("vllm/v1/engine/async_llm.py", 900, "output_handler", "outputs = await engine_core.get_output_async()"),
    (
        "vllm/v1/engine/core_client.py",
        883,
        "get_output_async",
        "raise self._format_exception(outputs) from None",
    ),
)
PROCESS_FRAMES = (
    ("multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
    ("vllm/v1/engine/core.py", 1588, "run_engine_core", "raise e"),
)


def engine_death_lines(
    error: FatalError,
    *,
    pid: int,
    when_s: float,
    vllm_version: str,
    model_name: str,
    max_model_len: int,
    scheduled_requests: int,
    scheduled_tokens: int,
    request_ids: Sequence[str],
) -> list[str]:
    """Every line vLLM logs when ``error`` kills its engine, in order (module docstring)."""

    def record(process: str, where: str, message: str) -> list[str]:
        return log_lines(process, pid, "ERROR", where, message, when_s)

    out = record(
        "EngineCore",
        "dump_input.py:72",
        f"Dumping input data for V1 LLM engine (v{vllm_version}) with config: model='{model_name}', "
        f"max_seq_len={max_model_len}",
    )
    out += record(
        "EngineCore",
        "dump_input.py:79",
        "Dumping scheduler output for model execution: SchedulerOutput("
        f"num_scheduled_reqs={scheduled_requests}, total_num_scheduled_tokens={scheduled_tokens})",
    )
    if error.in_worker:
        trace = _traceback(WORKER_FRAMES, error.line)
        out += record("Worker", "multiproc_executor.py:822", f"WorkerProc hit an exception.\n{trace}")
        raised = FatalError(
            "RuntimeError",
            f"Worker failed with error '{error.message}', please check the stack trace above for the "
            "root cause",
        )
        engine_frames = (*ENGINE_FRAMES, COLLECTIVE_RPC_FRAME)
    else:
        raised = error
        engine_frames = (*ENGINE_FRAMES, GPU_RUNNER_FRAME)
    trace = _traceback(engine_frames, raised.line)
    out += record("EngineCore", "core.py:1586", f"EngineCore encountered a fatal error.\n{trace}")
    dead = f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_TEXT}"
    out += record(
        "APIServer", "async_llm.py:943", f"AsyncLLM output_handler failed.\n{_traceback(API_FRAMES, dead)}"
    )
    for request_id in request_ids:
        out += record("APIServer", "async_llm.py:817", f"Request {request_id} failed (engine dead).")
    process_trace = f"Process EngineCore:\n{_traceback(PROCESS_FRAMES, raised.line)}"
    out += [f"(EngineCore pid={pid}) {line}" for line in process_trace.split("\n")]
    return out


def _traceback(frames: Sequence[Frame], last_line: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, line, function, code in frames:
        lines += [f'  File "{SIM_ROOT}/{path}", line {line}, in {function}', f"    {code}"]
    return "\n".join([*lines, last_line])


def _version(text: str) -> tuple[int, int]:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return (0, 0)
