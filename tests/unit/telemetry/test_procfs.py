"""The kernel's process and memory cgroup files, parsed: texts exactly as Linux writes them."""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.telemetry.procfs import (
    CgroupEntry,
    Mount,
    ProcStat,
    TcpSocket,
    cgroup_mount_dir,
    descendants,
    memory_cgroup_entry,
    parse_cgroup_bytes,
    parse_flat_keyed,
    parse_mountinfo,
    parse_proc_cgroup,
    parse_proc_net_tcp,
    parse_proc_stat,
    parse_proc_status,
    parse_smaps_rollup,
    parse_v1_limit,
)

from .fakeproc import TCP6_HEADER, TCP_HEADER, smaps_rollup_text, stat_text, status_text, tcp_line

# A real line (this machine's `cat /proc/self/stat`).
REAL_STAT = (
    "32016 (cat) R 32010 32010 2696 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 53866 3133440 389 "
    "18446744073709551615 94845187620864 94845187640745 140737395339936 0 0 0 0 0 0 0 0 0 17 1 0 0 0 "
    "0 0 94845187656752 94845187658368 94845432922112 140737395342050 140737395342070 140737395342070 "
    "140737395343339 0\n"
)


def test_stat_of_a_real_line() -> None:
    assert parse_proc_stat(REAL_STAT) == ProcStat(
        pid=32016, comm="cat", state="R", ppid=32010, start_ticks=53866
    )


@pytest.mark.parametrize("comm", ["VLLM::EngineCor", "a b", "x) S 1 (y", "((", ") 1 2 3 4", ""])
def test_stat_comm_with_spaces_and_parentheses(comm: str) -> None:
    stat = parse_proc_stat(stat_text(4242, comm, "S", 17, 99999))
    assert (stat.pid, stat.comm, stat.state, stat.ppid, stat.start_ticks) == (4242, comm, "S", 17, 99999)


@given(st.text(alphabet=st.characters(blacklist_characters="\n\x00"), max_size=15))
def test_stat_comm_any_text(comm: str) -> None:
    stat = parse_proc_stat(stat_text(7, comm, "Z", 1, 3))
    assert (stat.comm, stat.ppid, stat.state) == (comm, 1, "Z")


@pytest.mark.parametrize("text", ["", "12 cat S 1", "12 (cat) S 1 2 3\n"])
def test_stat_that_is_not_one(text: str) -> None:
    with pytest.raises(ValueError):
        parse_proc_stat(text)


def test_status_rss_and_hwm_in_bytes() -> None:
    status = parse_proc_status(status_text(12, 1, "python3", "S", 204_800, None))
    assert (status.name, status.rss_bytes, status.hwm_bytes) == ("python3", 204_800 * 1024, 204_800 * 1024)
    real = "Name:\tcat\nVmPeak:\t    3776 kB\nVmHWM:\t    1924 kB\nVmRSS:\t    1800 kB\nRssAnon:\t 144 kB\n"
    assert parse_proc_status(real).rss_bytes == 1800 * 1024
    assert parse_proc_status(real).hwm_bytes == 1924 * 1024


def test_status_of_a_zombie_has_no_rss() -> None:
    status = parse_proc_status(status_text(12, 1, "python3", "Z", None, None))
    assert (status.rss_bytes, status.hwm_bytes) == (None, None)


def test_smaps_rollup_pss() -> None:
    assert parse_smaps_rollup(smaps_rollup_text(1732, 341)) == 341 * 1024
    assert parse_smaps_rollup("") is None


def test_proc_cgroup_v2_v1_and_hybrid() -> None:
    assert parse_proc_cgroup("0::/system.slice/vllm.service\n") == (
        CgroupEntry(0, (), "/system.slice/vllm.service"),
    )
    hybrid = parse_proc_cgroup(
        "12:cpu,cpuacct:/docker/abc\n9:name=systemd:/\n4:memory:/process_api/5e2e\n0::/\n"
    )
    assert hybrid[0] == CgroupEntry(12, ("cpu", "cpuacct"), "/docker/abc")
    assert memory_cgroup_entry(hybrid) == (1, "/process_api/5e2e")  # v1 holds the memory controller
    assert memory_cgroup_entry(parse_proc_cgroup("0::/\n")) == (2, "/")  # in a cgroup namespace
    assert memory_cgroup_entry(parse_proc_cgroup("3:cpu,memory:/a:b\n")) == (1, "/a:b")
    assert memory_cgroup_entry(parse_proc_cgroup("5:cpu:/x\n")) is None


def test_cgroup_numbers() -> None:
    assert parse_cgroup_bytes("max\n") is None
    assert parse_cgroup_bytes("8589934592\n") == 8589934592
    with pytest.raises(ValueError):
        parse_cgroup_bytes("lots\n")


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("9223372036854771712\n", None),  # 4 KiB pages
        ("9223372036854710272\n", None),  # 64 KiB pages (arm64, ppc64)
        ("9223372036854775807\n", None),
        ("4294967296\n", 4294967296),
    ],
)
def test_v1_limit(text: str, limit: int | None) -> None:
    assert parse_v1_limit(text) == limit


def test_flat_keyed_files() -> None:
    events = parse_flat_keyed("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert events == {"low": 0, "high": 0, "max": 12, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}
    assert parse_flat_keyed("oom_kill_disable 0\nunder_oom 0\n").get("oom_kill") is None


def test_proc_net_tcp_and_tcp6() -> None:
    text = TCP_HEADER + tcp_line(0, 8000, 0x0A, 1080) + tcp_line(1, 8000, 0x01, 0)
    assert parse_proc_net_tcp(text) == (TcpSocket(8000, 0x0A, 1080), TcpSocket(8000, 0x01, 0))
    six = TCP6_HEADER + tcp_line(0, 0x1F90, 0x0A, 23456, v6=True)
    assert parse_proc_net_tcp(six) == (TcpSocket(8080, 0x0A, 23456),)
    real = (
        "   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1080 1 "
        "00000000361459f2 100 0 0 10 0\n"
    )
    assert parse_proc_net_tcp(real) == (TcpSocket(2024, 0x0A, 1080),)


def test_descendants_breadth_first_root_first() -> None:
    def stat(pid: int, ppid: int) -> ProcStat:
        return ProcStat(pid, "p", "S", ppid, 1)

    stats = {
        p.pid: p for p in [stat(1, 0), stat(10, 1), stat(20, 10), stat(21, 10), stat(30, 20), stat(5, 1)]
    }
    assert descendants(10, stats) == [10, 20, 21, 30]
    assert descendants(99, stats) == []
    loop = {1: stat(1, 2), 2: stat(2, 1)}  # a parent cycle (pid reuse in the middle of a scan)
    assert descendants(1, loop) == [1, 2]


# A host's mounts (cgroup v1 hybrid, with the v2 unified mount) and a v1 container's (docker without a
# cgroup namespace: each hierarchy's mount shows the container's own cgroup).
HOST_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""
DOCKER_V1_MOUNTINFO = """\
612 603 0:71 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
615 612 0:32 /docker/abc /sys/fs/cgroup/memory ro,relatime master:15 - cgroup cgroup rw,memory
616 612 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,relatime master:12 - cgroup cgroup rw,cpu,cpuacct
620 603 8:1 /var/lib/my\\040dir /data\\040here rw,relatime - ext4 /dev/sda1 rw
"""


def test_mountinfo() -> None:
    mounts = parse_mountinfo(DOCKER_V1_MOUNTINFO)
    assert mounts[1] == Mount("/docker/abc", "/sys/fs/cgroup/memory", "cgroup", ("rw", "memory"))
    assert (mounts[3].root, mounts[3].mount_point) == ("/var/lib/my dir", "/data here")
    assert parse_mountinfo("garbage\n") == ()


@pytest.mark.parametrize(
    ("mountinfo", "version", "path", "where"),
    [
        (HOST_MOUNTINFO, 1, "/process_api/5e2e", "/sys/fs/cgroup/memory/process_api/5e2e"),
        (HOST_MOUNTINFO, 2, "/user.slice", "/sys/fs/cgroup/unified/user.slice"),
        (HOST_MOUNTINFO, 1, "/", "/sys/fs/cgroup/memory"),
        (DOCKER_V1_MOUNTINFO, 1, "/docker/abc", "/sys/fs/cgroup/memory"),
        (DOCKER_V1_MOUNTINFO, 1, "/docker/abc/inner", "/sys/fs/cgroup/memory/inner"),
        (DOCKER_V1_MOUNTINFO, 1, "/docker/abcd", None),  # a sibling's prefix is not its parent
        (DOCKER_V1_MOUNTINFO, 1, "/docker/other", None),
        (DOCKER_V1_MOUNTINFO, 2, "/", None),  # no cgroup2 mount
    ],
)
def test_cgroup_mount_dir(mountinfo: str, version: Literal[1, 2], path: str, where: str | None) -> None:
    assert cgroup_mount_dir(parse_mountinfo(mountinfo), version, path) == where
