"""The decision service: one parsed request in, calibrated and routed outcomes out.

``DecisionService.answer`` is the one pipeline every decision API goes through (chat
with ``semif``, System One, Decisions, rerank, each ``/invocations`` line): it picks
the calibration profile, plans the debiasing, reads every question, then applies the
profile. For each read it (1) assigns labels that are verified single tokens at the
answer position of the served model's chat template (``catalogue.py``), (2) lays out
the options block in the conversation (``prompt_cache.py``), (3) reads the next
token's log-probabilities over the whole vocabulary, repeatably on a leased slot
(``reader.py``; no grammar: llama-server reports the probabilities before any grammar,
which would only choose the generated token), and (4) widens the read (same prompt, served from
llama-server's prompt cache) until every label's log-probability is known. Nothing
is guessed: a label missing from the widest read is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from .admission import Admission, Work
from .bounded import BoundedCache
from .calibration.profile import Profile
from .catalogue import LabelCatalogue, Labels, rendering_kwargs
from .checking import SelfCheck
from .cost import ONE, CostModel, kind_of
from .deadlines import Deadline
from .decision.debias import average, divide_out, rotate
from .decision.outcome import Outcome
from .decision.prompt import (
    CONTENT_FREE,
    DEFAULT_LAYOUT,
    PROMPT_FORMAT_VERSIONS,
    content_free,
    lay_out,
    state_messages,
)
from .decision.question import Question
from .decision.readout import decide
from .decision.selfcheck import Check
from .discovery import Discovery
from .errors import InvalidRequest, UpstreamBadResponse
from .metrics import Metrics, after_reply
from .profile_store import NO_PROFILE, ProfileStore, apply_profile, debias_for
from .prompt_cache import Prompt, PromptCache
from .reader import Reader, short
from .upstream import ModelInfo, NextToken, Upstream
from .verdicts import Verdicts

__all__ = ["Answered", "Asked", "DecisionService", "Outcome", "read_widths"]

_WIDE_READ = 1024
_UNKNOWN_VOCAB = 1 << 18  # llama-server clamps n_probs to its vocabulary
_MAX_CONTENT_FREE = 256  # content-free answers (contextual calibration) remembered ...
_MAX_FREE_KEY = 64 * 1024  # ... for questions up to this size (JSON bytes)
_MAX_OPTION_COUNTS = 32  # option counts whose reads-needed are remembered
_MAX_LABEL_SETS = 256  # label sets whose sufficient read width is remembered ...
_NARROW_AGAIN = 32  # ... for this many decisions, then the first width is tried again
_LEAST_WEIGHT = 1e-300  # a content-free probability that underflowed still divides
_NOTHING: Mapping[str, tuple[int, ...]] = MappingProxyType({})
log = logging.getLogger("proxy")


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


@dataclass(frozen=True)
class Asked:
    """One decision request, parsed: questions (by id) about one conversation, and how
    their answers are to be debiased and calibrated.

    ``free``: the content-free conversation contextual calibration reads (None: the
    conversation with its last user turn "N/A"). ``calibration``: the profile named
    (None: the configured default when ``default_profile``, else none).
    ``profile_debias``: whether a profile's own debiasing applies when the request
    asks for none. The ``*_param`` fields name where a refusal points. ``deadline``: the
    request's own (proxy/deadlines.py; None: the server's)."""

    messages: Sequence[Mapping[str, Any]]
    questions: Mapping[str, Question]
    template_kwargs: Mapping[str, Any] | None = None
    layout: str = DEFAULT_LAYOUT
    free: Sequence[Mapping[str, Any]] | None = None
    calibration: str | None = None
    default_profile: bool = True
    calibration_param: str = "x_calibration"
    debias_method: str | None = None
    debias: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: _NOTHING)
    profile_debias: bool = True
    debias_param: str = "x_debias"
    label_mass_floor: float | None = None
    deadline: Deadline | None = None

    @classmethod
    def about_state(
        cls, state_text: str, questions: Mapping[str, Question], **wishes: Any
    ) -> Asked:
        """Questions about a state (System One, Decisions, rerank): each asked in its own
        prompt, state first and question last, so no answer depends on the others."""
        return cls(
            state_messages(state_text), questions, free=state_messages(CONTENT_FREE), **wishes
        )


class Answered(dict[str, Outcome]):
    """``DecisionService.answer``'s outcomes by question id (a dict, read as before), and
    for the decision records (proxy/records.py): ``raw``, each question's probabilities
    after debiasing and before calibration (the options in the caller's order), and
    ``profile``, the calibration profile applied (None: none)."""

    def __init__(self, *, profile: Profile | None = None) -> None:
        super().__init__()
        self.profile = profile
        self.raw: dict[str, tuple[float, ...]] = {}


class _Prepared(NamedTuple):
    """One question's prompt: its model and labels, the conversation it is read in and
    that conversation's tokens (None: read through the chat endpoint), made for a read
    scheme (``ubatch``). Made once per question, by the admission's estimate, and taken
    by the read."""

    info: ModelInfo
    labels: Labels
    convo: list[dict[str, Any]]
    tokens: Prompt | None
    ubatch: int


class DecisionService:
    """One served model's decisions. ``profiles``: the calibration profiles requests
    may name (None: none, as in tests)."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        n_probs: int,
        question_fanout: int = 1,
        metrics: Metrics | None = None,
        admission: Admission | None = None,
        ubatch: int = 0,
        self_check: bool = False,
        verdicts: Verdicts | None = None,
        profiles: ProfileStore | None = None,
    ):
        self._upstream = upstream
        self._metrics = metrics
        self._profiles = profiles
        self._n_probs = n_probs
        self._fanout = question_fanout
        self._admission = admission or Admission(
            max_active=1 << 30, max_queued=0, deadline_s=3600.0, retry_after_s=1
        )
        self._discovery = Discovery(upstream)
        self._catalogue = LabelCatalogue(upstream, self._discovery)
        self._prompts = PromptCache(upstream)
        self._reader = Reader(
            upstream,
            self._discovery,
            ubatch=ubatch,
            admission=self._admission,
            metrics=metrics,
            on_fresh=lambda: self.self_check.start(),
        )
        self.self_check = SelfCheck(
            upstream,
            self._reader,
            self._prompts,
            self._catalogue,
            n_probs=n_probs,
            metrics=metrics,
            model=self.model,
            enabled=self_check,  # run when the slots are first counted, and on restarts
            verdicts=verdicts,
        )
        # (question, template, layout) JSON -> the content-free answer: see _free_answer
        self._content_free: BoundedCache[bytes, tuple[float, ...]] = BoundedCache(_MAX_CONTENT_FREE)
        # option count -> reads its last decision took
        self._reads_needed: BoundedCache[int, int] = BoundedCache(_MAX_OPTION_COUNTS)
        # label token ids -> (the read width that held them all, decisions started there)
        self._widths: BoundedCache[tuple[int, ...], tuple[int, int]] = BoundedCache(_MAX_LABEL_SETS)

    # -- the pipeline ---------------------------------------------------------------

    async def answer(self, asked: Asked) -> Answered:
        """Every question's outcome, by id: debiased as asked (else as the profile says),
        then calibrated and routed by the profile. The answer also holds what a decision
        record needs (``Answered``): the probabilities before calibration and the profile."""
        profile = await self._profile(asked)
        plans = {
            qid: debias_for(
                profile if asked.profile_debias else None,
                question,
                asked.debias_method,
                asked.debias.get(qid, ()),
                param=asked.debias_param,
            )
            for qid, question in asked.questions.items()
        }
        free = asked.free
        if free is None and any(plan.method == "contextual" for plan in plans.values()):
            free = content_free(asked.messages)
        outcomes = await self._ask(
            asked.messages,
            free,
            asked.questions,
            asked.template_kwargs,
            asked.layout,
            {qid: plan.shifts for qid, plan in plans.items() if plan.shifts},
            frozenset(qid for qid, plan in plans.items() if plan.method == "contextual"),
            asked.deadline,
        )
        answered = Answered(profile=profile)
        for qid, outcome in outcomes.items():
            plan = plans[qid]
            # debiased (a PriDe prior divided out) but not calibrated: the record's "raw"
            read = apply_profile(None, outcome, plan) if plan.prior is not None else outcome
            answered.raw[qid] = read.decision.probabilities
            answered[qid] = apply_profile(
                profile,
                read,
                plan if plan.prior is None else replace(plan, prior=None),
                asked.label_mass_floor,
            )
        return answered

    async def _profile(self, asked: Asked) -> Profile | None:
        """The calibration profile ``asked`` uses, checked against the served model, the
        request's prompt format and the read scheme. Behind a llama-server router the
        default profile applies only to its own model."""
        if asked.calibration is None and not asked.default_profile:
            return None
        store, info = self._profiles, await self.model()
        if store is None:
            if asked.calibration not in (None, NO_PROFILE):
                raise InvalidRequest(
                    "this server has no calibration profiles", param=asked.calibration_param
                )
            return None
        router = self.upstream_model is not None
        profile = store.select(
            asked.calibration, param=asked.calibration_param, info=info if router else None
        )
        if profile is not None:
            store.check(
                profile,
                info,
                param=asked.calibration_param,
                version=PROMPT_FORMAT_VERSIONS[asked.layout],
                scheme=self.scheme,
            )
        return profile

    async def decide(
        self,
        messages: Sequence[Mapping[str, Any]],
        question: Question,
        template_kwargs: Mapping[str, Any] | None = None,
        *,
        debias: Sequence[int] = (),
        contextual: bool = False,
        layout: str = DEFAULT_LAYOUT,
    ) -> Outcome:
        """One question asked about a conversation, in ``layout`` (decision/prompt.py),
        neither calibrated nor routed. ``debias``: the cyclic shifts of the options to
        read and average (empty: one read as given); ``contextual``: divide out the
        answer to the same question about a content-free last user turn."""
        free = content_free(messages) if contextual else None
        outcomes = await self._ask(
            messages,
            free,
            {"0": question},
            template_kwargs,
            layout,
            {"0": tuple(debias)} if debias else {},
            frozenset({"0"}) if contextual else frozenset(),
        )
        return outcomes["0"]

    async def _ask(
        self,
        messages: Sequence[Mapping[str, Any]],
        free: Sequence[Mapping[str, Any]] | None,
        questions: Mapping[str, Question],
        template_kwargs: Mapping[str, Any] | None,
        layout: str,
        debias: Mapping[str, Sequence[int]],
        contextual: frozenset[str],
        deadline: Deadline | None = None,
    ) -> dict[str, Outcome]:
        """Every question about one conversation, each in its own prompt, once admitted
        under ``deadline`` (None: the server's).

        The first question is read alone: it computes the conversation's KV in one slot.
        The rest follow ``question_fanout`` at a time (0: one per slot this process
        leases). One at a time, each lands in the slot that holds the conversation and
        computes only its own question. In parallel (``fans_out``), on the segment scheme
        (a GPU's, as deploy/ sets it up) every other slot computes the conversation once
        more, which costs more than it saves on a CPU (bench/shared_state.py) and is meant
        for a GPU; on the prefix scheme (a CPU's) they wait for the slot reading it as any
        decision does (proxy/kv.py). The questions in ``contextual`` are calibrated
        against the same question about ``free``."""
        if self._metrics:
            after_reply(self._metrics.questions.observe, len(questions))
        self._admission.crowded(deadline)  # before planning asks llama-server anything
        book = await self._reader.book()
        # a fan-out on the segment scheme: the questions after the first read at once, each
        # in a slot of its own (on the prefix scheme they wait for the slot reading it)
        fans_out = self._fanout != 1 and not self._reader.ubatch
        fanned_out = 0
        if fans_out and len(questions) > 1:
            fanned_out = min(len(questions) - 1, self._fanout or book.size, book.size)
        work, first_prompt, prepared = await self._work(
            messages, free, questions, template_kwargs, layout, debias, contextual, fanned_out
        )
        # until it has finished, its prompt is one the slots will hold (book.base)
        with book.coming(first_prompt) if first_prompt else contextlib.nullcontext():
            async with self._admission.admit(work, deadline):
                items = list(questions.items())

                def one(
                    qid: str, question: Question, in_fan_out: bool = False
                ) -> Coroutine[Any, Any, Outcome]:
                    return self._decide(
                        messages,
                        question,
                        template_kwargs,
                        debias.get(qid, ()),
                        free if qid in contextual else None,
                        layout,
                        in_fan_out=in_fan_out,
                        prepared=prepared.get(qid, {}),
                    )

                first_id, first = items[0]
                outcomes = {first_id: await one(first_id, first)}
                if len(items) > 1:
                    limit = asyncio.Semaphore(self._fanout or book.size)

                    async def limited(qid: str, question: Question) -> None:
                        async with limit:
                            outcomes[qid] = await one(qid, question, fans_out)

                    try:
                        async with asyncio.TaskGroup() as group:
                            for qid, question in items[1:]:
                                group.create_task(limited(qid, question))
                    except ExceptionGroup as failed:  # the first failure speaks for the request
                        raise failed.exceptions[0] from None
                return {qid: outcomes[qid] for qid, _ in items}

    async def _decide(
        self,
        messages: Sequence[Mapping[str, Any]],
        question: Question,
        template_kwargs: Mapping[str, Any] | None,
        debias: Sequence[int],
        free: Sequence[Mapping[str, Any]] | None = None,
        layout: str = DEFAULT_LAYOUT,
        *,
        in_fan_out: bool = False,
        prepared: Mapping[int | None, _Prepared] = MappingProxyType({}),
    ) -> Outcome:
        """``prepared``: the prompts the admission's estimate made, by cyclic shift (None:
        the content-free read's)."""
        if not _rotated(question, debias):
            outcome = await self._decide_once(
                messages,
                question,
                template_kwargs,
                layout,
                in_fan_out=in_fan_out,
                prepared=prepared.get(0),
            )
        else:
            # one after another: each rotation reuses the KV of everything before the options
            reads = [
                (
                    s,
                    await self._decide_once(
                        messages,
                        rotate(question, s),
                        template_kwargs,
                        layout,
                        in_fan_out=in_fan_out,
                        prepared=prepared.get(s),
                    ),
                )
                for s in debias
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
                free, question, template_kwargs, layout, prepared.get(None)
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
        if self._metrics:
            after_reply(self._metrics.decision, outcome.decision, outcome.reads)
        return outcome

    async def _free_answer(
        self,
        free: Sequence[Mapping[str, Any]],
        question: Question,
        template_kwargs: Mapping[str, Any] | None,
        layout: str,
        prepared: _Prepared | None = None,
    ) -> tuple[tuple[float, ...], Outcome | None]:
        """The probabilities the model gives the question's options about a content-free
        input, and the read that took them (None when remembered): read once per question
        template, then remembered."""
        key = _free_key(free, question, template_kwargs, layout)
        known = self._content_free.get(key)
        if known is not None:
            return known, None
        read = await self._decide_once(free, question, template_kwargs, layout, prepared=prepared)
        weights = tuple(max(p, _LEAST_WEIGHT) for p in read.decision.probabilities)
        if len(key) <= _MAX_FREE_KEY:
            self._content_free.put(key, weights)
        return weights, read

    async def _decide_once(
        self,
        messages: Sequence[Mapping[str, Any]],
        question: Question,
        template_kwargs: Mapping[str, Any] | None,
        layout: str = DEFAULT_LAYOUT,
        *,
        in_fan_out: bool = False,
        prepared: _Prepared | None = None,
    ) -> Outcome:
        """One read of ``question``, its prompt ``prepared`` (by the admission's
        estimate) unless the read scheme or the served model has changed since."""
        kwargs = rendering_kwargs(template_kwargs)
        for _attempt in range(2):
            ubatch = self._reader.ubatch  # this read's scheme, even if a self-check changes it
            # made before an admission wait: again if the scheme or the model changed since
            if (
                prepared is None
                or prepared.ubatch != ubatch
                or prepared.info is not self._discovery.known
            ):
                prepared = await self._prepare(messages, question, kwargs, layout, ubatch)
            outcome = await self._read(question, prepared, kwargs, layout, in_fan_out=in_fan_out)
            if outcome is not None:
                return outcome
            self._forget()  # another model answered: verify labels again, once
            prepared = None
        raise UpstreamBadResponse("llama-server changed models while answering")

    async def _prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        question: Question,
        kwargs: Mapping[str, Any],
        layout: str,
        ubatch: int,
    ) -> _Prepared:
        """``question``'s prompt about ``messages`` in ``layout``: labels verified in the
        served model's template (``catalogue.py``), the options block laid out in the
        conversation and, for text, the conversation's tokens (``prompt_cache.py``)."""
        info, labels = await self._catalogue.labels(len(question.names), kwargs)
        block = self._prompts.layout(question, tuple(label for label, _ in labels))
        convo = lay_out(messages, block, layout)
        tokens = (
            await self._prompts.prompt(convo, block, kwargs, ubatch) if _text_only(convo) else None
        )
        return _Prepared(info, labels, convo, tokens, ubatch)

    # -- what llama-server serves -----------------------------------------------------

    async def model(self) -> ModelInfo:
        """What llama-server serves (cached; refreshed when another model answers)."""
        return await self._discovery.model()

    @property
    def known_model(self) -> ModelInfo | None:
        """The served model as last asked; None before any answer."""
        return self._discovery.known

    async def reranks(self) -> bool:
        """Whether llama-server serves a reranker model, which answers rerank requests
        itself (asked once)."""
        return await self._discovery.reranks()

    async def total_slots(self) -> int:
        """llama-server's parallel slots (asked once)."""
        return await self._discovery.total_slots()

    @property
    def upstream_model(self) -> str | None:
        """The model a llama-server router routes this service's reads to (None: one
        model, nothing named)."""
        return self._upstream.model

    @property
    def cost(self) -> CostModel:
        """What a step costs on this llama-server (proxy/cost.py)."""
        return self._reader.cost

    def _forget(self) -> None:
        self._discovery.forget()
        self._reader.forget()
        self._prompts.forget()
        self._content_free.clear()  # another model's content-free answers
        self._catalogue.forget()

    # -- what a decision costs (proxy/cost.py), for admission -----------------------

    async def _work(
        self,
        messages: Sequence[Mapping[str, Any]],
        free: Sequence[Mapping[str, Any]] | None,
        questions: Mapping[str, Question],
        template_kwargs: Mapping[str, Any] | None,
        layout: str,
        debias: Mapping[str, Sequence[int]],
        contextual: frozenset[str],
        fanned_out: int = 0,
    ) -> tuple[Work | None, tuple[int, ...], dict[str, dict[int | None, _Prepared]]]:
        """The tokens and idle-server seconds of reading each question about ``messages``
        in turn, each read where the slot book places it and costed as it evaluates there
        (``SlotBook.trail``), except that ``fanned_out`` questions after the first are read
        at once (a fan-out on the segment scheme), each in a slot of this process's own
        (the content-free reads of such a fan-out run beside it, in whichever slot frees
        first, and are costed where the one before went: one evaluation of the
        content-free turn, or of the state, too few each time the fan-out took that slot);
        each read widened as often as the last one with as many options. A question
        debiased (``debias``: its cyclic shifts) is read once per shift, so each
        rotation's prompt is made here too; one in ``contextual`` is read once more about
        ``free`` (the content-free turn) unless that answer is remembered, and that read
        is made and costed the same way. None while this server's costs are unknown or the
        prompt cannot be planned (images; a template that hides the options). With it, the
        first question's prompt (its segment, on the segment scheme; empty when none was
        made): what the slots will hold (``SlotBook.coming``), which decisions costed
        after it may build on; and the prompts made on the way, by question id and shift,
        for the reads to take."""
        prepared: dict[str, dict[int | None, _Prepared]] = {}
        cost = self._reader.cost
        if cost.observed == 0:
            return None, (), prepared
        kwargs = rendering_kwargs(template_kwargs)
        ubatch = self._reader.ubatch
        trail = (await self._reader.book()).trail(ubatch, fanned_out)
        tokens = 0
        seconds = 0.0
        for qid, question in questions.items():
            asked_shifts = debias.get(qid, ())
            shifts = tuple(asked_shifts) if _rotated(question, asked_shifts) else (0,)
            reads: list[tuple[Sequence[Mapping[str, Any]], Question, int | None]] = [
                (messages, rotate(question, shift) if shift else question, shift)
                for shift in shifts
            ]
            if (
                qid in contextual
                and free is not None
                and question.kind != "score"
                and _free_key(free, question, template_kwargs, layout) not in self._content_free
            ):
                reads.append((free, question, None))  # its content-free answer, not remembered
            made = prepared.setdefault(qid, {})
            for n_read, (convo, asked, shift) in enumerate(reads):
                one_prompt = await self._prepare(convo, asked, kwargs, layout, ubatch)
                made[shift] = one_prompt  # shift None: the content-free read
                found, n_ctx = one_prompt.tokens, one_prompt.info.n_ctx
                if found is None or (n_ctx and len(found[0]) >= n_ctx):
                    return None, trail.first, prepared  # read as it comes, or refused: too long
                prompt, s_len = found
                placed = trail.place(
                    prompt, s_len, question=n_read == 0, content_free=shift is None
                )
                for step in placed.steps:
                    step_s = cost.step_s(
                        kind_of(step.evaluated, ubatch), step.evaluated, step.cached
                    )
                    if step_s is None:
                        return None, trail.first, prepared
                    tokens += step.evaluated
                    seconds += step_s
            # each read widened as often as the last one with as many options, at the
            # question's own prompt
            own = made[shifts[0]].tokens
            widen = (self._reads_needed.get(len(question.names)) or 1) * len(reads)
            seconds += (widen - len(reads)) * (
                cost.step_s(ONE, 1, len(own[0]) if own else 0) or 0.0
            )
        return Work(tokens, seconds), trail.first, prepared

    # -- the read ---------------------------------------------------------------------

    async def _read(
        self,
        question: Question,
        prepared: _Prepared,
        kwargs: Mapping[str, Any],
        layout: str = DEFAULT_LAYOUT,
        *,
        in_fan_out: bool = False,
    ) -> Outcome | None:
        """The read, or ``None`` when a model other than ``prepared.info``'s answered it.

        Text conversations are read repeatably (``proxy/reader.py``): through
        ``/completion`` with the prompt's tokens, pinned to a leased slot. Others (images,
        audio) go through llama-server's chat endpoint, which renders them itself.
        ``in_fan_out``: one of a request's questions read in parallel on the segment scheme
        (``_ask``), which takes a free slot rather than wait for one.

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
        book = await self._reader.book()
        segment = (tokens[0] if ubatch else tokens[0][: tokens[1]]) if tokens else ()
        queued = tokens is not None and short(tokens[0], ubatch)
        own = len(tokens[0]) - len(segment) if tokens else 0  # after the segment
        async with book.lease(
            segment, by_prefix=bool(ubatch), short=queued, own=own, wait=not in_fan_out
        ) as slot:
            widths = read_widths(self._n_probs, len(labels), info.n_vocab)
            width_from = self._width_from(tuple(ids), widths)
            for width in widths[widths.index(width_from) :]:
                if tokens is None:  # pinned too, so that it cannot land in a leased slot
                    book.contents[slot] = None
                    read = await self._upstream.next_token(
                        convo,
                        n_probs=width,
                        template_kwargs=kwargs,
                        slot=slot,
                    )
                    spent = read.prompt_evaluated
                else:
                    read, spent = await self._reader.read(book, slot, *tokens, width, ubatch)
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
                        read_scheme=self.scheme if tokens is not None else "chat",
                        repeatable=self.checked.repeatable if tokens is not None else False,
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

    # -- the self-check (proxy/checking.py) -----------------------------------------

    @property
    def scheme(self) -> str:
        """How prompts are evaluated (proxy/kv.py): ``prefix-<ub>`` or ``segment``."""
        return self._reader.scheme

    @property
    def checked(self) -> Check:
        """The latest self-check (``repeatable`` None while none has finished)."""
        return self.self_check.result

    async def settled(self) -> bool:
        """Whether the self-check has settled (``SelfCheck.settled``)."""
        return await self.self_check.settled()

    async def close(self) -> None:
        await self.self_check.close()


def _free_key(
    free: Sequence[Mapping[str, Any]],
    question: Question,
    template_kwargs: Mapping[str, Any] | None,
    layout: str,
) -> bytes:
    """What a content-free answer is remembered by (``DecisionService._free_answer``)."""
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


def _rotated(question: Question, debias: Sequence[int]) -> bool:
    """Whether ``question`` is read once per cyclic shift in ``debias`` (a score is not)."""
    return list(debias) not in ([], [0]) and question.kind != "score"


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
