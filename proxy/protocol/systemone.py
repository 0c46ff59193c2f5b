"""The System One API (TypeSafe ``POST /v1/systemone``) on any chat model.

    {"model": "jev-latest", "state": <string|object|array>,
     "questions": {<id>: {"type": "choice"|"score"|"noul", "instructions": ..., "criteria": ...}}}

``parse_request`` validates the shape with pydantic and the meaning with the
question builders; every failure becomes ``Unprocessable`` with FastAPI-style
``{loc, msg, type}`` entries whose ``loc`` starts with ``"body"``. Unknown
top-level fields are ignored, as the API does. Extensions: ``x_debias``
(``"cyclic"``, ``{"method": "cyclic", "rotations": k}``, ``"pride"`` or
``"contextual"``; applies to choice and noul questions, score levels keep their
order), ``x_calibration`` and ``x_label_mass_floor`` (overrides the profile's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    JsonValue,
    SerializeAsAny,
    SkipValidation,
    ValidationError,
    field_validator,
)

from ..decision.debias import DebiasError, parse_debias
from ..decision.outcome import Outcome
from ..decision.prompt import PROMPT_FORMAT_VERSION
from ..decision.question import (
    Question,
    QuestionError,
    as_text,
    choice_question,
    noul_question,
    score_question,
)
from ..decision.readout import system_one_answer
from ..errors import Unprocessable
from .answers import Calibrated, ChoiceAnswer, NoulAnswer, ScoreAnswer
from .records import DebiasMethod, DecisionRecord, Route, RouteReason
from .wire import (
    ChoiceOptions,
    Count,
    Debias,
    Description,
    NoulCriteria,
    Open,
    Probability,
    ScoreLevels,
)

__all__ = [
    "MAX_QUESTIONS",
    "SystemOneRequest",
    "SystemOneResponse",
    "SystemOneCall",
    "parse_request",
    "response_body",
    "DEFAULT_MODEL",
]

MAX_QUESTIONS = 128
DEFAULT_MODEL = "jev-latest"

State = str | dict[str, JsonValue] | list[JsonValue]


# ``criteria`` and ``x_debias`` keep their wire types unchecked here (``SkipValidation``):
# the question builders and ``parse_debias`` check them, naming the exact item.
class _Question(Open):
    instructions: Description = None


class _SystemOneChoice(_Question):
    type: Literal["choice"]
    criteria: Annotated[ChoiceOptions, SkipValidation]


class _SystemOneScore(_Question):
    type: Literal["score"]
    criteria: Annotated[ScoreLevels, SkipValidation]


class _SystemOneNoul(_Question):
    type: Literal["noul"]
    criteria: Annotated[NoulCriteria | None, SkipValidation] = None


class SystemOneRequest(Open):
    """Questions about one state; unknown fields are ignored, as the API does."""

    model: str | None = None
    state: Annotated[State, SkipValidation]
    x_debias: Annotated[Debias | None, SkipValidation] = None
    x_calibration: str | None = None
    x_label_mass_floor: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    questions: Annotated[
        dict[
            str,
            Annotated[
                _SystemOneChoice | _SystemOneScore | _SystemOneNoul, Field(discriminator="type")
            ],
        ],
        Field(min_length=1, max_length=MAX_QUESTIONS),
    ]

    @field_validator("state")
    @classmethod
    def _state_is_content(cls, value: object) -> object:
        if value is None or not isinstance(value, (str, dict, list)):
            raise ValueError("state must be a string, an object or an array")
        return value


class _Rotation(Open):
    """One cyclic read: its shift and the probabilities by position shown."""

    shift: Count
    by_position: list[Probability]


class _ReadFacts(Open):
    """How the answer was read (``response_body``), as extensions of the API."""

    x_label_mass: Annotated[float, Field(ge=0)]
    x_reads: Annotated[int, Field(ge=1)]
    x_calibration: Calibrated | None = None
    x_route: Route | None = None
    x_route_reason: RouteReason | None = None
    x_debias: DebiasMethod | None = None
    x_debias_note: str | None = None
    x_rotations: list[_Rotation] | None = None
    x_prompt_format_version: Literal["semif-1"]
    x_prompt_tokens: Count = Field(description="what a replay of the prompt must tokenise to")
    x_read_scheme: str | None = None
    x_repeatable: bool | None = None
    x_decision_id: str | None = Field(
        None, description="the decision's id in the records and outcomes (docs/records.md)"
    )
    # the record as ``DecisionRecord.dump`` gave it (a dict): written as it is
    x_record: SerializeAsAny[DecisionRecord] | None = Field(
        None, description="the decision record (--decision-records answer)"
    )


# _ReadFacts last in each MRO: its fields follow the answer's, in the order written
class SystemOneChoiceAnswer(_ReadFacts, ChoiceAnswer):
    pass


class SystemOneScoreAnswer(_ReadFacts, ScoreAnswer):
    pass


class SystemOneNoulAnswer(_ReadFacts, NoulAnswer):
    pass


_ANSWERS: dict[str, type[_ReadFacts]] = {
    "choice": SystemOneChoiceAnswer,
    "score": SystemOneScoreAnswer,
    "noul": SystemOneNoulAnswer,
}


class _SystemOneUsage(Open):
    input_tokens: Count
    output_tokens: Count
    x_cached_input_tokens: Count


class SystemOneResponse(Open):
    model: str
    answers: dict[
        str,
        Annotated[
            SystemOneChoiceAnswer | SystemOneScoreAnswer | SystemOneNoulAnswer,
            Field(discriminator="type"),
        ],
    ]
    usage: _SystemOneUsage


@dataclass(frozen=True)
class SystemOneCall:
    model: str | None
    state_text: str
    questions: dict[str, Question]
    debias: dict[str, tuple[int, ...]]  # question id -> cyclic shifts (absent: read once)
    calibration: str | None
    debias_method: str | None = None  # "cyclic", "pride", "contextual" or None
    label_mass_floor: float | None = None  # overrides the profile's


_BUILDERS = {"choice": choice_question, "score": score_question, "noul": noul_question}


def parse_request(body: dict[str, Any]) -> SystemOneCall:
    try:
        request = SystemOneRequest.model_validate(body)
    except ValidationError as exc:
        raise Unprocessable([_detail(e) for e in exc.errors()]) from exc
    questions: dict[str, Question] = {}
    details: list[dict[str, Any]] = []
    for qid, q in request.questions.items():
        loc = ("body", "questions", qid, q.type, "criteria")
        instructions = as_text(q.instructions) if q.instructions is not None else None
        try:
            questions[qid] = _BUILDERS[q.type](q.criteria, loc=loc, instructions=instructions)
        except QuestionError as err:
            details.append({"loc": list(err.loc), "msg": err.message, "type": "value_error"})
    if details:
        raise Unprocessable(details)
    try:
        parsed = {
            qid: parse_debias(request.x_debias, len(q.names))
            for qid, q in questions.items()
            if q.kind != "score"
        }
    except DebiasError as err:
        raise Unprocessable(
            [{"loc": ["body", "x_debias"], "msg": str(err), "type": "value_error"}]
        ) from err
    method = next((m for m, _ in parsed.values()), None)  # the same for every question
    return SystemOneCall(
        request.model,
        as_text(request.state),
        questions,
        {qid: tuple(d) for qid, (_, d) in parsed.items() if d},
        request.x_calibration,
        method,
        request.x_label_mass_floor,
    )


def _detail(error: Any) -> dict[str, Any]:
    return {"loc": ["body", *error["loc"]], "msg": error["msg"], "type": error["type"]}


def response_body(
    model: str,
    outcomes: Mapping[str, Outcome],
    ids: Mapping[str, str] | None = None,
    records: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The System One answer (a ``SystemOneResponse``, dumped); ``ids`` and ``records``
    (proxy/recorder.py), by question id, in each answer's ``x_decision_id`` and
    ``x_record``."""
    answers = {}
    for qid, outcome in outcomes.items():
        answer = system_one_answer(outcome.decision)
        answer["x_label_mass"] = outcome.decision.label_mass
        answer["x_reads"] = outcome.reads
        if outcome.calibration is not None:
            answer["x_calibration"] = Calibrated.model_construct(None, **outcome.calibration)
            answer["x_route"] = outcome.route
            answer["x_route_reason"] = outcome.route_reason
        if outcome.debias is not None:
            answer["x_debias"] = outcome.debias
            if outcome.debias_note:
                answer["x_debias_note"] = outcome.debias_note
        if outcome.rotations:
            answer["x_rotations"] = [
                _Rotation.model_construct(shift=s, by_position=list(p))
                for s, p in outcome.rotations
            ]
        answer["x_prompt_format_version"] = PROMPT_FORMAT_VERSION
        answer["x_prompt_tokens"] = outcome.prompt_tokens  # what a replay must tokenise to
        if outcome.read_scheme:
            answer["x_read_scheme"] = outcome.read_scheme
        if outcome.repeatable is not None:  # the server's self-check: unknown until it ran
            answer["x_repeatable"] = outcome.repeatable
        if ids is not None:
            answer["x_decision_id"] = ids[qid]
        if records is not None:
            answer["x_record"] = records[qid]
        answers[qid] = _ANSWERS[outcome.decision.question.kind].model_construct(**answer)
    # the API's fields, all prompt tokens; the cached share as an extension
    usage = _SystemOneUsage.model_construct(
        input_tokens=sum(o.tokens_in for o in outcomes.values()),
        output_tokens=sum(o.reads for o in outcomes.values()),
        x_cached_input_tokens=sum(o.tokens_cached for o in outcomes.values()),
    )
    return SystemOneResponse.model_construct(model=model, answers=answers, usage=usage).model_dump(
        exclude_unset=True
    )
