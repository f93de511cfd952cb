"""``StreamScrubber``: chunked bytes scrubbed as ``scrub`` scrubs the whole text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oomload.credentials import StreamScrubber, scrub

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
    out += scrubber.flush()
    assert out.decode() == scrub(text.decode(), SECRETS)


def test_without_secrets_nothing_is_held() -> None:
    scrubber = StreamScrubber.of((None, "", "abc"))  # none of them a secret scrub would replace
    assert scrubber.feed(b"sk-") == b"sk-" and scrubber.flush() == b""
