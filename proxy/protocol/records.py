"""The decision record ``semif.decision/1`` (docs/records.md): the one model that the proxy
writes (``proxy/recorder.py``, with ``model_construct``: its values are the proxy's own), that
answers carry with ``--decision-records answer``, that the OpenAPI document shows, and that
the offline tools read back (``semif_tools/record_files.py``, ``semif_tools/capture.py``, with
``model_validate``).

``dump`` is the record's one serialisation: its fields in the model's order, ``input`` only
when it was given (``--decision-records-inputs``); the writer and the answers turn that into
JSON with orjson, as before the model was the writer's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue

from .wire import Count, Layout, Open, Probability

__all__ = [
    "RECORD",
    "Route",
    "RouteReason",
    "DebiasMethod",
    "RecordedApi",
    "RecordedQuestion",
    "DecisionInput",
    "DecisionRecord",
]

RECORD = "semif.decision/1"  # the record's format, its "record" field
Route = Literal["auto", "review"]
# calibration/profile.py's ROUTE_REASONS (a unit test holds them equal)
RouteReason = Literal["label_mass", "no_threshold", "below_threshold", "above_threshold"]
DebiasMethod = Literal["cyclic", "pride", "contextual"]
RecordedApi = Literal["chat", "system_one", "decisions", "rerank", "invocations"]


class RecordedQuestion(Open):
    type: Literal["choice", "score", "noul"]
    instructions: str | None
    options: list[str] = Field(description="as the prompt lists them")


class DecisionInput(Open):
    """Only with --decision-records-inputs: the conversation (chat), or the state and
    the question (System One, Decisions, rerank)."""

    messages: list[JsonValue] | None = None
    state: str | None = None
    question: RecordedQuestion | None = None


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
    # Read back from files an older proxy may have written: the wording versions and the
    # reasons are open strings here (what this proxy writes: PromptFormat, RouteReason).
    prompt_format_version: str = Field(description="the prompt wording's version (semif-1, ...)")
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
    route_reason: str | None = Field(
        description="why the route: label_mass, no_threshold, below_threshold or above_threshold"
    )
    debias: DebiasMethod | None
    repeatable: bool | None
    latency_ms: Annotated[float, Field(ge=0)]
    input: DecisionInput | None = None

    def dump(self) -> dict[str, Any]:
        """The record as the JSON object written: every field in order, ``input`` only
        when set."""
        return self.model_dump(exclude_unset=True)
