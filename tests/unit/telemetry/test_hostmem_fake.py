"""The server's host memory read from fake ``/proc`` and cgroup trees laid out as the kernel writes them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from oomload.errors import ConfigError
from oomload.telemetry.hostmem import (
    LocalServerMemory,
    memory_cgroup_at,
    read_server_memory,
)
from oomload.telemetry.proctree import find_listening_pid, find_listening_pids, process_tree

from .fakeproc import V1_UNLIMITED, FakeHost

KIB = 1024
GIB = 1024**3


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def vllm_tree(host: FakeHost, cgroup: str = "0::/kubepods/pod1/c1\n") -> None:
    """launcher 100 → API server 200 → EngineCore 300 → workers 400, 401; an unrelated 500."""
    host.process(1, 0, comm="systemd", cgroup="0::/init.scope\n")
    host.process(100, 1, comm="bash", rss_kib=3000, pss_kib=1000, cgroup=cgroup)
    host.process(200, 100, comm="vllm", rss_kib=500_000, pss_kib=400_000, cgroup=cgroup)
    host.process(300, 200, comm="VLLM::EngineCor", rss_kib=800_000, pss_kib=700_000, cgroup=cgroup)
    host.process(400, 300, comm="VLLM::Worker_TP0", rss_kib=2_000_000, pss_kib=1_900_000, cgroup=cgroup)
    host.process(401, 300, comm="VLLM::Worker_TP1", rss_kib=2_000_000, pss_kib=1_900_000, cgroup=cgroup)
    host.process(500, 1, comm="sshd", rss_kib=9999, pss_kib=9999, cgroup="0::/system.slice/ssh\n")


def read(host: FakeHost, pid: int | None, cgroup_dir: Path | None = None) -> dict[str, object]:
    line = read_server_memory(
        pid, cgroup_dir=cgroup_dir, proc_root=host.proc, cgroup_root=host.cgroup, clock=lambda: 1000.0
    )
    return dict(line)


def test_tree_sums_and_v2_cgroup_with_peak_limit_and_oom_kills(host: FakeHost) -> None:
    vllm_tree(host)
    host.cgroup_v2(
        "/kubepods/pod1/c1", current=6 * GIB, max_bytes=8 * GIB, peak=7 * GIB, events_max=12, oom_kill=2
    )
    assert process_tree(200, host.proc) == [200, 300, 400, 401]
    assert read(host, 200) == {
        "t_unix_s": 1000.0,
        "source": "local",
        "pid": 200,
        "processes": 4,
        "rss_bytes": (500_000 + 800_000 + 2 * 2_000_000) * KIB,
        "pss_bytes": (400_000 + 700_000 + 2 * 1_900_000) * KIB,
        "cgroup": "v2:/kubepods/pod1/c1",
        "cgroup_current_bytes": 6 * GIB,
        "cgroup_limit_bytes": 8 * GIB,
        "cgroup_peak_bytes": 7 * GIB,
        "cgroup_oom_kill": 2,
        "cgroup_events_max": 12,
        "alive": True,
        "data_bytes": 2_000_000 * KIB,  # no process has a data limit: the largest VmData
        "data_limit_bytes": None,
    }
    assert read(host, 100)["processes"] == 5  # from the launcher: it and the whole server


def test_the_process_nearest_its_data_limit(host: FakeHost) -> None:
    """``prlimit --data`` on the launcher: every process inherits it and each is bounded apart; the line
    names the one with the least headroom, not the largest, and not the tree's sum."""
    limit = 1_300_000_000
    cgroup = "0::/user.slice\n"
    host.process(100, 1, comm="prlimit", rss_kib=3000, data_kib=500, data_limit=limit, cgroup=cgroup)
    host.process(200, 100, comm="vllm", rss_kib=400_000, data_kib=1_000_000, data_limit=limit, cgroup=cgroup)
    host.process(300, 200, comm="VLLM::EngineCor", rss_kib=900_000, data_kib=1_250_000, data_limit=limit)
    host.process(400, 300, comm="VLLM::Worker", rss_kib=1_500_000, data_kib=1_200_000, data_limit=2 * limit)
    host.cgroup_v2("/user.slice", current=6 * GIB, max_bytes=None, peak=None, oom_kill=0)
    line = read(host, 100)
    assert (line["data_bytes"], line["data_limit_bytes"]) == (1_250_000 * KIB, limit)
    assert line["rss_bytes"] == (3000 + 400_000 + 900_000 + 1_500_000) * KIB
    # a limit set on a running process (prlimit --pid) is read for a process seen for the first time
    host.process(401, 300, comm="VLLM::Worker", rss_kib=10, data_kib=1_000, data_limit=1_100_000)
    assert (read(host, 100)["data_bytes"], read(host, 100)["data_limit_bytes"]) == (1_000 * KIB, 1_100_000)


def test_v2_without_peak_and_without_limit(host: FakeHost) -> None:
    vllm_tree(host)
    host.cgroup_v2("/kubepods/pod1/c1", current=5 * GIB, max_bytes=None, peak=None, oom_kill=0)
    line = read(host, 200)
    assert (line["cgroup_limit_bytes"], line["cgroup_peak_bytes"], line["cgroup_oom_kill"]) == (None, None, 0)
    assert line["cgroup_events_max"] == 0
    assert "error" not in line  # memory.peak is absent before Linux 5.19: not an error


def test_inside_a_cgroup_namespace_the_mount_is_the_cgroup(host: FakeHost) -> None:
    vllm_tree(host, cgroup="0::/\n")
    host.cgroup_v2("/", current=3 * GIB, max_bytes=4 * GIB, peak=3 * GIB)
    line = read(host, 200)
    assert (line["cgroup"], line["cgroup_current_bytes"], line["cgroup_limit_bytes"]) == (
        "v2:/",
        3 * GIB,
        4 * GIB,
    )


@pytest.mark.parametrize(
    ("limit", "oom_kill", "expected_limit"),
    [(V1_UNLIMITED, 0, None), (16 * GIB, 3, 16 * GIB), (16 * GIB, None, 16 * GIB)],
)
def test_v1_memory_cgroup_on_a_hybrid_host(
    host: FakeHost, limit: int, oom_kill: int | None, expected_limit: int | None
) -> None:
    vllm_tree(
        host, cgroup="12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n"
    )
    host.cgroup_v1(
        "/docker/abc", usage=9 * GIB, limit=limit, max_usage=10 * GIB, failcnt=7, oom_kill=oom_kill
    )
    line = read(host, 200)
    assert line["cgroup"] == "v1:/docker/abc"
    assert line["cgroup_current_bytes"] == 9 * GIB
    assert line["cgroup_limit_bytes"] == expected_limit
    assert line["cgroup_peak_bytes"] == 10 * GIB
    assert line["cgroup_events_max"] == 7
    assert line["cgroup_oom_kill"] == oom_kill  # None: Linux < 4.13 has no oom_kill line
    assert "error" not in line


def test_explicit_cgroup_dir_without_a_pid(host: FakeHost) -> None:
    pod = host.cgroup_v2(
        "/kubepods.slice/pod-x", current=2 * GIB, max_bytes=3 * GIB, peak=2 * GIB, populated=True
    )
    line = read(host, None, cgroup_dir=pod)
    assert (line["pid"], line["processes"], line["rss_bytes"], line["cgroup"]) == (
        None,
        None,
        None,
        "v2:/kubepods.slice/pod-x",
    )
    assert line["alive"] is True
    (pod / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert read(host, None, cgroup_dir=pod)["alive"] is False  # no process left in the pod


def test_explicit_v1_cgroup_dir_alive_by_its_procs(host: FakeHost) -> None:
    pod = host.cgroup_v1("/kubepods/pod-y", usage=GIB, procs=(200,))
    assert memory_cgroup_at(pod, host.cgroup).label == "v1:/kubepods/pod-y"
    assert read(host, None, cgroup_dir=pod)["alive"] is True
    (pod / "cgroup.procs").write_text("")
    assert read(host, None, cgroup_dir=pod)["alive"] is False


def test_not_a_memory_cgroup_is_a_config_error(host: FakeHost) -> None:
    with pytest.raises(ConfigError, match=r"does not exist$"):
        memory_cgroup_at(host.cgroup / "nope", host.cgroup)
    (host.cgroup / "unified").mkdir()
    with pytest.raises(ConfigError, match=r"neither memory.current \(cgroup v2\) nor memory.usage_in_bytes"):
        memory_cgroup_at(host.cgroup / "unified", host.cgroup)


def test_a_pid_that_never_ran(host: FakeHost) -> None:
    vllm_tree(host)
    line = read(host, 999)
    assert line["alive"] is False
    assert (line["processes"], line["rss_bytes"], line["cgroup"]) == (None, None, None)
    assert line["error"] == "pid 999 is not running"


def test_unreadable_files_are_none_and_one_error(host: FakeHost) -> None:
    vllm_tree(host)
    cg = host.cgroup_v2("/kubepods/pod1/c1", current=GIB, peak=GIB)
    (cg / "memory.max").unlink()
    for pid in (300, 400):  # smaps_rollup that cannot be read (a directory here; EACCES for non-root)
        (host.proc / str(pid) / "smaps_rollup").unlink()
        (host.proc / str(pid) / "smaps_rollup").mkdir()
    line = read(host, 200)
    assert line["pss_bytes"] is None
    assert line["rss_bytes"] == (500_000 + 800_000 + 2 * 2_000_000) * KIB
    assert line["cgroup_current_bytes"] == GIB and line["cgroup_limit_bytes"] is None
    error = str(line["error"])
    assert error.startswith("cannot read the PSS of pid 300, 400 (")
    assert f"{cg / 'memory.max'} (no such file)" in error
    assert "\n" not in error


def test_a_cgroup_that_is_gone_says_so_once(host: FakeHost) -> None:
    vllm_tree(host)
    cg = host.cgroup_v2("/kubepods/pod1/c1", current=GIB)
    reader = LocalServerMemory(200, proc_root=host.proc, cgroup_root=host.cgroup)
    assert reader.read()["cgroup_current_bytes"] == GIB
    shutil.rmtree(cg)
    line = reader.read()
    assert line["cgroup"] == "v2:/kubepods/pod1/c1"
    assert line["cgroup_current_bytes"] is None and line["cgroup_limit_bytes"] is None
    assert line["error"] == f"cannot read {cg / 'memory.current'} (no such file)"


def test_a_cgroup_outside_this_namespace(host: FakeHost) -> None:
    host.process(200, 1, cgroup="0::/../../other\n")
    line = read(host, 200)
    assert line["cgroup"] is None
    assert (
        line["error"]
        == "cannot read the memory cgroup of pid 200 (/../../other: outside this cgroup namespace)"
    )


def test_a_child_that_vanishes_mid_read_is_no_error(host: FakeHost) -> None:
    vllm_tree(host)
    host.cgroup_v2("/kubepods/pod1/c1", current=GIB)
    (host.proc / "401" / "status").unlink()  # listed by the scan, gone when its status is read
    line = read(host, 200)
    assert line["processes"] == 3
    assert line["rss_bytes"] == (500_000 + 800_000 + 2_000_000) * KIB
    assert "error" not in line


def test_root_gone_orphans_still_counted_cgroup_still_read(host: FakeHost) -> None:
    vllm_tree(host)
    host.cgroup_v2("/kubepods/pod1/c1", current=5 * GIB, oom_kill=0)
    reader = LocalServerMemory(200, proc_root=host.proc, cgroup_root=host.cgroup, pss_share=1)
    assert reader.read()["processes"] == 4
    shutil.rmtree(host.proc / "200")  # the API server died; EngineCore is reparented to init
    host.process(300, 1, comm="VLLM::EngineCor", rss_kib=800_000, pss_kib=700_000)
    host.cgroup_v2("/kubepods/pod1/c1", current=4 * GIB, oom_kill=1)
    line = reader.read()
    assert line["alive"] is False
    assert line["processes"] == 3  # EngineCore and both workers still hold memory
    assert line["rss_bytes"] == (800_000 + 2 * 2_000_000) * KIB
    assert (line["cgroup_current_bytes"], line["cgroup_oom_kill"]) == (4 * GIB, 1)
    assert "error" not in line
    for pid in ("300", "400", "401"):
        shutil.rmtree(host.proc / pid)
    line = reader.read()
    assert (line["alive"], line["processes"], line["rss_bytes"], line["pss_bytes"]) == (False, 0, 0, 0)
    assert line["cgroup_current_bytes"] == 4 * GIB


def test_a_reused_pid_is_not_the_server(host: FakeHost) -> None:
    host.process(200, 1, start_ticks=5000)
    reader = LocalServerMemory(200, proc_root=host.proc, cgroup_root=host.cgroup)
    assert reader.read()["alive"] is True
    shutil.rmtree(host.proc / "200")
    host.process(200, 1, comm="cron", start_ticks=9000, rss_kib=4)  # another process got the pid
    line = reader.read()
    assert (line["alive"], line["processes"], line["rss_bytes"]) == (False, 0, 0)


def test_a_zombie_root_is_dead(host: FakeHost) -> None:
    host.process(200, 1, state="Z", rss_kib=None, pss_kib=None)
    line = read(host, 200)
    assert (line["alive"], line["processes"], line["rss_bytes"]) == (False, 0, 0)


def test_find_listening_pid_topmost_of_forked_holders(host: FakeHost) -> None:
    vllm_tree(host)
    host.listen(8000, 777)
    host.connection(8000, 778)  # an accepted connection on the same local port is no listener
    host.listen(9000, 901, v6=True)
    host.process(200, 100, comm="vllm", sockets=(777, 778))
    host.process(210, 200, comm="vllm", sockets=(777,))  # a forked API server process
    host.process(500, 1, comm="sshd", sockets=(778,))
    host.process(600, 1, comm="nginx", sockets=(901,))
    assert find_listening_pids(8000, host.proc) == [200, 210]
    assert find_listening_pid(8000, host.proc) == 200
    assert find_listening_pid(9000, host.proc) == 600  # tcp6 only
    assert find_listening_pid(8001, host.proc) is None


def test_check_doubts_a_lone_process_that_listens_nowhere(host: FakeHost) -> None:
    host.process(50, 1, comm="bash")
    host.process(60, 1, comm="python (x)", sockets=(1234,))
    host.listen(8000, 1234, net=host.proc / "60" / "net")
    host.process(70, 1, comm="sh")
    host.process(71, 70, comm="sleep")

    def check(pid: int) -> str | None:
        return LocalServerMemory(pid, proc_root=host.proc, cgroup_root=host.cgroup).check()

    assert check(50) == "pid 50 (bash) listens on no TCP port and has no child processes: is it the server?"
    assert check(60) is None  # listens (in its own network namespace's table)
    assert check(70) is None  # a launcher: it has children
    assert check(99) == "pid 99 is not running"


def test_pss_is_read_at_a_bounded_share_of_the_time(host: FakeHost) -> None:
    vllm_tree(host)
    host.cgroup_v2("/kubepods/pod1/c1", current=GIB)
    every = LocalServerMemory(200, proc_root=host.proc, cgroup_root=host.cgroup, pss_share=1)
    assert all(every.read()["pss_bytes"] == 4_900_000 * KIB for _ in range(3))
    never = LocalServerMemory(200, proc_root=host.proc, cgroup_root=host.cgroup, pss_share=0)
    line = never.read()
    assert (line["pss_bytes"], line["rss_bytes"]) == (None, 5_300_000 * KIB)
    rarely = LocalServerMemory(200, proc_root=host.proc, cgroup_root=host.cgroup, pss_share=1e-9)
    first, second = rarely.read(), rarely.read()  # the next PSS read is due in ~days
    assert first["pss_bytes"] == 4_900_000 * KIB
    assert second["pss_bytes"] is None and "error" not in second


def test_a_v1_container_sees_its_own_cgroup_at_the_mount_point(host: FakeHost) -> None:
    vllm_tree(host, cgroup="4:memory:/docker/abc\n1:name=systemd:/docker/abc\n")
    mount = host.cgroup / "memory"
    (host.proc / "self").mkdir()
    (host.proc / "self" / "mountinfo").write_text(
        f"612 603 0:71 / {host.cgroup} ro,nosuid - tmpfs tmpfs rw,mode=755\n"
        f"615 612 0:32 /docker/abc {mount} ro,relatime master:15 - cgroup cgroup rw,memory\n"
    )
    host.cgroup_v1("/", usage=3 * GIB, limit=4 * GIB)  # the container's cgroup, at the mount itself
    line = read(host, 200)
    assert (line["cgroup"], line["cgroup_current_bytes"], line["cgroup_limit_bytes"]) == (
        "v1:/docker/abc",
        3 * GIB,
        4 * GIB,
    )
    assert "error" not in line
