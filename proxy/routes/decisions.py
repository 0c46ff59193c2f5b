"""POST /v1/decisions: the OpenAI Decisions API answered by reading labels from any chat model."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..app_keys import KIND, MODELS, SETTINGS
from ..errors import InvalidRequest
from ..protocol.decisions import parse_request, response_body
from .common import check_depth, json_object, json_response
from ..served import UnknownModel

__all__ = ["decisions", "decisions_answer"]


async def decisions(request: web.Request) -> web.Response:
    request[KIND] = "decision"
    raw = await request.read()
    return json_response(await decisions_answer(request.app, json_object(raw), raw))


async def decisions_answer(app: web.Application, body: dict[str, Any], raw: bytes
                           ) -> dict[str, Any]:
    check_depth(body, raw)
    call = parse_request(body)
    limit = app[SETTINGS].max_state_chars
    if len(call.state_text) > limit:
        raise InvalidRequest(f"the input is {len(call.state_text)} characters; the limit is {limit}",
                             param="input", code="input_too_long")
    try:
        service = await app[MODELS].service(call.model)
    except UnknownModel as exc:
        raise InvalidRequest(exc.message(), param="model", code="model_not_found") from exc
    outcomes = await service.decide_many(call.state_text, call.questions)
    return response_body(call, outcomes)
