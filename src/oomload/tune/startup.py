"""Why a vLLM server did not start: its own log, classified (pure).

vLLM checks its memory budget at start-up and refuses, in its own words, before it serves anything
(reference ``vllm-facts.md`` §2.5; the simulator says the same words, ``oomload.sim.geometry``). The
classifier looks for those words anywhere in the log — the real server prints the root cause from the
EngineCore and again from the API server, the simulator once after ``oomload: error:`` — and the first
cause in this order wins (a later, generic line such as "Engine core initialization failed" is a
consequence, never the cause):

==================  =========================================================================================
cause               the words
==================  =========================================================================================
``free_memory``     "Free memory on device [cuda:0] (F/T GiB) on startup is less than desired GPU memory
                    utilization (U, R GiB)" — on the CPU build "Available memory on node 0 (F/T GiB) …
                    desired CPU memory utilization (U, R GiB)": other processes hold memory, or two
                    servers share the device
``weights``         "Failed to load model - not enough GPU memory": the weights alone do not fit
``cuda_oom``        "CUDA out of memory" / ``torch.OutOfMemoryError`` (graph capture, profiling, sampler
                    warm-up)
``no_kv_memory``    "No available memory for the cache blocks": weights + activations + graphs took it all
``context_too_long``  "To serve at least one request with the model's max seq len (L) … the estimated maximum
                    model length is N" (V1), or V0's "max seq len (L) is larger than the maximum number of
                    tokens that can be stored in KV cache (N)"
``other``           anything else: the last line that names an error and is not the API server's
                    consequence ("Engine core initialization failed. See root cause above"), verbatim
==================  =========================================================================================

Besides the cause, the numbers the message carries: free and total device GiB (``free_memory``), and
the estimated maximum model length (``context_too_long``) — the next candidate follows from them
(``oomload.tune.search``).

The pool a started server got is read the same way from its log (``pool_from_log``): "GPU/CPU KV cache
size: N tokens" and "Overriding num_gpu_blocks=… with num_gpu_blocks_override=B", as a fallback for a
server whose ``/metrics`` has no ``vllm:cache_config_info``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class StartCause(StrEnum):
    """The known reasons a vLLM server does not start (module docstring)."""

    FREE_MEMORY = "free_memory"
    WEIGHTS = "weights"
    CUDA_OOM = "cuda_oom"
    NO_KV_MEMORY = "no_kv_memory"
    CONTEXT_TOO_LONG = "context_too_long"
    OTHER = "other"


CAUSE_TEXT: dict[StartCause, str] = {
    StartCause.FREE_MEMORY: "not enough free device memory for the asked utilization",
    StartCause.WEIGHTS: "the weights do not fit",
    StartCause.CUDA_OOM: "CUDA out of memory during start-up (graph capture / profiling)",
    StartCause.NO_KV_MEMORY: "no memory left for the KV cache",
    StartCause.CONTEXT_TOO_LONG: "max_model_len longer than the KV cache can hold",
    StartCause.OTHER: "another error",
}

_FREE = re.compile(  # the GPU's words, and the CPU build's for its NUMA node (reference excerpt F)
    r"(?:Free memory on device(?: \S+)?|Available memory on node \d+) \((?P<free>[\d.]+)/(?P<total>[\d.]+) "
    r"GiB\) on startup is less than desired [GC]PU memory utilization \((?P<util>[\d.]+), "
    r"(?P<requested>[\d.]+) GiB\)"
)
_WEIGHTS = re.compile(r"Failed to load model - not enough GPU memory")
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
_NO_KV = re.compile(r"No available memory for the cache blocks")
_CONTEXT_V1 = re.compile(r"max seq len \((?P<len>\d+)\).*?estimated maximum model length is (?P<est>\d+)")
_CONTEXT_V0 = re.compile(
    r"max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that can be stored in KV "
    r"cache \((?P<est>\d+)\)"
)
_ERRORISH = re.compile(r"error|exception|traceback|refused|failed|not found|no such", re.IGNORECASE)
# what the API server says after any failed start: the consequence, never the cause
_CONSEQUENCE = re.compile(
    r"Engine core initialization failed|See root cause above|EngineCore failed to start"
    r"|WorkerProc initialization failed|died unexpectedly|Failed core proc"
)
_KV_TOKENS = re.compile(r"(?:GPU|CPU) KV cache size: (?P<tokens>[\d,]+) tokens")
_OVERRIDE = re.compile(r"Overriding num_gpu_blocks=\d+ with num_gpu_blocks_override=(?P<blocks>\d+)")
_GIB = 1024**3
MAX_MESSAGE_CHARS = 600


@dataclass(frozen=True, slots=True)
class StartupFailure:
    """One failed start: the cause, the server's own line, and the numbers the line carries."""

    cause: StartCause
    message: str  # the line that names the cause, verbatim (trimmed to MAX_MESSAGE_CHARS)
    free_bytes: int | None = None  # free_memory: what the device had free
    total_bytes: int | None = None  # free_memory: the device's total
    max_model_len: int | None = None  # context_too_long: the asked max_model_len
    estimated_max_model_len: int | None = None  # context_too_long: what the pool could hold

    @property
    def reason(self) -> str:
        """The cause in words, for tables."""
        return CAUSE_TEXT[self.cause]

    @property
    def free_share(self) -> float | None:
        """Free / total device memory at start-up (free_memory only)."""
        if self.free_bytes is None or not self.total_bytes:
            return None
        return self.free_bytes / self.total_bytes


def classify_startup_failure(log_text: str) -> StartupFailure:
    """The cause of a failed start, from the server's log (module docstring for the rules)."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in lines:
        match = _FREE.search(line)
        if match:
            return StartupFailure(
                StartCause.FREE_MEMORY,
                _trim(line),
                free_bytes=int(float(match["free"]) * _GIB),
                total_bytes=int(float(match["total"]) * _GIB),
            )
    for pattern, cause in ((_WEIGHTS, StartCause.WEIGHTS), (_CUDA_OOM, StartCause.CUDA_OOM)):
        found = next((line for line in lines if pattern.search(line)), None)
        if found is not None:
            return StartupFailure(cause, _trim(found))
    found = next((line for line in lines if _NO_KV.search(line)), None)
    if found is not None:
        return StartupFailure(StartCause.NO_KV_MEMORY, _trim(found))
    for line in lines:
        match = _CONTEXT_V1.search(line) or _CONTEXT_V0.search(line)
        if match:
            return StartupFailure(
                StartCause.CONTEXT_TOO_LONG,
                _trim(line),
                max_model_len=int(match["len"]),
                estimated_max_model_len=int(match["est"]),
            )
    errorish = [line for line in lines if _ERRORISH.search(line)]
    causes = [line for line in errorish if not _CONSEQUENCE.search(line)]
    last = (causes or errorish)[-1] if errorish else (lines[-1] if lines else "the server printed nothing")
    return StartupFailure(StartCause.OTHER, _trim(last))


@dataclass(frozen=True, slots=True)
class LoggedPool:
    """What a started server's log says about its KV pool (either may be missing)."""

    kv_cache_tokens: int | None
    num_gpu_blocks: int | None


def pool_from_log(log_text: str) -> LoggedPool:
    """The last "KV cache size: N tokens" and "num_gpu_blocks_override=B" lines of a start-up log."""
    tokens = [int(m["tokens"].replace(",", "")) for m in _KV_TOKENS.finditer(log_text)]
    blocks = [int(m["blocks"]) for m in _OVERRIDE.finditer(log_text)]
    return LoggedPool(tokens[-1] if tokens else None, blocks[-1] if blocks else None)


def _trim(line: str) -> str:
    return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 1] + "…"
