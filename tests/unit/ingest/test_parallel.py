"""The parallel build writes the same trace, byte for byte, as the single-process build.

Small logs are cut into many byte spans (``parallel_min_bytes=0``, spans of a few hundred bytes)
so every boundary case is met: bad lines and requests without a time at span starts, skips in
several spans (their line numbers), several inputs read whole by workers and merged by time.
Both builds run in a fresh interpreter (``RUNNER``): the test process may have been patched by
gevent (Locust), where the library reads in-process only.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from spreadrun import SPY, run_both

from clirun import default_sigint
from oomload.ingest.build import merge_batches
from oomload.ingest.columns import make_batch
from oomload.ingest.parallel import plan_spans


def _openai_log(
    path: Path, count: int, *, start_s: float = 1_717_000_000.0, bad_every: int = 7, ids_every: int = 5
) -> Path:
    lines = []
    for i in range(count):
        if i % bad_every == 3:
            lines.append("{not json")
            continue
        line: dict[str, object] = {
            "request": {"model": "m", "max_tokens": 64, "messages": [{"content": "x" * (i % 50)}]},
            "response": {
                "id": f"c-{i}" if i % ids_every else None,
                "usage": {"prompt_tokens": i, "completion_tokens": 2},
            },
        }
        if i % 11 != 0:  # some requests have no time: they take the one before them
            line["timestamp"] = start_s + i * 0.5
        if i % 17 == 5:  # … or one that cannot be read: the same, counted apart
            line["timestamp"] = "2024-13-45T99:00:00Z"
        if i % 13 == 0:
            line["error"] = {"message": "overloaded"}
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


def _mooncake_log(path: Path, count: int) -> Path:
    lines = [
        json.dumps({"timestamp": i * 10, "input_length": 100 + i, "output_length": 5, "hash_ids": [i, i + 1]})
        if i % 9 != 4
        else '{"timestamp": 5, "input_length": -1, "output_length": 1}'
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


RUNNER = (
    SPY
    + r"""
import json, sys
from oomload.ingest import build_trace, parallel
spec = json.loads(sys.argv[1])
parallel.SPAN_FORMATS = tuple(spec["span_formats"])
results = []
for workers in (1, 2):
    kinds.clear()
    out = f"{spec['out']}.{workers}"
    try:
        r = build_trace(
            spec["inputs"], out, workers=workers, parallel_min_bytes=0, span_bytes=700, strict=spec["strict"]
        )
    except Exception as err:
        results.append({"error": f"{type(err).__name__}: {err}"})
        continue
    results.append({
        "bytes": open(out, encoding="utf-8").read(), "count": r.records_written, "reordered": r.reordered,
        "counts": r.skips.counts, "examples": r.skips.examples, "notes": r.skips.notes, "kinds": dict(kinds),
    })
print(json.dumps(results))
"""
)


def _build_both(
    inputs: list[Path],
    tmp_path: Path,
    *,
    strict: bool = False,
    span_formats: tuple[str, ...] = ("openai",),
    spread_kinds: dict[str, int] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The build's results on 1 and 2 workers; ``spread_kinds`` gets what the main process was sent
    in the second (``_Packed`` tables, or ``RenderedLines`` / ``LinesToRender`` rendered by workers)."""
    spread_kinds = {} if spread_kinds is None else spread_kinds
    spec = {
        "inputs": [str(p) for p in inputs],
        "out": str(tmp_path / "trace.jsonl"),
        "strict": strict,
        "span_formats": list(span_formats),
    }
    single, spread = run_both(RUNNER, json.dumps(spec))
    assert single.pop("kinds", {}) == {}  # one process: no spans
    spread_kinds.update(spread.pop("kinds", {}))
    return single, spread


def test_spans_of_an_openai_log_build_the_same_bytes(tmp_path: Path) -> None:
    log = _openai_log(tmp_path / "gw.jsonl", 300)
    assert len(plan_spans(log, log.stat().st_size, 700)) > 20
    single, spread = _build_both([log], tmp_path)
    assert spread == single
    assert single["counts"] == {"not a JSON object": 43}
    assert any("no timestamp" in note for note in single["notes"])
    assert any("16 requests had a time that could not be read" in note for note in single["notes"])


def test_lines_rendered_by_workers_are_the_same_bytes(tmp_path: Path) -> None:
    """Every id present: workers render most batches themselves, with the origin of the first span."""
    log = _openai_log(tmp_path / "gw.jsonl", 400, ids_every=10**9, start_s=1_717_000_000.123456)
    kinds: dict[str, int] = {}
    single, spread = _build_both([log], tmp_path, spread_kinds=kinds)
    assert spread == single and single["count"] > 300
    assert kinds["RenderedLines"] > 10 and "LinesToRender" not in kinds


def test_generated_ids_rendered_by_workers_are_numbered_in_trace_order(tmp_path: Path) -> None:
    """No ids at all: each is r<N>, N counted over the trace; workers render them once the writer
    knows where their rows start (a second task per span), bad lines and untimed requests included."""
    log = _openai_log(tmp_path / "gw.jsonl", 400, ids_every=1)
    kinds: dict[str, int] = {}
    single, spread = _build_both([log], tmp_path, spread_kinds=kinds)
    assert spread == single and '"id":"r399' not in single["bytes"] and '"id":"r300"' in single["bytes"]
    assert kinds["LinesToRender"] > 10 and "RenderedLines" not in kinds


def test_spans_of_a_mooncake_log_build_the_same_bytes(tmp_path: Path) -> None:
    """Mooncake logs are not spread by default (slower on few cores), but the spans read them right."""
    log = _mooncake_log(tmp_path / "mc.jsonl", 400)
    single, spread = _build_both([log], tmp_path, span_formats=("openai", "mooncake"))
    assert spread == single and single["counts"]


def test_several_inputs_read_by_workers_build_the_same_bytes(tmp_path: Path) -> None:
    first = _openai_log(tmp_path / "a.jsonl", 120)
    second = tmp_path / "b.jsonl.gz"  # overlapping in time: merged, not appended
    second.write_bytes(
        gzip.compress(_openai_log(tmp_path / "b.jsonl", 90, start_s=1_717_000_020.0).read_bytes())
    )
    third = _openai_log(tmp_path / "c.jsonl", 60, start_s=1_717_000_500.0, bad_every=5)
    single, spread = _build_both([first, second, third], tmp_path)
    assert spread == single and single["count"] > 200


def test_strict_stops_at_the_first_bad_line_of_the_file(tmp_path: Path) -> None:
    log = _openai_log(tmp_path / "gw.jsonl", 200, bad_every=150)
    single, spread = _build_both([log], tmp_path, strict=True)
    assert spread == single
    assert single["error"].startswith(f"TraceFormatError: {log}:4: not a JSON object")


STATS_RUNNER = r"""
import json, sys
from oomload.ingest import count_trace, parallel
results = []
spans = []
real = parallel._span_batches
def counted(*args, **kwargs):
    spans.append(1)
    return real(*args, **kwargs)
parallel._span_batches = counted
for workers in (1, 2):
    c = count_trace([sys.argv[1]], workers=workers, parallel_min_bytes=0, span_bytes=700)
    lengths = c.prompt_tokens.distinct()[1].tolist()
    results.append([repr(c.arrivals), lengths, c.failed, c.skips.counts, c.skips.notes, len(spans)])
print(json.dumps(results))
"""


def test_stats_straight_from_spans_match_the_single_process(tmp_path: Path) -> None:
    log = _openai_log(tmp_path / "gw.jsonl", 300)
    done = subprocess.run(
        [sys.executable, "-c", STATS_RUNNER, str(log)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    single, spread = json.loads(done.stdout.strip().splitlines()[-1])
    assert spread[:5] == single[:5] and single[2] > 0
    assert (single[5], spread[5]) == (0, 1)  # the second read in byte ranges


HOLD_RUNNER = r"""
import json, sys
from oomload.ingest import build_trace, untimed
from oomload.trace.model import read_trace
out = []
for name, hold in (("held.jsonl", untimed.UNTIMED_HOLD_ROWS), ("capped.jsonl", 3)):
    untimed.UNTIMED_HOLD_ROWS = hold
    path = sys.argv[2] + "/" + name
    build_trace([sys.argv[1]], path, workers=2, parallel_min_bytes=1, span_bytes=120)
    out.append([r.arrival_s for r in read_trace(path)])
print(json.dumps(out))
"""


def test_the_main_process_holds_untimed_spans_up_to_a_bound(tmp_path: Path) -> None:
    """The spans read before any time are held for it up to ``UNTIMED_HOLD_ROWS`` rows: past it they keep
    0, as the column reader's chunks do (bounded memory on a log with no time). In a fresh process: one
    that gevent has patched reads in process."""
    untimed = json.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    timed = json.dumps({"timestamp": 1_700_000_000, "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    log = tmp_path / "gw.jsonl"
    log.write_text(f"{untimed}\n" * 5 + f"{timed}\n")
    done = subprocess.run(
        [sys.executable, "-c", HOLD_RUNNER, str(log), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    held, capped = json.loads(done.stdout.strip().splitlines()[-1])
    assert held == [0.0] * 6  # within the bound: all take the first time
    assert capped == [0.0] * 5 + [1_700_000_000.0]  # spans of about 2 lines: 4 rows held is past 3


def test_a_gevent_patched_process_reads_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from oomload.ingest import parallel

    class Patched:
        @staticmethod
        def is_module_patched(name: str) -> bool:
            return name == "threading"

    monkeypatch.setitem(sys.modules, "gevent.monkey", Patched)
    assert not parallel.pool_usable()


def test_merge_keeps_heapq_order_for_ties() -> None:
    import heapq

    streams_times = [[0.0, 1.0, 1.0, 3.0], [1.0, 1.0, 2.0], [1.0, 5.0]]
    batches = [
        [
            make_batch(
                len(t),
                time_s=t,
                prompt_tokens=[s * 10 + i for i in range(len(t))],
                output_tokens=[0] * len(t),
            )
        ]
        for s, t in enumerate(streams_times)
    ]
    merged = [
        row
        for batch in merge_batches([iter(b) for b in batches])
        for row in batch.column("prompt_tokens").to_pylist()
    ]
    expected = [
        row
        for _, row in heapq.merge(
            *[[(t, s * 10 + i) for i, t in enumerate(times)] for s, times in enumerate(streams_times)],
            key=lambda item: item[0],
        )
    ]
    assert merged == expected


def test_requests_before_the_first_timed_one_take_its_time_in_spans(tmp_path: Path) -> None:
    """The first 40 requests, over several spans, have no time: they take the first timed one's."""
    lines = [
        {"response": {"id": f"c-{i}", "usage": {"prompt_tokens": i + 1, "completion_tokens": 2}}}
        for i in range(80)
    ]
    for i, line in enumerate(lines[40:], start=40):
        line["timestamp"] = 1_717_000_000.0 + i
    log = tmp_path / "gw.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert len(plan_spans(log, log.stat().st_size, 700)) > 5
    single, spread = _build_both([log], tmp_path)
    assert spread == single
    arrivals = [json.loads(x)["arrival_s"] for x in single["bytes"].splitlines()[1:]]
    assert arrivals == [0.0] * 41 + [float(i) for i in range(1, 40)]


SLOW_START = """
import os, time
if os.environ.get("OOMLOAD_TEST_SLOW_START"):
    time.sleep(float(os.environ["OOMLOAD_TEST_SLOW_START"]))
"""
SIGNAL_STARTING_WORKERS = r"""
import multiprocessing, os, signal, sys, time
from oomload.ingest.parallel import ReadPool

os.environ["PYTHONPATH"] = os.pathsep.join([sys.argv[1], os.environ.get("PYTHONPATH", "")])
os.environ["OOMLOAD_TEST_SLOW_START"] = "3"  # each worker sleeps in its sitecustomize, before any import
with ReadPool(2) as reads:
    pool = reads.pool
    children = multiprocessing.active_children()
    for child in children:
        os.kill(child.pid, signal.SIGINT)  # as a Ctrl-C to the process group reaches a starting worker
        os.kill(child.pid, signal.SIGTERM)
    print(len(children), pool.submit(sum, [1, 2]).result(timeout=60))
"""


def test_a_ctrl_c_while_a_worker_starts_neither_kills_it_nor_prints_a_traceback(tmp_path: Path) -> None:
    """A worker imports for a second or more before it can ignore the signals of its process group (a
    terminal's Ctrl-C, a CI runner's SIGTERM): it starts ignoring them, so one that comes then is dropped —
    the pool still works and no worker prints ``KeyboardInterrupt``. Each worker here is held
    in its ``sitecustomize`` for 3 s while both signals are sent to it."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_START)
    proc = subprocess.run(
        [sys.executable, "-c", SIGNAL_STARTING_WORKERS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout.split()) == (0, ["2", "3"]), proc.stderr[-3000:]
    assert "KeyboardInterrupt" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


SIGNAL_WHILE_SPAWNING = r"""
import multiprocessing, os, signal, threading, time
from multiprocessing import resource_tracker, util
from oomload.ingest import parallel

# a thread that does not block the signals, as numpy's and Arrow's native threads: it may take one
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
resource_tracker.ensure_running()  # its own start spawns too: only the workers' spawns are signalled
spawn = util.spawnv_passfds

def spawn_and_signal(*args):
    pid = spawn(*args)
    os.killpg(0, signal.SIGINT)  # a Ctrl-C to the group once a worker runs, before it is sent its task
    time.sleep(0.3)
    return pid

util.spawnv_passfds = spawn_and_signal
reads = parallel.ReadPool(2)
try:
    reads.pool.submit(sum, [1, 2]).result(timeout=60)
    print("the Ctrl-C was lost")
except KeyboardInterrupt:
    print("interrupted")
finally:
    reads.close()
print("workers left:", len(multiprocessing.active_children()))
"""


def test_a_ctrl_c_while_the_workers_are_spawned_stops_the_build_and_every_worker() -> None:
    """A Ctrl-C that comes while the pool's workers are spawned still interrupts the build (CI saw one
    lost: the build ran on to exit 0), no worker prints a traceback (nor ``EOFError``: the main process
    interrupted between a worker's start and the data it sends it), and ``close`` stops every worker
    that was started."""
    proc = subprocess.run(
        [sys.executable, "-c", SIGNAL_WHILE_SPAWNING],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    assert proc.stdout.splitlines() == ["interrupted", "workers left: 0"], (proc.stdout, proc.stderr)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
