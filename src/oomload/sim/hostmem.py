"""The simulated server's host memory: real bytes held in proportion to its modelled CPU-side memory.

A real vLLM server dies of host memory in two ways that leave different evidence (reference
``oom-kinds.md``): a container's memory limit ends it with the kernel's OOM killer (SIGKILL, no log
line, exit status −9 / 137 from a shell), and a per-process limit (``prlimit --data``) makes an
allocation fail, which the CPU build reports as PyTorch's allocator error before the engine dies.
A soak also meets memory that grows slowly at constant load. To let oomload's host-memory sampler
(which reads ``/proc/PID/status``) see what it would see on a real server, the simulator holds real,
touched memory:

    modelled bytes = base_bytes
                   + bytes_per_token × Σ (prompt + output tokens so far) over the requests it holds
                   + min(leak_bytes_per_s × seconds since start, leak_cap_bytes)

- The per-token term stands for vLLM's CPU-side request state (token-id lists, detokenizer state,
  output text), which grows with prompt + output tokens and is freed when the request is answered.
  Requests are counted from admission until their handler is done with them (waiting, running and
  preempted ones alike).
- The leak follows the wall clock (real seconds, not ``--time-scale``'d ones): soak trend detection
  judges memory on the wall clock, and a time-scaled leak would grow at a rate no sampler could
  read back. It grows whether or not requests are in flight, and never shrinks.
- The memory is a ballast of anonymous ``mmap`` chunks of ``CHUNK_BYTES``, each page written once
  when mapped (so it is resident) and unmapped when the modelled bytes fall (so RSS falls too:
  malloc'd buffers would stay in the heap). The ballast holds ``ceil(modelled / CHUNK_BYTES)`` chunks.

The limit (``limit_bytes``) applies to the process's *real* RSS (``/proc/self/statm``), interpreter
included, as a cgroup counts it. When a growth would take RSS over it:

- ``container`` (default): chunks are mapped one by one while RSS + the next chunk fits; at the
  chunk that does not, the process SIGKILLs itself, as the kernel's OOM killer would — no log line,
  no traceback, exit status −9, memory at the limit;
- ``process``: the whole growth is refused before anything is mapped (``AllocationFailed`` with the
  bytes it would have added), as a ``malloc`` under ``prlimit`` fails; the engine loop then dies
  with the CPU allocator's words (``oomload.sim.vllmlog``) and exits 1.

Not modelled: page cache and kernel memory a cgroup also charges, swap, a step's transient host
activations (the CPU build's largest allocation), memory that falls back after a leak, and the limit
itself: ``process`` refuses growth in the model, with no real ``RLIMIT_DATA`` (one would fail the
interpreter's own allocations at random places first), so the sampler reads none in
``/proc/PID/limits`` and the "Server memory" finding says "no limit" where a real server under
``prlimit --data`` states it.
"""

from __future__ import annotations

import math
import mmap
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

MIB = 1024**2
CHUNK_BYTES = MIB
PAGE_BYTES = mmap.PAGESIZE
LIMIT_KINDS = ("container", "process")
DEFAULT_LEAK_CAP_BYTES = 1024 * MIB  # a leak with no limit stops here (tests share the machine)
LEAK_TICK_S = 0.1  # how often the engine loop lets the leak grow


@dataclass(frozen=True, slots=True)
class HostMemoryConfig:
    """The host-memory model's parameters (module docstring); all zero = no ballast at all."""

    base_bytes: int = 0
    bytes_per_token: int = 0
    leak_bytes_per_s: float = 0.0
    leak_cap_bytes: int | None = None  # None: DEFAULT_LEAK_CAP_BYTES without a limit, no cap with one
    limit_bytes: int | None = None
    limit_kind: str = "container"

    def __post_init__(self) -> None:
        if self.limit_kind not in LIMIT_KINDS:
            raise ValueError(f"limit_kind must be one of {LIMIT_KINDS}, got {self.limit_kind!r}")

    @property
    def enabled(self) -> bool:
        """Whether the model holds or checks anything (otherwise the server skips it entirely)."""
        return bool(self.base_bytes or self.bytes_per_token or self.leak_bytes_per_s or self.limit_bytes)

    @property
    def effective_leak_cap_bytes(self) -> float:
        if self.leak_cap_bytes is not None:
            return float(self.leak_cap_bytes)
        return math.inf if self.limit_bytes is not None else float(DEFAULT_LEAK_CAP_BYTES)

    def leak_bytes(self, elapsed_s: float) -> int:
        """Bytes leaked ``elapsed_s`` wall-clock seconds after the start."""
        return int(min(self.leak_bytes_per_s * max(elapsed_s, 0.0), self.effective_leak_cap_bytes))

    def modelled_bytes(self, tokens: int, elapsed_s: float) -> int:
        """The model's bytes with ``tokens`` tokens held and ``elapsed_s`` seconds since the start."""
        return self.base_bytes + self.bytes_per_token * tokens + self.leak_bytes(elapsed_s)


@dataclass(frozen=True, slots=True)
class AllocationFailed:
    """A growth the ``process`` limit refused: what the update tried to add, and RSS at that moment."""

    tried_bytes: int
    rss_bytes: int


def read_rss_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``, second field × page size)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE_BYTES


def oom_kill() -> None:
    """End this process as the kernel's OOM killer does: SIGKILL, nothing written, nothing flushed."""
    os.kill(os.getpid(), signal.SIGKILL)


class HostMemory:
    """The ballast that makes the model's bytes real, and the limit that ends the process.

    ``rss_bytes`` and ``kill`` are parameters so a test can run the limit logic without dying.
    """

    def __init__(
        self,
        config: HostMemoryConfig,
        *,
        start_s: float,
        rss_bytes: Callable[[], int] = read_rss_bytes,
        kill: Callable[[], None] = oom_kill,
    ) -> None:
        self.config = config
        self.start_s = start_s
        self._rss_bytes = rss_bytes
        self._kill = kill
        self._chunks: list[mmap.mmap] = []

    @property
    def held_bytes(self) -> int:
        return len(self._chunks) * CHUNK_BYTES

    def update(self, tokens: int, now_s: float) -> AllocationFailed | None:
        """Grow or shrink the ballast to the model's bytes now; apply the limit (module docstring)."""
        target = self.config.modelled_bytes(tokens, now_s - self.start_s)
        want = -(-target // CHUNK_BYTES)
        while len(self._chunks) > want:
            self._chunks.pop().close()
        missing = want - len(self._chunks)
        if missing <= 0:
            return None
        limit = self.config.limit_bytes
        rss = self._rss_bytes() if limit is not None else 0
        if limit is not None and self.config.limit_kind == "process" and rss + missing * CHUNK_BYTES > limit:
            return AllocationFailed(missing * CHUNK_BYTES, rss)  # refused whole: nothing is mapped
        for _ in range(missing):
            if limit is not None and rss + CHUNK_BYTES > limit:
                self._kill()  # the container limit: chunk by chunk up to the limit, then the OOM killer
                return AllocationFailed(missing * CHUNK_BYTES, rss)  # reached only with a fake kill
            self._chunks.append(_touched_chunk())
            rss += CHUNK_BYTES
        return None

    def release(self) -> None:
        """Unmap the whole ballast."""
        while self._chunks:
            self._chunks.pop().close()


def _touched_chunk() -> mmap.mmap:
    chunk = mmap.mmap(-1, CHUNK_BYTES)
    chunk[::PAGE_BYTES] = b"\x01" * (CHUNK_BYTES // PAGE_BYTES)  # one write per page: resident
    return chunk
