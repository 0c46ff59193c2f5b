"""POST /v1/rerank (and /rerank, /reranking, /v1/reranking, /v2/rerank): candidates
ranked by a chat model's decisions (protocol/rerank.py).

A llama-server that serves a real reranker model (started with ``--reranking``; it
answers rerank itself and cannot chat) gets the request forwarded untouched, as
``/v1/systemone`` is forwarded to a native decision model; the proxy asks once.
"""

from __future__ import annotations

import time

from aiohttp import web

from ..app_keys import KIND, METRICS, MODELS, SETTINGS, UPSTREAM
from ..errors import InvalidRequest
from ..protocol.rerank import (
    listwise_question,
    parse_request,
    pointwise_questions,
    query_state,
    relevance,
    response_body,
)
from ..served import UnknownModel
from ..service import Asked
from .common import (
    check_depth,
    context_of,
    json_object,
    json_response,
    recorded,
    relay,
    request_header,
    routed,
)

__all__ = ["rerank"]


async def rerank(request: web.Request) -> web.StreamResponse:
    request[KIND] = "decision"
    app = request.app
    raw = await request.read()
    body = json_object(raw)
    check_depth(body, raw)
    model = body.get("model") if isinstance(body.get("model"), str) else None
    try:
        service = await app[MODELS].service(model, strict=False)
    except UnknownModel as exc:
        raise InvalidRequest(exc.message(), param="model", code="model_not_found") from exc
    if await service.discovery.reranks():  # a reranker: its own answer, whatever the body says
        path = "/v1/rerank" if request.path == "/v2/rerank" else request.path
        return await relay(request, app[UPSTREAM], routed(raw, body, service), path)
    settings = app[SETTINGS]
    call = parse_request(
        body,
        max_documents=settings.rerank_max_documents,
        max_document_chars=settings.rerank_max_document_chars,
    )
    started = time.monotonic()
    context = context_of(
        request, "rerank", state=query_state(call), question_ids=call.method != "listwise"
    )
    if call.method == "listwise":
        asked = Asked.about_state(
            query_state(call),
            {"0": listwise_question(call)},
            default_profile=False,
            deadline=context.deadline,
        )
    else:
        # only a profile the request names (a default one was fitted on other prompts),
        # applied without its debiasing
        asked = Asked.about_state(
            query_state(call),
            pointwise_questions(call),
            calibration=call.calibration,
            default_profile=False,
            profile_debias=False,
            deadline=context.deadline,
        )
    outcomes = await service.answer(asked, context.facts)
    metrics = app[METRICS]
    metrics.rerank_documents.labels(call.method).observe(len(call.documents))
    metrics.rerank_seconds.labels(call.method).observe(
        (time.monotonic() - started) / len(call.documents)
    )
    decided = recorded(app, context, asked, outcomes, service)
    answered = next(iter(outcomes.values())).model
    return json_response(
        response_body(
            call,
            relevance(call, outcomes),
            outcomes,
            call.model or answered,
            decided.ids,
            decided.records,
        ),
        headers=request_header(context),
    )
