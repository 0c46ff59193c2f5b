"""A decision's answer in System One form (``decision/readout.py``'s ``system_one_answer``),
the core that ``/v1/systemone`` answers and chat's ``semif`` extends, the facts of
a calibrated read the two share, and the decision record (``proxy/records.py``) that
answers carry with ``--decision-records answer``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue

from .wire import Count, Layout, Open, Probability, PromptFormat

__all__ = [
    "ChoiceAnswer",
    "ScoreAnswer",
    "NoulAnswer",
    "Calibrated",
    "Route",
    "RouteReason",
    "DebiasMethod",
    "RecordedApi",
    "DecisionRecord",
]

Route = Literal["auto", "review"]
# calibration/profile.py's ROUTE_REASONS (a unit test holds them equal)
RouteReason = Literal["label_mass", "no_threshold", "below_threshold", "above_threshold"]
DebiasMethod = Literal["cyclic", "pride", "contextual"]
RecordedApi = Literal["chat", "system_one", "decisions", "rerank", "invocations"]


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


class _DecisionQuestion(Open):
    type: Literal["choice", "score", "noul"]
    instructions: str | None
    options: list[str] = Field(description="as the prompt lists them")


class _DecisionInput(Open):
    """Only with --decision-records-inputs: the conversation (chat), or the state and
    the question (System One, Decisions, rerank)."""

    messages: list[JsonValue] | None = None
    state: str | None = None
    question: _DecisionQuestion | None = None


class DecisionRecord(Open):
    """One decision as recorded (``semif.decision/1``, docs/records.md): what was decided,
    with what, and how it was routed."""

    record: Literal["semif.decision/1"]
    decision_id: str = Field(
        description="the request id, with /<question id> when the request holds several "
        "decisions (a jsonlines line: /<line> first)"
    )
    request_id: str
    question_id: str | None = Field(description="null where the API names no questions")
    time: str = Field(description="UTC, to the millisecond, when the answer was made")
    api: RecordedApi
    model: str
    llama_build: str | None
    prompt_format_version: PromptFormat
    layout: Layout
    read_scheme: str
    prompt_tokens: Count
    prompt_hash: Annotated[str, Field(pattern="^hmac-sha256:[0-9a-f]{64}$")] | None = Field(
        description="HMAC-SHA256 of the prompt's token ids under the operator's key; null "
        "for a read through llama-server's chat endpoint (images)"
    )
    question_type: Literal["choice", "score", "noul"]
    options: list[str] = Field(description="the option names in the request's order")
    raw_probabilities: list[Probability] = Field(
        description="after debiasing, before calibration; in the options' order"
    )
    probabilities: list[Probability] = Field(description="as served; in the options' order")
    choice: str = Field(description="the option served as most likely")
    confidence: Probability
    label_mass: Annotated[float, Field(ge=0)]
    profile: str | None
    calibration_method: str | None
    threshold: float | None
    route: Route | None
    route_reason: RouteReason | None
    debias: DebiasMethod | None
    repeatable: bool | None
    latency_ms: Annotated[float, Field(ge=0)]
    input: _DecisionInput | None = None
