"""Before the first request: is the endpoint there, which model does it serve, how long a context?

Plain HTTP (``urllib``): ``GET /v1/models`` gives the model id and vLLM's ``max_model_len``; a
missing endpoint, a refused connection or a non-OpenAI answer becomes an ``EndpointError`` with one
clear sentence. ``count_unfit`` says how many trace requests cannot fit ``max_model_len``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oomload.errors import EndpointError
from oomload.trace import TraceRecord


@dataclass(frozen=True, slots=True)
class Preflight:
    """What the endpoint told us."""

    model: str
    max_model_len: int | None
    models: tuple[str, ...]


def get_json(url: str, *, timeout_s: float, api_key: str | None = None) -> Any:
    """GET ``url`` and decode its JSON body; raises ``EndpointError`` on any failure."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            body = resp.read(4 << 20)
    except urllib.error.HTTPError as err:
        hint = " (check the API key: --api-key-env)" if err.code in (401, 403) else ""
        raise EndpointError(f"{url} answered HTTP {err.code}{hint}") from err
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise EndpointError(
            f"cannot reach {url} ({reason}); is the server running and the URL right?"
        ) from err
    try:
        return json.loads(body)
    except ValueError as err:
        raise EndpointError(f"{url} did not answer JSON; is this an OpenAI-compatible server?") from err


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
    )


def count_unfit(records: Sequence[TraceRecord], max_model_len: int | None) -> int:
    """How many requests need more than ``max_model_len`` tokens (prompt + output)."""
    if max_model_len is None:
        return 0
    return sum(1 for r in records if max(1, r.prompt_tokens) + max(1, r.output_tokens) > max_model_len)
