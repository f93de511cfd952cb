"""``RealVllmServer``'s log: byte for byte what the server wrote without secrets; with them a copy that
never holds one, up to date whenever it is asked (``sync_log``), finished at stop; the raw log has no name
while the server runs (it has one, in a 0700 directory, only where ``/proc`` cannot read it back).

The server is a Python snippet (a ``ServeSpec`` of the test's) that answers ``/health`` on the host and
port it is given, and ``/say``, for which it writes a line naming the key before it answers.
"""

from __future__ import annotations

import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oomload.errors import EndpointError
from oomload.realvllm import server as server_module
from oomload.realvllm.server import RealVllmServer

KEY = "sk-raw-log-only-4711"
SERVER = """
import http.server, sys
key, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(f"INFO non-default args: {{'api_key': [{key!r}], 'max_num_seqs': 7}}", flush=True)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/say":
            sys.stdout.write(f"INFO asked, and says {key} again\\n")
            sys.stdout.flush()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer((host, port), Handler).serve_forever()
"""
FAILING = r"""
import sys
sys.stdout.buffer.write(b"INFO key " + sys.argv[1].encode() + b"\n\xff\xfe not UTF-8\nERROR no end")
"""


@dataclass(frozen=True)
class Snippet:
    """A ``ServeSpec``: ``python -c CODE KEY HOST PORT`` in the caller's environment."""

    code: str
    program: str = "a test snippet"

    def serve_argv(self, host: str, port: int) -> list[str]:
        return [sys.executable, "-c", self.code, KEY, host, str(port)]

    def serve_env(self, env: dict[str, str], tmp_dir: Path) -> dict[str, str]:
        return {**env, "TMPDIR": str(tmp_dir)}


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process's temporary directory, where a raw log's private directory is made."""
    path = tmp_path / "temp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path


def _server(tmp_path: Path, code: str, secrets: tuple[str, ...]) -> RealVllmServer:
    return RealVllmServer(
        Snippet(code),
        tmp_path / "run",
        startup_timeout_s=30.0,
        stop_timeout_s=5.0,
        log_name="server.log",
        tmp_dir=tmp_path / "server-tmp",
        secrets=secrets,
    )


def test_without_secrets_the_log_is_what_the_server_wrote_byte_for_byte(tmp_path: Path, temp: Path) -> None:
    server = _server(tmp_path, FAILING, ())
    with pytest.raises(EndpointError, match="exited with code 0 before it was ready"):
        server.start()
    assert server.log_path.read_bytes() == f"INFO key {KEY}\n".encode() + b"\xff\xfe not UTF-8\nERROR no end"
    assert list(temp.iterdir()) == []  # no raw log: the server wrote server.log itself


def test_a_failed_start_says_its_last_lines_without_the_key_and_keeps_the_log_without_it(
    tmp_path: Path, temp: Path
) -> None:
    server = _server(tmp_path, FAILING, (KEY,))
    with pytest.raises(EndpointError) as caught:
        server.start()
    assert KEY not in str(caught.value) and "INFO key ***" in str(caught.value)
    assert server.log_path.read_bytes() == b"INFO key ***\n\xff\xfe not UTF-8\nERROR no end"  # the end too
    assert "ERROR no end" in server.log_text() and KEY not in server.log_text()
    assert list(temp.iterdir()) == []  # the raw log and its private directory are gone


def test_a_running_servers_copy_is_up_to_date_when_synced_and_never_holds_the_key(
    tmp_path: Path, temp: Path
) -> None:
    server = _server(tmp_path, SERVER, (KEY,))
    with server:
        # start() returns with the start-up lines copied: the limits read from them are there
        assert (
            server.log_path.read_text() == "INFO non-default args: {'api_key': ['***'], 'max_num_seqs': 7}\n"
        )
        assert list(temp.iterdir()) == []  # the raw log has no name: a kill leaves nothing behind
        for n in range(3):
            urllib.request.urlopen(server.url + "/say", timeout=10).close()  # written before it answers
            server.sync_log()  # no waiting for the follower's next poll
            assert server.log_path.read_text().count("INFO asked, and says *** again\n") == n + 1
            assert server.log_text().count("says *** again") == n + 1
        assert "***" in server.log_tail(1) and KEY not in server.log_tail()
    assert KEY not in server.log_path.read_text()
    assert list(temp.iterdir()) == []


def test_without_proc_links_the_raw_log_keeps_a_private_name_until_stop(
    tmp_path: Path, temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module.os, "getpid", lambda: 2**31 - 1)  # no /proc/PID/fd/N to read through
    server = _server(tmp_path, SERVER, (KEY,))
    with server:
        [raw_dir] = temp.iterdir()
        assert raw_dir.stat().st_mode & 0o777 == 0o700
        urllib.request.urlopen(server.url + "/say", timeout=10).close()
        server.sync_log()
        assert server.log_path.read_text().count("INFO asked, and says *** again\n") == 1
    assert KEY not in server.log_path.read_text()
    assert list(temp.iterdir()) == []


def test_a_sentence_about_the_unnamed_raw_log_names_the_servers_log_not_proc(
    tmp_path: Path, temp: Path
) -> None:
    """The raw log is read through /proc/PID/fd/N, a path the user never gave: truncated under the
    follower, its sentence says "the server's log" (before: "the server log /proc/…/fd/7 was …")."""
    problems: list[str] = []
    server = _server(tmp_path, SERVER, (KEY,))
    server.on_log_problem = problems.append
    with server:
        raw = server._raw_source  # the follower's source: the test's one way to the unnamed file
        assert raw is not None and str(raw).startswith("/proc/")
        with open(raw, "r+b") as handle:  # reopens the unnamed file for writing
            handle.truncate(0)
        server.sync_log()
        urllib.request.urlopen(server.url + "/say", timeout=10).close()
        server.sync_log()
        assert server.log_path.read_text().count("INFO asked, and says *** again\n") == 1  # still copied
    assert problems == ["the server's log was truncated; reading it again from its start"]
