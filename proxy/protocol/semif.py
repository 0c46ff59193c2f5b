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

``parse_semif`` turns it into a ``SemifCall`` or raises ``InvalidRequest`` whose
``param`` names the offending field (``semif.options.3``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import ConfigDict, Field, JsonValue, SkipValidation, ValidationError
from pydantic.json_schema import SkipJsonSchema

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
from .relayed import MESSAGE_STRINGS, check_tool_call
from .wire import (
    CONTENT_OR_CALLS,
    ChoiceOptions,
    Closed,
    Debias,
    Layout,
    NoulCriteria,
    Open,
    ScoreLevels,
    TextPart,
    ToolCall,
)

__all__ = [
    "MAX_TOP_LOGPROBS",
    "SemifSpec",
    "SemifChoice",
    "SemifNoul",
    "SemifScore",
    "ChatDecisionRequest",
    "DecisionMessage",
    "SemifCall",
    "parse_semif",
    "refuse_incompatible",
    "requested_logprobs",
]

_BUILDERS = {"choice": choice_question, "noul": noul_question, "score": score_question}
MAX_TOP_LOGPROBS = 20  # OpenAI's cap; the whole distribution stays in ``semif``


class SemifSpec(Closed):
    """What ``parse_semif`` validates. ``options``, ``temperature`` and ``debias`` keep
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


class DecisionMessage(Open):
    """A message a decision read can lay out (``refuse_incompatible``'s rules): text
    content (a string, null or text parts) and, if any, tool calls. The document also
    asks llama-server's rule of it (content, or tool calls in an assistant message) and
    a ``type`` of each tool call, which the read itself does not need."""

    model_config = ConfigDict(json_schema_extra=CONTENT_OR_CALLS)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | SkipJsonSchema[None] = None  # absent, never null: llama-server refuses it
    tool_call_id: str | SkipJsonSchema[None] = None
    reasoning_content: str | SkipJsonSchema[None] = None
    tool_calls: list[ToolCall] | None = None


class _StreamOptions(Open):
    include_usage: bool = False


class ChatDecisionRequest(Open):
    """A chat completion answered as a decision: the fields a one-token read cannot honour
    (``n`` over 1, tools, ``response_format``) are refused; others are ignored."""

    messages: Annotated[list[DecisionMessage], Field(min_length=1)]
    semif: SemifChoice | SemifNoul | SemifScore
    model: JsonValue = Field(None, description="echoed in the answer when it is a string")
    stream: bool = Field(False, description="the whole answer as one chunk, then [DONE]")
    stream_options: _StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    n: Literal[1] | None = None
    tools: Annotated[list[JsonValue], Field(max_length=0)] | None = None
    response_format: None = None
    chat_template_kwargs: dict[str, JsonValue] | None = None


@dataclass(frozen=True)
class SemifCall:
    question: Question
    debias: tuple[int, ...]  # cyclic shifts to read and average; empty: read once
    calibration: str | None
    debias_method: str | None = None  # "cyclic", "pride", "contextual" or None
    label_mass_floor: float | None = None  # overrides the profile's
    layout: str = DEFAULT_LAYOUT  # where the options go (decision/prompt.py)


# Valid calls by their JSON text: most traffic repeats the same few questions,
# and a call is a pure function of its JSON (key order included: it orders options).
_MAX_PARSED = 512
_PARSED: BoundedCache[bytes, SemifCall] = BoundedCache(_MAX_PARSED)
_MAX_KEY_BYTES = 8 * 1024  # with _MAX_PARSED: a few MB at most


def parse_semif(raw: object) -> SemifCall:
    if not isinstance(raw, dict):
        raise InvalidRequest("semif must be an object", param="semif")
    try:
        key = orjson.dumps(raw)
    except TypeError:  # not JSON (a caller outside HTTP): parse without remembering
        return _parse(raw)
    call = _PARSED.get(key)
    if call is None:
        call = _parse(raw)
        if len(key) <= _MAX_KEY_BYTES:
            _PARSED.put(key, call)
    return call


def _parse(raw: dict[str, Any]) -> SemifCall:
    try:
        spec = SemifSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(part) for part in first["loc"])
        raise InvalidRequest(f"semif.{loc}: {first['msg']}", param=f"semif.{loc}") from exc
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


def requested_logprobs(body: dict[str, Any]) -> int | None:
    """How many options to list in ``choices[0].logprobs`` (``top_logprobs``, 0 to 20), or
    None when the request did not ask for log-probabilities (OpenAI's rules: ``logprobs``
    a boolean, ``top_logprobs`` only with ``logprobs: true``)."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise InvalidRequest("logprobs must be a boolean", param="logprobs")
    if top is not None and (
        isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS
    ):
        raise InvalidRequest(
            f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}", param="top_logprobs"
        )
    if not wanted:
        if top is not None:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return None
    return 0 if top is None else top


def refuse_incompatible(body: dict[str, Any]) -> None:
    """Fields that cannot be honoured by a one-token decision read are refused, not ignored."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise InvalidRequest("semif answers one choice; n must be 1", param="n")
    tools = body.get("tools")
    if tools is not None and tools != []:
        raise InvalidRequest("semif cannot be combined with tools", param="tools")
    if body.get("response_format") is not None:
        raise InvalidRequest(
            "semif cannot be combined with response_format", param="response_format"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        _check_message(message, f"messages.{i}")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _check_message(message: object, param: str) -> None:
    """A message a decision read can lay out: a known role, text content (a string,
    null, or text parts) and, if present, a list of tool calls."""
    if (
        not isinstance(message, dict)
        or not isinstance(message.get("role"), str)
        or message["role"] not in _ROLES
    ):
        raise InvalidRequest(
            f"each message must be an object with a role among {sorted(_ROLES)}", param=param
        )
    content = message.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise InvalidRequest(
                    "semif reads text only: each content part must be "
                    '{"type": "text", "text": "..."}',
                    param=f"{param}.content.{j}",
                )
    elif content is not None and not isinstance(content, str):
        raise InvalidRequest(
            "content must be a string, null or a list of text parts", param=f"{param}.content"
        )
    for field in MESSAGE_STRINGS:
        if field in message and not isinstance(message[field], str):
            raise InvalidRequest(f"{field} must be a string", param=f"{param}.{field}")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise InvalidRequest("tool_calls must be a list", param=f"{param}.tool_calls")
    for k, call in enumerate(calls):
        check_tool_call(call, f"{param}.tool_calls.{k}")
        if not isinstance(call["function"]["arguments"], str):
            raise InvalidRequest(
                "a tool call's arguments must be a string (JSON text)",
                param=f"{param}.tool_calls.{k}.function.arguments",
            )
