"""One replay run, wired: preflight → run directory → session (telemetry, Locust) → verdict.

``run_replay(config, console)`` does, in order:

1. read the trace; raise the open-file limit and refuse a level one process cannot carry under it
   (``oomload.load.fdlimit``); with ``--web``, refuse a web port that is taken
   (``webui.check_web_port``); with ``--serve`` start the user's server line
   (``oomload.realvllm.serveline``: its log is the run directory's ``server.log``, which never holds
   the line's secrets or the API key — ``RealVllmServer`` copies the log there without them as it
   grows; a failed start is ``ServeStartError`` with the cause the log gives); without a URL start
   the simulated vLLM (``oomload.sim.process.SimServer``) with the demo's settings
   (``oomload.run.config.DEMO_SIM_ARGS``, less each flag ``--sim`` gives again: ``sim_line_args``)
   and say so — the model and the GPU it simulates; a URL ending in ``/v1`` is used without it (said
   in one line);
2. preflight the endpoint (``/v1/models``: model, ``max_model_len``; warn how many trace requests
   cannot fit — with ``--only-fitting`` say how many are left out, every process's
   ``load.payload.RequestOrder`` leaving them out, and refuse a trace none of whose requests fits),
   waiting at most ``preflight_timeout_s``; for ``--api chat``, one count through ``/tokenize``, which
   every chat prompt is calibrated with (``load.preflight.check_tokenize``);
3. create the run directory, write ``config.json`` (no secrets: only the API key's variable name),
   ``provenance.json`` (what a comparison needs: the server's version, the scrubbed ``--serve`` line,
   the trace's SHA-256, the levels and repeats; ``oomload.rundir.provenance``) and copy the trace
   (``trace.jsonl``);
4. run the ``oomload.run.session.Session`` (telemetry, Locust, the death watch, the workers);
5. when oomload started the server and it died, wait for its exit status (``oomload.run.served``:
   ``server_exit.json``), and bring its ``server.log`` up to its last line (the verdict reads the
   death's cause there); write ``status.json``, the repro traces (``oomload.run.repro``), hand the
   run directory to ``oomload.report.finalize_run`` for the verdict and the exit code (130 when
   interrupted); with ``--web`` (and a run not ended by Ctrl-C: on its own, or by the web UI's STOP)
   the web UI then keeps serving the verdict until Ctrl-C or ``--web-keep-s``; last, stop the server oomload
   started (its whole process group; the copy of its log is finished, its raw log closed).

From the moment the run directory exists, a Ctrl-C or SIGTERM — whenever it comes — ends in
``status.json`` (``interrupted``) and a partial report. A run directory that stops taking writes
(disk full, read-only, a file size limit) ends the run within a second: status.json if it still fits,
no report (it would not fit either), and ``RunDirWriteError`` — one sentence, exit 2 — saying that the
run directory keeps what it wrote and that ``oomload report`` judges it once there is space. A run that
fit but whose repro traces or reports do not (``oomload.report``'s module docstring) ends the same
way: one sentence naming the file, what is kept, exit 2.
Importing Locust monkey-patches the process with gevent; it happens inside ``run_replay`` only.

``ReplayConfig``, ``LoadOptions``, ``write_repro`` and ``build_user_class`` are importable from here
(their homes: ``config``, ``repro``, ``session``).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from oomload import __version__
from oomload.credentials import read_api_key, scrub
from oomload.errors import (
    ConfigError,
    EndpointError,
    ExitCode,
    OutputWriteError,
    RunDirWriteError,
    ServeStartError,
)
from oomload.load.fdlimit import open_files_problem, raise_open_files
from oomload.load.preflight import check_tokenize, count_unfit, preflight, server_version
from oomload.outfile import reason
from oomload.realvllm.servecmd import ServeCommand
from oomload.run.config import (
    DEMO_HOLD_S,
    DEMO_LEVELS,
    DEMO_SIM_ARGS,
    LoadOptions,
    ReplayConfig,
    config_json,
    preflight_timeout_s,
    sim_flag,
    sim_line_args,
)
from oomload.run.repro import write_repro
from oomload.run.served import EXIT_WAIT_S, ServedProcess, exit_text, record_exit
from oomload.run.session import Session, build_user_class
from oomload.run.webui import check_web_port
from oomload.rundir import RunWriter, new_run_dir
from oomload.rundir.provenance import PROVENANCE_FILE, Provenance, make_provenance
from oomload.trace.model import TraceHeader, TraceRecord, read_trace, read_trace_header, write_trace
from oomload.verdict.runinfo import served_line
from oomload.verdict.runview import SERVER_LOG


def _quiet_hub_interrupts() -> None:
    """A Ctrl-C that lands while gevent's hub runs its loop was printed by the hub — a bare
    "KeyboardInterrupt" and a time stamp on stderr — before "oomload: interrupted" (an interrupt 1.2 s
    into a replay, while the simulator started). The hub is told it is no error to print; it still
    raises it in the main greenlet (``Hub.SYSTEM_ERROR``), where the run ends as interrupted."""
    import gevent

    hub = gevent.get_hub()
    if not issubclass(KeyboardInterrupt, hub.NOT_ERROR):
        hub.NOT_ERROR = (*hub.NOT_ERROR, KeyboardInterrupt)


def run_replay(config: ReplayConfig, console: Console | None = None) -> int:
    """Run one replay and return the process exit code (``finalize_run``'s, or 130 when interrupted)."""
    console = console or Console(stderr=False)
    records = read_trace(config.trace_path)
    header = read_trace_header(config.trace_path)
    api_key = read_api_key(config.api_key_env, os.environ)
    _check_open_files(config)
    if config.web:  # as the master's port: before anything starts, not a traceback mid-run
        check_web_port(config.web_host, config.web_port)
    import locust  # noqa: F401  (monkey-patches the process with gevent: before any socket is made)

    _quiet_hub_interrupts()
    sim = served = None
    command = config.serve_command()
    if config.url is not None:
        url = config.url.text
        if config.url.note:
            console.print(f"[yellow]note:[/] {config.url.note}")
    elif command is not None:
        served = _start_served(config, command, console, (api_key, *config.serve_secrets()))
        url = served.url
    else:
        sim = _start_sim(config, console)
        url = sim.url
    try:
        return _run_with_server(
            config, console, records, header, url, api_key, simulated=sim is not None, served=served or sim
        )
    finally:
        if sim is not None:
            sim.stop()
        if served is not None:
            served.stop()
            if served.tmp_dir is not None:
                shutil.rmtree(served.tmp_dir, ignore_errors=True)


def _check_open_files(config: ReplayConfig) -> None:
    """Raise this process's open-file limit (its children inherit it) and refuse a top level that one
    process still cannot carry (``oomload.load.fdlimit``): ``ConfigError``, before any load."""
    files = raise_open_files()
    top = max(config.levels)
    workers = config.expected_workers()
    users = math.ceil(top / workers) if workers else top
    what = f"concurrency {top}" + (f" over {workers} workers ({users} users each)" if workers else "")
    problem = open_files_problem(files, users, what)
    if problem is not None:
        raise ConfigError(problem)


def _start_sim(config: ReplayConfig, console: Console) -> Any:
    from oomload.sim.process import SimServer

    args = sim_line_args(config.sim_args)
    model, gpu = sim_flag(args, "--model"), sim_flag(args, "--gpu")
    console.print(
        f"[bold yellow]No --url: replaying against a SIMULATED vLLM server[/] — model {model}, "
        f"simulated GPU {gpu} (oomload sim serve {' '.join(args)})"
    )
    log_path, made = None, False
    if config.run_dir is not None:  # the simulator's log is the run's server.log, as --serve's is
        made = not config.run_dir.exists()
        config.run_dir.mkdir(parents=True, exist_ok=True)
        log_path = config.run_dir / SERVER_LOG
    try:
        return SimServer(args, log_path=log_path).start()
    except BaseException:
        # nothing was run, and the error already holds the simulator's words: no log left behind, and
        # no run directory this call made (``oomload.cli.replay`` removes the one it made, now empty)
        if log_path is not None:
            log_path.unlink(missing_ok=True)
        if made and config.run_dir is not None:
            shutil.rmtree(config.run_dir, ignore_errors=True)
        raise


def _start_served(
    config: ReplayConfig, command: ServeCommand, console: Console, secrets: tuple[str | None, ...]
) -> Any:
    """Start the ``--serve`` line (its log in the run directory, never with ``secrets`` in it) and wait
    for ``/health``; a start that fails is ``ServeStartError`` with the cause its log gives
    (``oomload.tune.startup``)."""
    from oomload.realvllm.serveline import ServeLine
    from oomload.realvllm.server import RealVllmServer, free_port
    from oomload.tune.startup import StartCause, classify_startup_failure

    run_dir = config.run_dir if config.run_dir is not None else new_run_dir(config.runs_parent)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="oomload-serve-")  # short: vLLM's ZMQ IPC socket paths must fit 107 bytes
    server = RealVllmServer(
        ServeLine(command),
        run_dir,
        port=free_port("127.0.0.1"),
        startup_timeout_s=config.serve_timeout_s,
        log_name=SERVER_LOG,
        cwd=Path.cwd(),  # the user's line may name relative paths
        tmp_dir=Path(tmp),
        secrets=secrets,
        on_log_problem=lambda sentence: console.print(f"[yellow]note:[/] {escape(sentence)}"),
    )
    line = scrub(config.serve or "", config.serve_secrets())
    console.print(f"starting the server: [bold]{escape(line)}[/] (its log: {server.log_path})")
    try:
        server.start()
    except EndpointError as err:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing runs in it any more
        failure = classify_startup_failure(server.log_text())  # stopped: the whole log, without secrets
        how = (
            "no answer on /health in time"
            if server.exit_code is None
            else f"it {exit_text(server.exit_code)}"
        )
        said = failure.reason if failure.cause is not StartCause.OTHER else f"it said {failure.message!r}"
        raise ServeStartError(
            f"the --serve line did not start ({how}): {said}; its log: {server.log_path}"
        ) from err
    console.print(f"the server is up at {server.url} (pid {server.pid}, {server.startup_s:.0f} s to start)")
    return server


def _say_unfit(
    console: Console, config: ReplayConfig, records: Sequence[TraceRecord], max_model_len: int | None
) -> None:
    """Say how many trace requests do not fit the server's window, and what becomes of them: refused
    (or clamped) by the server, or, with ``--only-fitting``, left out (``ConfigError`` when none fits)."""
    if config.only_fitting and max_model_len is None:
        console.print(
            "[yellow]warning:[/] the server does not say its max_model_len (/v1/models): --only-fitting "
            "leaves nothing out"
        )
        return
    unfit = count_unfit(records, max_model_len)
    if not unfit:
        return
    need = f"{unfit} of {len(records)} trace requests need more than max_model_len={max_model_len} tokens"
    if not config.only_fitting:
        console.print(
            f"[yellow]warning:[/] {need} (prompt + output); the server will reject or clamp them "
            "(--only-fitting replays only the ones that fit)"
        )
    elif unfit == len(records):
        raise ConfigError(f"{need} (prompt + output): with --only-fitting nothing is left to replay")
    else:
        console.print(f"{need} (prompt + output): left out (--only-fitting); {len(records) - unfit} replayed")


def _say_zero_lengths(console: Console, records: Sequence[TraceRecord]) -> None:
    """Say how many trace requests give a prompt or an output of 0 tokens: each is sent with 1
    (``payload.asked_lengths``: servers refuse 0), so the replay's lengths differ from the trace's there."""
    prompts = sum(1 for r in records if r.prompt_tokens == 0)
    outputs = sum(1 for r in records if r.output_tokens == 0)
    parts = [f"{prompts} of {len(records)} trace requests have a prompt of 0 tokens"] if prompts else []
    if outputs:
        parts.append(
            f"{outputs} {'' if prompts else f'of {len(records)} trace requests have '}an output of 0"
        )
    if parts:
        console.print(f"note: {' and '.join(parts)}: each is sent with 1 token instead (servers refuse 0)")


def _run_with_server(
    config: ReplayConfig,
    console: Console,
    records: list[TraceRecord],
    header: TraceHeader,
    url: str,
    api_key: str | None,
    *,
    simulated: bool,
    served: ServedProcess | None = None,
) -> int:
    info = preflight(url, model=config.model, api_key=api_key, timeout_s=preflight_timeout_s(config))
    if config.api == "chat":
        check_tokenize(url, info.model, api_key)
    _say_unfit(console, config, records, info.max_model_len)
    _say_zero_lengths(console, records)
    run_dir = config.run_dir if config.run_dir is not None else new_run_dir(config.runs_parent)
    run_dir.mkdir(parents=True, exist_ok=True)
    writer = RunWriter(run_dir)
    session = Session(
        config, console, writer, records, url, api_key, info.model, info.max_model_len, simulated, served
    )
    end_reason = "error"
    # from here on a Ctrl-C or SIGTERM, whenever it comes, ends in status.json and a (partial) report:
    # the session's handlers take over once it runs; until then Python's KeyboardInterrupt does
    try:
        document = config_json(
            config, url, info.model, info.max_model_len, simulated, records, info.serve_args
        )
        # what the report's run block shows of the server: its version, and the simulator's flags
        document["vllm_version"] = server_version(url, api_key=api_key)
        if simulated:
            document["sim_args"] = list(sim_line_args(config.sim_args))
        writer.write_json("config.json", document)
        writer.write_json(PROVENANCE_FILE, _provenance(config, document).to_json())
        writer.write_file("trace.jsonl", lambda fh: write_trace(fh, records, header))
        console.print(
            f"run directory [bold]{run_dir}[/] · model {info.model} · max_model_len {info.max_model_len} · "
            f"{len(records)} trace requests · levels {','.join(map(str, config.levels))}"
        )
        end_reason = session.run()
    except KeyboardInterrupt:
        end_reason = "interrupted"
        writer.event("interrupted")
    finally:
        # with --web the web UI outlives the load: it serves the verdict once the report exists
        full = writer.write_error is not None
        keep_web = end_reason not in ("interrupted", "error") or session.stopped_from_web
        session.shutdown(keep_web=keep_web and not full)
        if served is not None:  # its exit is evidence when it died (oomload.run.served)
            died = session.dead_evidence is not None or served.poll() is not None
            record_exit(writer, served, wait_s=EXIT_WAIT_S if died else 0.0)
            served.sync_log()  # the verdict reads a death's cause in server.log: up to its last line
        finished = end_reason not in ("interrupted", "error")
        with contextlib.suppress(RunDirWriteError):  # a full disk: said below, once
            writer.write_status(finished=finished, end_reason=end_reason)
        writer.close()
    failure = writer.write_failure()
    if failure is not None:  # no report either: it could not be written (module docstring)
        raise failure
    try:
        _write_repro(run_dir)
        code = _finalize(run_dir, config.gates, console, html=config.html, baseline=config.baseline)
        if session.web_ui is not None:
            from oomload.run.webui import final_state

            session.serve_verdict(final_state(run_dir, code), config.web_keep_s)
    finally:
        session.close_web()
    if end_reason == "interrupted":
        return int(ExitCode.INTERRUPTED)
    return code


def _provenance(config: ReplayConfig, document: dict[str, Any]) -> Provenance:
    """What a later ``oomload compare`` needs of this run (``oomload.rundir.provenance``), from the
    ``config.json`` just written and the trace file's digest."""
    try:
        return make_provenance(
            oomload_version=__version__,
            trace_path=config.trace_path,
            trace_requests=int(document["trace_count"]),
            levels=config.levels,
            repeats=config.repeats,
            server_version=document.get("vllm_version"),
            serve=served_line(document),
            sim_args=document.get("sim_args"),
            model=document.get("model"),
            url=document.get("url"),
            started_unix_s=document.get("started_unix_s"),
        )
    except OSError as err:
        raise ConfigError(
            f"cannot read the trace {config.trace_path} again for its digest ({reason(err)})"
        ) from err


def _write_repro(run_dir: Path) -> None:
    from oomload.report import report_write_error

    try:
        write_repro(run_dir)
    except OutputWriteError as err:  # a full disk after the run: said as a report's would be
        name = os.path.relpath(err.path or run_dir, run_dir)
        raise report_write_error(run_dir, name, err, ()) from err


def _finalize(
    run_dir: Path, gates: Sequence[str], console: Console, *, html: bool = True, baseline: Path | None = None
) -> int:
    from oomload.report import RUN_FORMATS, finalize_run

    formats = tuple(f for f in RUN_FORMATS if html or f != "html")
    return int(finalize_run(run_dir, gates=gates, console=console, formats=formats, baseline=baseline))


__all__ = [
    "DEMO_HOLD_S",
    "DEMO_LEVELS",
    "DEMO_SIM_ARGS",
    "LoadOptions",
    "ReplayConfig",
    "build_user_class",
    "preflight_timeout_s",
    "run_replay",
    "write_repro",
]
