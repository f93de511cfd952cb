"""``StreamScrubber``: chunked bytes scrubbed as ``scrub`` scrubs the whole text; URLs as shown."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oomload.credentials import StreamScrubber, redact_url, scrub, url_has_credentials

SECRETS = ("sk-SECRET123abc", "tok-ABAB")
PIECES = ["sk-SE", "CRET123abc", "sk-", "tok-AB", "AB", "x", "\n", "tok-"]


@given(
    parts=st.lists(st.sampled_from(PIECES), max_size=12),
    cuts=st.lists(st.integers(0, 200), max_size=6),
)
def test_chunked_scrub_is_the_whole_text_scrubbed(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts).encode()
    scrubber = StreamScrubber.of(SECRETS)
    out, start = b"", 0
    for cut in sorted({min(c, len(text)) for c in cuts} | {len(text)}):
        out += scrubber.feed(text[start:cut])
        start = cut
    whole = scrub(text.decode(), SECRETS)
    assert whole.startswith(out.decode())
    cut_off = whole[len(out.decode()) :]  # the start of a secret at the very end, held back
    assert not cut_off or any(s.startswith(cut_off) and s != cut_off for s in SECRETS if s)
    assert scrubber.flush() == (b"***" if cut_off else b"")


def test_a_stream_cut_in_the_middle_of_a_secret_ends_with_stars() -> None:
    scrubber = StreamScrubber.of(("sk-serve-scrub-key",))
    assert scrubber.feed(b"--api-key sk-serve-scrub-") == b"--api-key "
    assert scrubber.flush() == b"***"


def test_without_secrets_nothing_is_held() -> None:
    scrubber = StreamScrubber.of((None, "", "abc"))  # none of them a secret scrub would replace
    assert scrubber.feed(b"sk-") == b"sk-" and scrubber.flush() == b""


def test_a_shown_url_hides_user_information_and_any_query_or_fragment() -> None:
    assert redact_url("http://u:pw@h:8000/v1?api_key=sk-1#x") == "http://***@h:8000/v1?***"
    assert redact_url("https://h/p#token=abc") == "https://h/p#***"
    assert redact_url("http://h:8000/proxy") == "http://h:8000/proxy"
    assert url_has_credentials("http://u:pw@h") and not url_has_credentials("http://h/?user=a@b")
