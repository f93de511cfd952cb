"""Secrets in, never out: the API key from the environment, and URLs that must not carry credentials.

The API key travels in one place only, the ``Authorization: Bearer KEY`` header. A value that cannot
be a header value would make the HTTP client raise an error whose text holds the whole header (the
key with it), so the key is checked before anything is sent: it must be one word of printable ASCII
(``!`` … ``~``). Each way it can be wrong gets its own sentence — a trailing carriage return (a key
file saved with Windows line ends), other white space or control characters, a non-ASCII character
(a typographic quote or dash copied with it) — and every sentence names the *variable*, never the
value, not even part of it.

A URL with ``user:password@`` in it would be echoed by every message that names the URL, and written
to ``config.json``; ``url_credentials_error`` says why it is refused without repeating it, and
``redact_url`` hides the user information, and a query or fragment (``?api_key=…``), in any URL that is
shown anyway. ``scrub`` replaces a secret
in text built from an exception that oomload did not word itself (the last line of defence for
crash reports). ``StreamScrubber`` does the same to bytes that arrive in chunks (a server's log as it
is copied): a secret split between two chunks is still replaced, because the end of a chunk that could
begin a secret is held back until the next one says whether it does; a stream that ends there (its
writer killed mid-secret) ends with ``***``, never with the start of the secret.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from oomload.errors import ConfigError

REDACTED = "***"


def api_key_problem(value: str) -> str | None:
    """What is wrong with ``value`` as an API key, in words that never quote it; None when nothing."""
    ends = value[: len(value) - len(value.lstrip())] + value[len(value.rstrip()) :]
    if "\r" in ends:
        return "ends with a carriage return (a key file saved with Windows line ends?)"
    if "\n" in ends:
        return "starts or ends with a line break"
    if ends:
        return "starts or ends with white space"
    if any(ord(c) > 0x7E for c in value):
        return (
            "holds a non-ASCII character (a typographic quote or dash copied with it?); "
            "an HTTP header carries ASCII only"
        )
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in value):
        return "holds white space or a control character inside it; an API key is one word"
    return None


def read_api_key(env_var: str, environ: Mapping[str, str]) -> str | None:
    """The API key in ``environ[env_var]`` (None when unset or empty); ``ConfigError`` naming the
    variable and what is wrong when it cannot be sent as a header value."""
    value = environ.get(env_var) or None
    if value is None:
        return None
    problem = api_key_problem(value)
    if problem is not None:
        raise ConfigError(f"the API key in ${env_var} {problem}; fix the variable (its value is not shown)")
    return value


def url_has_credentials(url: str) -> bool:
    """True when the URL's authority (between ``://`` and the next ``/``, ``?`` or ``#``) holds ``@``."""
    _, sep, rest = url.partition("://")
    return bool(sep) and "@" in rest[: _authority_end(rest)]


def redact_url(url: str) -> str:
    """``url`` as it may be shown: any ``user:password@`` as ``***@``, and a ``?query`` or ``#fragment``
    (where a key is often put: ``?api_key=…``) as ``?***`` / ``#***``; otherwise unchanged."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = _authority_end(rest)
    authority, path = rest[:end], rest[end:]
    if "@" in authority:
        authority = f"{REDACTED}@{authority.rpartition('@')[2]}"
    for mark in "?#":
        if mark in path:
            path = path[: path.index(mark)] + mark + REDACTED
            break
    return f"{scheme}://{authority}{path}"


def _authority_end(rest: str) -> int:
    """Where the authority of ``rest`` (a URL after ``://``) ends: at its first ``/``, ``?`` or ``#``."""
    stops = [at for at in (rest.find(c) for c in "/?#") if at >= 0]
    return min(stops, default=len(rest))


def url_credentials_error(flag: str, url: str, key_env: str = "OPENAI_API_KEY") -> ConfigError:
    """The refusal of a URL with credentials in it; shows the URL with them hidden."""
    return ConfigError(
        f"{flag} {redact_url(url)} holds credentials (user:password@); oomload neither sends nor shows "
        f"them: give the URL without them and put the key in {key_env}"
    )


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every occurrence of each non-empty secret replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


def _secret_bytes(secrets: Iterable[str | None]) -> tuple[bytes, ...]:
    """The secrets ``scrub`` replaces, as UTF-8 bytes."""
    return tuple(s.encode() for s in secrets if s and len(s) >= 4)


@dataclass
class StreamScrubber:
    """``scrub`` over a byte stream given in chunks (module docstring): ``feed`` returns what can be
    written now; ``flush`` ends the stream, the held-back end (the start of a secret cut off, when the
    writer was killed in the middle of writing it) as ``***``."""

    secrets: tuple[bytes, ...]
    _held: bytes = field(default=b"", init=False)

    @classmethod
    def of(cls, secrets: Iterable[str | None]) -> StreamScrubber:
        return cls(_secret_bytes(secrets))

    def feed(self, chunk: bytes) -> bytes:
        if not self.secrets:
            return chunk
        data = self._held + chunk
        for secret in self.secrets:
            data = data.replace(secret, REDACTED.encode())
        keep = 0  # the longest end of ``data`` that begins a secret
        for secret in self.secrets:
            for n in range(min(len(secret) - 1, len(data)), keep, -1):
                if data.endswith(secret[:n]):
                    keep = n
                    break
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return REDACTED.encode() if held else b""
