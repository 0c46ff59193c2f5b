"""Field types the wire formats share: a question's options, levels and criteria, the
debias spec, probabilities and counts.

The question fields (``ChoiceOptions``, ``ScoreLevels``, ``NoulCriteria``) and the
debias spec are typed as the wire carries them, and the request models wrap them in
``SkipValidation``: the question builders (``decision/question.py``) and
``parse_debias`` check them, so that every API words their refusals alike and names the
exact item (``semif.options.3``). The types give the models their JSON Schema and
mypy its types; the builders take ``object``, never trusting them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ..decision.question import MAX_LEVELS, MAX_OPTIONS, MIN_LEVELS, MIN_OPTIONS

__all__ = [
    "TextPart",
    "Function",
    "ToolCall",
    "CONTENT_OR_CALLS",
    "Description",
    "Name",
    "ChoiceOptions",
    "ScoreLevels",
    "NoulCriteria",
    "CyclicDebias",
    "Debias",
    "Probability",
    "Count",
    "Closed",
    "Open",
    "Layout",
    "PromptFormat",
    "Absent",
    "NOT_BLANK",
    "NonBlank",
    "param_of",
    "refusal",
]


class Closed(BaseModel):
    """A request object of ours: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Open(BaseModel):
    """An object others may add keys to (OpenAI's bodies, answers): unknown keys pass."""

    model_config = ConfigDict(extra="ignore", frozen=True)


Name = Annotated[str, Field(min_length=1)]
# free text or structure, shown in the prompt as it is (objects and arrays as JSON)
Description = str | dict[str, JsonValue] | list[JsonValue] | None
ChoiceOptions = (
    Annotated[
        list[Name],
        Field(
            min_length=MIN_OPTIONS, max_length=MAX_OPTIONS, json_schema_extra={"uniqueItems": True}
        ),
    ]
    | Annotated[dict[Name, Description], Field(min_length=MIN_OPTIONS, max_length=MAX_OPTIONS)]
)
ScoreLevels = Annotated[
    list[Name | dict[str, JsonValue] | list[JsonValue]],
    Field(min_length=MIN_LEVELS, max_length=MAX_LEVELS, description="lowest first"),
]


class NoulCriteria(Closed):
    """What "true" (yes) and "false" (no) mean, either or both."""

    true: Description = None
    false: Description = None


class CyclicDebias(Closed):
    """Cyclic debiasing over ``rotations`` evenly spread shifts (all of them up to 8
    options when absent)."""

    method: Literal["cyclic"]
    rotations: Annotated[int, Field(ge=1)] | None = None


Debias = Literal["cyclic", "pride", "contextual"] | CyclicDebias

# llama-server's rule for a chat message, as JSON Schema: content, or tool calls in an
# assistant message
CONTENT_OR_CALLS: dict[str, JsonValue] = {
    "anyOf": [
        {"required": ["content"]},
        {"required": ["tool_calls"], "properties": {"role": {"const": "assistant"}}},
    ]
}

Probability = Annotated[float, Field(ge=0, le=1)]
Count = Annotated[int, Field(ge=0)]
# echoed in answers (decision/prompt.py's LAYOUTS and PROMPT_FORMAT_VERSIONS; a unit test
# holds these to them)
Layout = Literal["conversation_first", "options_first"]
PromptFormat = Literal["semif-1", "semif-3"]


# text that is not only white space (``refusal`` words its refusal "must not be empty")
NOT_BLANK = r"[^\s\x1c-\x1f]"  # Python's white space (str.isspace) included
NonBlank = Annotated[str, Field(pattern=NOT_BLANK)]


def _not_null(value: str | None) -> str | None:
    if value is None:
        raise PydanticCustomError("not_null", "must be a string; leave it out rather than null")
    return value


# a string that may be left out but is never null (llama-server's template refuses null);
# a default of None is not validated, so only an explicit null is refused
Absent = Annotated[str | SkipJsonSchema[None], AfterValidator(_not_null)]


def param_of(body: object, loc: tuple[str | int, ...], *, keep_last: bool) -> str:
    """The dotted path of the steps of pydantic's ``loc`` found in ``body``: union tags
    are skipped; the last step (a missing field) is kept when asked."""
    parts: list[str] = []
    here = body
    for i, step in enumerate(loc):
        if isinstance(here, dict) and isinstance(step, str) and step in here:
            here = here[step]
        elif isinstance(here, list) and isinstance(step, int) and 0 <= step < len(here):
            here = here[step]
        elif not (keep_last and i == len(loc) - 1):
            continue
        parts.append(str(step))
    return ".".join(parts)


def refusal(exc: ValidationError, body: object) -> tuple[str, str]:
    """The field a model's first error names (``param_of``) and its message."""
    first = exc.errors()[0]
    message = first["msg"]
    if first["type"] == "string_pattern_mismatch" and first.get("ctx", {}).get("pattern") == (
        NOT_BLANK
    ):
        message = "must not be empty"
    return param_of(body, first["loc"], keep_last=first["type"] == "missing"), message


class TextPart(Open):
    """A chat message's text content part (OpenAI's shape)."""

    type: Literal["text"]
    text: str


class Function(Open):
    name: str
    arguments: str


class ToolCall(Open):
    """A tool call an assistant message carries (OpenAI's shape)."""

    type: Literal["function"]
    id: Absent = None
    function: Function
