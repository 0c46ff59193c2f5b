"""POST /v1/decisions: the OpenAI Decisions API answered by reading labels from any chat model."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web

from ..app_keys import KIND, MODELS, SETTINGS
from ..errors import InvalidRequest
from ..protocol.decisions import parse_request, response_body
from ..recorder import Context
from ..served import UnknownModel
from ..service import Asked
from .common import check_depth, context_of, json_object, json_response, recorded, request_header

__all__ = ["decisions", "decisions_reply", "decisions_record"]


async def decisions(request: web.Request) -> web.Response:
    request[KIND] = "decision"
    raw = await request.read()
    return await decisions_reply(request, json_object(raw), raw)


async def decisions_reply(request: web.Request, body: dict[str, Any], raw: bytes) -> web.Response:
    """The answer to a parsed Decisions body."""
    request[KIND] = "decision"
    context = context_of(request, "decisions")
    return json_response(
        await decisions_record(request.app, body, raw, context), headers=request_header(context)
    )


async def decisions_record(
    app: web.Application, body: dict[str, Any], raw: bytes, context: Context
) -> dict[str, Any]:
    """The answer to a Decisions body as one JSON object (also a jsonlines line's)."""
    check_depth(body, raw)
    call = parse_request(body)
    limit = app[SETTINGS].max_state_chars
    if len(call.state_text) > limit:
        raise InvalidRequest(
            f"the input is {len(call.state_text)} characters; the limit is {limit}",
            param="input",
            code="input_too_long",
        )
    try:
        service = await app[MODELS].service(call.model)
    except UnknownModel as exc:
        raise InvalidRequest(exc.message(), param="model", code="model_not_found") from exc
    # no calibration: the Decisions API has no field to name a profile
    asked = Asked.about_state(
        call.state_text, call.questions, default_profile=False, deadline=context.deadline
    )
    outcomes = await service.answer(asked, context.facts)
    decided = recorded(app, replace(context, state=call.state_text), asked, outcomes, service)
    return response_body(call, outcomes, decided.ids, decided.records)
