"""The simulator's host memory: the ballast, the leak, the two kinds of limit (RSS and kill faked)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from oomload.cli import main
from oomload.sim.hostmem import (
    CHUNK_BYTES,
    DEFAULT_LEAK_CAP_BYTES,
    MIB,
    AllocationFailed,
    HostMemory,
    HostMemoryConfig,
    read_rss_bytes,
)


class FakeProcess:
    """RSS = a fixed interpreter size + the ballast; ``kill`` records instead of dying."""

    def __init__(self, interpreter_bytes: int = 50 * MIB) -> None:
        self.interpreter_bytes = interpreter_bytes
        self.memory: HostMemory | None = None
        self.kills: list[int] = []

    def rss(self) -> int:
        assert self.memory is not None
        return self.interpreter_bytes + self.memory.held_bytes

    def kill(self) -> None:
        assert self.memory is not None
        self.kills.append(self.rss())


def _memory(config: HostMemoryConfig, fake: FakeProcess | None = None) -> tuple[HostMemory, FakeProcess]:
    fake = fake or FakeProcess()
    memory = HostMemory(config, start_s=100.0, rss_bytes=fake.rss, kill=fake.kill)
    fake.memory = memory
    return memory, fake


def test_the_model_is_base_plus_tokens_plus_a_capped_leak() -> None:
    config = HostMemoryConfig(
        base_bytes=10 * MIB, bytes_per_token=1024, leak_bytes_per_s=MIB, leak_cap_bytes=5 * MIB
    )
    assert config.modelled_bytes(0, 0.0) == 10 * MIB
    assert config.modelled_bytes(2048, 3.0) == 10 * MIB + 2 * MIB + 3 * MIB
    assert config.modelled_bytes(0, 60.0) == 15 * MIB  # the cap
    assert config.modelled_bytes(0, -1.0) == 10 * MIB
    assert not HostMemoryConfig().enabled and HostMemoryConfig(limit_bytes=MIB).enabled


def test_the_default_leak_cap_bounds_a_leak_only_without_a_limit() -> None:
    unbounded = HostMemoryConfig(leak_bytes_per_s=MIB)
    assert unbounded.leak_bytes(1e9) == DEFAULT_LEAK_CAP_BYTES
    limited = HostMemoryConfig(leak_bytes_per_s=MIB, limit_bytes=100 * MIB)
    assert limited.leak_bytes(1e6) == 1e6 * MIB  # grows until the limit ends it


def test_the_ballast_follows_the_tokens_up_and_down_and_the_leak_with_the_clock() -> None:
    memory, _ = _memory(HostMemoryConfig(bytes_per_token=MIB // 4, leak_bytes_per_s=MIB / 2))
    assert memory.update(tokens=10, now_s=100.0) is None
    assert memory.held_bytes == 3 * CHUNK_BYTES  # 2.5 MiB → 3 chunks
    memory.update(tokens=0, now_s=100.0)
    assert memory.held_bytes == 0  # the requests were answered: their memory goes back
    memory.update(tokens=0, now_s=110.0)
    assert memory.held_bytes == 5 * MIB  # 10 s at 0.5 MiB/s
    memory.release()
    assert memory.held_bytes == 0


def test_a_container_limit_kills_at_the_chunk_that_crosses_it() -> None:
    memory, fake = _memory(HostMemoryConfig(bytes_per_token=MIB, limit_bytes=80 * MIB))
    assert memory.update(tokens=20, now_s=100.0) is None and fake.kills == []
    failed = memory.update(tokens=100, now_s=100.0)
    assert fake.kills == [80 * MIB]  # mapped up to the limit, then the OOM killer
    assert memory.held_bytes == 30 * MIB
    assert failed == AllocationFailed(80 * MIB, 80 * MIB)  # only a fake kill returns


def test_a_process_limit_refuses_the_whole_growth_and_maps_nothing() -> None:
    memory, fake = _memory(HostMemoryConfig(bytes_per_token=MIB, limit_bytes=80 * MIB, limit_kind="process"))
    assert memory.update(tokens=20, now_s=100.0) is None
    failed = memory.update(tokens=40, now_s=100.0)
    assert failed == AllocationFailed(tried_bytes=20 * MIB, rss_bytes=70 * MIB)
    assert memory.held_bytes == 20 * MIB and fake.kills == []


def test_real_rss_is_read_from_proc() -> None:
    assert 5 * MIB < read_rss_bytes() < 8 * 1024 * MIB


def test_the_ballast_is_resident() -> None:
    """Mapped and written: RSS grows by the ballast (in a fresh process, whose RSS nothing else moves)."""
    code = (
        "from oomload.sim.hostmem import MIB, HostMemory, HostMemoryConfig, read_rss_bytes\n"
        "memory = HostMemory(HostMemoryConfig(base_bytes=32 * MIB), start_s=0.0)\n"
        "before = read_rss_bytes()\n"
        "memory.update(tokens=0, now_s=0.0)\n"
        "grown = read_rss_bytes() - before\n"
        "memory.release()\n"
        "print(grown, read_rss_bytes() - before)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown, after_release = (int(v) for v in done.stdout.split())
    assert 30 * MIB <= grown <= 34 * MIB
    assert after_release < 2 * MIB  # unmapped: the memory went back


def test_an_unknown_limit_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="limit_kind"):
        HostMemoryConfig(limit_kind="cgroup-v3")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--host-memory-limit-mib", "0"], "--host-memory-limit-mib must be a finite number > 0, got 0.0"),
        (["--host-leak-mib-per-min", "-1"], "--host-leak-mib-per-min must be a finite number ≥ 0, got -1.0"),
        (["--host-bytes-per-token", "-5"], "--host-bytes-per-token must be an integer ≥ 0, got -5"),
        (["--host-base-mib", "nan"], "--host-base-mib must be a finite number ≥ 0, got nan"),
    ],
)
def test_bad_host_memory_flags_are_one_line_errors(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "serve", "--port", "0", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("oomload: error:")
