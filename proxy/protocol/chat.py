"""OpenAI ``chat.completion`` bodies carrying a decision."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

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
    prompt_format_version: PromptFormat
    layout: Layout
    calibration: Calibrated | None = None
    route: Route | None = None
    route_reason: RouteReason | None = None
    debias: DebiasMethod | None = None
    debias_note: str | None = None
    read_scheme: str | None = None
    repeatable: bool | None = Field(None, description="the server's self-check, once it ran")
    logprobs_of: Literal["calibrated", "debiased", "read"] | None = Field(
        None, description="what choices[0].logprobs list (only when the request asked)"
    )
    decision_id: str | None = Field(
        None, description="the decision's id in the records and outcomes (docs/records.md)"
    )
    record: DecisionRecord | None = Field(
        None, description="the decision record (--decision-records answer)"
    )


class SemifChoiceAnswer(ChoiceAnswer, _ReadFacts):
    pass


class SemifScoreAnswer(ScoreAnswer, _ReadFacts):
    pass


class SemifNoulAnswer(NoulAnswer, _ReadFacts):
    probabilities: dict[str, Probability] = Field(description='"true" and "false"')


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
    usage: _ChatUsage | None = None
    semif: SemifAnswer | None = None


def semif_object(outcome: Outcome) -> dict[str, Any]:
    """The answer in System One form plus the read's own facts."""
    decision = outcome.decision
    answer = system_one_answer(decision)
    if decision.question.kind == "noul":
        answer["probabilities"] = dict(zip(decision.question.names, decision.probabilities))
    answer["label_mass"] = decision.label_mass
    answer["labels"] = dict(zip(decision.question.names, outcome.labels))
    answer["reads"] = outcome.reads
    if outcome.calibration is not None:
        answer["calibration"] = outcome.calibration
        answer["route"] = outcome.route
        answer["route_reason"] = outcome.route_reason
    if outcome.debias is not None:
        answer["debias"] = outcome.debias
        if outcome.debias_note:
            answer["debias_note"] = outcome.debias_note
    answer["prompt_format_version"] = PROMPT_FORMAT_VERSIONS[outcome.layout]
    answer["layout"] = outcome.layout
    if outcome.read_scheme:
        answer["read_scheme"] = outcome.read_scheme
    if outcome.repeatable is not None:  # the server's self-check: unknown until it ran
        answer["repeatable"] = outcome.repeatable
    return answer


def _usage(outcome: Outcome) -> dict[str, Any]:
    return {
        "prompt_tokens": outcome.tokens_in,
        "completion_tokens": outcome.reads,  # one token per read, as System One counts them
        "total_tokens": outcome.tokens_in + outcome.reads,
        "prompt_tokens_details": {"cached_tokens": outcome.tokens_cached},
    }


def _logprobs_of(outcome: Outcome) -> str:
    """What the listed log-probabilities are of: "calibrated" (a profile's map changed
    them), "debiased" (any debiasing: cyclic, PriDe or contextual), or the labels' "read"
    probabilities."""
    if outcome.calibration is not None and outcome.calibration.get("method") != "none":
        return "calibrated"
    return "debiased" if outcome.debias is not None else "read"


def _entry(name: str, p: float) -> dict[str, Any]:
    return {
        "token": name,
        "logprob": math.log(p) if p > 0 else LEAST_LOGPROB,
        "bytes": list(name.encode("utf-8")),
    }


def logprobs_object(outcome: Outcome, top: int) -> dict[str, Any]:
    """The decision as OpenAI chat log-probabilities: one position, the chosen option as its
    token with ln p, and the ``top`` most likely options (names as tokens, ties in option
    order) in ``top_logprobs``; the same numbers as ``semif.probabilities``."""
    decision = outcome.decision
    names, probs = decision.question.names, decision.probabilities
    order = sorted(range(len(names)), key=lambda i: (-probs[i], i))[:top]
    chosen = _entry(decision.best_name, probs[decision.best])
    chosen["top_logprobs"] = [_entry(names[i], probs[i]) for i in order]
    return {"content": [chosen], "refusal": None}


def completion_body(
    outcome: Outcome,
    model: str | None,
    top_logprobs: int | None = None,
    decision_id: str | None = None,
    record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``chat.completion``; with ``top_logprobs`` (the request asked for logprobs) the
    distribution also in ``choices[0].logprobs``, where every OpenAI client keeps it.
    ``decision_id`` and ``record`` (proxy/recorder.py) go in ``semif``."""
    semif = semif_object(outcome)
    logprobs = None
    if top_logprobs is not None:
        logprobs = logprobs_object(outcome, top_logprobs)
        semif["logprobs_of"] = _logprobs_of(outcome)
    if decision_id is not None:
        semif["decision_id"] = decision_id
    if record is not None:
        semif["record"] = record
    return {
        "id": f"chatcmpl-semif-{random.getrandbits(128):032x}",  # unique, not secret
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or outcome.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": outcome.decision.best_name},
                "logprobs": logprobs,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(outcome),
        "semif": semif,
    }


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
    answer's chunk then carries ``usage: null``, as OpenAI's do)."""
    body = completion_body(outcome, model, top_logprobs, decision_id, record)
    choice = body["choices"][0]
    body["object"] = "chat.completion.chunk"
    body["choices"] = [
        {
            "index": 0,
            "delta": choice["message"],
            "logprobs": choice["logprobs"],
            "finish_reason": "stop",
        }
    ]
    usage = body.pop("usage")
    if not include_usage:
        return [body]
    closing = {k: v for k, v in body.items() if k != "semif"}
    return [{**body, "usage": None}, {**closing, "choices": [], "usage": usage}]
