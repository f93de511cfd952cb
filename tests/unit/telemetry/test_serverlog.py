"""The server-log follower on real files: a thread, appends, late creation, truncation, rotation, the
cap, a dest that cannot be written. No timing assertions: each test polls until a condition holds,
with a bounded deadline."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from oomload.errors import ConfigError
from oomload.telemetry.serverlog import ServerLogFollower
from oomload.verdict.deathcause import DeathKind, classify_death

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "server-logs" / "cuda-oom-v1.txt"
DEADLINE_S = 10.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        time.sleep(0.005)


def append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "vllm.log", tmp_path / "run" / "server.log"


@pytest.fixture
def follow(paths: tuple[Path, Path]) -> Iterator[Callable[..., ServerLogFollower]]:
    """Builds and starts followers on ``paths``; stops each at the end."""
    started: list[ServerLogFollower] = []
    paths[1].parent.mkdir()

    def make(**kwargs: object) -> ServerLogFollower:
        options: dict[str, object] = {"poll_s": 0.01, **kwargs}
        follower = ServerLogFollower(paths[0], paths[1], **options)  # type: ignore[arg-type]
        follower.start()
        started.append(follower)
        return follower

    yield make
    for follower in started:
        follower.stop()


def test_only_what_is_appended_after_start_is_copied_bytes_as_written(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    source, dest = paths
    source.write_text("an older life: torch.OutOfMemoryError: CUDA out of memory\n")
    follower = follow()
    append(source, "one\n")
    append(source, "two, half")
    wait_until(lambda: dest.read_bytes() == b"one\ntwo, half", "the partial line is copied as it is")
    append(source, " and the rest\n")
    wait_until(lambda: dest.read_bytes() == b"one\ntwo, half and the rest\n", "its rest follows")
    follower.stop()
    assert follower.text() == "one\ntwo, half and the rest\n"
    assert follower.copied_bytes == len(b"one\ntwo, half and the rest\n")
    assert follower.problems == []


def test_a_file_created_after_start_is_copied_from_its_first_byte(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    source, dest = paths
    heard: list[str] = []
    follower = follow(on_problem=heard.append)
    wait_until(lambda: len(follower.problems) == 1, "one sentence while the file is missing")
    time.sleep(0.05)  # several more polls of a missing file
    source.write_text("first line of the kubectl stream\n")
    wait_until(lambda: dest.read_text() == "first line of the kubectl stream\n", "the late file is copied")
    assert (
        follower.problems
        == heard
        == [f"the server log {source} does not exist yet; waiting for it to appear"]
    )


def test_truncation_reads_the_file_again_from_its_start(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    source, dest = paths
    source.write_text("written before the run\n")
    follower = follow()
    append(source, "one, no newline")
    wait_until(lambda: dest.read_text() == "one, no newline", "the first text")
    source.write_text("")  # truncated in place (same inode)
    append(source, "two\n")
    wait_until(lambda: dest.read_text() == "one, no newline\ntwo\n", "the truncated file from its start")
    assert follower.problems == [f"the server log {source} was truncated; reading it again from its start"]


def test_a_rewrite_in_place_longer_than_what_was_read_is_seen_by_its_first_bytes(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    source, dest = paths
    source.write_text("life 1\n")
    follower = follow(poll_s=3600)  # one poll at start, then only the polls below
    append(source, "x\n")
    follower.poll_once()
    assert dest.read_text() == "x\n"
    with source.open("r+b") as f:  # same inode, now longer than the offset read so far
        f.write(b"LIFE 2 starts with other bytes and is longer\n")
        f.truncate()
    follower.poll_once()
    assert dest.read_text() == "x\nLIFE 2 starts with other bytes and is longer\n"
    assert follower.problems == [f"the server log {source} was truncated; reading it again from its start"]


def test_rotation_drains_the_old_file_then_reads_the_new_one(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower], tmp_path: Path
) -> None:
    source, dest = paths
    server = source.open("ab")  # the server's own descriptor, kept across the rotation
    follower = follow()
    server.write(b"a\n")
    server.flush()
    wait_until(lambda: dest.read_text() == "a\n", "the first line")
    server.write(b"the old file's last words, no newline")
    server.flush()
    fresh = tmp_path / "fresh"
    fresh.write_text("new\n")
    os.link(source, tmp_path / "vllm.log.1")  # rename by link + replace: the path is never missing
    os.replace(fresh, source)
    wait_until(lambda: dest.read_text().endswith("new\n"), "the new file")
    server.close()
    assert dest.read_text() == "a\nthe old file's last words, no newline\nnew\n"
    assert follower.problems == [f"the server log {source} was replaced (rotated); reading the new file"]


def test_a_removed_file_is_waited_for_and_its_successor_read_from_its_start(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    source, dest = paths
    source.touch()
    follower = follow(poll_s=3600)  # one poll at start, then only the polls below
    append(source, "a")
    follower.poll_once()
    source.unlink()
    follower.poll_once()
    follower.poll_once()
    source.write_text("b\n")
    follower.poll_once()
    assert dest.read_text() == "a\nb\n"
    assert follower.problems == [f"the server log {source} disappeared; waiting for it to come back"]


def test_past_the_cap_only_the_tail_is_kept_and_written_at_the_end(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    source, dest = paths
    source.touch()
    follower = follow(max_bytes=10, tail_bytes=8)
    append(source, "0123456789abcdef\n")
    wait_until(lambda: follower.text().endswith("abcdef\n"), "the first write past the cap")
    append(source, "EngineCore encountered a fatal error.\ndeath\n")
    wait_until(lambda: follower.text().endswith("death\n"), "the tail")
    assert dest.read_text() == "0123456789"  # the copy on disk stops at the cap
    follower.stop()
    past_the_cap = "abcdef\nEngineCore encountered a fatal error.\ndeath\n"
    left_out = len(past_the_cap) - 8
    expected = f"0123456789\n[oomload: {left_out} bytes of the server log left out here]\n.\ndeath\n"
    assert dest.read_text() == follower.text() == expected
    assert follower.copied_bytes == 10
    assert len(follower.problems) == 1 and "passed 10 bytes" in follower.problems[0]


def test_a_dest_that_cannot_be_opened_is_one_sentence_and_the_text_is_still_followed(
    tmp_path: Path,
) -> None:
    source = tmp_path / "vllm.log"
    source.touch()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the run directory should be\n")
    follower = ServerLogFollower(source, blocker / "server.log", poll_s=0.01)
    follower.start()
    try:
        append(source, "still followed\n")
        wait_until(lambda: follower.text() == "still followed\n", "the text in memory")
    finally:
        follower.stop()
    assert len(follower.problems) == 1
    assert follower.problems[0].startswith(f"cannot write {blocker / 'server.log'} (Not a directory)")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to fail a write")
def test_a_failing_write_stops_the_copy_with_one_sentence(tmp_path: Path) -> None:
    source = tmp_path / "vllm.log"
    source.touch()
    follower = ServerLogFollower(source, Path("/dev/full"), poll_s=0.01)
    follower.start()
    try:
        append(source, "one\n")
        wait_until(lambda: follower.problems != [], "the failed write")
        append(source, "two\n")
        wait_until(lambda: follower.text() == "one\ntwo\n", "the text in memory")
    finally:
        follower.stop()
    assert follower.problems == [
        "writing /dev/full failed (No space left on device): the server log is no longer copied there"
    ]


def test_stalled_counts_from_start_then_from_the_last_growth(paths: tuple[Path, Path]) -> None:
    source, dest = paths
    source.touch()
    dest.parent.mkdir()
    now = [100.0]
    follower = ServerLogFollower(source, dest, poll_s=0.01, clock=lambda: now[0])
    assert follower.stalled_s() == 0.0  # not started
    follower.start()
    try:
        now[0] = 103.0
        assert follower.stalled_s() == 3.0
        append(source, "growth\n")
        wait_until(lambda: follower.copied_bytes == 7, "the growth is read at t=103")
        now[0] = 110.0
        assert follower.stalled_s() == 7.0
    finally:
        follower.stop()


def test_a_bug_in_the_thread_ends_it_with_a_sentence_not_an_exception(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    source, _ = paths
    source.touch()

    def boom(sentence: str) -> None:
        raise RuntimeError("boom")

    follower = follow(on_problem=boom)
    source.unlink()  # the thread's next poll has a problem, and the callback raises
    wait_until(lambda: len(follower.problems) == 2, "the thread records its end")
    assert follower.problems[1] == "following the server log stopped: RuntimeError: boom"


def test_copying_onto_itself_and_bad_numbers_are_config_errors(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(ConfigError, match="onto itself"):
        ServerLogFollower(log, tmp_path / "." / "server.log")
    with pytest.raises(ConfigError, match="max_bytes=0"):
        ServerLogFollower(log, tmp_path / "copy.log", max_bytes=0)


def test_stop_without_start_copies_nothing(paths: tuple[Path, Path]) -> None:
    source, dest = paths
    source.write_text("not this run's\n")
    follower = ServerLogFollower(source, dest)
    follower.stop()
    assert follower.text() == "" and not dest.exists()


def test_what_it_follows_is_what_the_classifier_reads(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    source, _ = paths
    source.touch()
    follower = follow()
    data = FIXTURE.read_bytes()
    for start in range(0, len(data), 997):  # chunks that cut lines anywhere
        with source.open("ab") as f:
            f.write(data[start : start + 997])
    wait_until(lambda: follower.copied_bytes == len(data), "the whole excerpt")
    cause = classify_death(log_text=follower.text(), exit_status=None, memory=[])
    assert cause.kind is DeathKind.CUDA_OOM and cause.tried_bytes == 2 * 1024**3


SECRET = "sk-SECRET123abc"


def test_secrets_never_reach_the_disk_even_split_between_reads(
    paths: tuple[Path, Path], follow: Callable[..., ServerLogFollower]
) -> None:
    """vLLM's start-up line names its --api-key: the copy has ``***`` in its place before the run ends
    (a killed oomload leaves no secret), also when the key arrives in two reads."""
    source, dest = paths
    follower = follow(secrets=(SECRET, None, "sk-other-key"))
    line = f"INFO non-default args: {{'api_key': ['{SECRET}'], 'model': 'm'}}\n"
    cut = line.index(SECRET) + 5
    append(source, line[:cut])
    wait_until(lambda: dest.read_bytes() != b"", "the first part copied")
    append(source, line[cut:] + "key sk-other-key at the end: sk-SE")
    wait_until(lambda: b"the end" in dest.read_bytes(), "the rest copied")
    assert SECRET not in dest.read_text() and "sk-other-key" not in dest.read_text()
    assert "'api_key': ['***']" in dest.read_text() and "key *** at" in dest.read_text()
    assert dest.read_text().endswith("the end: ")  # a possible start of a secret waits
    follower.stop()
    # the log ended there: what began a secret is written as *** (the writer may have been killed in it)
    assert dest.read_text().endswith("the end: ***")
    assert SECRET not in follower.text()
