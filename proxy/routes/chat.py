"""POST /v1/chat/completions: decisions for requests with ``semif``, relay for the rest."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..app_keys import KIND, MODELS, SETTINGS, UPSTREAM
from ..decision.outcome import Outcome
from ..errors import InvalidRequest
from ..protocol.chat import completion_body, completion_chunks
from ..protocol.relayed import relayed_body
from ..protocol.semif import ChatDecision, parse_chat
from ..recorder import Context, Decided
from ..served import UnknownModel
from ..service import Asked
from .common import (
    check_depth,
    context_of,
    json_object,
    json_response,
    recorded,
    relay,
    relayed_work,
    request_header,
)

__all__ = ["chat_completions", "chat_reply", "chat_record"]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    return await chat_reply(request, json_object(raw), raw)


async def chat_reply(request: web.Request, body: dict[str, Any], raw: bytes) -> web.StreamResponse:
    """The answer to a parsed chat body: a decision when it has ``semif``, else relayed."""
    if body.get("semif") is None:  # checked and bounded here: a 400, not llama-server's 500
        path = "/v1/chat/completions"
        data = relayed_body(path, body, raw, request.app[SETTINGS].relay_max_tokens)
        return await relay(
            request, request.app[UPSTREAM], data, path, relayed_work(request.app, path, body, data)
        )
    request[KIND] = "decision"
    context = context_of(request, "chat", question_ids=False)
    chat, outcome, decided = await _decision(request.app, body, raw, context)
    decision_id, record = _one(decided)
    model, top = chat.model, chat.top_logprobs
    if not chat.request.stream:
        return json_response(
            completion_body(outcome, model, top, decision_id, record),
            headers=request_header(context),
        )
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **request_header(context),
        }
    )
    await response.prepare(request)
    chunks = completion_chunks(outcome, model, top, chat.include_usage, decision_id, record)
    for chunk in chunks:
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def chat_record(
    app: web.Application, body: dict[str, Any], raw: bytes, context: Context
) -> dict[str, Any]:
    """The whole answer to a chat decision body (no stream), as one JSON object."""
    chat, outcome, decided = await _decision(app, body, raw, context)
    return completion_body(outcome, chat.model, chat.top_logprobs, *_one(decided))


def _one(decided: Decided) -> tuple[str, dict[str, Any] | None]:
    """A chat decision's id and record (None unless answers carry records)."""
    return decided.ids["0"], decided.records["0"] if decided.records is not None else None


async def _decision(
    app: web.Application, body: dict[str, Any], raw: bytes, context: Context
) -> tuple[ChatDecision, Outcome, Decided]:
    """The decision a chat body with ``semif`` asks for: the body as its model read it,
    the outcome, and its id and record."""
    check_depth(body, raw)
    chat = parse_chat(body)
    call, model = chat.call, chat.model
    try:  # one model: any name, as llama-server allows; a router: one of its models
        service = await app[MODELS].service(model, strict=False)
    except UnknownModel as exc:
        raise InvalidRequest(exc.message(), param="model", code="model_not_found") from exc
    asked = Asked(
        body["messages"],  # validated; sent to the chat template as the client wrote them
        {"0": call.question},
        chat.request.chat_template_kwargs,
        call.layout,
        calibration=call.calibration,
        calibration_param="semif.calibration",
        debias_method=call.debias_method,
        debias={"0": call.debias},
        debias_param="semif.debias",
        label_mass_floor=call.label_mass_floor,
        deadline=context.deadline,
    )
    answered = await service.answer(asked, context.facts)
    decided = recorded(app, context, asked, answered, service)
    return chat, answered["0"], decided
