"""What server memory to watch, the sampling thread into a run directory, and the remote reader."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from oomload.errors import ConfigError, EndpointError, SamplerUnavailableError
from oomload.rundir import RunWriter
from oomload.rundir.servermemory import ServerMemoryLine, ServerMemoryRow
from oomload.telemetry.hostmem import LocalServerMemory
from oomload.telemetry.hostsampler import (
    MemoryTarget,
    RemoteServerMemory,
    ServerMemorySampler,
    open_memory_source,
    parse_server_memory_text,
    render_server_memory_text,
    resolve_memory_target,
)

from .fakeproc import FakeHost

GIB = 1024**3
HANG_S = 60.0  # a hang guard, not a timing assertion


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    host = FakeHost(tmp_path / "host")
    host.process(1, 0, comm="systemd")
    host.process(200, 1, comm="vllm", rss_kib=500_000, pss_kib=400_000, cgroup="0::/pod/c\n", sockets=(77,))
    host.process(300, 200, comm="VLLM::EngineCor", rss_kib=800_000, pss_kib=700_000, cgroup="0::/pod/c\n")
    host.listen(8000, 77)
    host.cgroup_v2("/pod/c", current=2 * GIB, max_bytes=4 * GIB, peak=3 * GIB, oom_kill=0)
    return host


# -- resolving a spec (pure) ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "base_url", "server_pid", "target"),
    [
        ("auto", "http://127.0.0.1:8000", None, MemoryTarget(port=8000, explicit=False)),
        ("auto", "http://localhost:8000/v1", None, MemoryTarget(port=8000, explicit=False)),
        ("auto", "http://[::1]:8001", None, MemoryTarget(port=8001, explicit=False)),
        ("auto", "http://0.0.0.0:8002", None, MemoryTarget(port=8002, explicit=False)),
        ("auto", "http://localhost", None, MemoryTarget(port=80, explicit=False)),
        ("auto", "https://127.0.0.2", None, MemoryTarget(port=443, explicit=False)),
        ("auto", "http://gpu-host:8000", 4242, MemoryTarget(pid=4242)),  # it started the server
        ("pid:123", None, None, MemoryTarget(pid=123)),
        ("PID:123", "http://h:1", 123, MemoryTarget(pid=123)),
        ("port:8000", None, None, MemoryTarget(port=8000)),
        (
            "cgroup:/sys/fs/cgroup/kubepods/pod1",
            None,
            None,
            MemoryTarget(cgroup_dir=Path("/sys/fs/cgroup/kubepods/pod1")),
        ),
        ("remote:http://gpu-host:9400/", None, None, MemoryTarget(url="http://gpu-host:9400")),
    ],
)
def test_specs(spec: str, base_url: str | None, server_pid: int | None, target: MemoryTarget) -> None:
    resolved = resolve_memory_target(spec, base_url, server_pid)
    assert resolved == target
    assert resolved.watches


def test_auto_for_another_host_watches_nothing_and_says_why() -> None:
    target = resolve_memory_target("auto", "http://gpu-host:8000/v1")
    assert not target.watches
    assert target.reason == (
        "the server at http://gpu-host:8000/v1 is not on this machine: run `oomload sample "
        "--server-port 8000 --serve --host 0.0.0.0` beside it and watch remote:http://gpu-host:9400"
    )
    assert resolve_memory_target("auto", None).reason == "no server URL to find the server's process by"
    none = resolve_memory_target("none", "http://127.0.0.1:8000", 12)
    assert not none.watches and none.reason is not None


@pytest.mark.parametrize(
    ("spec", "server_pid", "message"),
    [
        ("pid:12", 13, "the server memory target pid:12 is not the server's pid 13"),
        ("pid:0", None, "a pid is a whole number > 0, got '0'"),
        ("pid:x", None, "a pid is a whole number > 0, got 'x'"),
        ("port:70000", None, "a TCP port is 1–65535, got 70000"),
        ("port:8000", 5, "the server's pid 5 is known: watch it with auto or pid:5"),
        ("remote:gpu-host:9400", None, "the server memory target must be auto, none, pid:N, port:N, "),
        (
            "bogus",
            None,
            "the server memory target must be auto, none, pid:N, port:N, cgroup:DIR or remote:URL, "
            "got 'bogus'",
        ),
        ("auto", -3, "a server pid must be > 0, got -3"),
    ],
)
def test_bad_specs(spec: str, server_pid: int | None, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_memory_target(spec, "http://127.0.0.1:8000", server_pid)
    assert str(err.value).startswith(message)


# -- opening a source -------------------------------------------------------------------------------------
def open_on(host: FakeHost, target: MemoryTarget) -> LocalServerMemory:
    source = open_memory_source(target, proc_root=host.proc, cgroup_root=host.cgroup, clock=lambda: 5.0)
    assert isinstance(source, LocalServerMemory)
    return source


def test_the_listener_of_the_port_is_the_server(host: FakeHost) -> None:
    source = open_on(host, MemoryTarget(port=8000, explicit=False))
    assert source.pid == 200
    line = source.read()
    assert (line["processes"], line["cgroup"], line["cgroup_limit_bytes"]) == (2, "v2:/pod/c", 4 * GIB)


def test_auto_finding_nothing_is_unavailable_explicit_is_a_config_error(host: FakeHost) -> None:
    message = "no process that oomload can see listens on TCP port 8001 here"
    with pytest.raises(SamplerUnavailableError, match=message):
        open_on(host, MemoryTarget(port=8001, explicit=False))
    with pytest.raises(ConfigError, match=message):
        open_on(host, MemoryTarget(port=8001))
    with pytest.raises(ConfigError, match=r"^pid 999 is not running \(or not visible here\)$"):
        open_on(host, MemoryTarget(pid=999))
    with pytest.raises(ConfigError, match="does not exist"):
        open_on(host, MemoryTarget(pid=200, cgroup_dir=host.cgroup / "gone"))
    with pytest.raises(SamplerUnavailableError, match="not watched"):
        open_on(host, resolve_memory_target("none"))


def test_open_a_remote_source_reads_it_once() -> None:
    line = sample_line()
    remote = open_memory_source(
        MemoryTarget(url="http://mem-host:9400"),
        fetch=lambda url, timeout_s: render_server_memory_text(line),
        clock=lambda: 77.0,
    )
    assert isinstance(remote, RemoteServerMemory)
    assert remote.read()["t_unix_s"] == 77.0

    def refused(url: str, timeout_s: float) -> str:
        raise EndpointError(f"GET {url} failed: connection refused (is the server running?)")

    with pytest.raises(SamplerUnavailableError) as err:
        open_memory_source(MemoryTarget(url="http://mem-host:9400"), fetch=refused)
    assert str(err.value) == (
        "cannot read the server's memory: GET http://mem-host:9400/metrics failed: connection refused "
        "(is the server running?)"
    )


# -- the sampler ---------------------------------------------------------------------------------------------
def rows(run_dir: Path) -> list[ServerMemoryRow]:
    lines = (run_dir / "server_memory.jsonl").read_text().splitlines()
    return [row for row in (ServerMemoryRow.from_json(json.loads(text)) for text in lines) if row]


def test_the_sampler_writes_lines_and_notes_the_server_gone(host: FakeHost, tmp_path: Path) -> None:
    said: list[str] = []
    with RunWriter(tmp_path / "run") as writer:
        sampler = ServerMemorySampler(open_on(host, MemoryTarget(pid=200)), writer, on_problem=said.append)
        for _ in range(3):
            sampler.sample_once()
        shutil.rmtree(host.proc / "200")
        shutil.rmtree(host.proc / "300")
        for _ in range(2):
            sampler.sample_once()
    written = rows(tmp_path / "run")
    assert sampler.samples == len(written) == 5
    assert [r.alive for r in written] == [True, True, True, False, False]
    assert [r.processes for r in written] == [2, 2, 2, 0, 0]
    assert written[0].rss_bytes == 1_300_000 * 1024
    assert written[4].cgroup_current_bytes == 2 * GIB  # the cgroup is still read
    assert (
        said
        == sampler.problems
        == ["the server's root process (pid 200) is gone; its memory cgroup (v2:/pod/c) is still read"]
    )
    assert sampler.latest is not None and sampler.latest["alive"] is False


def test_problems_are_said_once_and_sampling_goes_on(host: FakeHost, tmp_path: Path) -> None:
    host.process(50, 1, comm="bash")
    sampler = ServerMemorySampler(open_on(host, MemoryTarget(pid=50)))
    sampler.check()
    for _ in range(3):
        line = sampler.sample_once()
        assert line is not None and line["processes"] == 1
    assert sampler.problems == [
        "pid 50 (bash) listens on no TCP port and has no child processes: is it the server?",
        f"cannot read {host.cgroup / 'memory.current'} (no such file)",  # "0::/" here: the mount
    ]
    assert sampler.samples == 3


class Flaky:
    """A source that fails every other read."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> ServerMemoryLine:
        self.reads += 1
        if self.reads % 2 == 0:
            raise SamplerUnavailableError("cannot read the server's memory: GET … timed out after 5 s")
        return sample_line()

    def check(self) -> str | None:
        return None

    def describe(self) -> str:
        return "flaky"


def test_a_read_that_fails_writes_no_line(tmp_path: Path) -> None:
    with RunWriter(tmp_path) as writer:
        sampler = ServerMemorySampler(Flaky(), writer)
        results = [sampler.sample_once() for _ in range(4)]
    assert [r is not None for r in results] == [True, False, True, False]
    assert len(rows(tmp_path)) == sampler.samples == 2
    assert sampler.problems == ["cannot read the server's memory: GET … timed out after 5 s"]


def test_the_thread_samples_until_stopped_then_once_more(host: FakeHost, tmp_path: Path) -> None:
    with RunWriter(tmp_path) as writer:
        sampler = ServerMemorySampler(open_on(host, MemoryTarget(pid=200)), writer, interval_s=0.01)
        sampler.start()
        deadline = time.monotonic() + HANG_S
        while sampler.samples < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        sampler.stop()
        counted = sampler.samples
        sampler.stop()  # a second stop does nothing
    assert counted >= 4  # three while running, one at the stop
    assert sampler.samples == counted == len(rows(tmp_path))


# -- the remote text ----------------------------------------------------------------------------------------
def sample_line(**changes: object) -> ServerMemoryLine:
    line: ServerMemoryLine = {
        "t_unix_s": 1.5,
        "source": "local",
        "pid": 4242,
        "processes": 3,
        "rss_bytes": 2_100_000_000,
        "pss_bytes": 1_700_000_000,
        "cgroup": "v2:/kubepods/pod1",
        "cgroup_current_bytes": 2_500_000_000,
        "cgroup_limit_bytes": 4 * GIB,
        "cgroup_peak_bytes": 3_000_000_000,
        "cgroup_oom_kill": 1,
        "cgroup_events_max": 12,
        "alive": True,
        "data_bytes": 1_200_000_000,
        "data_limit_bytes": 1_300_000_000,
    }
    line.update(changes)  # type: ignore[typeddict-item]
    return line


def test_render_and_parse_round_trip() -> None:
    line = sample_line()
    text = render_server_memory_text(line)
    assert "oomload_server_rss_bytes 2100000000\n" in text
    assert "# TYPE oomload_cgroup_oom_kill_total counter\n" in text
    back = parse_server_memory_text(text, t_unix_s=9.0, source="remote:http://h:9400")
    assert back == {**line, "t_unix_s": 9.0, "source": "remote:http://h:9400"}


def test_unknown_values_are_absent_series_and_come_back_none() -> None:
    line = sample_line(
        pss_bytes=None,
        cgroup=None,
        cgroup_current_bytes=None,
        cgroup_limit_bytes=None,
        cgroup_peak_bytes=None,
        cgroup_oom_kill=None,
        cgroup_events_max=None,
        alive=False,
        error='cannot read the PSS of pid 4242 (permission denied); a "quoted" \\ path',
    )
    text = render_server_memory_text(line)
    assert "oomload_server_pss_bytes" not in text
    assert "oomload_cgroup_memory_limit_bytes" not in text
    assert "oomload_server_alive 0\n" in text
    assert parse_server_memory_text(text, t_unix_s=1.5, source="local") == line


def test_a_data_limit_travels_and_its_absence_too() -> None:
    unlimited = sample_line(data_limit_bytes=None)
    text = render_server_memory_text(unlimited)
    assert "oomload_server_data_bytes 1200000000\n" in text and "oomload_server_data_limit_bytes" not in text
    assert parse_server_memory_text(text, t_unix_s=1.5, source="local") == unlimited
    unread = sample_line()
    del unread["data_bytes"], unread["data_limit_bytes"]  # a simulator's line, or an older sampler's
    assert parse_server_memory_text(render_server_memory_text(unread), t_unix_s=1.5, source="local") == unread


def test_text_that_is_not_a_server_memory_endpoint() -> None:
    dcgm = 'DCGM_FI_DEV_FB_USED{gpu="0"} 61234\n'
    with pytest.raises(SamplerUnavailableError, match="has no oomload_server_memory_info series"):
        parse_server_memory_text(dcgm, t_unix_s=0.0, source="remote:x")
    with pytest.raises(SamplerUnavailableError, match="did not answer Prometheus text"):
        parse_server_memory_text("<html>not found</html>\n", t_unix_s=0.0, source="remote:x")


def test_remote_reader_url_source_and_clock() -> None:
    asked: list[str] = []

    def fetch(url: str, timeout_s: float) -> str:
        asked.append(url)
        return render_server_memory_text(sample_line())

    remote = RemoteServerMemory("http://mem-host:9400/", clock=lambda: 123.0, fetch=fetch)
    line = remote.read()
    assert asked == ["http://mem-host:9400/metrics"]
    assert (line["source"], line["t_unix_s"], line["pid"]) == ("remote:http://mem-host:9400", 123.0, 4242)
