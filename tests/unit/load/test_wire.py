"""The master/worker messages' pure parts: addresses, version checks, the trace and the config forms,
and the batching of a worker's results."""

from __future__ import annotations

from typing import Any

import pytest

from oomload.errors import ConfigError
from oomload.load import wire
from oomload.load.payload import PayloadOptions
from oomload.load.resultstream import ResultStream
from oomload.outcome import Outcome, RequestResult
from oomload.run.config import LoadOptions, ReplayConfig
from oomload.trace import TraceRecord


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
    assert options.payload == PayloadOptions(model="m", seed=7)
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
