"""A vLLM server's log, read for its death: the root-cause line, and what only followed from it (pure).

``read_death_log`` finds the line that names why the engine died, and of which sort it is:

==============  ===========================================================================================
sign            the words (looked for in this order; within a sign, its first line in the stretch)
==============  ===========================================================================================
``cuda_oom``    ``torch.OutOfMemoryError`` / "CUDA out of memory. Tried to allocate …" (today's wording and
                the older "(GPU 0; … total capacity; …)"), "CUDA error: out of memory", NCCL's
                "Cuda failure 'out of memory'", ``CUBLAS_STATUS_ALLOC_FAILED``, ROCm's "HIP out of memory"
``cpu_oom``     "DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes" (also "…: not
                enough memory: …"), a ``MemoryError``, or oneDNN's "RuntimeError: could not create a
                primitive" — how vLLM's CPU build reports an allocation that failed inside a oneDNN
                GEMM (no size given): seen on this project's harness under a data limit, where the same
                burst without the limit was answered
``kernel_kill`` the kernel's or the orchestrator's word: "Out of memory: Killed process", "Memory cgroup out
                of memory", "oom-kill:", "OOMKilled" (in a log that holds them: a container's, a journal)
``crash``       an NCCL error, a segfault / "Fatal Python error", a C++ abort, a non-OOM "CUDA error"; or
                the first exception of a traceback opened by vLLM's fatal headers ("EngineCore encountered
                a fatal error.", "WorkerProc hit an exception.", multiprocessing's "Process EngineCore:",
                V0's "Exception in worker … while processing method"); else the error a "Worker failed with
                error '…'" line carries
==============  ===========================================================================================

The allocator sorts are looked for first, across the whole stretch: an allocator failure is the most
direct cause there is, and the other ranks' NCCL errors or the survivors' exceptions follow from it.
Besides, ``worker_exit`` is the first "Worker proc W died unexpectedly (exit code: N)" (V0: "Worker W pid
P died, exit code: N"), ``shell_killed`` a shell's "Killed" (its child died of SIGKILL: the kernel's OOM
killer's usual trace in a container's log), and ``consequences`` what the log said in place of a cause.

What misleads, and how it is kept out:

* **Consequences are never causes.** "EngineCore encountered an issue", ``EngineDeadError``, "Engine
  core initialization failed", "AsyncLLM output_handler failed", "Worker failed with error",
  "died unexpectedly", "Request … failed (engine dead)", the fatal headers themselves, vLLM's
  "Dumping input data …" dumps, and the broken-channel exceptions a survivor raises (``EOFError``,
  ``BrokenPipeError``, ``CancelledError``, …) only say *that* the engine died.
* **Only loud lines count.** A line logged at DEBUG, INFO or WARNING (vLLM's ``INFO 12-04 …``,
  uvicorn's ``INFO:``, c10's ``[W…]``) never carries a cause, however much it says about memory;
  neither do a traceback's frames and source lines (indented), such as ``except torch.OutOfMemoryError``.
  The "expandable_segments" hint is part of the CUDA OOM message, not a line of its own.
* **Only a serving life counts.** The log is cut into serving stretches by start-up markers ("vLLM API
  server version", "Initializing a V1 LLM engine") and ready markers ("Starting vLLM server on",
  "Application startup complete", "Uvicorn running on"); start-up text is dropped (a start-up CUDA OOM
  is ``oomload.tune.startup``'s business). The first stretch that holds a death line is read: a run stops
  when its server dies, so a later life (a restart) is not the run's death. Text before the first
  marker is a serving stretch when that marker opens a new start-up (the follower joined a server
  already serving), start-up text when it is a ready marker.
* **Generic exceptions count only after a fatal header**, in the header's process: a handled error
  logged earlier with its traceback (a rejected over-long prompt's ``ValueError``) is not the cause.
  Once a process is reported dead ("Worker proc … died unexpectedly", "Engine core proc … died"), the
  tracebacks that follow are the survivors' (``RuntimeError``, ``TimeoutError`` from a broken
  channel): a killed process prints nothing, so they open no cause.
* **Prefixes are noise.** ``(Worker pid=12) ERROR 12-04 05:15:04 [file.py:123]``, ``[rank0]:``, ISO,
  kubectl or journald timestamps, docker compose's ``service-1  |`` and Ray's ``[repeated 6x across
  cluster]`` are removed before matching and quoting; the process tag is kept aside (an excerpt
  follows one process).

``death_excerpt`` gives the lines that lead to the root cause in its process (the traceback's tail,
plus up to three lines that continue its message), or the stretch's last lines when there is no cause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

LogSign = Literal["cuda_oom", "cpu_oom", "kernel_kill", "crash"]
MAX_QUOTE_CHARS = 240
MAX_EXCERPT_LINE_CHARS = 300

_STAMP = re.compile(
    r"^(?:\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?"  # ISO / kubectl
    r"|[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [^\s:]+:"  # journald "Oct 02 … unit[12]:"
    r"|[\w.-]+ +\|)\s*(?:-\s+)?"  # docker compose's "service-1  | "
)
_TAG = re.compile(r"^\((?P<tag>[^()]*\bpid=\d+[^()]*)\)\s?|^\[(?P<rank>rank\d+)\]:\s?")
_LEVEL = re.compile(
    r"^(?:(?P<vllm>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(?:\d{2}-\d{2}\s+[\d:.]+\s+)?\[?[\w./-]+(?::\d+)?\]\s?"
    r"|[\w.]+ - (?P<pylog>DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
    r"|(?P<uvicorn>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+"
    r"|\[(?P<c10>[IWEF])\d{4} [\d:.]+ [\w.]+:\d+\]\s?)"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes vLLM writes around its process tag, even to files
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]$")
_QUIET = frozenset({"DEBUG", "INFO", "WARNING", "WARN", "I", "W"})


def _size(name: str) -> str:
    return rf"(?P<{name}>\d+(?:\.\d+)?) ?(?P<{name}_unit>bytes|B|KiB|MiB|GiB|TiB)\b"


_UNITS = {"bytes": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_CUDA_OOM = re.compile(
    r"(?:CUDA|HIP) out of memory|OutOfMemoryError:|CUDA error: out of memory"
    r"|Cuda failure (?:\d+ )?'out of memory'|CUBLAS_STATUS_ALLOC_FAILED"
)
_CUDA_TRIED = re.compile(r"Tried to allocate " + _size("tried"))
_CUDA_NEW = re.compile(
    r"has a total capac\w* of " + _size("total") + " of which " + _size("free") + " is free"
)
_CUDA_IN_USE = re.compile(r"this process has " + _size("in_use") + " memory in use")
_CUDA_OLD = re.compile(r"\(GPU \d+; " + _size("total") + r" total capacity; .*?; " + _size("free") + " free")
_CPU_OOM = re.compile(
    r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate"
    r"|^(?:builtins\.)?MemoryError\b"
    # oneDNN's failed allocation (docstring): the bare sentence; "could not create a primitive
    # descriptor for …" is an unsupported ISA or data type (vLLM issue 24976), not memory
    r"|^RuntimeError: could not create a primitive\.?$"
)
_CPU_TRIED = re.compile(r"you tried to allocate (?P<tried>\d+) bytes")
_KERNEL = re.compile(r"Out of memory: Kill(?:ed)? process|Memory cgroup out of memory|oom-kill:|OOMKilled")
_CRASH = re.compile(
    r"NCCL error|nccl\w+Error\b|Watchdog caught collective operation timeout|Fatal Python error"
    r"|Segmentation fault|SIGSEGV|Segfault encountered|Caught signal \d+|terminate called after throwing"
    r"|Aborted \(core dumped\)|Bus error \(core dumped\)|CUDA error: |Triton Error \[CUDA\]"
)
_FATAL_HEADER = re.compile(
    r"EngineCore encountered a fatal error|WorkerProc hit an exception|^Process [\w-]+:$"
    r"|Exception in worker \S+ while processing method"
)
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*)?(?:Error|Exception|Exit|Interrupt|Fault)(?::|$)"
)
_CONSEQUENCE = re.compile(
    r"EngineCore encountered an issue|EngineDeadError|EngineCore encountered a fatal error"
    r"|Engine core initialization failed|AsyncLLM output_handler failed|WorkerProc hit an exception"
    r"|Worker failed with error|died unexpectedly|died, exit code|worker process has died"
    r"|failed \(engine dead\)|EngineDead|Engine loop is not running|is already dead, terminating"
    r"|Engine loop has died"
    r"|got fatal signal from worker|WorkerProc initialization failed|See (?:the )?(?:stack trace|root cause)"
    r"|Dumping (?:input data|scheduler)|Error in (?:chat )?completion stream generator"
    r"|^(?:asyncio\.(?:exceptions\.)?|concurrent\.futures\.)?CancelledError|^GeneratorExit|^KeyboardInterrupt"
    r"|^SystemExit|^(?:BrokenPipe|ConnectionReset|ConnectionRefused|ConnectionAborted|EOF)Error|^zmq\.error"
)
_DIED = re.compile(r"died unexpectedly|died, exit code|worker process has died")
_WRAPPED = re.compile(r"Worker failed with error '(?P<inner>.*)', please check")
_WORKER_EXIT = re.compile(
    r"Worker proc (?P<name>\S+) died unexpectedly \(exit code: (?P<code>-?\d+)\)"
    r"|Worker (?P<name0>\S+) pid \d+ died, exit code: (?P<code0>-?\d+)"
)
_ALLOCATORS: tuple[tuple[LogSign, re.Pattern[str], re.Pattern[str]], ...] = (
    ("cuda_oom", _CUDA_OOM, _CUDA_TRIED),
    ("cpu_oom", _CPU_OOM, _CPU_TRIED),
)
_SHELL_KILLED = re.compile(r"^Killed$|: line \d+: +\d+ Killed\b")  # a shell saw its child die of SIGKILL
_ENDS_MESSAGE = re.compile(_FATAL_HEADER.pattern + "|" + _CONSEQUENCE.pattern)  # a new record, not more text
_BEGIN = re.compile(r"vLLM API server version|Initializing a V1 LLM engine|Initializing an LLM engine")
_READY = re.compile(r"Starting vLLM (?:API )?server|Application startup complete|Uvicorn running on")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a server log, its prefixes taken apart."""

    index: int  # 0-based, in the text given
    tag: str | None  # the process tag: "Worker pid=12", "rank0"
    quiet: bool  # logged at DEBUG / INFO / WARNING: never a cause
    message: str  # without prefixes; leading spaces kept (a traceback's frames are indented)

    @property
    def loud(self) -> bool:
        """May carry a cause: not quiet, and not a traceback's frame or source line."""
        return not self.quiet and bool(self.message) and not self.message[0].isspace()


@dataclass(frozen=True, slots=True)
class WorkerExit:
    """A logged worker death with its exit code (Popen's convention: negative = that signal)."""

    name: str
    code: int
    line: LogLine


@dataclass(frozen=True, slots=True)
class Allocation:
    """The numbers an allocator's failure carries, in bytes (``None`` where the wording has none)."""

    tried_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    in_use_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class LogFinding:
    """What a log's serving stretch says about the death (module docstring)."""

    sign: LogSign | None = None
    line: LogLine | None = None  # the root-cause line
    worker_exit: WorkerExit | None = None
    consequences: tuple[str, ...] = ()  # the lines that said only *that* it died (when none says why)
    shell_killed: LogLine | None = None  # a shell's "Killed": its child died of SIGKILL
    lines: int = 0  # how many lines the whole log had

    @property
    def quote(self) -> str | None:
        return None if self.line is None else quote(self.line.message)


def parse_log(text: str) -> list[LogLine]:
    """Every line of ``text``, its prefixes taken apart."""
    return [_parse_line(i, raw) for i, raw in enumerate(text.splitlines())]


def _parse_line(index: int, raw: str) -> LogLine:
    rest, tag, level = _ANSI.sub("", raw.rstrip()), None, None
    for _ in range(4):  # prefixes nest: a timestamp, a tag, a level, in a few orders
        before = rest
        rest = _STAMP.sub("", rest, count=1)
        match = _TAG.match(rest)
        if match:
            tag = tag or match["tag"] or match["rank"]
            rest = rest[match.end() :]
        match = _LEVEL.match(rest)
        if match and level is None:
            level = next(g for g in match.groups() if g is not None)
            rest = rest[match.end() :]
        if rest == before:
            break
    return LogLine(index, tag, level in _QUIET, _REPEATED.sub("", rest))


def serving_stretch(lines: Sequence[LogLine]) -> list[LogLine]:
    """The first serving stretch that holds a death line, else the first one (module docstring)."""
    first = next((line for line in lines if _BEGIN.search(line.message) or _READY.search(line.message)), None)
    serving = first is None or not _READY.search(first.message)
    stretches: list[list[LogLine]] = [[]]
    for line in lines:
        if _BEGIN.search(line.message):
            serving = False
        elif _READY.search(line.message):
            if not serving:
                stretches.append([])
            serving = True
        elif serving:
            stretches[-1].append(line)
    filled = [s for s in stretches if s]
    return next((s for s in filled if any(_is_death_line(line) for line in s)), filled[0] if filled else [])


def read_death_log(text: str) -> LogFinding:
    """The root cause that ``text``'s serving stretch names, if any (module docstring)."""
    all_lines = parse_log(text)
    lines = serving_stretch(all_lines)
    loud = [line for line in lines if line.loud]
    worker_exit = None
    for line in loud:
        match = _WORKER_EXIT.search(line.message)
        if match:
            worker_exit = WorkerExit(
                match["name"] or match["name0"], int(match["code"] or match["code0"]), line
            )
            break
    found = _root_cause(lines, loud)
    said: dict[str, str] = {}  # one line per consequence phrase, in order
    for line in loud if found is None else ():
        match = _CONSEQUENCE.search(line.message)
        if match:
            said.setdefault(match.group(0), quote(line.message))
    killed = next((line for line in loud if _SHELL_KILLED.search(line.message)), None)
    if found is None:
        return LogFinding(None, None, worker_exit, tuple(said.values()), killed, len(all_lines))
    return LogFinding(found[0], found[1], worker_exit, (), killed, len(all_lines))


def _root_cause(lines: Sequence[LogLine], loud: Sequence[LogLine]) -> tuple[LogSign, LogLine] | None:
    for line in loud:
        for sign, pattern, numbers in _ALLOCATORS:
            if pattern.search(line.message):  # the allocator's own line: the first one with the numbers
                later = (x for x in loud if x.index >= line.index and pattern.search(x.message))
                return sign, next((x for x in later if numbers.search(x.message)), line)
    kernel = next((line for line in loud if _KERNEL.search(line.message)), None)
    if kernel is not None:
        return "kernel_kill", kernel
    crash = _crash_line(lines)
    return None if crash is None else ("crash", crash)


def _crash_line(lines: Sequence[LogLine]) -> LogLine | None:
    """The first crash signature or post-header exception (none after a process is reported dead);
    else the error a "Worker failed with error '…'" line carries (module docstring)."""
    header: LogLine | None = None
    survivors = False
    for line in lines:
        if not line.loud:
            continue
        if _DIED.search(line.message):
            header, survivors = None, True
        elif _FATAL_HEADER.search(line.message):
            header = header or (None if survivors else line)
        elif _CONSEQUENCE.search(line.message):
            continue
        elif _CRASH.search(line.message) or _opens(header, line):
            return line
    return next((line for line in lines if line.loud and _WRAPPED.search(line.message)), None)


def _opens(header: LogLine | None, line: LogLine) -> bool:
    """``line`` is an exception in the traceback a fatal header opened (same process)."""
    return header is not None and line.tag == header.tag and bool(_EXCEPTION.match(line.message))


def _is_death_line(line: LogLine) -> bool:
    patterns = (_CONSEQUENCE, _CUDA_OOM, _CPU_OOM, _KERNEL, _CRASH, _FATAL_HEADER)
    return line.loud and any(p.search(line.message) for p in patterns)


def allocator_failure(text: str) -> LogSign | None:
    """``"cuda_oom"`` / ``"cpu_oom"`` when ``text`` (a request's error, say) holds an allocator's failure."""
    return "cuda_oom" if _CUDA_OOM.search(text) else "cpu_oom" if _CPU_OOM.search(text) else None


def allocation(message: str) -> Allocation:
    """The numbers an allocator's message carries (bytes; PyTorch's units are binary)."""
    tried = _CUDA_TRIED.search(message)
    cpu = _CPU_TRIED.search(message)
    device = _CUDA_NEW.search(message) or _CUDA_OLD.search(message)
    in_use = _CUDA_IN_USE.search(message)
    return Allocation(
        tried_bytes=_bytes(tried, "tried") if tried else int(cpu["tried"]) if cpu else None,
        free_bytes=_bytes(device, "free") if device else None,
        total_bytes=_bytes(device, "total") if device else None,
        in_use_bytes=_bytes(in_use, "in_use") if in_use else None,
    )


def _bytes(match: re.Match[str], name: str) -> int:
    return round(float(match[name]) * _UNITS[match[f"{name}_unit"]])


def quote(message: str) -> str:
    """A cause's text: unwrapped from "Worker failed with error '…'", spaces collapsed, at most
    ``MAX_QUOTE_CHARS`` (cut after a sentence where one ends past half of that)."""
    wrapped = _WRAPPED.search(message)
    text = " ".join((wrapped["inner"] if wrapped else message).split())
    if len(text) <= MAX_QUOTE_CHARS:
        return text
    cut = text.rfind(". ", 0, MAX_QUOTE_CHARS - 1)
    return text[: cut + 1] + " …" if cut >= MAX_QUOTE_CHARS // 2 else text[: MAX_QUOTE_CHARS - 1] + "…"


def death_excerpt(log_text: str, max_lines: int = 20) -> str:
    """The lines that lead to the root cause, in its process, without prefixes; the serving stretch's
    last lines when the log names no cause; empty for an empty log (module docstring)."""
    lines = parse_log(log_text)
    stretch = serving_stretch(lines)
    found = _root_cause(stretch, [line for line in stretch if line.loud])
    if found is None:
        chosen = (stretch or lines)[-max_lines:]
    else:
        root = found[1]
        pool = [line for line in stretch if line.tag == root.tag]
        at = next(i for i, line in enumerate(pool) if line.index == root.index)
        after = 0
        for line in pool[at + 1 : at + 4]:  # the message's continuation ("Last error:", NCCL's detail)
            text = line.message
            if line.quiet or not text or text.startswith("Traceback") or _ENDS_MESSAGE.search(text):
                break
            after += 1
        chosen = pool[max(0, at + 1 + after - max_lines) : at + 1 + after]
    return "\n".join(_trim(line.message) for line in chosen)


def _trim(text: str) -> str:
    return text if len(text) <= MAX_EXCERPT_LINE_CHARS else text[: MAX_EXCERPT_LINE_CHARS - 1] + "…"
