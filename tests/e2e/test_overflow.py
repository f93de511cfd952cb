"""Context overflow on the real vLLM: prompts longer than ``max_model_len`` come back as HTTP 400, are
counted as overflow with their lengths, and ``max_model_len`` is recommended from the trace's P99."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from harness import FIGURES, Run, ServerPool, replay, write_trace_file

from oomload.trace.stats import percentile

pytestmark = pytest.mark.e2e

MAX_MODEL_LEN = 2048
OVERFLOW_PROMPT = 2300
OUTPUT_TOKENS = 8


def _lengths() -> list[tuple[int, int]]:
    """300 requests; three (at positions 1, 3 and 5, so an ordered replay reaches them) overflow."""
    rng = random.Random(5)
    lengths = [(rng.randint(32, 700), OUTPUT_TOKENS) for _ in range(300)]
    for i in (1, 3, 5):
        lengths[i] = (OVERFLOW_PROMPT, OUTPUT_TOKENS)
    return lengths


def test_overflow_is_counted_with_lengths_and_max_model_len_covers_p99(
    vllm_servers: ServerPool, tmp_path: Path
) -> None:
    server = vllm_servers.get()
    lengths = _lengths()
    trace = write_trace_file(tmp_path / "t.jsonl", lengths)
    run_dir = tmp_path / "run"
    proc = replay(
        server.url,
        trace,
        run_dir,
        *("--concurrency", "4", "--hold-s", "4", "--warmup-s", "0", "--no-refine", "--order", "trace"),
        *("--stop-on", "never"),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    run = Run.read(run_dir)
    too_long = [r for r in run.requests if r["prompt_tokens_asked"] > MAX_MODEL_LEN]
    fitting = [r for r in run.requests if r["prompt_tokens_asked"] <= MAX_MODEL_LEN]
    assert len(too_long) >= 3
    assert {(r["outcome"], r.get("http_status")) for r in too_long} == {("context_overflow", 400)}
    assert {r["outcome"] for r in fitting} == {"ok"}
    assert all(
        (r["usage_prompt_tokens"], r["usage_completion_tokens"]) == (r["prompt_tokens_asked"], OUTPUT_TOKENS)
        for r in fitting
    )

    assert run.summary is not None
    overflow = run.summary["verdict"]["context_overflow"]
    assert overflow["refused"] == len(too_long)
    total = OVERFLOW_PROMPT + OUTPUT_TOKENS
    assert (overflow["refused_total_tokens_min"], overflow["refused_total_tokens_max"]) == (total, total)
    assert (overflow["model_limit"], overflow["trace_over_limit"], overflow["trace_count"]) == (
        MAX_MODEL_LEN,
        3,
        300,
    )
    p99 = percentile([p + o for p, o in lengths], 99)
    advice = run.summary["recommendation"]["max_model_len"]
    assert advice is not None
    assert p99 <= advice["max_model_len"] < MAX_MODEL_LEN
    setting = next(s for s in run.summary["recommendation"]["settings"] if s["flag"] == "--max-model-len")
    assert setting["value"] == advice["max_model_len"]


def test_only_fitting_sends_none_of_them(vllm_servers: ServerPool, tmp_path: Path) -> None:
    """The same trace with ``--only-fitting``: the real server's ``/v1/models`` gives the window, the
    three long requests are never sent, and the report counts them as left out, not refused."""
    server = vllm_servers.get()
    trace = write_trace_file(tmp_path / "t.jsonl", _lengths())
    run_dir = tmp_path / "run"
    proc = replay(
        server.url,
        trace,
        run_dir,
        *("--concurrency", "4", "--hold-s", "4", "--warmup-s", "0", "--no-refine", "--order", "trace"),
        *("--stop-on", "never", "--only-fitting"),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "left out (--only-fitting); 297 replayed" in " ".join(proc.stdout.split())
    run = Run.read(run_dir)
    assert run.requests and {r["outcome"] for r in run.requests} == {"ok"}
    assert max(r["prompt_tokens_asked"] for r in run.requests) < OVERFLOW_PROMPT
    assert run.summary is not None
    overflow = run.summary["verdict"]["context_overflow"]
    assert (overflow["refused"], overflow["trace_over_limit"], overflow["left_out"]) == (0, 3, True)


def test_long_answers_beside_fast_refusals_are_not_a_server_that_answers_nothing(
    vllm_servers: ServerPool, tmp_path: Path
) -> None:
    """19 of 20 trace requests overflow the window (refused in milliseconds), one in 20 asks 1,000
    output tokens (seconds on this CPU): each step's first seconds end in refusals only while the long
    requests are being served. That is not a server that answers nothing (``capacity.schedule``, "No
    answer": a request in flight for 2 s may yet be answered): every level is measured, with answers."""
    server = vllm_servers.get()
    trace = write_trace_file(
        tmp_path / "t.jsonl", ([(OVERFLOW_PROMPT, OUTPUT_TOKENS)] * 19 + [(64, 1000)]) * 10
    )
    run_dir = tmp_path / "run"
    proc = replay(
        server.url,
        trace,
        run_dir,
        *("--concurrency", "2,3", "--hold-s", "6", "--warmup-s", "0", "--no-refine", "--no-evidence"),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    run = Run.read(run_dir)
    ends = [s for s in run.steps if s["event"] == "end"]
    assert [(s["concurrency"], s["reason"]) for s in ends] == [(2, "hold_done"), (3, "hold_done")], ends
    ok = [r for r in run.requests if r["outcome"] == "ok"]
    refused = [r for r in run.requests if r["outcome"] == "context_overflow"]
    assert ok and len(refused) >= 10, sorted({r["outcome"] for r in run.requests})
    FIGURES.append(
        f"long answers beside refusals: {len(ok)} ok (e2e {min(r['e2e_ms'] for r in ok) / 1000:.1f}–"
        f"{max(r['e2e_ms'] for r in ok) / 1000:.1f} s) and {len(refused)} refused, both levels measured"
    )
