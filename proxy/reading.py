"""One question's read: the next token's log-probabilities at the answer position of its
prompt (``Prepared``, made by proxy/preparing.py), widened until every label's is known.

Text conversations are read repeatably (``proxy/reader.py``): through ``/completion``
with the prompt's tokens, pinned to a leased slot. Others (images, audio) go through
llama-server's chat endpoint, which renders them itself. No grammar: llama-server
reports the probabilities before any grammar, which would only choose the generated
token. Nothing is guessed: a label missing from the widest read is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .bounded import BoundedCache
from .catalogue import Labels
from .decision.outcome import Outcome
from .decision.prompt import DEFAULT_LAYOUT
from .decision.question import Question
from .decision.readout import decide
from .decision.selfcheck import Check
from .errors import InvalidRequest, UpstreamBadResponse
from .facts import Facts
from .prompt_cache import Prompt
from .reader import Reader, short
from .upstream import ModelInfo, NextToken, Upstream

__all__ = ["Prepared", "Reading", "read_widths"]

_WIDE_READ = 1024
_UNKNOWN_VOCAB = 1 << 18  # llama-server clamps n_probs to its vocabulary
_MAX_OPTION_COUNTS = 32  # option counts whose reads-needed are remembered
_MAX_LABEL_SETS = 256  # label sets whose sufficient read width is remembered ...
_NARROW_AGAIN = 32  # ... for this many decisions, then the first width is tried again


class Prepared(NamedTuple):
    """One question's prompt: its model and labels, the conversation it is read in and
    that conversation's tokens (None: read through the chat endpoint), made for a read
    scheme (``ubatch``). Made once per question, by the admission's estimate, and taken
    by the read."""

    info: ModelInfo
    labels: Labels
    convo: list[dict[str, Any]]
    tokens: Prompt | None
    ubatch: int


def read_widths(first: int, n_labels: int, n_vocab: int | None) -> list[int]:
    """The top-k sizes tried in turn: the configured first read (at least 4 per
    label), a wide read, then the whole vocabulary. Strictly increasing."""
    vocab = n_vocab or _UNKNOWN_VOCAB
    steps = [max(first, 4 * n_labels), max(_WIDE_READ, 16 * n_labels), vocab]
    out: list[int] = []
    for k in steps:
        k = min(k, vocab)
        if not out or k > out[-1]:
            out.append(k)
    return out


class Reading:
    """One served model's reads. ``n_probs``: the first width read; ``checked``: the
    latest self-check (proxy/checking.py), which answers say whether reads repeat by."""

    def __init__(
        self,
        upstream: Upstream,
        reader: Reader,
        *,
        n_probs: int,
        checked: Callable[[], Check],
    ):
        self._upstream = upstream
        self._reader = reader
        self._n_probs = n_probs
        self._checked = checked
        # option count -> reads its last decision took
        self._reads_needed: BoundedCache[int, int] = BoundedCache(_MAX_OPTION_COUNTS)
        # label token ids -> (the read width that held them all, decisions started there)
        self._widths: BoundedCache[tuple[int, ...], tuple[int, int]] = BoundedCache(_MAX_LABEL_SETS)

    def reads_needed(self, n_options: int) -> int:
        """How many reads the last decision with ``n_options`` options took (1 when none
        was made): what admission's estimate expects the next one to take."""
        return self._reads_needed.get(n_options) or 1

    async def read(
        self,
        question: Question,
        prepared: Prepared,
        kwargs: Mapping[str, Any],
        layout: str = DEFAULT_LAYOUT,
        *,
        in_fan_out: bool = False,
        facts: Facts | None = None,
    ) -> Outcome | None:
        """The read, or ``None`` when a model other than ``prepared.info``'s answered it.

        ``in_fan_out``: one of a request's questions read in parallel on the segment scheme
        (``DecisionService``'s fan-out), which takes a free slot rather than wait for one.
        ``facts``: the request's (proxy/facts.py).

        A read returns the top ``width`` log-probabilities; a label missing there (a model
        that wants to open with a preamble or a thinking token gives the labels little
        mass) is fetched by a wider read (``read_widths``: three at most), never guessed.
        Each wider read sends the prompt again, and a short prompt's slot may have been
        used by a read queued behind it meanwhile, so on a slow model each can cost the
        whole prompt: the width that held these labels last time is where the next
        decision on them starts (the numbers are the same at any width: one forward
        pass), so extra reads are made once per label set (and a narrow read tried again
        every ``_NARROW_AGAIN`` decisions), not once per decision."""
        info, labels, convo, tokens, ubatch = prepared
        names = tuple(label for label, _ in labels)
        ids = [tid for _, tid in labels]
        if tokens is not None and info.n_ctx and len(tokens[0]) >= info.n_ctx:
            raise InvalidRequest(
                f"the prompt needs {len(tokens[0]) + 1} tokens (the answer's included); a "
                f"llama-server slot holds {info.n_ctx}: send less, or start llama-server with "
                "a larger context per slot",
                code="context_length_exceeded",
            )
        evaluated = reads = 0
        first: NextToken | None = None
        book = await self._reader.book(facts)
        segment = (tokens[0] if ubatch else tokens[0][: tokens[1]]) if tokens else ()
        queued = tokens is not None and short(tokens[0], ubatch)
        own = len(tokens[0]) - len(segment) if tokens else 0  # after the segment
        async with book.lease(
            segment, by_prefix=bool(ubatch), short=queued, own=own, wait=not in_fan_out, facts=facts
        ) as slot:
            widths = read_widths(self._n_probs, len(labels), info.n_vocab)
            width_from = self._width_from(tuple(ids), widths)
            for width in widths[widths.index(width_from) :]:
                if tokens is None:  # pinned too, so that it cannot land in a leased slot
                    book.contents[slot] = None
                    read = await self._upstream.next_token(
                        convo, n_probs=width, template_kwargs=kwargs, slot=slot, facts=facts
                    )
                    spent = read.prompt_evaluated
                else:
                    read, spent = await self._reader.read(
                        book, slot, *tokens, width, ubatch, facts=facts
                    )
                if read.model != info.id:
                    return None
                first = first or read
                reads += 1
                evaluated += spent
                # All labels from one read: one forward pass, one set of numerics.
                logprobs = read.of(ids)
                if logprobs is not None:
                    self._reads_needed.put(len(labels), reads)
                    self._width_held(tuple(ids), widths, width_from, width)
                    return Outcome(  # each read sent the whole prompt (mostly cached)
                        decide(question, logprobs),
                        tuple(names),
                        read.model,
                        first.prompt_tokens,
                        evaluated,
                        reads,
                        input_tokens=first.prompt_tokens * reads,
                        read_scheme=self._reader.scheme if tokens is not None else "chat",
                        repeatable=self._checked().repeatable if tokens is not None else False,
                        layout=layout,
                        prompt_ids=tokens[0] if tokens is not None else (),
                    )
        missing = [label for label, tid in labels if tid not in read.logprobs]
        raise UpstreamBadResponse(
            f"llama-server returned no log-probability for labels {missing} "
            "even over the whole vocabulary"
        )

    def _width_from(self, ids: tuple[int, ...], widths: list[int]) -> int:
        """The width a read of the labels ``ids`` starts at: where the last one found them
        all, unless that was ``_NARROW_AGAIN`` decisions ago (one narrow read then tells
        whether they still need it), else the first."""
        held = self._widths.get(ids)
        if held is None or held[0] not in widths or held[1] >= _NARROW_AGAIN:
            return widths[0]
        return held[0]

    def _width_held(self, ids: tuple[int, ...], widths: list[int], began: int, held: int) -> None:
        """Remember where the labels ``ids`` were found (nothing when at the first width)."""
        if held == widths[0]:
            self._widths.pop(ids)
            return
        before = self._widths.get(ids)
        started_there = before is not None and began == held == before[0]
        self._widths.put(ids, (held, before[1] + 1 if started_there and before else 1))
