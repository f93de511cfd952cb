"""The vLLM server-log reader on the real fixture log with lines added: aborts, dates, prompts."""

from __future__ import annotations

from pathlib import Path

from oomload.ingest import SkipLog, iter_records
from oomload.trace.model import TraceRecord

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"  # real vLLM logs (tests/fixtures/regenerate.py)
PREFIX = "(APIServer pid=7306) INFO 12-01 06:33:54 [v1/engine/async_llm.py:600] "


def records(path: Path) -> tuple[list[TraceRecord], SkipLog]:
    skips = SkipLog()
    return list(iter_records([path], skips=skips)), skips


def test_v1_aborted_requests_line_marks_every_request_it_names(tmp_path: Path) -> None:
    """vLLM ≥ 0.10 logs ``Aborted request(s) a,b.``: each id named is a failed request."""
    lines = (FIXTURES / "vllm-request-log.txt").read_text().splitlines(keepends=True)
    lines += [
        PREFIX + "Aborted request(s) cmpl-9042a2401c167e4f-0.\n",
        PREFIX + "Aborted request(s) cmpl-a1d36b23ac0fef57-0,chatcmpl-9c9bc00d5b99e5cd.\n",
    ]
    path = tmp_path / "v1-aborts.log"
    path.write_text("".join(lines))
    recs, _ = records(path)
    failed = sorted(r.id for r in recs if not r.ok)
    assert failed == ["chatcmpl-9c9bc00d5b99e5cd", "cmpl-9042a2401c167e4f-0", "cmpl-a1d36b23ac0fef57-0"]
    assert sum(r.ok for r in recs) == len(recs) - 3


def _received(stamp: str, request_id: str) -> str:
    """An older vLLM's one-line request (prompt ids on the ``Received request`` line)."""
    return (
        f"INFO {stamp} engine.py:267] Received request {request_id}: prompt: 'hi', "
        "params: SamplingParams(n=1, max_tokens=16), prompt_token_ids: [1, 2, 3], lora_request: None.\n"
    )


def test_a_log_crossing_new_year_keeps_its_order(tmp_path: Path) -> None:
    """The stamps have no year: 12-31 23:59:58 → 01-01 00:00:01 is 3 s later, not a year earlier."""
    path = tmp_path / "new-year.log"
    stamps = ["12-31 23:59:58", "01-01 00:00:01", "12-31 23:59:59", "01-01 00:00:05", "02-01 00:00:05"]
    path.write_text("".join(_received(stamp, f"cmpl-{i}") for i, stamp in enumerate(stamps)))
    recs, skips = records(path)
    # the third is a line of the old year written late: it stays in that year
    assert [(r.id, r.arrival_s) for r in recs] == [
        ("cmpl-0", 0.0),
        ("cmpl-1", 3.0),
        ("cmpl-2", 1.0),
        ("cmpl-3", 7.0),
        ("cmpl-4", 7.0 + 31 * 86400),
    ]
    assert skips.total == 0


def test_max_tokens_is_read_from_the_sampling_params_not_the_prompt(tmp_path: Path) -> None:
    """Older vLLM logs the prompt's text before ``SamplingParams(…)``: words in it are not params."""
    path = tmp_path / "v0.log"
    path.write_text(
        "INFO 12-20 20:25:50 engine.py:267] Received request cmpl-a: prompt: 'reply with max_tokens=5, "
        "or SamplingParams(max_tokens=7)', params: SamplingParams(n=1, temperature=0.0, max_tokens=16), "
        "prompt_token_ids: [1, 2, 3, 4], lora_request: None.\n"
    )
    recs, _ = records(path)
    assert [(r.prompt_tokens, r.max_tokens, r.output_tokens) for r in recs] == [(4, 16, 16)]
