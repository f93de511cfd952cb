"""A ``--soak`` too short for any memory trend is refused before any load, and an inconclusive soak is
no high-confidence verdict.

Seen on a new user's pass: ``replay --soak 40s --concurrency 4`` against a simulator leaking 60 MiB a
minute ran, watched memory rise from 55 to 96 MiB, and reported "trend inconclusive: 0 samples left
(needs 12); the first 60 s were dropped as warm-up" with confidence high.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clirun import run
from oomload.cli import build_parser
from oomload.cli.replay import build_config
from oomload.verdict import build_verdict
from oomload.verdict.runview import load_run
from runbuilder import T0, StepSpec, write_run

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "sample-chat.jsonl"
GIB = 2**30


def test_the_minimum_is_the_warm_up_and_the_span_a_fit_needs() -> None:
    from oomload.verdict.trend import MIN_JUDGED_SPAN_S, WARMUP_MIN_S, memory_trend
    from oomload.verdict.trendfit import MIN_FIT_SPAN_S

    assert MIN_JUDGED_SPAN_S == WARMUP_MIN_S + MIN_FIT_SPAN_S
    rising = [int(GIB + 2**20 * t) for t in range(400)]  # 1 MiB a second, one sample each 0.5 s
    at_minimum = [0.5 * i for i in range(int(2 * MIN_JUDGED_SPAN_S))]
    assert memory_trend(at_minimum, rising[: len(at_minimum)]).verdict == "inconclusive"
    longer = [0.5 * i for i in range(int(2 * MIN_JUDGED_SPAN_S) + 4)]
    assert memory_trend(longer, rising[: len(longer)]).verdict == "growing"


@pytest.mark.parametrize("soak", ["40s", "2m"])
def test_a_soak_no_trend_can_judge_is_refused_before_any_load(
    soak: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    argv = ["replay", str(SAMPLE), "--soak", soak, "--concurrency", "4", "--run-dir", str(run_dir)]
    code, out, err = run(argv, capsys)
    assert code == 2
    assert err.strip() == (
        f"oomload: error: --soak {soak} is too short: a memory trend drops at least its first 60 s as "
        "warm-up and needs 60 s after them, so a soak must last more than 120 s (e.g. 10m)"
    )
    assert not run_dir.exists() and "SIMULATED" not in out + err  # no server started, nothing written


def test_a_soak_a_trend_can_judge_passes() -> None:
    args = build_parser().parse_args(["replay", str(SAMPLE), "--url", "http://127.0.0.1:1", "--soak", "121s",
                                      "--concurrency", "4"])  # fmt: skip
    assert build_config(args).soak_s == 121.0


def test_an_inconclusive_soak_is_a_caveat_and_not_high_confidence(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "soak", [StepSpec(4, duration_s=40.0)], gpu=False, config={"soak_s": 40.0})
    lines = [
        f'{{"t_unix_s": {T0 + 0.5 * i}, "source": "local", "pid": 4242, "processes": 3, '
        f'"rss_bytes": {55 * 2**20 + i * 2**19}, "alive": true}}'
        for i in range(80)
    ]
    (run_dir / "server_memory.jsonl").write_text("\n".join(lines) + "\n")
    verdict = build_verdict(load_run(run_dir))
    assert [t.verdict for t in verdict.memory_trends] == ["inconclusive"]
    notes = [n for n in verdict.notes if n.kind == "soak_inconclusive"]
    assert [n.message for n in notes] == [
        "1 of the soak's 1 memory trend(s) inconclusive (Memory trend): the soak shows neither a leak nor "
        "its absence there"
    ]
    assert verdict.confidence != "high"
