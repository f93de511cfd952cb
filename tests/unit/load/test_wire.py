"""The master/worker messages' pure parts: addresses, version checks, the trace and the config forms,
and the batching of a worker's results."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oomload.errors import ConfigError, ExitCode, OutputWriteError
from oomload.load import wire
from oomload.load.payload import PayloadOptions
from oomload.load.resultstream import ResultStream
from oomload.outcome import Outcome, RequestResult
from oomload.run.config import LoadOptions, ReplayConfig
from oomload.run.worker_node import _RowFile
from oomload.trace.model import TraceRecord


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.5", ("10.0.0.5", 5557)),
        ("load-master:6000", ("load-master", 6000)),
        ("[::1]:7000", ("::1", 7000)),
        ("[fe80::1]", ("fe80::1", 5557)),
    ],
)
def test_master_addresses(text: str, expected: tuple[str, int]) -> None:
    assert wire.parse_master_address(text) == expected


@pytest.mark.parametrize("text", ["", "host:0", "host:70000", "host:http", "user@host:5557", "[::1"])
def test_bad_master_addresses_are_one_sentence(text: str) -> None:
    with pytest.raises(ConfigError, match="--master"):
        wire.parse_master_address(text)


def test_versions_must_match() -> None:
    master = {"oomload_version": "0.1.0", "locust_version": "2.47.0"}
    assert wire.version_mismatch(master, {"oomload_version": "0.1.0", "locust_version": "2.47.3"}) is None
    why = wire.version_mismatch(master, {"oomload_version": "0.0.9", "locust_version": "2.47.0"})
    assert why is not None and "oomload 0.0.9" in why and "0.1.0" in why
    why = wire.version_mismatch(master, {"oomload_version": "0.1.0", "locust_version": "2.31.0"})
    assert why is not None and "Locust 2.31.0" in why


def test_the_trace_travels_as_lengths_and_comes_back_equal() -> None:
    records = [TraceRecord("a", 0.5, 100, 7), TraceRecord("b", 1.0, 3000, 1, hash_ids=(1, 2, 3))]
    assert wire.trace_from_wire(wire.trace_to_wire(records)) == records
    with pytest.raises(ConfigError):
        wire.trace_from_wire([])
    with pytest.raises(ConfigError):
        wire.trace_from_wire([{"id": "x"}])


def test_load_options_have_one_serialized_form_without_the_key(tmp_path: Any) -> None:
    config = ReplayConfig(
        trace_path=tmp_path / "t.jsonl", seed=7, request_timeout_s=30.0, api_key_env="MY_KEY"
    )
    options = config.load_options("http://127.0.0.1:8000", "m")
    assert LoadOptions.from_json(options.to_json()) == options
    assert options.payload == PayloadOptions(model="m", seed=7, prompt_salt=config.prompt_salt)
    assert config.prompt_salt != ReplayConfig(trace_path=tmp_path / "t.jsonl").prompt_salt  # each run its own
    assert options.api_key_env == "MY_KEY" and options.request_timeout_s == 30.0
    with pytest.raises(ConfigError, match="unknown shape"):
        LoadOptions.from_json({"url": "x"})


def test_expected_and_local_workers() -> None:
    assert ReplayConfig(trace_path="t").expected_workers() == 0  # type: ignore[arg-type]
    assert ReplayConfig(trace_path="t", processes=3).local_workers() == 3  # type: ignore[arg-type]
    remote = ReplayConfig(trace_path="t", processes=0, workers=4)  # type: ignore[arg-type]
    assert (remote.expected_workers(), remote.local_workers()) == (4, 0)


def _result(i: int) -> RequestResult:
    return RequestResult(
        request_id=f"w0-{i}",
        step=1,
        concurrency=2,
        start_unix_s=10.0 + i,
        end_unix_s=11.0 + i,
        outcome=Outcome.OK,
        prompt_tokens_asked=5,
        output_tokens_asked=3,
    )


class _Copy:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def append(self, stream: str, obj: dict[str, Any]) -> None:
        assert stream == "requests"
        self.rows.append(obj)


def test_results_go_in_numbered_batches_and_nothing_is_lost() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    copy = _Copy()
    stream = ResultStream(lambda kind, data: sent.append((kind, data)), 3, max_rows=4, copy=copy)
    for i in range(10):
        stream.request(_result(i))
    assert [len(d["rows"]) for _, d in sent] == [4, 4]  # full batches go at once
    assert stream.flush() == 2 and stream.flush() == 0  # the rest on flush; nothing twice
    assert {kind for kind, _ in sent} == {wire.RESULTS}
    assert [d["seq"] for _, d in sent] == [0, 1, 2] and all(d["worker"] == 3 for _, d in sent)
    rows = [row for _, d in sent for row in d["rows"]]
    assert rows == [_result(i).to_json() for i in range(10)] == copy.rows
    assert stream.rows_sent == 10


# -- a worker's own copy of its rows (--results FILE): a failing disk stops the worker, never a row ------


def _stream(copy: _RowFile) -> tuple[ResultStream, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    stream = ResultStream(
        lambda kind, data: sent.append(data) if kind == wire.RESULTS else None, 0, copy=copy
    )
    return stream, sent


def test_the_copy_holds_every_row_as_a_json_line(tmp_path: Path) -> None:
    failed: list[str] = []
    copy = _RowFile(tmp_path / "deep" / "rows.jsonl", lambda: failed.append("leave"))
    stream, sent = _stream(copy)
    for i in range(5):
        stream.request(_result(i))
    stream.flush()
    copy.close()
    lines = (tmp_path / "deep" / "rows.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [row for batch in sent for row in batch["rows"]]
    assert copy.rows == 5 and copy.failure() is None and failed == []


@pytest.mark.skipif(
    not Path("/dev/full").exists(), reason="needs /dev/full (a device whose writes fail: disk full)"
)
def test_a_full_disk_stops_the_worker_once_with_one_sentence_and_the_master_gets_every_row() -> None:
    failed: list[str] = []
    copy = _RowFile(Path("/dev/full"), lambda: failed.append("leave"))
    stream, sent = _stream(copy)
    for i in range(300):  # more than a batch: some go at once, the rest on flush
        stream.request(_result(i))
    stream.flush()
    assert [row["request_id"] for batch in sent for row in batch["rows"]] == [f"w0-{i}" for i in range(300)]
    assert failed == ["leave"]  # the worker is told to leave once, not once a row
    failure = copy.failure()
    assert isinstance(failure, OutputWriteError) and failure.exit_code is ExitCode.USAGE
    assert str(failure) == (
        "--results /dev/full could not be written (No space left on device); this worker stopped and "
        "left its master after 0 rows, which the file holds whole — every result it had still went to "
        "the master"
    )
    copy.close()


ROW_FILE_CHILD = """
import resource, signal, sys
from pathlib import Path
from oomload.outcome import Outcome, RequestResult
from oomload.run.worker_node import _RowFile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
left = []
copy = _RowFile(Path(sys.argv[1]), lambda: left.append(1))
for i in range(100):
    copy.append("requests", RequestResult(
        request_id=f"w0-{i}", step=1, concurrency=2, start_unix_s=1.0, end_unix_s=2.0, outcome=Outcome.OK,
        prompt_tokens_asked=10, output_tokens_asked=5,
    ).to_json())
print(copy.rows, len(left), copy.failure())
"""


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="no RLIMIT_FSIZE on this platform")
def test_a_row_cut_off_by_a_file_size_limit_is_removed_so_the_file_ends_on_whole_rows(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"request_id":"an-older-run"}\n')  # --results appends: an older copy is kept
    limit = 2_000
    child = subprocess.run(
        [sys.executable, "-c", ROW_FILE_CHILD, str(path), str(limit)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    rows, left, sentence = child.stdout.strip().split(" ", 2)
    lines = path.read_text().splitlines()
    assert 0 < int(rows) < 100 and left == "1"  # the limit was met mid-run, the worker told once
    assert [json.loads(line)["request_id"] for line in lines] == [
        "an-older-run",
        *(f"w0-{i}" for i in range(int(rows))),
    ]
    assert path.read_bytes().endswith(b"\n") and path.stat().st_size <= limit
    assert (
        f"could not be written (File too large); this worker stopped and left its master after {rows} rows"
        in sentence
    )


# -- the authenticated link ---------------------------------------------------------------------------

TOKEN = "a-worker-token-of-forty-characters-0123"


def _pair() -> tuple[wire.LinkKeys, wire.LinkKeys]:
    master = wire.LinkKeys.derive(TOKEN, "master", "w" * 32, "m" * 32, "host_1")
    worker = wire.LinkKeys.derive(TOKEN, "worker", "w" * 32, "m" * 32, "host_1")
    return master, worker


def test_a_sealed_message_opens_at_the_other_end_only() -> None:
    master, worker = _pair()
    body = {"step": 3, "concurrency": 8, "phase": "ramp", "x": [1.5, None, "é"]}
    sealed = master.seal(wire.STEP, body)
    assert worker.open(wire.STEP, sealed) == body
    reply = worker.seal(wire.READY, {"worker": 0})
    assert master.open(wire.READY, reply) == {"worker": 0}
    with pytest.raises(wire.LinkRejected, match="bad_seal"):  # its own seal is not the other end's
        master.open(wire.STEP, master.seal(wire.STEP, body))


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (lambda d: {**d, "body": {**d["body"], "step": 4}}, "bad_seal"),  # the body changed
        (lambda d: {**d, "seq": d["seq"] + 1}, "bad_seal"),  # the number changed
        (lambda d: {**d, "mac": "0" * 64}, "bad_seal"),  # a guess
        (lambda d: d["body"], "unsealed"),  # the plain body, as an unauthenticated peer sends it
        (lambda d: {**d, "seq": "1"}, "unsealed"),
        (lambda d: None, "unsealed"),
    ],
)
def test_a_tampered_or_unsealed_message_is_rejected(tamper: Any, reason: str) -> None:
    master, worker = _pair()
    sealed = master.seal(wire.STEP, {"step": 3})
    with pytest.raises(wire.LinkRejected) as err:
        worker.open(wire.STEP, tamper(sealed))
    assert err.value.reason == reason


def test_a_message_is_bound_to_its_type_its_connection_and_is_accepted_once() -> None:
    master, worker = _pair()
    sealed = master.seal(wire.STEP, {"step": 3})
    with pytest.raises(wire.LinkRejected, match="bad_seal"):
        worker.open(wire.STOP, sealed)  # a step message replayed as a stop
    other = wire.LinkKeys.derive(TOKEN, "worker", "w" * 32, "n" * 32, "host_1")  # another handshake
    with pytest.raises(wire.LinkRejected, match="bad_seal"):
        other.open(wire.STEP, sealed)
    assert worker.open(wire.STEP, sealed) == {"step": 3}
    with pytest.raises(wire.LinkRejected, match="replayed"):
        worker.open(wire.STEP, sealed)


def test_handshake_proofs_need_the_token_and_differ_by_role_and_nonce() -> None:
    proof = wire.handshake_proof(TOKEN, "master", "w" * 32, "m" * 32, "host_1")
    assert wire.proof_matches(proof, wire.handshake_proof(TOKEN, "master", "w" * 32, "m" * 32, "host_1"))
    for other in (
        wire.handshake_proof(TOKEN + "x", "master", "w" * 32, "m" * 32, "host_1"),
        wire.handshake_proof(TOKEN, "worker", "w" * 32, "m" * 32, "host_1"),
        wire.handshake_proof(TOKEN, "master", "v" * 32, "m" * 32, "host_1"),
        wire.handshake_proof(TOKEN, "master", "w" * 32, "m" * 32, "host_2"),
    ):
        assert not wire.proof_matches(proof, other)
    assert not wire.proof_matches(proof, None) and not wire.proof_matches(proof, 5)
    assert wire.nonce_ok(wire.new_nonce()) and not wire.nonce_ok("short") and not wire.nonce_ok(["x"])


def test_tokens_are_checked_without_being_shown() -> None:
    token = wire.new_token()
    assert wire.check_token(token + "\n", "FILE") == token == wire.check_token(token, "$V")
    for bad, match in [("", "empty"), ("short", "at least 32"), ("x" * 31 + " y", "printable ASCII")]:
        with pytest.raises(ConfigError, match=match) as err:
            wire.check_token(bad, "$OOMLOAD_WORKER_TOKEN")
        assert "$OOMLOAD_WORKER_TOKEN" in str(err.value)
        assert not bad or bad not in str(err.value)


def test_urls_of_the_same_server_have_one_key() -> None:
    key = wire.url_key("http://127.0.0.1:8000")
    assert wire.url_key("HTTP://127.0.0.1:8000/") == key
    assert wire.url_key("http://gpu-host") == wire.url_key("http://GPU-host:80/")
    assert wire.url_key("http://127.0.0.1:8001") != key
    assert wire.url_key("https://127.0.0.1:8000") != key
    assert wire.url_key("http://evil:8000") != key


def test_a_valid_result_row_comes_back_as_the_record() -> None:
    row = _result(1).to_json() | {"ttft_ms": 12.5, "http_status": 200, "usage_prompt_tokens": 5}
    assert wire.result_from_wire(row, last_step=1).to_json() == row


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"step": 2}, "wrong_step"),  # a step the master has not begun
        ({"step": -1}, "bad_row"),
        ({"step": True}, "bad_row"),
        ({"outcome": "pwned"}, "bad_row"),
        ({"request_id": ""}, "bad_row"),
        ({"request_id": "x" * 2000}, "bad_row"),
        ({"request_id": 5}, "bad_row"),
        ({"error": "e" * 5000}, "bad_row"),
        ({"prompt_tokens_asked": 10**12}, "bad_row"),
        ({"prompt_tokens_asked": 5.0}, "bad_row"),
        ({"start_unix_s": float("nan")}, "bad_row"),
        ({"ttft_ms": float("inf")}, "bad_row"),
        ({"ttft_ms": "1"}, "bad_row"),
        ({"http_status": 999}, "bad_row"),
        ({"extra": "field"}, "bad_row"),
    ],
)
def test_a_bad_result_row_is_rejected(change: dict[str, Any], reason: str) -> None:
    row = _result(1).to_json() | change
    with pytest.raises(wire.LinkRejected) as err:
        wire.result_from_wire(row, last_step=1)
    assert err.value.reason == reason
    with pytest.raises(wire.LinkRejected):
        wire.result_from_wire(["not", "a", "row"], last_step=1)


def test_sealed_messages_may_arrive_out_of_order_but_never_twice() -> None:
    master, worker = _pair()
    first, second = worker.seal(wire.RESULTS, {"seq": 0}), worker.seal(wire.RESULTS, {"seq": 1})
    assert master.open(wire.RESULTS, second) == {"seq": 1}
    assert master.open(wire.RESULTS, first) == {"seq": 0}  # it waited for its send: still accepted
    for again in (first, second):
        with pytest.raises(wire.LinkRejected, match="replayed"):
            master.open(wire.RESULTS, again)
    held = worker.seal(wire.RESULTS, {"held": True})  # delayed past the window
    for _ in range(wire.REPLAY_WINDOW + 1):
        master.open(wire.RESULTS, worker.seal(wire.RESULTS, {}))
    with pytest.raises(wire.LinkRejected, match="replayed"):
        master.open(wire.RESULTS, held)


@pytest.mark.parametrize(
    ("bind_host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1:5557"),
        ("127.0.0.2", "127.0.0.2:5557"),  # a specific address: the master listens there only
        ("10.0.0.5", "10.0.0.5:5557"),
        ("0.0.0.0", "127.0.0.1:5557"),  # every address: loopback is one of them
        ("*", "127.0.0.1:5557"),
        ("::", "127.0.0.1:5557"),
        ("::1", "[::1]:5557"),
    ],
)
def test_local_workers_reach_the_master_where_it_listens(bind_host: str, expected: str) -> None:
    address = wire.local_master_address(bind_host, 5557)
    assert address == expected
    assert wire.parse_master_address(address) == (expected.rpartition(":")[0].strip("[]"), 5557)
