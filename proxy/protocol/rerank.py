"""The rerank API on any chat model: ``POST /v1/rerank`` (and ``/rerank``, ``/reranking``,
``/v1/reranking``, which llama-server accepts too; ``/v2/rerank``, Cohere's), in the shape
Jina, Cohere and llama-server answer it:

    {"model": ..., "query": "...", "documents": ["..." | {"text": "..."}], "top_n": 3,
     "return_documents": false, "x_method": "pointwise" | "listwise", "x_calibration": ...}
    ->
    {"id", "model", "object": "list",
     "results": [{"index", "relevance_score"[, "document": {"text"}]}],   best first
     "usage": {"prompt_tokens", "total_tokens"}, "meta": {...},
     "x_method", "x_evaluated_tokens", "x_prompt_format_version"}

Pointwise (the default): each document's relevance is P(yes) of its own yes/no question
about the query, read as every decision is; the query comes first, so llama-server
computes it once and each document costs its own tokens. Listwise: one choice over all
documents, one read, scores that sum to 1 (which document is best). ``parse_request``
validates a body with ``RerankRequest`` and raises ``InvalidRequest`` whose ``param``
names the field.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, SerializeAsAny, Tag, ValidationError

from ..decision.outcome import Outcome
from ..decision.prompt import (
    LISTWISE_INSTRUCTION,
    POINTWISE_INSTRUCTION,
    PROMPT_FORMAT_VERSION,
    RERANK_QUERY,
)
from ..decision.question import MAX_OPTIONS, Question, choice_question, noul_question
from ..errors import InvalidRequest
from .answers import Calibrated
from .records import DecisionRecord
from .wire import Count, NonBlank, Open, Probability, refusal

__all__ = [
    "METHODS",
    "LISTWISE_MAX",
    "RerankRequest",
    "RerankResponse",
    "RelayedRerank",
    "RerankCall",
    "parse_request",
    "pointwise_questions",
    "listwise_question",
    "relevance",
    "response_body",
]

METHODS = ("pointwise", "listwise")
LISTWISE_MAX = MAX_OPTIONS  # one label per document
Method = Literal["pointwise", "listwise"]


class _TextDocument(Open):
    text: str


def _text_or_object(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "object" if isinstance(value, dict) else None


# a document: a string, or an object with a string text; only that branch reports errors
_Document = Annotated[
    Annotated[str, Tag("text")] | Annotated[_TextDocument, Tag("object")],
    Discriminator(
        _text_or_object,
        custom_error_type="document",
        custom_error_message="must be a string or an object with a string text",
    ),
]


class RerankRequest(Open):
    """The wire format ``parse_request`` validates with this model; the limits the server's
    settings choose (documents, characters) and the rules across fields (listwise's
    document count, no calibration for listwise) are checked after it."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    query: NonBlank
    documents: list[_Document] = Field(min_length=1)
    top_n: Annotated[int, Field(ge=1)] | None = Field(None, description="all of them when absent")
    return_documents: bool = False
    model: str | None = None
    x_method: Method = Field(
        "pointwise",
        description=(
            "pointwise: P(yes) of a yes/no question per document, the query read once; "
            f"listwise: one choice over all documents (2 to {LISTWISE_MAX}), scores summing to 1"
        ),
    )
    x_calibration: str | None = Field(None, description="a profile for pointwise scores")


class _Ranked(Open):
    index: Count = Field(description="the document's position in the request")
    relevance_score: Probability
    document: _TextDocument | None = None  # with return_documents
    x_decision_id: str | None = Field(
        None,
        description="the id of the decision that scored it (docs/records.md): the "
        "document's own (pointwise) or the one choice's (listwise)",
    )


class _RerankUsage(Open):
    prompt_tokens: Count
    total_tokens: Count


class _Version(Open):
    version: str


class _Billed(Open):
    search_units: Count


class _CohereMeta(Open):  # Cohere's
    api_version: _Version
    billed_units: _Billed


class RerankResponse(Open):
    """The documents' scores, best first (the caller's order among equals), ``top_n``."""

    id: str
    model: str
    object: Literal["list"]
    results: list[_Ranked]
    usage: _RerankUsage
    meta: _CohereMeta
    x_method: Method
    x_evaluated_tokens: Count = Field(
        description="what llama-server computed; the rest came from its cache"
    )
    x_prompt_format_version: Literal["semif-1"]
    x_calibration: Calibrated | None = None
    # the records as ``DecisionRecord.dump`` gave them (dicts): written as they are
    x_records: list[SerializeAsAny[DecisionRecord]] | None = Field(
        None,
        description="with --decision-records answer: every decision's record, in the "
        "documents' order (pointwise; those top_n leaves out too) or the one (listwise)",
    )


class _Scored(Open):
    index: Count
    relevance_score: float = Field(description="the reranker model's raw score")


class RelayedRerank(Open):
    """A reranker model's own answer (llama-server started with --reranking)."""

    model: str
    object: Literal["list"]
    results: list[_Scored]
    usage: _RerankUsage


@dataclass(frozen=True)
class RerankCall:
    model: str | None
    query: str
    documents: tuple[str, ...]
    top_n: int  # results returned, best first
    return_documents: bool
    method: str
    calibration: str | None  # a profile's name (pointwise scores only)


def parse_request(
    body: Mapping[str, Any], *, max_documents: int, max_document_chars: int
) -> RerankCall:
    """``body`` validated by ``RerankRequest``, then the settings' limits and the rules
    across fields; a refusal is an ``InvalidRequest`` whose ``param`` names the field."""
    try:
        request = RerankRequest.model_validate(body)
    except ValidationError as exc:
        param, message = refusal(exc, body)
        raise InvalidRequest(f"{param}: {message}", param=param or None) from exc
    query = request.query
    if len(query) > max_document_chars:
        raise InvalidRequest(
            f"the query is {len(query)} characters; the limit is {max_document_chars}",
            param="query",
            code="query_too_long",
        )
    if len(request.documents) > max_documents:
        raise InvalidRequest(
            f"{len(request.documents)} documents; the limit is {max_documents} "
            "(PROXY_RERANK_MAX_DOCUMENTS)",
            param="documents",
            code="too_many_documents",
        )
    documents = tuple(_document(d, i, max_document_chars) for i, d in enumerate(request.documents))
    method = request.x_method
    if method == "listwise" and len(documents) > LISTWISE_MAX:
        raise InvalidRequest(
            f"listwise reads at most {LISTWISE_MAX} documents, got {len(documents)}",
            param="documents",
            code="too_many_documents",
        )
    if method == "listwise" and len(documents) < 2:
        raise InvalidRequest("listwise ranks at least 2 documents", param="documents")
    top_n = len(documents) if request.top_n is None else min(request.top_n, len(documents))
    if request.x_calibration is not None and method == "listwise":
        raise InvalidRequest(
            "calibration profiles fit pointwise scores; listwise scores are a "
            "distribution over the documents",
            param="x_calibration",
        )
    return RerankCall(
        request.model,
        query,
        documents,
        top_n,
        request.return_documents,
        method,
        request.x_calibration,
    )


def _document(value: str | _TextDocument, i: int, limit: int) -> str:
    text = value if isinstance(value, str) else value.text
    if len(text) > limit:
        raise InvalidRequest(
            f"document {i} is {len(text)} characters; the limit is {limit} "
            "(PROXY_RERANK_MAX_DOCUMENT_CHARS)",
            param=f"documents.{i}",
            code="document_too_long",
        )
    return text


def query_state(call: RerankCall) -> str:
    """The state every document's question is asked about: the query, laid out first."""
    return f"{RERANK_QUERY}\n{call.query}"


def pointwise_questions(call: RerankCall) -> dict[str, Question]:
    """One yes/no question per document, the document inside it (after the query)."""
    return {
        str(i): noul_question(None, instructions=POINTWISE_INSTRUCTION.format(document=d))
        for i, d in enumerate(call.documents)
    }


def listwise_question(call: RerankCall) -> Question:
    """One choice over every document, in the caller's order."""
    return choice_question(
        {f"Document {i + 1}": d for i, d in enumerate(call.documents)},
        loc=("documents",),
        instructions=LISTWISE_INSTRUCTION,
    )


def relevance(call: RerankCall, outcomes: Mapping[str, Outcome]) -> list[float]:
    """Each document's score: P(yes) of its question (pointwise), or its share of the one
    choice (listwise, summing to 1)."""
    if call.method == "listwise":
        return list(outcomes["0"].decision.probabilities)
    # noul's options are (true, false): the first is "yes"
    return [outcomes[str(i)].decision.probabilities[0] for i in range(len(call.documents))]


def response_body(
    call: RerankCall,
    scores: Sequence[float],
    outcomes: Mapping[str, Outcome],
    model: str,
    ids: Mapping[str, str] | None = None,
    records: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ranked answer (a ``RerankResponse``, dumped): best first (the caller's order
    among equals), ``top_n`` of them.
    ``ids`` (by question id, proxy/recorder.py): each result's ``x_decision_id``;
    ``records``: every one in ``x_records``."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: call.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if call.return_documents:
            result["document"] = _TextDocument.model_construct(text=call.documents[i])
        if ids is not None:
            result["x_decision_id"] = ids["0" if call.method == "listwise" else str(i)]
        results.append(_Ranked.model_construct(**result))
    prompt = sum(o.tokens_in for o in outcomes.values())
    evaluated = sum(o.prompt_evaluated for o in outcomes.values())
    body: dict[str, Any] = {}
    calibrated = next((o.calibration for o in outcomes.values() if o.calibration), None)
    if calibrated:
        body["x_calibration"] = Calibrated.model_construct(None, **calibrated)
    if records is not None:
        body["x_records"] = list(records.values())
    return RerankResponse.model_construct(
        id=uuid.uuid4().hex,
        model=model,
        object="list",
        results=results,
        usage=_RerankUsage.model_construct(prompt_tokens=prompt, total_tokens=prompt),
        meta=_COHERE_META,
        x_method=call.method,
        x_evaluated_tokens=evaluated,  # what llama-server computed; the rest was cached
        x_prompt_format_version=PROMPT_FORMAT_VERSION,
        **body,
    ).model_dump(exclude_unset=True)


# Cohere's meta, the same in every answer
_COHERE_META = _CohereMeta.model_construct(
    api_version=_Version.model_construct(version="2"),
    billed_units=_Billed.model_construct(search_units=1),
)
