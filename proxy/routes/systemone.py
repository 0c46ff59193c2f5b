"""POST /v1/systemone: the System One API answered by reading labels from any chat model.

A model that is itself a decision model (llama-server lists ``decisions`` in
its ``output_modalities``) gets the request forwarded untouched instead.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web

from ..app_keys import FACT_SHEET, KIND, MODELS, SETTINGS, UPSTREAM
from ..errors import InvalidRequest, Unprocessable
from ..protocol.systemone import DEFAULT_MODEL, SystemOneCall, parse_request, response_body
from ..recorder import Context
from ..served import UnknownModel
from ..service import Asked, DecisionService
from ..upstream import ModelInfo
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

__all__ = ["served_here", "system_one", "system_one_reply", "system_one_record"]


async def system_one(request: web.Request) -> web.StreamResponse:
    request[KIND] = "decision"
    raw = await request.read()
    try:
        body = json_object(raw)
    except InvalidRequest as err:
        raise Unprocessable(
            [{"loc": ["body"], "msg": err.message, "type": "json_invalid"}]
        ) from err
    return await system_one_reply(request, body, raw)


async def system_one_reply(
    request: web.Request, body: dict[str, Any], raw: bytes
) -> web.StreamResponse:
    """The answer to a parsed System One body: read here, or relayed to a native
    decision model."""
    request[KIND] = "decision"
    call, service = await _prepared(request.app, body, raw)
    if not served_here(await service.discovery.model(request[FACT_SHEET])):
        return await relay(
            request, request.app[UPSTREAM], routed(raw, body, service), "/v1/systemone"
        )
    context = context_of(request, "system_one")
    return json_response(
        await _answer(request.app, call, service, context), headers=request_header(context)
    )


async def system_one_record(
    app: web.Application, body: dict[str, Any], raw: bytes, context: Context
) -> dict[str, Any]:
    """The answer to a System One body as one JSON object (a jsonlines line): a native
    decision model is not asked line by line."""
    call, service = await _prepared(app, body, raw)
    if not served_here(await service.discovery.model(context.facts)):
        raise InvalidRequest(
            "llama-server serves a native decision model: send System "
            "One requests to it one at a time",
            code="native_model",
        )
    return await _answer(app, call, service, context)


def served_here(info: ModelInfo | None) -> bool:
    """Whether System One requests are answered by reading labels (not relayed):
    known once the served model is, and true unless it is a decision model."""
    return info is not None and "decisions" not in info.output_modalities


async def _prepared(
    app: web.Application, body: dict[str, Any], raw: bytes
) -> tuple[SystemOneCall, DecisionService]:
    """The validated request (before llama-server is asked anything) and the service of
    the model it names (jev-latest or none: the default)."""
    check_depth(body, raw)
    call = parse_request(body)
    try:
        return call, await app[MODELS].service(call.model)
    except UnknownModel as exc:
        raise Unprocessable(
            [{"loc": ["body", "model"], "msg": exc.message(), "type": "value_error"}]
        ) from exc


async def _answer(
    app: web.Application, call: SystemOneCall, service: DecisionService, context: Context
) -> dict[str, Any]:
    """The System One answer to a validated request, read from ``service``'s chat model."""
    limit = app[SETTINGS].max_state_chars
    if len(call.state_text) > limit:
        raise Unprocessable(
            [
                {
                    "loc": ["body", "state"],
                    "type": "string_too_long",
                    "msg": f"the state is {len(call.state_text)} characters; the limit is {limit}",
                }
            ]
        )
    asked = Asked.about_state(
        call.state_text,
        call.questions,
        calibration=call.calibration,
        debias_method=call.debias_method,
        debias=call.debias,
        label_mass_floor=call.label_mass_floor,
        deadline=context.deadline,
    )
    outcomes = await service.answer(asked, context.facts)
    decided = recorded(app, replace(context, state=call.state_text), asked, outcomes, service)
    return response_body(call.model or DEFAULT_MODEL, outcomes, decided.ids, decided.records)
