"""A question's debiased answer, from the reads its debiasing takes.

Cyclic debiasing reads the question once per cyclic shift of its options and averages
the answers back in the caller's order; contextual calibration divides out the answer
to the same question about a content-free input, read once per question template and
served model, then remembered here. The arithmetic is ``decision/debias.py``'s; the
reads are the caller's (``ReadOnce``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import orjson

from .bounded import BoundedCache
from .decision.debias import average, divide_out, rotate
from .decision.outcome import Outcome
from .decision.question import Question
from .preparing import rotated
from .reading import Prepared

__all__ = ["Debiasing", "ReadOnce"]

_MAX_CONTENT_FREE = 256  # content-free answers (contextual calibration) remembered ...
_MAX_FREE_KEY = 64 * 1024  # ... for questions up to this size (JSON bytes)
_LEAST_WEIGHT = 1e-300  # a content-free probability that underflowed still divides

# one read of a question about a conversation, its prompt made beforehand (or None);
# the last argument says whether it is the content-free read
ReadOnce = Callable[
    [Sequence[Mapping[str, Any]], Question, Prepared | None, bool], Awaitable[Outcome]
]


class Debiasing:
    """One served model's debiasing, with its remembered content-free answers."""

    def __init__(self) -> None:
        # (question, template, layout) JSON -> the content-free answer: see _free_answer
        self._content_free: BoundedCache[bytes, tuple[float, ...]] = BoundedCache(_MAX_CONTENT_FREE)

    def reads_free(
        self,
        free: Sequence[Mapping[str, Any]] | None,
        question: Question,
        template_kwargs: Mapping[str, Any] | None,
        layout: str,
    ) -> bool:
        """Whether contextual calibration of ``question`` about the content-free ``free``
        reads its answer (there is one, not for a score, and not remembered)."""
        return (
            free is not None
            and question.kind != "score"
            and _free_key(free, question, template_kwargs, layout) not in self._content_free
        )

    async def answer(
        self,
        read: ReadOnce,
        messages: Sequence[Mapping[str, Any]],
        question: Question,
        template_kwargs: Mapping[str, Any] | None,
        shifts: Sequence[int],
        free: Sequence[Mapping[str, Any]] | None,
        layout: str,
        prepared: Mapping[int | None, Prepared] = MappingProxyType({}),
    ) -> Outcome:
        """``question``'s answer about ``messages``: read once, or once per cyclic shift in
        ``shifts`` and averaged; then, with ``free``, the content-free answer divided out.
        ``prepared``: the prompts the admission's estimate made, by cyclic shift (None: the
        content-free read's)."""
        if not rotated(question, shifts):
            outcome = await read(messages, question, prepared.get(0), False)
        else:
            # one after another: each rotation reuses the KV of everything before the options
            reads = [
                (s, await read(messages, rotate(question, s), prepared.get(s), False))
                for s in shifts
            ]
            first = reads[0][1]
            outcome = Outcome(
                average(question, [(s, o.decision) for s, o in reads]),
                first.labels,  # the first shift is 0: the options in the caller's order
                first.model,
                first.prompt_tokens,
                sum(o.prompt_evaluated for _, o in reads),
                sum(o.reads for _, o in reads),
                debias="cyclic",
                input_tokens=sum(o.tokens_in for _, o in reads),
                rotations=tuple((s, o.decision.probabilities) for s, o in reads),
                read_scheme=first.read_scheme,
                repeatable=first.repeatable,
                layout=layout,
                prompt_ids=first.prompt_ids,
            )
        if free is not None and question.kind != "score":
            weights, spent = await self._free_answer(
                read, free, question, template_kwargs, layout, prepared.get(None)
            )
            outcome = replace(
                outcome,
                decision=divide_out(outcome.decision, weights),
                reads=outcome.reads + (spent.reads if spent else 0),
                prompt_evaluated=outcome.prompt_evaluated
                + (spent.prompt_evaluated if spent else 0),
                input_tokens=outcome.tokens_in + (spent.tokens_in if spent else 0),
                debias="contextual",
            )
        return outcome

    async def _free_answer(
        self,
        read: ReadOnce,
        free: Sequence[Mapping[str, Any]],
        question: Question,
        template_kwargs: Mapping[str, Any] | None,
        layout: str,
        prepared: Prepared | None = None,
    ) -> tuple[tuple[float, ...], Outcome | None]:
        """The probabilities the model gives the question's options about a content-free
        input, and the read that took them (None when remembered): read once per question
        template, then remembered."""
        key = _free_key(free, question, template_kwargs, layout)
        known = self._content_free.get(key)
        if known is not None:
            return known, None
        outcome = await read(free, question, prepared, True)
        weights = tuple(max(p, _LEAST_WEIGHT) for p in outcome.decision.probabilities)
        if len(key) <= _MAX_FREE_KEY:
            self._content_free.put(key, weights)
        return weights, outcome

    def forget(self) -> None:
        """Another model answered: its content-free answers are another's."""
        self._content_free.clear()


def _free_key(
    free: Sequence[Mapping[str, Any]],
    question: Question,
    template_kwargs: Mapping[str, Any] | None,
    layout: str,
) -> bytes:
    """What a content-free answer is remembered by (``Debiasing._free_answer``)."""
    return orjson.dumps(
        [
            free,
            question.kind,
            question.names,
            question.shown,
            question.instructions,
            question.temperature,
            dict(template_kwargs or {}),
            layout,
        ],
        option=orjson.OPT_SORT_KEYS,
    )
