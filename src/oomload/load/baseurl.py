"""A server's base URL, parsed and checked once: what oomload appends ``/v1/…`` and ``/metrics`` to (pure).

``BaseUrl.parse`` is the one place a user's URL is read (``--url``, ``OOMLOAD_URL`` or Locust's
``--host``, ``--server-memory remote:URL``). It refuses, with one sentence naming the flag
(``ConfigError``, exit 2): a URL that is not ``http(s)://host[:port][/path]`` (a port out of range,
an empty host label), one with ``user:password@`` in it (refused, and never repeated), one with a
``?query`` or ``#fragment``, and one that names an endpoint such as ``/v1/completions`` instead of
the server's base. A trailing ``/`` goes, and so does a trailing ``/v1`` — the OpenAI SDK's habit
(``base_url=…/v1``) — with a ``note`` saying so, since oomload appends ``/v1/…`` itself.

``http_url`` checks a URL that is read as given, path and all (``--gpu dcgm:URL``, ``--gpu
remote:URL``, ``oomload sample --dcgm-url``): the same first rules — ``http(s)://``, a host, a valid
port, no ``user:password@`` — so a bad one is one sentence before anything runs, never an error from
the first request.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from oomload.credentials import redact_url, url_credentials_error, url_has_credentials
from oomload.errors import ConfigError

ENDPOINT_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/embeddings", "/metrics")


@dataclass(frozen=True, slots=True)
class BaseUrl:
    """A checked base URL: ``text`` has no trailing ``/`` or ``/v1``; ``note`` says what was dropped."""

    text: str
    host: str
    port: int
    tls: bool
    path: str  # the base's own path, "" or "/prefix" (no trailing slash)
    note: str | None = None

    @classmethod
    def parse(cls, url: str, flag: str = "--url") -> BaseUrl:
        """The base URL of ``url`` (module docstring); ``ConfigError`` naming ``flag`` when it is not one."""
        shown = redact_url(url)
        parts, host, port = _split(url, flag, f"{flag} {shown!r} must start with http:// or https://")
        if parts.query or parts.fragment:
            raise ConfigError(f"{flag} {shown!r}: give the server's base URL, without ?query or #fragment")
        base = url.rstrip("/")
        endpoint = next((e for e in ENDPOINT_PATHS if base.endswith(e)), None)
        if endpoint is not None:
            raise ConfigError(
                f"{flag} {shown!r} names the endpoint {endpoint}; give the server's base URL "
                f"({base[: -len(endpoint)] or 'http://HOST:PORT'}): oomload adds /v1/… itself"
            )
        note = None
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
            note = f"{flag} ends in /v1: using {base} (oomload adds /v1/… itself)"
        tls = parts.scheme == "https"
        path = urllib.parse.urlsplit(base).path.rstrip("/")
        return cls(base, host, port or (443 if tls else 80), tls, path, note)

    def __str__(self) -> str:
        return self.text


def http_url(url: str, flag: str) -> str:
    """``url`` as given, when it is an ``http(s)://HOST[:PORT][/PATH]`` URL without credentials;
    ``ConfigError`` naming ``flag`` otherwise (module docstring)."""
    shown = redact_url(url)
    _split(url, flag, f"{flag} must be an http(s) URL (http://HOST[:PORT][/PATH]), got {shown!r}")
    return url


def _split(url: str, flag: str, not_http: str) -> tuple[urllib.parse.SplitResult, str, int | None]:
    """``url``'s parts, host and port; ``ConfigError`` for credentials, a URL that does not parse, a
    scheme other than http(s) (the sentence ``not_http``) or no host."""
    if url_has_credentials(url):
        raise url_credentials_error(flag, url)
    shown = redact_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # ValueError for a port that is not a number or out of range
        host = parts.hostname
        if host:
            host.encode("idna")  # UnicodeError for an empty or overlong label ("a..b")
    except ValueError as err:  # UnicodeError is a ValueError
        raise ConfigError(f"{flag} {shown!r} is not a valid URL ({err})") from err
    if parts.scheme not in ("http", "https"):
        raise ConfigError(not_http)
    if not host:
        raise ConfigError(f"{flag} {shown!r} names no host (expected http://HOST[:PORT])")
    return parts, host, port
