"""Before the first request: is the endpoint there, which model does it serve, how long a context?

Plain HTTP (``urllib``, never through a proxy, as the load: ``telemetry.scrape.open_direct``):
``GET /v1/models`` gives the model id and vLLM's ``max_model_len``, and what ``vllm serve`` was given
for it (``serve_args``, for the recommended line): vLLM's card has the path or Hub id it loaded
(``root``) and, for a LoRA adapter, the base model's name (``parent``), so a name given with
``--served-model-name`` or an adapter's name is not taken for a model to load, and the adapters served
on the base are named with their paths (``--lora-modules``). Whatever
goes wrong on the way — a refused connection, an unknown host name, a TLS failure, no answer within the
timeout, an answer that is not HTTP at all (an SSH banner), an HTTP error, a body that is not JSON —
becomes an ``EndpointError`` with one clear sentence (exit 3), never a traceback.

The base URL it is given was checked once, before anything is sent (``oomload.load.baseurl``). A
404 on ``/v1/models`` says to give the base URL. ``count_unfit`` says how many trace requests cannot fit
``max_model_len``.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomload.errors import EndpointError
from oomload.load.payload import TokenizeError
from oomload.telemetry.scrape import open_direct
from oomload.trace.model import TraceRecord


@dataclass(frozen=True, slots=True)
class Preflight:
    """What the endpoint told us."""

    model: str
    max_model_len: int | None
    models: tuple[str, ...]
    serve_args: tuple[str, ...] = ()  # ``vllm serve``'s model (and served name) for this model; () unknown


def get_json(url: str, *, timeout_s: float, api_key: str | None = None) -> Any:
    """GET ``url`` and decode its JSON body; raises ``EndpointError`` on any failure."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with open_direct(request, timeout_s) as resp:
            body = resp.read(4 << 20)
    except urllib.error.HTTPError as err:
        hint = " (check the API key: --api-key-env)" if err.code in (401, 403) else ""
        if err.code == 404:
            hint = " (is --url the server's base URL, e.g. http://host:8000, with nothing after the port?)"
        raise EndpointError(f"{url} answered HTTP {err.code}{hint}") from err
    except Exception as err:  # every way a GET can fail becomes one sentence
        raise EndpointError(describe_failure(url, err, timeout_s)) from err
    try:
        return json.loads(body)
    except ValueError as err:
        raise EndpointError(f"{url} did not answer JSON; is this an OpenAI-compatible server?") from err


def describe_failure(url: str, err: BaseException, timeout_s: float) -> str:
    """One sentence for a GET that failed before an HTTP status came back."""
    reason: object = err.reason if isinstance(err, urllib.error.URLError) else err
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"{url} did not answer within {timeout_s:g} s; is the server running and the URL right?"
    if isinstance(reason, http.client.RemoteDisconnected):
        return f"{url} closed the connection without an answer; is this an HTTP server?"
    if isinstance(reason, http.client.HTTPException):
        return (
            f"{url} did not answer HTTP ({type(reason).__name__}); is this the server's HTTP port "
            "(not SSH, a database, or HTTPS spoken as http://)?"
        )
    if isinstance(reason, ssl.SSLError):
        return f"TLS with {url} failed ({reason}); is it an https:// server, and is its certificate trusted?"
    if isinstance(reason, socket.gaierror):
        host = urllib.parse.urlsplit(url).hostname
        return f"cannot resolve the host name {host!r} of {url} ({reason.strerror or reason})"
    if isinstance(reason, ConnectionRefusedError):
        return f"cannot reach {url} (connection refused); is the server running and the URL right?"
    if isinstance(reason, (OSError, ValueError)):  # UnicodeError is a ValueError
        return f"cannot reach {url} ({reason}); is the server running and the URL right?"
    return f"cannot reach {url} ({type(reason).__name__}: {reason})"


def preflight(base_url: str, *, model: str | None, api_key: str | None, timeout_s: float = 10.0) -> Preflight:
    """Check the endpoint and resolve the model; ``EndpointError`` with a clear sentence otherwise."""
    url = base_url.rstrip("/") + "/v1/models"
    obj = get_json(url, timeout_s=timeout_s, api_key=api_key)
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        raise EndpointError(
            f"{url} did not list models (no 'data' array); is this an OpenAI-compatible server?"
        )
    cards = [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]
    ids = tuple(str(c["id"]) for c in cards)
    if not ids:
        raise EndpointError(f"{url} lists no model")
    if model is None:
        chosen = cards[0]
    else:
        match = [c for c in cards if c["id"] == model]
        if not match:
            raise EndpointError(f"model {model!r} is not served at {base_url}; it serves: {', '.join(ids)}")
        chosen = match[0]
    max_len = chosen.get("max_model_len")
    return Preflight(
        model=str(chosen["id"]),
        max_model_len=max_len if isinstance(max_len, int) and max_len > 0 else None,
        models=ids,
        serve_args=serve_args(chosen, cards),
    )


def serve_args(card: dict[str, Any], cards: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """What ``vllm serve`` was given for the model of ``card`` (module docstring): its ``root`` (a LoRA
    adapter's: its ``parent``'s), with ``--served-model-name`` when the name differs, and the adapters
    served on that base (``--enable-lora --lora-modules NAME=ROOT …``, with ``--max-lora-rank`` when an
    adapter's ``adapter_config.json`` is readable here and its rank is above vLLM's default); ``()``
    when the card does not say (a server that is not vLLM)."""
    parent = card.get("parent")
    if isinstance(parent, str) and parent:  # a LoRA adapter: the base model is what was served
        card = next((c for c in cards if c.get("id") == parent), {"id": parent, "root": None})
    name, root = str(card["id"]), card.get("root")
    if not isinstance(root, str) or not root:
        return ()
    args = [root] if root == name else [root, "--served-model-name", name]
    adapters = [(str(c["id"]), c["root"]) for c in cards if c.get("parent") == name and _text(c.get("root"))]
    if adapters:
        args += ["--enable-lora", "--lora-modules", *(f"{a}={path}" for a, path in adapters)]
        rank = max((_lora_rank(path) for _, path in adapters), default=0)
        if rank > DEFAULT_LORA_RANK:
            args += ["--max-lora-rank", str(min((r for r in LORA_RANKS if r >= rank), default=rank))]
    return tuple(args)


# vLLM's ``--max-lora-rank`` choices and default (``vllm/config/lora.py``, 0.11-0.13)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_LORA_RANK = 16


def _text(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _lora_rank(root: str) -> int:
    """A PEFT adapter's rank ``r`` from ``ROOT/adapter_config.json``; 0 when it cannot be read here (a
    server on another host, a Hub id)."""
    try:
        obj = json.loads((Path(root) / "adapter_config.json").read_text(encoding="utf-8"))
        rank = obj.get("r") if isinstance(obj, dict) else None
    except (OSError, ValueError):
        return 0
    return rank if isinstance(rank, int) and rank > 0 else 0


def tokenize_counter(base_url: str, model: str, api_key: str | None) -> Callable[[str], int]:
    """``count_tokens(text)`` through vLLM's ``POST /tokenize`` in its messages form (the chat template
    counted): what ``--api chat`` calibrates its prompts with. ``TokenizeError`` on any failure."""
    target = base_url.rstrip("/") + "/tokenize"

    def count(text: str) -> int:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode()
        request = urllib.request.Request(target, data=body, headers={"Content-Type": "application/json"})
        if api_key:
            request.add_header("Authorization", f"Bearer {api_key}")
        try:
            with open_direct(request, 30.0) as resp:
                obj = json.loads(resp.read(1 << 20))
            return int(obj["count"])
        except urllib.error.HTTPError as err:
            short, refused = f"answered HTTP {err.code}", False
        except (ValueError, KeyError, TypeError):
            short, refused = "did not answer a token count", False
        except Exception as err:  # every way a POST can fail: one short phrase
            reason: object = err.reason if isinstance(err, urllib.error.URLError) else err
            refused = isinstance(reason, ConnectionRefusedError)
            short = "refused the connection" if refused else f"failed ({type(reason).__name__})"
        raise TokenizeError(
            f"{target} {short}; chat mode needs the server's /tokenize", short, refused=refused
        )

    return count


def check_tokenize(base_url: str, model: str, api_key: str | None) -> None:
    """Before a chat replay: one count through ``/tokenize``, so a server without it (not vLLM, or a
    gateway that does not pass it on) is one sentence before any load."""
    try:
        tokenize_counter(base_url, model, api_key)("")
    except TokenizeError as err:
        raise EndpointError(
            f"--api chat calibrates every prompt through the server's /tokenize, and "
            f"{base_url.rstrip('/')}/tokenize {err.short}: replay over the completions API (the default), "
            "or point --url at the vLLM server itself"
        ) from err


def server_version(base_url: str, *, api_key: str | None, timeout_s: float = 5.0) -> str | None:
    """The server's version from vLLM's ``GET /version`` (``{"version": "0.11.0"}``); ``None`` when the
    server has no such route or does not answer (the report then says "not reported")."""
    try:
        obj = get_json(base_url.rstrip("/") + "/version", timeout_s=timeout_s, api_key=api_key)
    except EndpointError:
        return None
    version = obj.get("version") if isinstance(obj, dict) else None
    return version if isinstance(version, str) and version else None


def count_unfit(records: Sequence[TraceRecord], max_model_len: int | None) -> int:
    """How many requests need more than ``max_model_len`` tokens (prompt + output)."""
    if max_model_len is None:
        return 0
    return sum(1 for r in records if not r.fits(max_model_len))
