"""A Ctrl-C while ``oomload`` is still starting (importing the CLI: Locust's gevent, rich, numpy) ends
as any Ctrl-C does: ``oomload: interrupted``, exit 130, no traceback.

The child says ``ready`` on stderr once the interpreter itself has started and it is about to import
the entry point (``oomload.__main__``, as the console script does; what that module imports first is
imported before); the signal then lands at a few delays inside the CLI's imports, never in Python's
own start-up, which no program can guard.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from clirun import default_sigint

REPO = Path(__file__).resolve().parents[2]
ENTRY = (
    "import signal, sys, types, oomload; sys.stderr.write('ready\\n'); sys.stderr.flush(); "
    "from oomload.__main__ import main; raise SystemExit(main())"
)
DELAYS_S = (0.03, 0.06, 0.1, 0.15, 0.2)  # from 0: the entry module's own load, a millisecond


def _interrupted_at(delay_s: float) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, "--version"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
        cwd=REPO,
    )
    assert proc.stderr is not None
    assert proc.stderr.readline() == "ready\n"
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_a_ctrl_c_while_the_cli_is_imported_is_exit_130_without_a_traceback() -> None:
    codes = []
    for delay_s in DELAYS_S:
        code, err = _interrupted_at(delay_s)
        assert "Traceback" not in err and "Error" not in err, (delay_s, err)
        assert (code, err) in ((130, "oomload: interrupted\n"), (0, "")), (delay_s, code, err)
        codes.append(code)
    assert 130 in codes, codes  # at least one signal landed while the CLI was being imported


def test_the_console_script_enters_through_a_module_that_imports_no_cli() -> None:
    # the `oomload` script imports its entry point's module before it calls anything: only a light one
    # can catch a Ctrl-C during the CLI's imports
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["oomload"].partition(":")
    probe = f"import sys, {module}; assert callable({module}.{function}); print('oomload.cli' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", result


def test_the_entry_points_exit_code_is_the_documented_one() -> None:
    from oomload.__main__ import INTERRUPTED
    from oomload.errors import ExitCode

    assert INTERRUPTED == ExitCode.INTERRUPTED
