"""Lines a reader could not use: counted by reason, with the first few locations kept for the user.

Readers call ``SkipLog.skip(reason, path, line)`` for every unusable line and carry on; with
``strict=True`` the first call raises ``TraceFormatError(reason, path, line)`` instead, so
``oomload trace build --strict`` stops at the first bad line. Notes (``note``) record facts about the
build that are not errors but that a user must know (e.g. "output lengths are the requested
max_tokens"), each once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from oomload.errors import TraceFormatError

NO_TOKEN_COUNTS = "no token counts (give --tokenizer)"


@dataclass(slots=True)
class SkipLog:
    """Counts of skipped lines by reason, and the first ``keep`` ``path:line`` of each reason."""

    strict: bool = False
    keep: int = 5
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    truncated_requests: int = 0  # requests kept whose prefix chain covers only the logged part

    def skip(self, reason: str, path: str, line: int | None) -> None:
        if self.strict:
            raise TraceFormatError(f"{reason} (stopped by --strict)", path, line)
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < self.keep:
            shown.append(path if line is None else f"{path}:{line}")

    def skip_at(self, reason: str, path: str, line_of: Callable[[], int]) -> None:
        """``skip`` with the line number computed by ``line_of`` only when it is kept: under
        ``strict``, or for the first ``keep`` lines of a reason (a reader that must count lines for it)."""
        kept = self.strict or len(self.examples.get(reason, ())) < self.keep
        self.skip(reason, path, line_of() if kept else None)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def absorb(self, other: SkipLog) -> None:
        """Add ``other``'s counts, examples (up to ``keep``) and notes after these."""
        for reason, count in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + count
            shown = self.examples.setdefault(reason, [])
            shown += other.examples.get(reason, [])[: max(self.keep - len(shown), 0)]
        for text in other.notes:
            self.note(text)
        self.truncated_requests += other.truncated_requests

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items(), key=lambda item: -item[1]))


def nothing_usable(skips: SkipLog) -> str:
    """The sentence for inputs that yielded no request: why, by reason."""
    if not skips.counts:
        return "no requests found in the input"
    reasons = "; ".join(f"{reason}: {n}" for reason, n in skips.as_dict().items())
    return f"no usable requests in the input ({skips.total} lines skipped — {reasons})"
