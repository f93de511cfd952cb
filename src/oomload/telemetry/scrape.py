"""One HTTP GET of a Prometheus text endpoint (vLLM ``/metrics``, a DCGM exporter, ``oomload sample``).

Stdlib ``urllib`` with a timeout: under Locust's gevent patching its sockets are cooperative, and in
a plain process it blocks only the calling thread. Every failure becomes one ``EndpointError``
sentence naming the URL and the reason (refused, timed out, HTTP status, …).
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

from oomload.errors import EndpointError

MAX_BODY_BYTES = 64 * 1024 * 1024


def fetch_text(url: str, timeout_s: float) -> str:
    """GET ``url`` and return its body as text; every failure becomes one ``EndpointError`` sentence."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body: bytes = response.read(MAX_BODY_BYTES)
            charset = response.headers.get_content_charset() or "utf-8"
    except urllib.error.HTTPError as err:
        raise EndpointError(f"GET {url} answered HTTP {err.code} {err.reason}") from err
    except urllib.error.URLError as err:
        raise EndpointError(f"GET {url} failed: {_reason(err.reason)}") from err
    except TimeoutError as err:
        raise EndpointError(f"GET {url} timed out after {timeout_s:g} s") from err
    except (http.client.HTTPException, ConnectionError, OSError) as err:
        raise EndpointError(f"GET {url} failed: {_reason(err)}") from err
    return body.decode(charset, errors="replace")


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is the server running?)"
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    text = str(reason) or type(reason).__name__
    return text
