"""``oomload report RUN_DIR``: renders a saved run, gates map to exit codes, bad input is one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomload.cli import main
from oomload.outcome import Outcome, RequestResult
from oomload.rundir import RunWriter

T0 = 1_700_000_000.0


def make_run(
    path: Path, *, preempt_at: int = 4, gates: list[str] | None = None, finished: bool = True
) -> Path:
    """Three steps (1, 2, 4), preemption in the step at ``preempt_at``."""
    with RunWriter(path) as w:
        w.write_json(
            "config.json", {"schema": 1, "model": "m", "url": "http://127.0.0.1:1", "gates": gates or []}
        )
        counter = 0
        for i, c in enumerate((1, 2, 4)):
            start = T0 + 10 * i
            w.append(
                "steps", {"event": "start", "step": i, "concurrency": c, "phase": "ramp", "t_unix_s": start}
            )
            for k in range(3 * c):  # c requests in flight all the time, three rounds of 10/3 s
                s = start + (k // c) * 10 / 3 + 0.001 * (k % c)
                w.request(
                    RequestResult(f"{i}-{k}", i, c, s, s + 3.3, Outcome.OK, 256, 256, 256, 256, 40.0, 9.0)
                )
            delta = 2 if c == preempt_at else 0
            counter += delta
            w.append(
                "metrics",
                {"t_unix_s": start + 5, "ok": True, "kv_cache_usage": 0.3 * c, "num_requests_running": c,
                 "num_requests_waiting": 0, "num_preemptions_total": counter, "preemptions_delta": delta},
            )  # fmt: skip
            w.append(
                "steps",
                {
                    "event": "end",
                    "step": i,
                    "concurrency": c,
                    "phase": "ramp",
                    "t_unix_s": start + 10,
                    "started": 3 * c,
                },
            )
        if finished:
            w.write_json(
                "status.json", {"finished": True, "end_reason": "completed", "ended_unix_s": T0 + 30}
            )
    return path


def test_report_renders_every_file_and_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--format", "terminal,json,md,junit"]) == 0
    out = capsys.readouterr().out
    assert "Preemption onset" in out and "concurrency 4" in out
    assert {p.name for p in run.iterdir()} >= {"summary.json", "report.md", "junit.xml"}
    assert not (run / "report.html").exists()


def test_json_flag_prints_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--json", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "oomload.summary/1"
    assert doc["verdict"]["last_safe_concurrency"] == 2


def test_gates_map_to_exit_codes(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--format", "json", "--gate", "no-preemption-below:3"]) == 0
    assert main(["report", str(run), "--format", "json", "--gate", "no-preemption-below:5"]) == 1
    assert main(["report", str(run), "--format", "json", "--gate", "no-oom-up-to:64"]) == 4
    gate_file = tmp_path / "scenario.toml"
    gate_file.write_text('[gate]\nrules = ["no-preemption-up-to:4"]\n')
    assert main(["report", str(run), "--format", "json", "--gate-file", str(gate_file)]) == 1


def test_gates_from_the_run_config_apply_by_default(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", gates=["no-preemption-below:8"])
    assert main(["report", str(run), "--format", "json"]) == 1
    assert json.loads((run / "summary.json").read_text())["gates"][0]["rule"] == "no-preemption-below:8"


def test_partial_run_is_rendered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", finished=False)
    assert main(["report", str(run), "--format", "terminal,md"]) == 0
    assert "CUT SHORT" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["report", "{missing}"], "is not a run directory (no such directory)"),
        (["report", "{empty}"], "is not a run directory (no config.json)"),
        (["report", "{run}", "--gate", "ttft<2"], "gate 'ttft<2'"),
        (["report", "{run}", "--format", "pdf"], "--format 'pdf'"),
        (["report", "{run}", "--gate-file", "{missing}"], "cannot read gate file"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    (tmp_path / "empty").mkdir()
    run = make_run(tmp_path / "run")
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "run": run}
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("oomload: error: ") and says in err
    assert "Traceback" not in err


def test_file_only_formats_print_what_was_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--format", "md,junit,json"]) == 0
    out = capsys.readouterr().out
    assert out == f"oomload: wrote report.md, junit.xml, summary.json in {run} (exit code 0)\n"


def test_a_format_named_twice_is_written_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--format junit,junit`` said "wrote junit.xml, junit.xml"."""
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--format", "junit,md,junit"]) == 0
    assert capsys.readouterr().out == f"oomload: wrote junit.xml, report.md in {run} (exit code 0)\n"


def test_a_corrupt_config_is_warned_about_and_the_rest_rendered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run")
    (run / "config.json").write_text('{"model": "m", "url":')
    assert main(["report", str(run), "--format", "md,json"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("oomload: warning: ")
    assert "config.json is unreadable (not valid JSON" in err
    notes = json.loads((run / "summary.json").read_text())["verdict"]["confidence"]["notes"]
    assert "config_unreadable" in {n["kind"] for n in notes}
    assert "| 2 | 4 |" in (run / "report.md").read_text()  # the steps are still there


def test_requests_lost_from_the_run_directory_and_a_torn_status_are_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A requests.jsonl cut short (a full disk, a copy stopped half-way) read as a complete run of fewer
    requests; a status.json that is there but torn read "no status.json"."""
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--format", "json"]) == 0
    notes = json.loads((run / "summary.json").read_text())["verdict"]["confidence"]["notes"]
    assert "requests_missing" not in {n["kind"] for n in notes}  # 21 started, 21 written
    requests = run / "requests.jsonl"
    lines = requests.read_text().splitlines(keepends=True)
    requests.write_text("".join(lines[:5]) + lines[5][:40])  # five whole lines, then a torn one
    (run / "status.json").write_text('{"finished": tr')
    main(["report", str(run), "--format", "json"])
    notes = json.loads((run / "summary.json").read_text())["verdict"]["confidence"]["notes"]
    texts = {n["kind"]: n["message"] for n in notes}
    lost = "steps.jsonl counts 21 requests started, requests*.jsonl holds 5 of them"
    assert texts["requests_missing"].startswith(lost)
    assert "status.json is unreadable" in texts["cut_short"] and "no status.json" not in texts["cut_short"]


def test_a_model_name_or_path_with_brackets_is_text_not_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A review found "org/model[/]" (a model name, or a run directory's path) crash the terminal view
    with rich's MarkupError (exit 70), and "[bold]" vanish from a name."""
    run = make_run(tmp_path / "runs[/x]" / "r")
    doc = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**doc, "model": "org/[bold]model[v2][/]"}))
    assert main(["report", str(run), "--format", "terminal"]) == 0  # no gate: exit 0
    assert "org/[bold]model[v2][/]" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("cache_config.json", "block_size", 1e308),
        ("cache_config.json", "num_gpu_blocks", -5),
        ("config.json", "tail_percentile", 1e308),
        ("config.json", "max_model_len", 0),
    ],
)
def test_a_value_no_server_has_is_left_unknown_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, field: str, value: float
) -> None:
    """Found by hand-editing a run: ``"block_size": 1e308`` made the arithmetic overflow and
    ``"tail_percentile": 1e308`` the percentile refuse — "internal error … a bug in oomload", exit 70."""
    run = make_run(tmp_path / "run")
    path = run / name
    doc = json.loads(path.read_text()) if path.exists() else {"num_gpu_blocks": 100, "block_size": 16}
    path.write_text(json.dumps({**doc, field: value}))
    assert main(["report", str(run), "--format", "md,json"]) == 0
    assert "internal error" not in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["verdict"]["steps"]
