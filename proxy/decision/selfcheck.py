"""Whether repeatable reads hold on the server at hand: the known prompt read four ways
must agree bit for bit (the service makes the reads: ``DecisionService.check``).

The mechanism (docs/repeatability.md) rests on one llama.cpp build's CPU kernels;
another build, a GPU backend or other server flags may choose kernels differently.
So the proxy checks where it runs: a prompt of more than 300 tokens, read through the
canonical path from an unknown slot, after another conversation that shares half of
it in the same slot, as a replay, and in another slot after a conversation that shares
only the template's opening.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["CHECK_OPTIONS", "CHECK_TEXT", "Check", "OTHER_TEXT", "WAYS", "compare"]

# About 330 tokens with SmolLM2's tokenizer; the question after it adds about 40.
CHECK_TEXT = " ".join(
    f"Entry {i}: the parcel for order {4100 + i} left the warehouse on day {i % 7 + 1}, "
    f"was scanned at hub {chr(65 + i % 26)} and is expected within {i % 5 + 2} days."
    for i in range(12)
)
OTHER_TEXT = CHECK_TEXT[: len(CHECK_TEXT) // 2] + " The rest of this note is about invoices."
CHECK_OPTIONS = ("delivered", "in transit", "lost")
WAYS = (
    "from an unknown slot",
    "after another conversation in the same slot",
    "as a replay",
    "in another slot",
)


@dataclass(frozen=True)
class Check:
    """The outcome of a check: the read scheme it covered, whether every way agreed
    (``None`` while not checked), and what differed."""

    scheme: str
    repeatable: bool | None
    detail: str = ""
    checked_at: float = 0.0  # unix time

    def as_json(self) -> dict[str, object]:
        return {
            "read_scheme": self.scheme,
            "repeatable": self.repeatable,
            "detail": self.detail,
            "checked_at": self.checked_at,
        }


def compare(reads: Sequence[Mapping[int, float]]) -> tuple[bool, str]:
    """Whether every read's top log-probabilities equal the first read's, bit for bit
    (the same tokens, the same floats), and if not, which way differed and by how much."""
    first = reads[0]
    for way, read in zip(WAYS[1:], reads[1:]):
        if read != first:
            common = set(read) & set(first)
            gap = max((abs(read[t] - first[t]) for t in common), default=float("inf"))
            return False, (
                f"the read {way} differs from the one {WAYS[0]}: largest "
                f"log-probability change {gap:.3g} over {len(common)} common tokens"
            )
    return True, f"{len(reads)} reads identical"
