"""One HTTP GET of a Prometheus text endpoint (vLLM ``/metrics``, a DCGM exporter, ``oomload sample``),
and ``open_direct``: every request to the server besides the load goes through it.

Stdlib ``urllib`` with a timeout: under Locust's gevent patching its sockets are cooperative, and in
a plain process it blocks only the calling thread. Every failure becomes one ``EndpointError``
sentence naming the URL and the reason (refused, timed out, HTTP status, …).

**Direct, never through a proxy.** ``urllib.request.urlopen`` honours ``http_proxy``/``https_proxy``;
the load (``oomload.load.http``, raw sockets) does not. A proxy variable set for other tools would
then send the preflight, ``/health``, ``/tokenize`` and ``/metrics`` to the proxy while the load went
straight to the server — a reachable server called unreachable, or watched through another host. So
``open_direct`` is ``urlopen`` through one shared opener without proxies (``ProxyHandler({})``), for
the preflight (``oomload.load.preflight``), the death watch, the started server's ``/health``
(``oomload.realvllm.server``) and the scrapes here.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from typing import Any

from oomload.errors import EndpointError

MAX_BODY_BYTES = 64 * 1024 * 1024
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy (module docstring)


def open_direct(request: str | urllib.request.Request, timeout_s: float) -> Any:
    """``urllib.request.urlopen(request, timeout=timeout_s)``, never through a proxy; raises as it does."""
    return _DIRECT.open(request, timeout=timeout_s)


def fetch_text(url: str, timeout_s: float) -> str:
    """GET ``url`` and return its body as text; every failure becomes one ``EndpointError`` sentence."""
    try:
        with open_direct(url, timeout_s) as response:
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
