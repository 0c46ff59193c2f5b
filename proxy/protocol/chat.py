"""OpenAI ``chat.completion`` bodies carrying a decision."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, SerializeAsAny

from ..decision.outcome import Outcome
from ..decision.prompt import PROMPT_FORMAT_VERSIONS
from ..decision.readout import system_one_answer
from .answers import Calibrated, ChoiceAnswer, NoulAnswer, ScoreAnswer
from .records import DebiasMethod, DecisionRecord, Route, RouteReason
from .wire import Count, Layout, Open, Probability, PromptFormat

__all__ = [
    "LEAST_LOGPROB",
    "SemifAnswer",
    "ChatCompletion",
    "ChatCompletionChunk",
    "semif_object",
    "logprobs_object",
    "completion_body",
    "completion_chunks",
]

LEAST_LOGPROB = -9999.0  # OpenAI's stand-in for a probability that rounds to 0


class _ReadFacts(Open):
    """How the answer was read (``semif_object``)."""

    label_mass: Annotated[float, Field(ge=0)] = Field(
        description="the options' share of the next-token probability before normalising"
    )
    labels: dict[str, str] = Field(description="option -> the label the model read it by")
    reads: Annotated[int, Field(ge=1)]
    calibration: Calibrated | None = None
    route: Route | None = None
    route_reason: RouteReason | None = None
    debias: DebiasMethod | None = None
    debias_note: str | None = None
    prompt_format_version: PromptFormat
    layout: Layout
    read_scheme: str | None = None
    repeatable: bool | None = Field(None, description="the server's self-check, once it ran")
    logprobs_of: Literal["calibrated", "debiased", "read"] | None = Field(
        None, description="what choices[0].logprobs list (only when the request asked)"
    )
    decision_id: str | None = Field(
        None, description="the decision's id in the records and outcomes (docs/records.md)"
    )
    # the record as ``DecisionRecord.dump`` gave it (a dict): written as it is
    record: SerializeAsAny[DecisionRecord] | None = Field(
        None, description="the decision record (--decision-records answer)"
    )


# _ReadFacts last in each MRO: its fields follow the answer's, in the order written
class SemifChoiceAnswer(_ReadFacts, ChoiceAnswer):
    pass


class SemifScoreAnswer(_ReadFacts, ScoreAnswer):
    pass


class _NoulProbabilities(NoulAnswer):
    probabilities: dict[str, Probability] = Field(description='"true" and "false"')


class SemifNoulAnswer(_ReadFacts, _NoulProbabilities):
    pass


_SEMIF_ANSWERS: dict[str, type[_ReadFacts]] = {
    "choice": SemifChoiceAnswer,
    "score": SemifScoreAnswer,
    "noul": SemifNoulAnswer,
}


SemifAnswer = Annotated[
    SemifChoiceAnswer | SemifScoreAnswer | SemifNoulAnswer, Field(discriminator="type")
]


class _AnswerMessage(Open):
    role: Literal["assistant"]
    content: str = Field(description="the chosen option's name")


class _TopLogprob(Open):
    token: str = Field(description="an option's name")
    logprob: Annotated[float, Field(le=0)]
    bytes: list[int]


class _Logprob(_TopLogprob):
    top_logprobs: list[_TopLogprob]


class _Logprobs(Open):
    content: list[_Logprob]
    refusal: None


class _CompletionChoice(Open):
    index: Count
    message: _AnswerMessage
    logprobs: _Logprobs | None
    finish_reason: Literal["stop"]


class _CachedTokens(Open):
    cached_tokens: Count


class _ChatUsage(Open):
    prompt_tokens: Count
    completion_tokens: Count = Field(description="one per read")
    total_tokens: Count
    prompt_tokens_details: _CachedTokens


class ChatCompletion(Open):
    """A decision as OpenAI's ``chat.completion``, the whole answer in ``semif``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[_CompletionChoice]
    usage: _ChatUsage
    semif: SemifAnswer


class _ChunkChoice(Open):
    index: Count
    delta: _AnswerMessage
    logprobs: _Logprobs | None
    finish_reason: Literal["stop"]


class ChatCompletionChunk(Open):
    """One event of a streamed decision (``completion_chunks``): the answer, then, when
    the request asked for usage, a chunk with no choices, the usage and no ``semif``."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[_ChunkChoice]
    semif: SemifAnswer | None = None  # before usage: the answer's chunk ends with usage null
    usage: _ChatUsage | None = None


def semif_object(
    outcome: Outcome,
    logprobs_of: str | None = None,
    decision_id: str | None = None,
    record: Mapping[str, Any] | None = None,
) -> _ReadFacts:
    """The answer in System One form plus the read's own facts; the fields left out are
    left unset (serialised with ``exclude_unset``)."""
    decision = outcome.decision
    facts = system_one_answer(decision)
    if decision.question.kind == "noul":
        facts["probabilities"] = dict(zip(decision.question.names, decision.probabilities))
    facts["label_mass"] = decision.label_mass
    facts["labels"] = dict(zip(decision.question.names, outcome.labels))
    facts["reads"] = outcome.reads
    if outcome.calibration is not None:
        facts["calibration"] = Calibrated.model_construct(None, **outcome.calibration)
        facts["route"] = outcome.route
        facts["route_reason"] = outcome.route_reason
    if outcome.debias is not None:
        facts["debias"] = outcome.debias
        if outcome.debias_note:
            facts["debias_note"] = outcome.debias_note
    facts["prompt_format_version"] = PROMPT_FORMAT_VERSIONS[outcome.layout]
    facts["layout"] = outcome.layout
    if outcome.read_scheme:
        facts["read_scheme"] = outcome.read_scheme
    if outcome.repeatable is not None:  # the server's self-check: unknown until it ran
        facts["repeatable"] = outcome.repeatable
    if logprobs_of is not None:
        facts["logprobs_of"] = logprobs_of
    if decision_id is not None:
        facts["decision_id"] = decision_id
    if record is not None:
        facts["record"] = record
    return _SEMIF_ANSWERS[decision.question.kind].model_construct(**facts)


def _usage(outcome: Outcome) -> _ChatUsage:
    return _ChatUsage.model_construct(
        prompt_tokens=outcome.tokens_in,
        completion_tokens=outcome.reads,  # one token per read, as System One counts them
        total_tokens=outcome.tokens_in + outcome.reads,
        prompt_tokens_details=_CachedTokens.model_construct(cached_tokens=outcome.tokens_cached),
    )


def _logprobs_of(outcome: Outcome) -> str:
    """What the listed log-probabilities are of: "calibrated" (a profile's map changed
    them), "debiased" (any debiasing: cyclic, PriDe or contextual), or the labels' "read"
    probabilities."""
    if outcome.calibration is not None and outcome.calibration.get("method") != "none":
        return "calibrated"
    return "debiased" if outcome.debias is not None else "read"


def _entry(name: str, p: float) -> _TopLogprob:
    return _TopLogprob.model_construct(
        token=name,
        logprob=math.log(p) if p > 0 else LEAST_LOGPROB,
        bytes=list(name.encode("utf-8")),
    )


def logprobs_object(outcome: Outcome, top: int) -> _Logprobs:
    """The decision as OpenAI chat log-probabilities: one position, the chosen option as its
    token with ln p, and the ``top`` most likely options (names as tokens, ties in option
    order) in ``top_logprobs``; the same numbers as ``semif.probabilities``."""
    decision = outcome.decision
    names, probs = decision.question.names, decision.probabilities
    order = sorted(range(len(names)), key=lambda i: (-probs[i], i))[:top]
    chosen = _entry(decision.best_name, probs[decision.best])
    position = _Logprob.model_construct(
        **dict(chosen), top_logprobs=[_entry(names[i], probs[i]) for i in order]
    )
    return _Logprobs.model_construct(content=[position], refusal=None)


def _parts(
    outcome: Outcome,
    top_logprobs: int | None,
    decision_id: str | None,
    record: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], _AnswerMessage, _Logprobs | None, _ReadFacts]:
    """What a completion and its chunks share: id, object-less head, message, logprobs
    and ``semif``."""
    logprobs = None if top_logprobs is None else logprobs_object(outcome, top_logprobs)
    semif = semif_object(
        outcome, None if logprobs is None else _logprobs_of(outcome), decision_id, record
    )
    head = {
        "id": f"chatcmpl-semif-{random.getrandbits(128):032x}",  # unique, not secret
        "created": int(time.time()),
    }
    message = _AnswerMessage.model_construct(role="assistant", content=outcome.decision.best_name)
    return head, message, logprobs, semif


def completion_body(
    outcome: Outcome,
    model: str | None,
    top_logprobs: int | None = None,
    decision_id: str | None = None,
    record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``chat.completion`` (a ``ChatCompletion``, dumped); with ``top_logprobs`` (the
    request asked for logprobs) the distribution also in ``choices[0].logprobs``, where
    every OpenAI client keeps it. ``decision_id`` and ``record`` (proxy/recorder.py) go in
    ``semif``."""
    head, message, logprobs, semif = _parts(outcome, top_logprobs, decision_id, record)
    choice = _CompletionChoice.model_construct(
        index=0, message=message, logprobs=logprobs, finish_reason="stop"
    )
    return ChatCompletion.model_construct(
        id=head["id"],
        object="chat.completion",
        created=head["created"],
        model=model or outcome.model,
        choices=[choice],
        usage=_usage(outcome),
        semif=semif,
    ).model_dump(exclude_unset=True)


def completion_chunks(
    outcome: Outcome,
    model: str | None,
    top_logprobs: int | None = None,
    include_usage: bool = False,
    decision_id: str | None = None,
    record: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The whole answer as one ``chat.completion.chunk``, then, when the request asked for
    usage (``stream_options.include_usage``), OpenAI's usage chunk with no choices (the
    answer's chunk then carries ``usage: null``, as OpenAI's do); ``ChatCompletionChunk``s,
    dumped."""
    head, message, logprobs, semif = _parts(outcome, top_logprobs, decision_id, record)
    common = {**head, "object": "chat.completion.chunk", "model": model or outcome.model}
    choice = _ChunkChoice.model_construct(
        index=0, delta=message, logprobs=logprobs, finish_reason="stop"
    )
    if not include_usage:
        answer = ChatCompletionChunk.model_construct(**common, choices=[choice], semif=semif)
        return [answer.model_dump(exclude_unset=True)]
    answer = ChatCompletionChunk.model_construct(
        **common, choices=[choice], semif=semif, usage=None
    )
    closing = ChatCompletionChunk.model_construct(**common, choices=[], usage=_usage(outcome))
    return [answer.model_dump(exclude_unset=True), closing.model_dump(exclude_unset=True)]
