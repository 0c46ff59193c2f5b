"""The OpenAI Decisions API (``POST /v1/decisions``) on any chat model.

    {"model": ..., "input": <string | [message | function_call | ..._output items]>,
     "questions": [{"type": "predicate" | "choice" | "score", "name": ..., "instructions": ...,
                    "choices": [{"value", "description"}] | "levels": [{"label", "description"}]}]}

The shape is the openai SDK's ``decision_create_params`` and ``Decision``. A
predicate is read as a noul (yes/no) question, a choice as a choice, a score as
a score, each about one state text: the input string as it is, or the input
items as a transcript, one ``role: text`` entry per item. Images are refused
(this server reads text). ``parse_request`` raises ``InvalidRequest`` whose
``param`` names the field (``questions.2.choices``); ``response_body`` gives
the answers in question order.

Longer than 400 lines on purpose: the SDK's input items (messages, tool calls and their
outputs, content parts), questions and answers are each a pydantic model, and the one
wire format is kept in one module as protocol/'s other APIs are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ..decision.outcome import Outcome
from ..decision.question import (
    MAX_LEVELS,
    MAX_OPTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    Question,
    QuestionError,
    as_text,
    choice_question,
    noul_question,
    score_question,
)
from ..decision.readout import Decision, choice_confidence, expected_level, score_confidence
from ..errors import InvalidRequest
from .records import DecisionRecord
from .wire import Count, NonBlank, Open, Probability, refusal

__all__ = [
    "MAX_QUESTIONS",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MAX_JSON_BYTES",
    "AskedQuestion",
    "DecisionsCall",
    "DecisionsRequest",
    "DecisionsResponse",
    "parse_request",
    "response_body",
]

MAX_QUESTIONS = 400
MAX_JSON_DEPTH = 32  # input_json: container levels
MAX_JSON_VALUES = 10_000  # input_json: values, containers included
MAX_JSON_BYTES = 256 * 1024  # input_json: compact UTF-8 JSON

_Status = Literal["in_progress", "completed", "incomplete"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Breakpoint(_Strict):
    mode: Literal["explicit"]


class _QuestionText(_Strict):
    type: Literal["input_text"]
    text: str


class _InputText(_QuestionText):
    prompt_cache_breakpoint: _Breakpoint | None = None  # accepted; llama-server caches by itself


class _Image(_Strict):
    """Refused (400) by the model itself, and allowed by none of the document's schemas
    (``SkipJsonSchema``): this server reads text only. The part is recognised so that the
    refusal says so."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    type: Literal["input_image"]

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        raise PydanticCustomError(
            "text_only", "images are not supported: this server reads text only"
        )


class _Json(_Strict):
    type: Literal["input_json"]
    # any JSON object, or a list of them; Any rather than JsonValue keeps the document's
    # schema plain (`additionalProperties: true`), which schemathesis 4.32 can negate: with
    # JsonValue's component there it fails to generate bad bodies (InvalidSchema)
    data: dict[str, Any] | list[dict[str, Any]]


class _OutputText(_Strict):
    type: Literal["output_text"]
    text: str


class _Refusal(_Strict):
    type: Literal["refusal"]
    refusal: str


def _text_or_list(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "list" if isinstance(value, list) else None


# A string, or a list of parts; only the branch that applies reports errors.
_TEXT_OR_LIST = Discriminator(
    _text_or_list,
    custom_error_type="text_or_list",
    custom_error_message="must be a string or a list of parts",
)
_Text = Annotated[str, Tag("text")]
_NoImage = SkipJsonSchema[_Image]
_UserPart = Annotated[_InputText | _NoImage | _Json, Field(discriminator="type")]
_AssistantPart = Annotated[_OutputText | _Refusal, Field(discriminator="type")]
_OutputPart = Annotated[_InputText | _NoImage, Field(discriminator="type")]
_InstructionPart = Annotated[_QuestionText | _NoImage | _Json, Field(discriminator="type")]
_UserContent = Annotated[_Text | Annotated[list[_UserPart], Tag("list")], _TEXT_OR_LIST]
_TextContent = Annotated[_Text | Annotated[list[_InputText], Tag("list")], _TEXT_OR_LIST]
_AssistantContent = Annotated[_Text | Annotated[list[_AssistantPart], Tag("list")], _TEXT_OR_LIST]
_OutputContent = Annotated[_Text | Annotated[list[_OutputPart], Tag("list")], _TEXT_OR_LIST]
_Instructions = Annotated[
    Annotated[NonBlank, Tag("text")]
    | Annotated[list[_InstructionPart], Field(min_length=1), Tag("list")],
    _TEXT_OR_LIST,
]


class _Message(_Strict):
    type: Literal["message"] = "message"


class _UserMessage(_Message):
    role: Literal["user"]
    content: _UserContent


class _DeveloperMessage(_Message):
    role: Literal["developer"]
    content: _TextContent


class _SystemMessage(_Message):
    role: Literal["system"]
    content: _TextContent


class _AssistantMessage(_Message):
    role: Literal["assistant"]
    content: _AssistantContent
    phase: Literal["commentary", "final_answer"] | None = None


class _Call(_Strict):
    call_id: str
    name: str
    id: str | None = None
    namespace: str | None = None
    status: _Status | None = None


class _FunctionCall(_Call):
    type: Literal["function_call"]
    arguments: str


class _CustomToolCall(_Call):
    type: Literal["custom_tool_call"]
    input: str


class _CallOutput(_Strict):
    call_id: str
    output: _OutputContent
    id: str | None = None
    status: _Status | None = None


class _FunctionCallOutput(_CallOutput):
    type: Literal["function_call_output"]


class _CustomToolCallOutput(_CallOutput):
    type: Literal["custom_tool_call_output"]


def _item_tag(value: Any) -> str | None:
    """A message's role (its ``type`` is optional), otherwise the item's ``type``."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "message")
    tag = value.get("role") if kind == "message" else kind
    return tag if isinstance(tag, str) else None


_Item = Annotated[
    Union[
        Annotated[_UserMessage, Tag("user")],
        Annotated[_DeveloperMessage, Tag("developer")],
        Annotated[_SystemMessage, Tag("system")],
        Annotated[_AssistantMessage, Tag("assistant")],
        Annotated[_FunctionCall, Tag("function_call")],
        Annotated[_FunctionCallOutput, Tag("function_call_output")],
        Annotated[_CustomToolCall, Tag("custom_tool_call")],
        Annotated[_CustomToolCallOutput, Tag("custom_tool_call_output")],
    ],
    Discriminator(
        _item_tag,
        custom_error_type="input_item",
        custom_error_message="must be a user, developer, system or assistant message, "
        "or a function_call, function_call_output, custom_tool_call or "
        "custom_tool_call_output item",
    ),
]


class _Question(_Strict):
    instructions: _Instructions
    name: str | None = None


class _DecisionsPredicate(_Question):
    """A yes/no question, answered with the probability of yes."""

    type: Literal["predicate"]


class _ChoiceOption(_Strict):
    value: NonBlank | bool  # typed: "true" and true are different values
    description: str | None = None


class _DecisionsChoice(_Question):
    type: Literal["choice"]
    # the limits are the question builders' to check (schema only)
    choices: list[_ChoiceOption] = Field(
        json_schema_extra={"minItems": MIN_OPTIONS, "maxItems": MAX_OPTIONS}
    )


class _Level(_Strict):
    label: NonBlank
    description: str | None = None


class _DecisionsScore(_Question):
    type: Literal["score"]
    levels: list[_Level] = Field(json_schema_extra={"minItems": MIN_LEVELS, "maxItems": MAX_LEVELS})


class _CacheOptions(_Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] = "30m"


_Asked = _DecisionsPredicate | _DecisionsChoice | _DecisionsScore


class DecisionsRequest(_Strict):
    """The openai SDK's ``decision_create_params``."""

    model: str
    input: Annotated[
        _Text | Annotated[list[_Item], Field(min_length=1), Tag("list")], _TEXT_OR_LIST
    ]
    questions: Annotated[
        list[Annotated[_Asked, Field(discriminator="type")]],
        Field(min_length=1, max_length=MAX_QUESTIONS),
    ]
    prompt_cache_key: str | None = None  # accepted and unused: llama-server caches prefixes
    prompt_cache_options: _CacheOptions | None = None
    safety_identifier: str | None = None


@dataclass(frozen=True)
class AskedQuestion:
    """``values`` echo the caller's choices (typed) or level labels; a predicate has none."""

    name: str | None
    question: Question
    values: tuple[str | bool, ...] = ()


@dataclass(frozen=True)
class DecisionsCall:
    model: str
    state_text: str
    asked: tuple[AskedQuestion, ...]

    @property
    def questions(self) -> dict[str, Question]:
        """Keyed by position, for ``DecisionService.answer``."""
        return {str(i): a.question for i, a in enumerate(self.asked)}


def parse_request(body: dict[str, Any]) -> DecisionsCall:
    try:
        request = DecisionsRequest.model_validate(body)
    except ValidationError as exc:
        param, message = refusal(exc, body)
        raise InvalidRequest(f"{param or 'body'}: {message}", param=param or None) from exc
    state_text = _state_text(request.input)
    asked = tuple(_ask(q, ("questions", i)) for i, q in enumerate(request.questions))
    return DecisionsCall(request.model, state_text, asked)


def _refused(message: str, loc: tuple[str | int, ...]) -> InvalidRequest:
    param = ".".join(str(part) for part in loc)
    return InvalidRequest(f"{param}: {message}", param=param)


def _state_text(value: str | list[Any]) -> str:
    """The input as the model reads it: a string as it is, items one per line."""
    if isinstance(value, str):
        return value
    calls: dict[str, set[str]] = {"function_call": set(), "custom_tool_call": set()}
    return "\n".join(_item_text(item, ("input", i), calls) for i, item in enumerate(value))


def _item_text(item: Any, loc: tuple[str | int, ...], calls: dict[str, set[str]]) -> str:
    if isinstance(item, (_UserMessage, _DeveloperMessage, _SystemMessage, _AssistantMessage)):
        return f"{item.role}: {_content_text(item.content, (*loc, 'content'))}"
    if isinstance(item, (_FunctionCall, _CustomToolCall)):
        calls[item.type].add(item.call_id)
        name = f"{item.namespace}.{item.name}" if item.namespace else item.name
        body = item.arguments if isinstance(item, _FunctionCall) else item.input
        return f"{item.type} {name} ({item.call_id}): {body}"
    call_type = item.type.removesuffix("_output")
    if item.call_id not in calls[call_type]:
        raise _refused(
            f"no earlier {call_type} item has call_id {item.call_id!r}", (*loc, "call_id")
        )
    return f"{item.type} ({item.call_id}): {_content_text(item.output, (*loc, 'output'))}"


def _content_text(content: str | list[Any], loc: tuple[str | int, ...]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(_part_text(part, (*loc, j)) for j, part in enumerate(content))


def _part_text(
    part: _InputText | _QuestionText | _Image | _Json | _OutputText | _Refusal,
    loc: tuple[str | int, ...],
) -> str:
    assert not isinstance(part, _Image)  # _Image's own validator refuses every image
    if isinstance(part, _Json):
        _check_json(part.data, (*loc, "data"))
        return as_text(part.data)
    if isinstance(part, _Refusal):
        return f"(refused) {part.refusal}"
    return part.text


def _check_json(data: Any, loc: tuple[str | int, ...]) -> None:
    """At most MAX_JSON_DEPTH container levels, MAX_JSON_VALUES values (containers
    included, keys not) and MAX_JSON_BYTES of compact UTF-8 JSON."""
    depth = values = 0
    level = [data]
    while level:
        values += len(level)
        if values > MAX_JSON_VALUES:
            raise _refused(f"input_json holds more than {MAX_JSON_VALUES} values", loc)
        containers = [v for v in level if isinstance(v, (dict, list))]
        depth += bool(containers)
        if depth > MAX_JSON_DEPTH:
            raise _refused(f"input_json nests more than {MAX_JSON_DEPTH} levels", loc)
        level = [c for v in containers for c in (v.values() if isinstance(v, dict) else v)]
    if len(orjson.dumps(data)) > MAX_JSON_BYTES:
        raise _refused(f"input_json is larger than {MAX_JSON_BYTES} bytes", loc)


def _ask(q: _Asked, loc: tuple[str | int, ...]) -> AskedQuestion:
    instructions = _content_text(q.instructions, (*loc, "instructions"))
    if not instructions.strip():
        raise _refused("instructions must not be empty", (*loc, "instructions"))
    try:
        return _build(q, loc, instructions)
    except QuestionError as err:
        raise _refused(err.message, err.loc) from err


def _build(q: _Asked, loc: tuple[str | int, ...], instructions: str) -> AskedQuestion:
    """The question builders check the limits (2-255 choices, 2-10 levels)."""
    if isinstance(q, _DecisionsPredicate):
        return AskedQuestion(q.name, noul_question(None, loc=loc, instructions=instructions))
    if isinstance(q, _DecisionsChoice):
        options = _choice_options(q.choices, (*loc, "choices"))
        question = choice_question(options, loc=(*loc, "choices"), instructions=instructions)
        return AskedQuestion(q.name, question, tuple(c.value for c in q.choices))
    shown = [_with_description(level.label, level.description) for level in q.levels]
    question = score_question(shown, loc=(*loc, "levels"), instructions=instructions)
    return AskedQuestion(q.name, question, tuple(level.label for level in q.levels))


def _choice_options(
    choices: list[_ChoiceOption], loc: tuple[str | int, ...]
) -> dict[str, str | None]:
    """Choice name (as the model reads it) -> description; two values that read
    the same (``"true"`` and ``true``) cannot be told apart, so they are refused."""
    seen: dict[str, int] = {}
    for j, choice in enumerate(choices):
        text = as_text(choice.value)
        if text in seen:
            raise _refused(
                f"choices {seen[text]} and {j} both read as {text!r}; each choice must be unique",
                loc,
            )
        seen[text] = j
    return {as_text(c.value): c.description for c in choices}


def _with_description(label: str, description: str | None) -> str:
    return f"{label} - {description.strip()}" if description and description.strip() else label


class _Recorded(Open):
    """Extensions of every answer: its decision id and, with --decision-records answer,
    its record (docs/records.md)."""

    x_decision_id: str | None = Field(
        None, description="the decision's id in the records and outcomes (docs/records.md)"
    )
    x_record: DecisionRecord | None = Field(
        None, description="the decision record (--decision-records answer)"
    )


class _DecisionsPredicateAnswer(_Recorded):
    type: Literal["predicate"]
    name: str | None
    probability: Probability = Field(description="the probability of yes")


class _ValueProbability(Open):
    value: str | bool = Field(description="a choice's value, as the request typed it")
    probability: Probability


class _DecisionsChoiceAnswer(_Recorded):
    type: Literal["choice"]
    name: str | None
    choice: str | bool
    confidence: Probability
    probabilities: list[_ValueProbability] = Field(description="in the request's order")


class _LevelProbability(Open):
    label: str
    value: Count = Field(description="the level's number, 0 lowest")
    probability: Probability


class _DecisionsScoreAnswer(_Recorded):
    type: Literal["score"]
    name: str | None
    score: Annotated[float, Field(ge=0)] = Field(description="the expected level")
    confidence: Probability
    probabilities: list[_LevelProbability]


class _InputDetails(Open):
    cache_write_tokens: Count
    cached_tokens: Count


class _OutputDetails(Open):
    reasoning_tokens: Count


class _DecisionsUsage(Open):
    input_tokens: Count
    input_tokens_details: _InputDetails
    output_tokens: Count
    output_tokens_details: _OutputDetails
    total_tokens: Count


class DecisionsResponse(Open):
    """The openai SDK's ``Decision``: one answer per question, in order."""

    model: str
    answers: list[
        Annotated[
            _DecisionsPredicateAnswer | _DecisionsChoiceAnswer | _DecisionsScoreAnswer,
            Field(discriminator="type"),
        ]
    ]
    usage: _DecisionsUsage


def response_body(
    call: DecisionsCall,
    outcomes: Mapping[str, Outcome],
    ids: Mapping[str, str] | None = None,
    records: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The SDK's ``Decision``. Usage has OpenAI's meaning: input tokens are every prompt
    token read, of which ``cached_tokens`` came from llama-server's prompt cache; output
    tokens are the one-token reads. ``ids`` and ``records`` (proxy/recorder.py), by
    question id, in each answer's ``x_decision_id`` and ``x_record``."""
    qids = list(call.questions)
    used = [outcomes[qid] for qid in qids]
    input_tokens = sum(o.tokens_in for o in used)
    output_tokens = sum(o.reads for o in used)
    answers = [_answer(a, o.decision) for a, o in zip(call.asked, used)]
    for qid, answer in zip(qids, answers):
        if ids is not None:
            answer["x_decision_id"] = ids[qid]
        if records is not None:
            answer["x_record"] = records[qid]
    return {
        "model": call.model,
        "answers": answers,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {
                "cache_write_tokens": 0,
                "cached_tokens": sum(o.tokens_cached for o in used),
            },
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }


def _answer(asked: AskedQuestion, decision: Decision) -> dict[str, Any]:
    probs = decision.probabilities
    kind = asked.question.kind
    if kind == "noul":
        p_true = dict(zip(asked.question.names, probs))["true"]
        return {"type": "predicate", "name": asked.name, "probability": p_true}
    if kind == "choice":
        return {
            "type": "choice",
            "name": asked.name,
            "choice": asked.values[decision.best],
            "confidence": choice_confidence(probs),
            "probabilities": [{"value": v, "probability": p} for v, p in zip(asked.values, probs)],
        }
    return {
        "type": "score",
        "name": asked.name,
        "score": expected_level(probs),
        "confidence": score_confidence(probs),
        "probabilities": [
            {"label": label, "value": i, "probability": p}
            for i, (label, p) in enumerate(zip(asked.values, probs))
        ],
    }
