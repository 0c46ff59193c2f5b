"""The decision service: one parsed request in, calibrated and routed outcomes out.

``DecisionService.answer`` is the one pipeline every decision API goes through (chat
with ``semif``, System One, Decisions, rerank, each ``/invocations`` line): it picks
the calibration profile and plans the debiasing (``profile_store.py``), makes every
prompt and prices the decision (``preparing.py``), waits for admission
(``admission.py``), reads each question, the first alone and the rest fanned out
(``reading.py``), debiased as planned (``debiasing.py``), then applies the profile. It
orchestrates; the work is done in those modules. The served model's parts are its
public attributes: ``discovery`` (what llama-server serves), ``reader`` (its slots and
read scheme, the cost model) and ``self_check`` (proxy/checking.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .admission import Admission
from .calibration.profile import Profile
from .catalogue import LabelCatalogue, rendering_kwargs
from .checking import SelfCheck
from .deadlines import Deadline
from .debiasing import Debiasing
from .decision.outcome import Outcome
from .decision.prompt import (
    CONTENT_FREE,
    DEFAULT_LAYOUT,
    PROMPT_FORMAT_VERSIONS,
    content_free,
    state_messages,
)
from .decision.question import Question
from .discovery import Discovery
from .errors import InvalidRequest
from .facts import Facts
from .fanout import fan_out
from .metrics import Metrics, after_reply
from .preparing import Preparation
from .profile_store import NO_PROFILE, ProfileStore, apply_profile, debias_for
from .prompt_cache import PromptCache
from .reader import Reader
from .reading import Reading
from .upstream import Upstream
from .verdicts import Verdicts

__all__ = ["Answered", "Asked", "DecisionService", "Outcome"]

_NOTHING: Mapping[str, tuple[int, ...]] = MappingProxyType({})


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
    for the decision records (proxy/recorder.py): ``raw``, each question's probabilities
    after debiasing and before calibration (the options in the caller's order), and
    ``profile``, the calibration profile applied (None: none)."""

    def __init__(self, *, profile: Profile | None = None) -> None:
        super().__init__()
        self.profile = profile
        self.raw: dict[str, tuple[float, ...]] = {}


class DecisionService:
    """One served model's decisions. ``profiles``: the calibration profiles requests
    may name (None: none)."""

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
        self.upstream = upstream  # a router's: bound to this model (``Upstream.model``)
        self._metrics = metrics
        self._profiles = profiles
        self._fanout = question_fanout
        self._admission = admission or Admission(
            max_active=1 << 30, max_queued=0, deadline_s=3600.0, retry_after_s=1
        )
        self.discovery = Discovery(upstream)
        catalogue = LabelCatalogue(upstream, self.discovery)
        prompts = PromptCache(upstream)
        self.reader = Reader(
            upstream,
            self.discovery,
            ubatch=ubatch,
            admission=self._admission,
            metrics=metrics,
            on_fresh=lambda: self.self_check.start(),
        )
        self.self_check = SelfCheck(
            upstream,
            self.reader,
            prompts,
            catalogue,
            n_probs=n_probs,
            metrics=metrics,
            model=self.discovery.model,
            enabled=self_check,  # run when the slots are first counted, and on restarts
            verdicts=verdicts,
        )
        self._reading = Reading(
            upstream, self.reader, n_probs=n_probs, checked=lambda: self.self_check.result
        )
        self._debiasing = Debiasing()
        self._preparation = Preparation(
            self.discovery, catalogue, prompts, self.reader, self._reading, forget=self._forget
        )

    async def answer(self, asked: Asked, facts: Facts) -> Answered:
        """Every question's outcome, by id: debiased as asked (else as the profile says),
        then calibrated and routed by the profile. The answer also holds what a decision
        record needs (``Answered``): the probabilities before calibration and the profile.
        ``facts``: the request's (proxy/facts.py), handed down to what learns them."""
        profile = await self._profile(asked, facts)
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
        contextual = frozenset(qid for qid, plan in plans.items() if plan.method == "contextual")
        free = asked.free
        if free is None and contextual:
            free = content_free(asked.messages)
        shifts = {qid: plan.shifts for qid, plan in plans.items() if plan.shifts}
        outcomes = await self._ask(asked, free, shifts, contextual, facts)
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

    async def _profile(self, asked: Asked, facts: Facts) -> Profile | None:
        """The calibration profile ``asked`` uses, checked against the served model, the
        request's prompt format and the read scheme. Behind a llama-server router the
        default profile applies only to its own model."""
        if asked.calibration is None and not asked.default_profile:
            return None
        store, info = self._profiles, await self.discovery.model(facts)
        if store is None:
            if asked.calibration not in (None, NO_PROFILE):
                raise InvalidRequest(
                    "this server has no calibration profiles", param=asked.calibration_param
                )
            return None
        router = self.upstream.model is not None
        profile = store.select(
            asked.calibration, param=asked.calibration_param, info=info if router else None
        )
        if profile is not None:
            store.check(
                profile,
                info,
                param=asked.calibration_param,
                version=PROMPT_FORMAT_VERSIONS[asked.layout],
                scheme=self.reader.scheme,
            )
        return profile

    async def _ask(
        self,
        asked: Asked,
        free: Sequence[Mapping[str, Any]] | None,
        shifts: Mapping[str, Sequence[int]],
        contextual: frozenset[str],
        facts: Facts,
    ) -> dict[str, Outcome]:
        """Every question about the conversation, each in its own prompt, read once
        admitted under the request's deadline: the first alone, the rest fanned out
        (``fanout.py``); each once per cyclic shift in ``shifts``, and the questions in
        ``contextual`` calibrated against the same question about ``free``."""
        if self._metrics:
            after_reply(self._metrics.questions.observe, len(asked.questions))
        self._admission.crowded(asked.deadline)  # before planning asks llama-server anything
        book = await self.reader.book(facts)
        # a fan-out on the segment scheme: the questions after the first read at once, each
        # in a slot of its own (on the prefix scheme they wait for the slot reading it)
        fans_out = self._fanout != 1 and not self.reader.ubatch
        fanned_out = 0
        if fans_out and len(asked.questions) > 1:
            fanned_out = min(len(asked.questions) - 1, self._fanout or book.size, book.size)
        layout, template_kwargs = asked.layout, asked.template_kwargs
        work, first_prompt, prepared = await self._preparation.estimate(
            asked.messages,
            asked.questions,
            template_kwargs,
            layout,
            free=free,
            debias=shifts,
            contextual=lambda qid, question: (
                qid in contextual
                and self._debiasing.reads_free(free, question, template_kwargs, layout)
            ),
            fanned_out=fanned_out,
            facts=facts,
        )
        kwargs = rendering_kwargs(template_kwargs)

        async def one(qid: str, question: Question, in_fan_out: bool) -> Outcome:
            outcome = await self._debiasing.answer(
                # the content-free read (``aside``) is never fanned out: it waits its turn
                lambda convo, asked_q, made, aside: self._preparation.read(
                    convo, asked_q, kwargs, layout, made, in_fan_out and not aside, facts
                ),
                asked.messages,
                question,
                template_kwargs,
                shifts.get(qid, ()),
                free if qid in contextual else None,
                layout,
                prepared.get(qid, {}),
            )
            if self._metrics:
                after_reply(self._metrics.decision, outcome.decision, outcome.reads)
            return outcome

        # until it has finished, its prompt is one the slots will hold (book.base)
        with book.coming(first_prompt) if first_prompt else contextlib.nullcontext():
            async with self._admission.admit(work, asked.deadline, facts):
                items = list(asked.questions.items())
                per_turn = self._fanout or book.size
                return await fan_out(items, one, per_turn=per_turn, fans_out=fans_out)

    def _forget(self) -> None:
        """Another model answered: what this one's reads and debiasing remember is its."""
        self.reader.forget()
        self._debiasing.forget()

    async def close(self) -> None:
        """Stop the self-check (a shutdown)."""
        await self.self_check.close()
