"""Watching the server's host memory over time: what to watch, a sampling thread, a remote reader.

What to watch (``MemoryTarget``) comes from a spec, resolved without I/O by
``resolve_memory_target(spec, base_url, server_pid)``:

==================  ====================================================================================
spec                target
==================  ====================================================================================
``auto``            the server's pid when the caller knows it (it started the server); else, when the
                    URL's host is this machine (loopback, ``localhost``, ``0.0.0.0``), the process that
                    listens on the URL's port; else nothing, and ``reason`` says why
``none``            nothing
``pid:N``           process N and its descendants, with its memory cgroup
``port:N``          the local process that listens on TCP port N, with its descendants and cgroup
``cgroup:DIR``      a memory cgroup directory (a pod's or a container's), without processes
``remote:URL``      another host's ``oomload sample --server-pid/--server-port/--cgroup --serve``
==================  ====================================================================================

``open_memory_source(target)`` then does the look-ups (the listener of a port, the pid running, the
directory a memory cgroup) and returns a ``ServerMemorySource``. A target the user named that cannot
be watched is a ``ConfigError``; an ``auto`` one that finds nothing is a ``SamplerUnavailableError``
(the caller goes on without, and says why).

``ServerMemorySampler`` reads a source on a fixed grid of ``interval_s`` (0.5 s by default: the
cgroup's peak counter keeps the spikes between samples) in one ``threading.Thread``; each line goes
to ``server_memory.jsonl`` through a ``RunWriter`` and/or to ``on_line``. A tick that comes late is
not made up with a burst. ``stop()`` joins the thread and takes one last sample. Problems are said
once each (``problems``, ``on_problem``): a doubtful target ("pid 12 (bash) listens on no TCP port
and has no child processes: is it the server?"), a line's ``error``, the root process gone (the
cgroup is still read: a container may hold a restarted server), a remote sampler that does not
answer (that tick has no line). Sampling always goes on with what it has.

The reads block (``/proc`` files: about 2–3 ms a read with a small tree, a PSS read longer; see
``hostmem``). Under Locust's gevent patching the thread is a greenlet and would stall the load's
event loop meanwhile: there, run ``oomload sample --server-pid PID --server-out
RUN_DIR/server_memory.jsonl --parent-pid …`` as a child process instead, as GPU sampling does.

``RemoteServerMemory`` reads the series ``render_server_memory_text`` writes (``oomload sample
--serve``); its lines have ``source: "remote:URL"`` and are stamped with the local clock when the
answer arrives, like remote GPU samples.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from oomload.errors import ConfigError, OomloadError, SamplerUnavailableError
from oomload.rundir import RunWriter
from oomload.rundir.servermemory import ServerMemoryLine
from oomload.telemetry.dcgm import dcgm_url
from oomload.telemetry.hostmem import CGROUP_ROOT, LocalServerMemory, memory_cgroup_at
from oomload.telemetry.proctree import PROC_ROOT, find_listening_pid, scan_processes
from oomload.telemetry.scrape import fetch_text

MEMORY_SPECS = ("auto", "none", "pid:N", "port:N", "cgroup:DIR", "remote:URL")
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
# (series, line field, help, type) of the numbers ``oomload sample --serve`` exposes.
SERIES: tuple[tuple[str, str, str, str], ...] = (
    ("oomload_server_rss_bytes", "rss_bytes", "RSS summed over the server's process tree, bytes.", "gauge"),
    ("oomload_server_pss_bytes", "pss_bytes", "PSS summed over the server's process tree, bytes.", "gauge"),
    ("oomload_server_processes", "processes", "Processes in the server's tree.", "gauge"),
    ("oomload_server_alive", "alive", "1 while the server's root process runs.", "gauge"),
    ("oomload_cgroup_memory_current_bytes", "cgroup_current_bytes", "The memory cgroup's usage.", "gauge"),
    ("oomload_cgroup_memory_limit_bytes", "cgroup_limit_bytes", "The memory cgroup's limit.", "gauge"),
    ("oomload_cgroup_memory_peak_bytes", "cgroup_peak_bytes", "The memory cgroup's peak usage.", "gauge"),
    ("oomload_cgroup_oom_kill_total", "cgroup_oom_kill", "OOM kills in the memory cgroup.", "counter"),
    (
        "oomload_cgroup_memory_max_events_total",
        "cgroup_events_max",
        "Times the memory cgroup's usage hit its limit.",
        "counter",
    ),
    (
        "oomload_server_data_bytes",
        "data_bytes",
        "VmData of the server's process nearest its data limit (the largest without one).",
        "gauge",
    ),
    (
        "oomload_server_data_limit_bytes",
        "data_limit_bytes",
        "That process's soft RLIMIT_DATA (absent: no process has one).",
        "gauge",
    ),
)
INFO_SERIES = "oomload_server_memory_info"
TIMESTAMP_SERIES = "oomload_server_memory_sample_timestamp_seconds"


class ServerMemorySource(Protocol):
    """Something that reads the server's memory: ``LocalServerMemory`` or ``RemoteServerMemory``."""

    def read(self) -> ServerMemoryLine:
        """The memory now; ``SamplerUnavailableError`` only when nothing at all could be read."""
        ...

    def check(self) -> str | None:
        """A doubt about the target, in one sentence, or ``None``."""
        ...

    def describe(self) -> str:
        """What is read, for an announcement."""
        ...


# -- what to watch ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MemoryTarget:
    """The server memory to watch: a local tree (``pid``, or the listener of ``port``) with its cgroup
    or ``cgroup_dir``, or a remote sampler (``url``); none of them: nothing (``reason`` says why).
    ``explicit``: the user named it (a target that cannot be watched is then a ``ConfigError``)."""

    pid: int | None = None
    port: int | None = None
    cgroup_dir: Path | None = None
    url: str | None = None
    explicit: bool = True
    reason: str | None = None

    @property
    def watches(self) -> bool:
        return any(v is not None for v in (self.pid, self.port, self.cgroup_dir, self.url))

    def describe(self) -> str:
        if self.url is not None:
            return f"remote:{self.url}"
        parts = [f"pid {self.pid}"] if self.pid is not None else []
        if self.port is not None:
            parts.append(f"the listener on port {self.port}")
        if self.cgroup_dir is not None:
            parts.append(f"cgroup {self.cgroup_dir}")
        return ", ".join(parts) or "nothing"


def resolve_memory_target(
    spec: str, base_url: str | None = None, server_pid: int | None = None
) -> MemoryTarget:
    """``spec`` (module docstring's table) → a ``MemoryTarget``, without I/O; ``ConfigError`` for a bad
    spec. ``server_pid``: the server's pid when the caller knows it."""
    kind, _, value = spec.strip().partition(":")
    kind = kind.lower()
    if server_pid is not None and server_pid <= 0:
        raise ConfigError(f"a server pid must be > 0, got {server_pid}")
    if kind == "none" and not value:
        return MemoryTarget(explicit=False, reason="the server's memory is not watched (none)")
    if kind == "auto" and not value:
        if server_pid is not None:
            return MemoryTarget(pid=server_pid)
        return _auto_target(base_url)
    if kind == "pid":
        pid = _whole(value, "pid")
        if server_pid is not None and server_pid != pid:
            raise ConfigError(f"the server memory target pid:{pid} is not the server's pid {server_pid}")
        return MemoryTarget(pid=pid)
    if server_pid is not None and kind in ("port", "cgroup", "remote"):
        raise ConfigError(f"the server's pid {server_pid} is known: watch it with auto or pid:{server_pid}")
    if kind == "port":
        port = _whole(value, "port")
        if port > 65535:
            raise ConfigError(f"a TCP port is 1–65535, got {port}")
        return MemoryTarget(port=port)
    if kind == "cgroup" and value:
        return MemoryTarget(cgroup_dir=Path(value))
    if kind == "remote" and value.startswith(("http://", "https://")):
        return MemoryTarget(url=value.rstrip("/"))
    allowed = ", ".join(MEMORY_SPECS[:-1]) + f" or {MEMORY_SPECS[-1]}"
    raise ConfigError(f"the server memory target must be {allowed}, got {spec!r}")


def _auto_target(base_url: str | None) -> MemoryTarget:
    if not base_url:
        return MemoryTarget(explicit=False, reason="no server URL to find the server's process by")
    parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return MemoryTarget(explicit=False, reason=f"{base_url} has no valid port")
    if not _is_local(host):
        return MemoryTarget(
            explicit=False,
            reason=(
                f"the server at {base_url} is not on this machine: run `oomload sample --server-port "
                f"{port} --serve --host 0.0.0.0` beside it and watch remote:http://{host}:9400"
            ),
        )
    return MemoryTarget(port=port, explicit=False)


def _is_local(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _whole(value: str, what: str) -> int:
    if not value.strip().isdigit() or int(value) <= 0:
        raise ConfigError(f"a {what} is a whole number > 0, got {value!r}")
    return int(value)


def open_memory_source(
    target: MemoryTarget,
    *,
    proc_root: Path = PROC_ROOT,
    cgroup_root: Path = CGROUP_ROOT,
    clock: Callable[[], float] = time.time,
    fetch: Callable[[str, float], str] | None = None,
) -> ServerMemorySource:
    """The source that reads ``target`` (module docstring); a remote one is read once to check it."""

    def fail(message: str) -> OomloadError:
        return ConfigError(message) if target.explicit else SamplerUnavailableError(message)

    if not target.watches:
        raise SamplerUnavailableError(target.reason or "no server memory to watch")
    if target.url is not None:
        remote = RemoteServerMemory(target.url, clock=clock, fetch=fetch)
        remote.read()
        return remote
    pid = target.pid
    if target.port is not None:
        pid = find_listening_pid(target.port, proc_root)
        if pid is None:
            raise fail(
                f"no process that oomload can see listens on TCP port {target.port} here "
                "(another user's process can be hidden from a user without root: give its pid)"
            )
    elif pid is not None and pid not in scan_processes(proc_root):
        raise fail(f"pid {pid} is not running (or not visible here)")
    if target.cgroup_dir is not None:
        try:
            memory_cgroup_at(target.cgroup_dir, cgroup_root)
        except ConfigError as err:
            raise fail(str(err)) from err
    return LocalServerMemory(
        pid, cgroup_dir=target.cgroup_dir, proc_root=proc_root, cgroup_root=cgroup_root, clock=clock
    )


# -- the sampling thread ------------------------------------------------------------------------------
class ServerMemorySampler:
    """Reads ``source`` every ``interval_s`` in a thread; lines go to ``writer`` (``server_memory.jsonl``)
    and/or ``on_line``; problems are said once each (module docstring)."""

    def __init__(
        self,
        source: ServerMemorySource,
        writer: RunWriter | None = None,
        *,
        interval_s: float = 0.5,
        on_line: Callable[[ServerMemoryLine], None] | None = None,
        on_problem: Callable[[str], None] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.source = source
        self.interval_s = interval_s
        self._writer = writer
        self._on_line = on_line
        self._on_problem = on_problem
        self._latest: ServerMemoryLine | None = None
        self._seen_alive = False
        self._said: set[str] = set()
        self.problems: list[str] = []
        self.samples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def latest(self) -> ServerMemoryLine | None:
        """The last line read (``None`` before the first)."""
        return self._latest

    def check(self) -> None:
        """Say the source's doubt about its target, if any (``start`` does it)."""
        doubt = self.source.check()
        if doubt is not None:
            self._problem(doubt)

    def sample_once(self) -> ServerMemoryLine | None:
        """Read once, hand the line on and return it (``None``: nothing could be read this time)."""
        with self._lock:
            try:
                line = self.source.read()
            except SamplerUnavailableError as err:
                self._problem(str(err))
                return None
            self._latest = line
            self.samples += 1
            if self._writer is not None:
                self._writer.append("server_memory", line)
            if self._on_line is not None:
                self._on_line(line)
            if "error" in line:
                self._problem(line["error"])
            if line["alive"]:
                self._seen_alive = True
            elif self._seen_alive:
                self._problem(_gone(line))
            return line

    def _problem(self, sentence: str) -> None:
        if sentence in self._said:
            return
        self._said.add(sentence)
        self.problems.append(sentence)
        if self._on_problem is not None:
            self._on_problem(sentence)

    def start(self) -> None:
        """Check the target, then sample every ``interval_s`` in a daemon thread."""
        if self._thread is not None:
            return
        self.check()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="oomload-server-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (joined) and take one last sample."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
            self.sample_once()

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_tick += self.interval_s
            now = time.monotonic()
            if next_tick < now:  # late: the next grid point, never a burst
                next_tick = now
            self._stop.wait(next_tick - now)

    def __enter__(self) -> ServerMemorySampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _gone(line: ServerMemoryLine) -> str:
    who = f"the server's root process (pid {line['pid']})" if line["pid"] is not None else "its cgroup"
    what = "is gone" if line["pid"] is not None else "holds no process"
    rest = f"; its memory cgroup ({line['cgroup']}) is still read" if line["cgroup"] else ""
    return f"{who} {what}{rest}"


# -- the remote reader and the text it reads -------------------------------------------------------------
class RemoteServerMemory:
    """Reads another host's ``oomload sample --serve`` (server memory series) into lines."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        fetch: Callable[[str, float], str] | None = None,
    ) -> None:
        self.source = f"remote:{url.rstrip('/')}"
        self.url = dcgm_url(url)
        self.timeout_s = timeout_s
        self._clock = clock
        self._fetch = fetch_text if fetch is None else fetch

    def describe(self) -> str:
        return f"the server's memory at {self.url}"

    def check(self) -> str | None:
        return None

    def read(self) -> ServerMemoryLine:
        try:
            text = self._fetch(self.url, self.timeout_s)
        except OomloadError as err:
            raise SamplerUnavailableError(f"cannot read the server's memory: {err}") from err
        return parse_server_memory_text(text, t_unix_s=self._clock(), source=self.source)


def render_server_memory_text(line: ServerMemoryLine | None) -> str:
    """Prometheus text of one line (module docstring's series; a value not known: no series)."""
    if line is None:
        return ""
    fields: Mapping[str, object] = line
    out: list[str] = []
    for name, field, help_text, kind in SERIES:
        value = fields.get(field)
        if not isinstance(value, int):  # None: not known, no series (a bool is an int)
            continue
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {int(value)}"]
    labels = {"pid": "" if line["pid"] is None else str(line["pid"]), "cgroup": line["cgroup"] or ""}
    if "error" in line:
        labels["error"] = line["error"]
    out += [
        f"# HELP {INFO_SERIES} The server watched: root pid, memory cgroup, what could not be read.",
        f"# TYPE {INFO_SERIES} gauge",
        f"{INFO_SERIES}{{{_labels(labels.items())}}} 1",
        f"# HELP {TIMESTAMP_SERIES} When the server's memory was read (Unix seconds, this host's clock).",
        f"# TYPE {TIMESTAMP_SERIES} gauge",
        f"{TIMESTAMP_SERIES} {line['t_unix_s']!r}",
    ]
    return "\n".join(out) + "\n"


def parse_server_memory_text(text: str, *, t_unix_s: float, source: str) -> ServerMemoryLine:
    """``render_server_memory_text``'s series (among others) → a line; ``SamplerUnavailableError``
    when the text is not Prometheus text or has none of them."""
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError, IndexError) as err:
        raise SamplerUnavailableError(
            f"the server memory endpoint did not answer Prometheus text ({err})"
        ) from err
    values = {s.name: float(s.value) for s in samples}
    info = next((s.labels for s in samples if s.name == INFO_SERIES), None)
    if info is None:
        raise SamplerUnavailableError(
            f"the endpoint has no {INFO_SERIES} series: it is not an `oomload sample --serve` "
            "that watches a server (--server-pid, --server-port or --cgroup)"
        )

    def number(name: str) -> int | None:
        value = values.get(name)
        return None if value is None or value != value else int(value)

    pid = info.get("pid", "")
    line: ServerMemoryLine = {
        "t_unix_s": t_unix_s,
        "source": source,
        "pid": int(pid) if pid.isdigit() else None,
        "processes": number("oomload_server_processes"),
        "rss_bytes": number("oomload_server_rss_bytes"),
        "pss_bytes": number("oomload_server_pss_bytes"),
        "cgroup": info.get("cgroup") or None,
        "cgroup_current_bytes": number("oomload_cgroup_memory_current_bytes"),
        "cgroup_limit_bytes": number("oomload_cgroup_memory_limit_bytes"),
        "cgroup_peak_bytes": number("oomload_cgroup_memory_peak_bytes"),
        "cgroup_oom_kill": number("oomload_cgroup_oom_kill_total"),
        "cgroup_events_max": number("oomload_cgroup_memory_max_events_total"),
        "alive": values.get("oomload_server_alive", 1.0) != 0,
    }
    data = number("oomload_server_data_bytes")
    if data is not None:
        line["data_bytes"] = data
        line["data_limit_bytes"] = number("oomload_server_data_limit_bytes")
    if info.get("error"):
        line["error"] = info["error"]
    return line


def _labels(items: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{key}="{_escape(value)}"' for key, value in items)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
