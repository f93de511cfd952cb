"""The preflight turns every way ``GET /v1/models`` can fail into one ``EndpointError`` sentence.

Tiny loopback servers in a thread: one that writes an SSH banner, one that accepts and never answers,
one that closes at once, one that speaks plain HTTP to an ``https://`` URL.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomload.errors import ConfigError, EndpointError
from oomload.load.baseurl import BaseUrl
from oomload.load.preflight import preflight, serve_args


@contextlib.contextmanager
def raw_server(answer: bytes | None, *, close: bool = True) -> Iterator[str]:
    """Accepts connections; writes ``answer`` (None: nothing) and closes, or keeps them open."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.1)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if answer is not None:
                with contextlib.suppress(OSError):
                    conn.recv(4096)
                    conn.sendall(answer)
            if close:
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        for conn in held:
            conn.close()


def _message(url: str, timeout_s: float = 5.0) -> str:
    with pytest.raises(EndpointError) as info:
        preflight(url, model=None, api_key=None, timeout_s=timeout_s)
    return str(info.value)


def test_an_ssh_banner_is_not_http() -> None:
    with raw_server(b"SSH-2.0-OpenSSH_9.6\r\n") as url:
        message = _message(url)
    assert message.startswith(f"{url}/v1/models did not answer HTTP (BadStatusLine)")


def test_a_connection_closed_without_an_answer() -> None:
    with raw_server(b"") as url:
        message = _message(url)
    assert "closed the connection without an answer" in message


def test_a_server_that_never_answers_is_waited_on_for_the_stated_timeout() -> None:
    with raw_server(None, close=False) as url:
        message = _message(url, timeout_s=0.3)
    assert message == f"{url}/v1/models did not answer within 0.3 s; is the server running and the URL right?"


def test_https_spoken_to_a_plain_http_port_is_a_tls_failure() -> None:
    with raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") as url:
        message = _message(url.replace("http://", "https://"))
    assert message.startswith("TLS with https://127.0.0.1:")


def test_an_unknown_host_name_is_named() -> None:
    message = _message("http://oomload-no-such-host.invalid:8000")
    assert "cannot resolve the host name 'oomload-no-such-host.invalid'" in message


def test_a_refused_connection() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        message = _message(f"http://127.0.0.1:{port}")
    assert "(connection refused)" in message


V1_NOTE = "--url ends in /v1: using http://h:8000 (oomload adds /v1/… itself)"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://h:8000", ("http://h:8000", None)),
        ("http://h:8000/", ("http://h:8000", None)),
        ("https://h/proxy/", ("https://h/proxy", None)),
        ("http://h:8000/v1", ("http://h:8000", V1_NOTE)),
        ("http://h:8000/v1/", ("http://h:8000", V1_NOTE)),
    ],
)
def test_a_base_url_ending_in_v1_is_accepted_and_said(url: str, expected: tuple[str, str | None]) -> None:
    base = BaseUrl.parse(url)
    assert (base.text, base.note) == expected


def test_a_base_url_knows_its_parts() -> None:
    assert BaseUrl.parse("https://h/proxy/v1/") == BaseUrl(
        "https://h/proxy",
        "h",
        443,
        True,
        "/proxy",
        "--url ends in /v1: using https://h/proxy (oomload adds /v1/… itself)",
    )
    assert BaseUrl.parse("http://127.0.0.1:8000").port == 8000
    with pytest.raises(ConfigError, match=r"^--server-memory remote: 'ftp://h' must start with http"):
        BaseUrl.parse("ftp://h", "--server-memory remote:")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://[::1", "is not a valid URL (Invalid IPv6 URL)"),
        ("http://a..b:8000", "is not a valid URL"),
        ("http://h:port", "is not a valid URL"),
        ("http://h:70000", "is not a valid URL"),
        ("ftp://h", "must start with http:// or https://"),
        ("http:///v1", "names no host"),
        (
            "http://h:8000/?api_key=sk-in-the-query-99",
            "'http://h:8000/?***': give the server's base URL, without ?query",
        ),
        ("http://h:8000/#sk-in-the-fragment", "'http://h:8000/#***': give the server's base URL"),
    ],
)
def test_a_malformed_url_is_a_config_error(url: str, words: str) -> None:
    with pytest.raises(ConfigError, match=r".*") as info:
        BaseUrl.parse(url)
    assert words in str(info.value)
    if "sk-" in url:  # a key put in the query or fragment is never echoed
        assert "sk-" not in str(info.value)
    else:
        assert repr(url) in str(info.value)


def test_serve_args_are_what_vllm_serve_was_given_for_the_model() -> None:
    """vLLM's /v1/models card: ``root`` is what it loaded, ``parent`` a LoRA adapter's base model."""
    base = {"id": "llama", "root": "/models/llama-3.1-8b", "parent": None}
    hub = {"id": "meta-llama/Llama-3.1-8B", "root": "meta-llama/Llama-3.1-8B", "parent": None}
    lora = {"id": "sql-lora", "root": "/adapters/sql", "parent": "llama"}
    cards = [base, lora]
    assert serve_args(hub, [hub]) == ("meta-llama/Llama-3.1-8B",)
    served = ("/models/llama-3.1-8b", "--served-model-name", "llama")
    adapters = ("--enable-lora", "--lora-modules", "sql-lora=/adapters/sql")
    assert serve_args(base, [base]) == served
    assert serve_args(base, cards) == (*served, *adapters)  # the server had its adapters: they stay
    assert serve_args(lora, cards) == (*served, *adapters)
    assert serve_args({"id": "m"}, [{"id": "m"}]) == ()  # not vLLM: no root, nothing to say
    assert serve_args({"id": "a", "root": "/r", "parent": "gone"}, []) == ()  # its base is not listed


def test_an_adapter_of_a_rank_above_the_default_gets_a_rank_vllm_accepts(tmp_path: Path) -> None:
    """vLLM refuses an adapter above ``--max-lora-rank`` (16 unless given): the rank is read from the
    adapter's ``adapter_config.json`` where oomload can read it, rounded up to one of vLLM's choices."""
    ranks = {"r8": 8, "r24": 24, "unreadable": None}
    cards = [{"id": "base", "root": "/m/base", "parent": None}]
    for name, rank in ranks.items():
        (tmp_path / name).mkdir()
        if rank is not None:
            (tmp_path / name / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
        cards.append({"id": name, "root": str(tmp_path / name), "parent": "base"})
    args = serve_args(cards[1], cards)
    assert args[:3] == ("/m/base", "--served-model-name", "base")
    assert args[-2:] == ("--max-lora-rank", "32")  # 24 → vLLM's next choice
    assert serve_args(cards[1], cards[:2]) == ("/m/base", "--served-model-name", "base", "--enable-lora",
                                               "--lora-modules", f"r8={tmp_path / 'r8'}")  # fmt: skip
