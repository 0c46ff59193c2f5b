"""A decision's prompts, made before it is admitted, and what reading them will cost.

For each read a question needs (``Preparation.prepare``) the labels are verified single
tokens at the answer position of the served model's chat template (``catalogue.py``),
the options block is laid out in the conversation and, for text, the conversation is
rendered and tokenised (``prompt_cache.py``). ``Preparation.estimate`` makes every
prompt of a decision that way and prices the reads with the cost model
(``proxy/cost.py``) where the slot book places them (``kv.Trail``), for admission
(``proxy/admission.py``); the reads then take the prompts made here, made again when
the read scheme or the served model has changed since (``Preparation.read``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .admission import Work
from .catalogue import LabelCatalogue, rendering_kwargs
from .cost import ONE, kind_of
from .decision.debias import rotate
from .decision.outcome import Outcome
from .decision.prompt import lay_out
from .decision.question import Question
from .discovery import Discovery
from .errors import UpstreamBadResponse
from .facts import Facts
from .prompt_cache import PromptCache
from .reader import Reader
from .reading import Prepared, Reading

__all__ = ["Estimate", "Preparation", "rotated"]


class Estimate(NamedTuple):
    """``Preparation.estimate``'s answer: the work (None: unknown), the first question's
    prompt (what the slots will hold, ``SlotBook.coming``; empty when none was made),
    and the prompts made on the way, by question id and cyclic shift (None: the
    content-free one's)."""

    work: Work | None
    first: tuple[int, ...]
    prepared: dict[str, dict[int | None, Prepared]]


def rotated(question: Question, debias: Sequence[int]) -> bool:
    """Whether ``question`` is read once per cyclic shift in ``debias`` (a score is not)."""
    return list(debias) not in ([], [0]) and question.kind != "score"


class Preparation:
    """One served model's prompts, and their reads (``reading``). ``forget``: called when
    another model answered a read, after this forgot what it knew of the last one."""

    def __init__(
        self,
        discovery: Discovery,
        catalogue: LabelCatalogue,
        prompts: PromptCache,
        reader: Reader,
        reading: Reading,
        *,
        forget: Callable[[], None],
    ):
        self._discovery = discovery
        self._catalogue = catalogue
        self._prompts = prompts
        self._reader = reader
        self._reading = reading
        self._forget_also = forget

    async def prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        question: Question,
        kwargs: Mapping[str, Any],
        layout: str,
        ubatch: int,
        facts: Facts | None = None,
    ) -> Prepared:
        """``question``'s prompt about ``messages`` in ``layout``: labels verified in the
        served model's template (``catalogue.py``), the options block laid out in the
        conversation and, for text, the conversation's tokens (``prompt_cache.py``)."""
        info, labels = await self._catalogue.labels(len(question.names), kwargs, facts)
        block = self._prompts.layout(question, tuple(label for label, _ in labels))
        convo = lay_out(messages, block, layout)
        tokens = (
            await self._prompts.prompt(convo, block, kwargs, ubatch, facts)
            if _text_only(convo)
            else None
        )
        return Prepared(info, labels, convo, tokens, ubatch)

    async def read(
        self,
        messages: Sequence[Mapping[str, Any]],
        question: Question,
        kwargs: Mapping[str, Any],
        layout: str,
        prepared: Prepared | None,
        in_fan_out: bool = False,
        facts: Facts | None = None,
    ) -> Outcome:
        """The read of ``question``'s prompt (``Reading.read``: ``in_fan_out``, ``facts``), the
        prompt ``prepared`` (by the admission's estimate) unless the read scheme or the
        served model has changed since; made again, once, when another model answered."""
        for _attempt in range(2):
            ubatch = self._reader.ubatch  # this read's scheme, even if a self-check changes it
            # made before an admission wait: again if the scheme or the model changed since
            if (
                prepared is None
                or prepared.ubatch != ubatch
                or prepared.info is not self._discovery.known
            ):
                prepared = await self.prepare(messages, question, kwargs, layout, ubatch, facts)
            outcome = await self._reading.read(
                question, prepared, kwargs, layout, in_fan_out=in_fan_out, facts=facts
            )
            if outcome is not None:
                return outcome
            self.forget()  # another model answered: verify labels again, once
            prepared = None
        raise UpstreamBadResponse("llama-server changed models while answering")

    async def estimate(
        self,
        messages: Sequence[Mapping[str, Any]],
        questions: Mapping[str, Question],
        template_kwargs: Mapping[str, Any] | None,
        layout: str,
        *,
        free: Sequence[Mapping[str, Any]] | None,
        debias: Mapping[str, Sequence[int]],
        contextual: Callable[[str, Question], bool],
        fanned_out: int = 0,
        facts: Facts | None = None,
    ) -> Estimate:
        """The tokens and idle-server seconds of reading each question about ``messages``
        in turn, each read where the slot book places it and costed as it evaluates there
        (``SlotBook.trail``), except that ``fanned_out`` questions after the first are read
        at once (a fan-out on the segment scheme), each in a slot of this process's own
        (the content-free reads of such a fan-out run beside it, in whichever slot frees
        first, and are costed where the one before went: one evaluation of the
        content-free turn, or of the state, too few each time the fan-out took that slot);
        each read widened as often as the last one with as many options. A question
        debiased (``debias``: its cyclic shifts) is read once per shift, so each
        rotation's prompt is made here too; one for which ``contextual(qid, question)``
        says so is read once more about ``free`` (the content-free turn: its answer is
        not remembered), and that read is made and costed the same way. The work is None
        while this server's costs are unknown or the prompt cannot be planned (images; a
        template that hides the options)."""
        prepared: dict[str, dict[int | None, Prepared]] = {}
        cost = self._reader.cost
        if cost.observed == 0:
            return Estimate(None, (), prepared)
        kwargs = rendering_kwargs(template_kwargs)
        ubatch = self._reader.ubatch
        trail = (await self._reader.book()).trail(ubatch, fanned_out)
        tokens = 0
        seconds = 0.0
        for qid, question in questions.items():
            asked_shifts = debias.get(qid, ())
            shifts = tuple(asked_shifts) if rotated(question, asked_shifts) else (0,)
            reads: list[tuple[Sequence[Mapping[str, Any]], Question, int | None]] = [
                (messages, rotate(question, shift) if shift else question, shift)
                for shift in shifts
            ]
            if free is not None and contextual(qid, question):
                reads.append((free, question, None))  # its content-free answer, not remembered
            made = prepared.setdefault(qid, {})
            for n_read, (convo, asked, shift) in enumerate(reads):
                one_prompt = await self.prepare(convo, asked, kwargs, layout, ubatch, facts)
                made[shift] = one_prompt  # shift None: the content-free read
                found, n_ctx = one_prompt.tokens, one_prompt.info.n_ctx
                if found is None or (n_ctx and len(found[0]) >= n_ctx):
                    return Estimate(None, trail.first, prepared)  # as it comes, or too long
                prompt, s_len = found
                placed = trail.place(
                    prompt, s_len, question=n_read == 0, content_free=shift is None
                )
                for step in placed.steps:
                    step_s = cost.step_s(
                        kind_of(step.evaluated, ubatch), step.evaluated, step.cached
                    )
                    if step_s is None:
                        return Estimate(None, trail.first, prepared)
                    tokens += step.evaluated
                    seconds += step_s
            # each read widened as often as the last one with as many options, at the
            # question's own prompt
            own = made[shifts[0]].tokens
            widen = self._reading.reads_needed(len(question.names)) * len(reads)
            seconds += (widen - len(reads)) * (
                cost.step_s(ONE, 1, len(own[0]) if own else 0) or 0.0
            )
        return Estimate(Work(tokens, seconds), trail.first, prepared)

    def forget(self) -> None:
        """Another model answered: what llama-server serves, its template and tokenizer
        are asked again (and ``forget`` given is called)."""
        self._discovery.forget()
        self._prompts.forget()
        self._catalogue.forget()
        self._forget_also()


def _text_only(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every message's content is text (a string or text parts only)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                return False
        elif content is not None and not isinstance(content, str):
            return False
    return True
