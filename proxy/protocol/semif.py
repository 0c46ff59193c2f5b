"""The ``semif`` extension of an OpenAI chat-completions request.

    "semif": {
        "type": "choice" | "noul" | "score",       # default "choice"
        "options": [...] | {name: description},    # noul: optional {"true":..,"false":..}
        "temperature": 1.0,                        # positive, finite
        "debias": "cyclic" | {"method": "cyclic", "rotations": k}
                  | "pride" | "contextual",         # optional (decision/debias.py)
        "calibration": "profile-name" | "none",    # optional
        "label_mass_floor": 0.3,                   # optional, overrides the profile's
        "layout": "conversation_first" | "options_first"  # optional (decision/prompt.py)
    }

``parse_chat`` validates a chat body carrying it with ``ChatDecisionRequest`` and turns it
into a ``ChatDecision``, or raises ``InvalidRequest`` whose ``param`` names the offending
field (``semif.options.3``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    SkipValidation,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ..bounded import BoundedCache
from ..decision.debias import DebiasError, parse_debias
from ..decision.prompt import DEFAULT_LAYOUT
from ..decision.question import (
    Question,
    QuestionError,
    check_temperature,
    choice_question,
    noul_question,
    score_question,
)
from ..errors import InvalidRequest
from .wire import (
    CONTENT_OR_CALLS,
    Absent,
    ChoiceOptions,
    Closed,
    Debias,
    Layout,
    NoulCriteria,
    Open,
    ScoreLevels,
    TextPart,
    ToolCall,
    refusal,
)

__all__ = [
    "MAX_TOP_LOGPROBS",
    "SemifSpec",
    "SemifChoice",
    "SemifNoul",
    "SemifScore",
    "Semif",
    "ChatDecisionRequest",
    "DecisionMessage",
    "SemifCall",
    "ChatDecision",
    "parse_chat",
    "requested_logprobs",
]

_BUILDERS = {"choice": choice_question, "noul": noul_question, "score": score_question}
MAX_TOP_LOGPROBS = 20  # OpenAI's cap; the whole distribution stays in ``semif``


class SemifSpec(Closed):
    """What every kind of ``semif`` has. ``options``, ``temperature`` and ``debias`` keep
    their wire types unchecked here (``SkipValidation``): the question builders and
    ``parse_debias`` check them, naming the exact item (``semif.options.3``)."""

    type: Literal["choice", "noul", "score"] = "choice"
    options: Annotated[ChoiceOptions | NoulCriteria | ScoreLevels | None, SkipValidation] = None
    temperature: Annotated[float, Field(gt=0), SkipValidation] = 1.0
    debias: Annotated[Debias | None, SkipValidation] = None
    calibration: str | None = None
    label_mass_floor: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    layout: Layout = "conversation_first"  # DEFAULT_LAYOUT


# The document's three kinds of ``semif``: ``SemifSpec`` with ``options`` as each needs them.
class SemifChoice(SemifSpec):
    """One of the options (the default type): a list of names or {name: description}."""

    type: Literal["choice"] = "choice"
    options: Annotated[ChoiceOptions, SkipValidation]


class SemifNoul(SemifSpec):
    """Yes or no; ``options`` may say what "true" and "false" mean."""

    type: Literal["noul"]
    options: Annotated[NoulCriteria | None, SkipValidation] = None


class SemifScore(SemifSpec):
    """A level of an ordered scale, ``options`` the levels, lowest first."""

    type: Literal["score"]
    options: Annotated[ScoreLevels, SkipValidation]


class _UnknownKind(Closed):
    """A ``semif`` of no known ``type``: recognised so that the refusal names ``type``."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: Literal["choice", "noul", "score"]


def _semif_kind(value: Any) -> str | None:
    """The branch a ``semif`` object is read by: its ``type`` ("choice" when absent)."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "choice")
    return kind if kind in ("choice", "noul", "score") else "unknown"


Semif = Annotated[
    Annotated[SemifChoice, Tag("choice")]
    | Annotated[SemifNoul, Tag("noul")]
    | Annotated[SemifScore, Tag("score")]
    | Annotated[SkipJsonSchema[_UnknownKind], Tag("unknown")],
    Discriminator(_semif_kind, custom_error_type="semif", custom_error_message="must be an object"),
]


def _text_or_list(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "list" if isinstance(value, list) else None


# a string, null or a list of text parts; only the branch that applies reports errors
_Content = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[TextPart], Tag("list")],
    Discriminator(
        _text_or_list,
        custom_error_type="content",
        custom_error_message="must be a string, null or a list of text parts",
    ),
]


class DecisionMessage(Open):
    """A message a decision read can lay out: text content (a string, null or text parts)
    and, if any, tool calls whose arguments are JSON text. The document also asks
    llama-server's rule of it (content, or tool calls in an assistant message), which
    the read itself does not need."""

    model_config = ConfigDict(json_schema_extra=CONTENT_OR_CALLS, frozen=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: _Content | None = None
    name: Absent = None  # absent, never null: llama-server refuses it
    tool_call_id: Absent = None
    reasoning_content: Absent = None
    tool_calls: list[ToolCall] | None = None


class _StreamOptions(Open):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    include_usage: bool = False


def _worded(message: str) -> WrapValidator:
    """The field's refusal in our words (a boolean is no number here either)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, bool):
            raise PydanticCustomError("semif_incompatible", message)
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("semif_incompatible", message) from None

    return WrapValidator(check)


class ChatDecisionRequest(Open):
    """A chat completion answered as a decision: the fields a one-token read cannot honour
    (``n`` over 1, tools, ``response_format``) are refused; others are ignored.
    ``parse_chat`` validates every decision body with it."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    messages: Annotated[list[DecisionMessage], Field(min_length=1)]
    semif: Semif
    model: JsonValue = Field(None, description="echoed in the answer when it is a string")
    stream: bool = Field(False, description="the whole answer as one chunk, then [DONE]")
    stream_options: _StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    n: Annotated[Literal[1], _worded("semif answers one choice; n must be 1")] | None = None
    tools: (
        Annotated[
            list[JsonValue], Field(max_length=0), _worded("semif cannot be combined with tools")
        ]
        | None
    ) = None
    response_format: Annotated[None, _worded("semif cannot be combined with response_format")] = (
        None
    )
    chat_template_kwargs: dict[str, JsonValue] | None = None


@dataclass(frozen=True)
class SemifCall:
    question: Question
    debias: tuple[int, ...]  # cyclic shifts to read and average; empty: read once
    calibration: str | None
    debias_method: str | None = None  # "cyclic", "pride", "contextual" or None
    label_mass_floor: float | None = None  # overrides the profile's
    layout: str = DEFAULT_LAYOUT  # where the options go (decision/prompt.py)


@dataclass(frozen=True)
class ChatDecision:
    """A chat body with ``semif`` as the model read it: the typed request, the question it
    asks, and how many options ``choices[0].logprobs`` lists (None: not asked)."""

    request: ChatDecisionRequest
    call: SemifCall
    top_logprobs: int | None

    @property
    def model(self) -> str | None:
        """The model the request names, when it names one by a string."""
        return self.request.model if isinstance(self.request.model, str) else None

    @property
    def include_usage(self) -> bool:
        options = self.request.stream_options
        return options is not None and options.include_usage


# Questions by their ``semif``'s JSON text: most traffic repeats the same few questions,
# and a question is a pure function of its JSON (key order included: it orders options).
_MAX_PARSED = 512
_PARSED: BoundedCache[bytes, SemifCall] = BoundedCache(_MAX_PARSED)
_MAX_KEY_BYTES = 8 * 1024  # with _MAX_PARSED: a few MB at most


def parse_chat(body: dict[str, Any]) -> ChatDecision:
    """``body`` validated by ``ChatDecisionRequest``, its ``semif`` built into a question;
    a refusal is an ``InvalidRequest`` whose ``param`` names the field (``semif.options.3``)."""
    try:
        request = ChatDecisionRequest.model_validate(body)
    except ValidationError as exc:
        param, message = refusal(exc, body)
        raise InvalidRequest(f"{param}: {message}", param=param or None) from exc
    spec = request.semif
    assert not isinstance(spec, _UnknownKind)  # its ``type`` is refused by the model
    return ChatDecision(request, _semif_call(spec, body["semif"]), requested_logprobs(request))


def _semif_call(spec: SemifSpec, raw: Any) -> SemifCall:
    """``spec``'s call, remembered by ``raw``'s JSON text."""
    try:
        key = orjson.dumps(raw)
    except TypeError:  # not JSON (a caller outside HTTP): build without remembering
        return _build(spec)
    call = _PARSED.get(key)
    if call is None:
        call = _build(spec)
        if len(key) <= _MAX_KEY_BYTES:
            _PARSED.put(key, call)
    return call


def _build(spec: SemifSpec) -> SemifCall:
    """The question the validated ``spec`` asks: the builders and ``parse_debias`` check
    what the model leaves to them (options, temperature, debias), naming the item."""
    try:
        temperature = check_temperature(spec.temperature, ("temperature",))
        question = _BUILDERS[spec.type](spec.options, loc=("options",), temperature=temperature)
    except QuestionError as exc:
        param = ".".join(["semif", *(str(p) for p in exc.loc)])
        raise InvalidRequest(f"{param}: {exc.message}", param=param) from exc
    try:
        if spec.debias is not None and question.kind == "score":
            raise DebiasError("score levels are ordered; debias applies to choice and noul")
        method, shifts = parse_debias(spec.debias, len(question.names))
    except DebiasError as exc:
        raise InvalidRequest(f"semif.debias: {exc}", param="semif.debias") from exc
    return SemifCall(
        question, tuple(shifts), spec.calibration, method, spec.label_mass_floor, spec.layout
    )


def requested_logprobs(request: ChatDecisionRequest) -> int | None:
    """How many options to list in ``choices[0].logprobs`` (``top_logprobs``), or None when
    the request did not ask for log-probabilities; OpenAI's rule across the two fields:
    ``top_logprobs`` only with ``logprobs: true``."""
    if not request.logprobs:
        if request.top_logprobs is not None:
            raise InvalidRequest("top_logprobs: needs logprobs: true", param="top_logprobs")
        return None
    return request.top_logprobs or 0
