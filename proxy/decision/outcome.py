"""What a decision read produced: the decision, how it was read, and how it was routed.

Pure data, beside the decision logic, so the wire formats (``protocol/``) can render
it without importing the service that makes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .readout import Decision

__all__ = ["Outcome"]


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    labels: tuple[str, ...]
    model: str
    prompt_tokens: int  # of the prompt as asked (what a replay must tokenise to)
    prompt_evaluated: int  # tokens llama-server computed for it (the rest came from its cache)
    reads: int  # upstream reads needed to know every label exactly
    calibration: dict[str, str] | None = None  # {"profile", "method"} once calibrated
    route: str | None = None  # "auto" | "review", from the profile's threshold
    route_reason: str | None = None  # why (profile.ROUTE_REASONS)
    debias: str | None = None  # the debiasing applied: "cyclic", "pride", "contextual"
    debias_note: str = ""  # why it is not the one asked for, when it is not
    # cyclic reads: (shift, probabilities by position shown), for estimating a position prior
    rotations: tuple[tuple[int, tuple[float, ...]], ...] = ()
    # every prompt sent, once per read (a widened read, rotations, a content-free read);
    # 0: prompt_tokens
    input_tokens: int = 0
    read_scheme: str = ""  # how the prompt was evaluated: "prefix-63", "segment" (proxy/kv.py)
    repeatable: bool | None = None  # the server's self-check (decision/selfcheck.py); None: not yet
    layout: str = "conversation_first"  # decision/prompt.py's LAYOUTS (System One: state first)
    # the prompt's token ids as read (the options in the caller's order), for the decision
    # record's keyed hash (proxy/recorder.py); empty when read through the chat endpoint
    prompt_ids: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def tokens_in(self) -> int:
        """The input tokens, OpenAI's meaning: every token of every prompt read."""
        return self.input_tokens or self.prompt_tokens

    @property
    def tokens_cached(self) -> int:
        """Of ``tokens_in``, those llama-server served from its cache."""
        return max(0, self.tokens_in - self.prompt_evaluated)
