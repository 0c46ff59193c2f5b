"""A question the model answers by picking one labelled option.

The builders validate what a caller declared and raise ``QuestionError`` with
the location of the offending field (relative to the question object), so
each API can render it in its own shape (OpenAI ``param``, System One ``loc``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Kind",
    "Question",
    "QuestionError",
    "MIN_OPTIONS",
    "MAX_OPTIONS",
    "MIN_LEVELS",
    "MAX_LEVELS",
    "NOUL_NAMES",
    "choice_question",
    "score_question",
    "noul_question",
    "check_temperature",
    "as_text",
]

Kind = Literal["choice", "noul", "score"]
MIN_OPTIONS = 2
MAX_OPTIONS = 255
MIN_LEVELS = 2
MAX_LEVELS = 10
NOUL_NAMES = ("true", "false")
_NOUL_SHOWN = {"true": "yes", "false": "no"}


class QuestionError(ValueError):
    def __init__(self, message: str, loc: tuple[str | int, ...]):
        super().__init__(message)
        self.message = message
        self.loc = loc


@dataclass(frozen=True)
class Question:
    """``names`` key the probabilities; ``shown`` is what the prompt lists for each;
    ``legend`` (score only) holds the caller's level values, echoed unchanged."""

    kind: Kind
    names: tuple[str, ...]
    shown: tuple[str, ...]
    instructions: str | None = None
    temperature: float = 1.0
    legend: tuple[Any, ...] | None = None


def as_text(value: object) -> str:
    """A description or level as prompt text: strings as they are, objects and arrays as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _is_description(value: object) -> bool:
    return value is None or isinstance(value, (str, dict, list))


def check_temperature(value: object, loc: tuple[str | int, ...]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise QuestionError("temperature must be a number", loc)
    if not math.isfinite(value) or value <= 0:
        raise QuestionError("temperature must be a positive finite number", loc)
    return float(value)


def choice_question(
    options: object,
    *,
    loc: tuple[str | int, ...] = ("options",),
    instructions: str | None = None,
    temperature: float = 1.0,
) -> Question:
    """Options are a list of names or a mapping of name -> description (or null)."""
    names, descriptions = _names_and_descriptions(options, loc)
    if len(names) < MIN_OPTIONS:
        raise QuestionError(f"a choice needs at least {MIN_OPTIONS} options, got {len(names)}", loc)
    if len(names) > MAX_OPTIONS:
        raise QuestionError(f"a choice takes at most {MAX_OPTIONS} options, got {len(names)}", loc)
    _check_distinct(names, loc)
    shown = tuple(_with_description(n.strip(), d) for n, d in zip(names, descriptions))
    return Question("choice", tuple(names), shown, instructions, temperature)


def score_question(
    levels: object,
    *,
    loc: tuple[str | int, ...] = ("options",),
    instructions: str | None = None,
    temperature: float = 1.0,
) -> Question:
    """Levels are an ordered list of descriptions, lowest first; names are "0".."n-1"."""
    if not isinstance(levels, Sequence) or isinstance(levels, (str, bytes)):
        raise QuestionError("score levels must be a list, lowest first", loc)
    if not MIN_LEVELS <= len(levels) <= MAX_LEVELS:
        raise QuestionError(
            f"a score needs {MIN_LEVELS} to {MAX_LEVELS} levels, got {len(levels)}", loc
        )
    for i, level in enumerate(levels):
        if level is None or not _is_description(level) or not as_text(level).strip():
            raise QuestionError("each level must be a non-empty string, object or array", (*loc, i))
    names = tuple(str(i) for i in range(len(levels)))
    shown = tuple(as_text(level) for level in levels)
    return Question("score", names, shown, instructions, temperature, tuple(levels))


def noul_question(
    criteria: object,
    *,
    loc: tuple[str | int, ...] = ("options",),
    instructions: str | None = None,
    temperature: float = 1.0,
) -> Question:
    """Yes/no; criteria may be absent or map "true"/"false" to descriptions."""
    if criteria is None:
        criteria = {}
    if not isinstance(criteria, Mapping):
        raise QuestionError('noul criteria must be an object with "true" and/or "false"', loc)
    for key, desc in criteria.items():
        if key not in NOUL_NAMES:
            raise QuestionError(f'noul criteria take only "true" and "false", not {key!r}', loc)
        if not _is_description(desc):
            raise QuestionError(
                "a description must be a string, object, array or null", (*loc, key)
            )
    shown = tuple(_with_description(_NOUL_SHOWN[n], criteria.get(n)) for n in NOUL_NAMES)
    return Question("noul", NOUL_NAMES, shown, instructions, temperature)


def _names_and_descriptions(
    options: object, loc: tuple[str | int, ...]
) -> tuple[list[str], list[str | None]]:
    if options is None:
        raise QuestionError("options are required", loc)
    if isinstance(options, Mapping):
        names = list(options.keys())
        descriptions = list(options.values())
        for name, desc in options.items():
            if not _is_description(desc):
                raise QuestionError(
                    "a description must be a string, object, array or null", (*loc, name)
                )
    elif isinstance(options, Sequence) and not isinstance(options, (str, bytes)):
        names, descriptions = list(options), [None] * len(options)
    else:
        raise QuestionError(
            "options must be a list of names or an object of name: description", loc
        )
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise QuestionError("option names must be strings", (*loc, i))
        if not name.strip():
            raise QuestionError("option names must not be empty", (*loc, i))
    return names, descriptions


def _check_distinct(names: Sequence[str], loc: tuple[str | int, ...]) -> None:
    seen: dict[str, str] = {}
    for name in names:
        key = name.strip().casefold()
        if key in seen:
            raise QuestionError(
                f"options {seen[key]!r} and {name!r} are the same after trimming and case-folding",
                loc,
            )
        seen[key] = name


def _with_description(name: str, description: object) -> str:
    text = as_text(description).strip() if description is not None else ""
    return f"{name} - {text}" if text else name
