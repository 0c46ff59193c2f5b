"""A decision's answer in System One form (``decision/readout.py``'s ``system_one_answer``),
the core that ``/v1/systemone`` answers and chat's ``semif`` extends, the facts of
a calibrated read the two share (the decision record answers carry: ``records.py``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue

from .wire import Open, Probability

__all__ = [
    "ChoiceAnswer",
    "ScoreAnswer",
    "NoulAnswer",
    "Calibrated",
]


class Calibrated(Open):
    """The calibration profile applied and its method for this kind of question."""

    profile: str
    method: str


class ChoiceAnswer(Open):
    type: Literal["choice"]
    choice: str = Field(description="the most likely option")
    probabilities: dict[str, Probability] = Field(description="by option, summing to 1")
    confidence: Probability = Field(description="0 when uniform, 1 when certain")


class ScoreAnswer(Open):
    type: Literal["score"]
    score: Annotated[float, Field(ge=0)] = Field(description="the expected level, 0 lowest")
    legend: dict[str, str | dict[str, JsonValue] | list[JsonValue]] = Field(
        description="each level's number (as text) -> the level as the request gave it"
    )
    probabilities: dict[str, Probability] = Field(description="by level number, summing to 1")
    confidence: Probability


class NoulAnswer(Open):
    type: Literal["noul"]
    noul: Probability = Field(description="the probability of yes")
