"""POST /v1/systemone: the System One API answered by reading labels from any chat model.

A model that is itself a decision model (llama-server lists ``decisions`` in
its ``output_modalities``) gets the request forwarded untouched instead.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..app_keys import KIND, MODELS, SETTINGS, UPSTREAM
from ..errors import InvalidRequest, Unprocessable
from ..profiles import calibrate, debias_for
from ..protocol.systemone import DEFAULT_MODEL, SystemOneCall, parse_request, response_body
from ..served import UnknownModel
from ..service import DecisionService
from ..upstream import ModelInfo
from .common import check_depth, json_object, json_response, relay, routed, select_profile

__all__ = ["served_here", "system_one", "system_one_answer", "system_one_service"]


async def system_one(request: web.Request) -> web.StreamResponse:
    request[KIND] = "decision"
    raw = await request.read()
    try:
        body = json_object(raw)
    except InvalidRequest as err:
        raise Unprocessable([{"loc": ["body"], "msg": err.message, "type": "json_invalid"}]) from err
    check_depth(body, raw)
    call = parse_request(body)  # validated before llama-server is asked anything
    service = await system_one_service(request.app, call)
    if not served_here(await service.model()):
        return await relay(request, request.app[UPSTREAM], routed(raw, body, service),
                           "/v1/systemone")
    return json_response(await system_one_answer(request.app, call, service))


async def system_one_service(app: web.Application, call: SystemOneCall) -> DecisionService:
    """The service of the model the request names (jev-latest or none: the default)."""
    try:
        return await app[MODELS].service(call.model)
    except UnknownModel as exc:
        raise Unprocessable([{"loc": ["body", "model"], "msg": exc.message(),
                              "type": "value_error"}]) from exc


def served_here(info: ModelInfo | None) -> bool:
    """Whether System One requests are answered by reading labels (not relayed):
    known once the served model is, and true unless it is a decision model."""
    return info is not None and "decisions" not in info.output_modalities


async def system_one_answer(
    app: web.Application, call: SystemOneCall, service: DecisionService
) -> dict[str, Any]:
    """The System One answer to a validated request, read from ``service``'s chat model."""
    limit = app[SETTINGS].max_state_chars
    if len(call.state_text) > limit:
        raise Unprocessable([{"loc": ["body", "state"], "type": "string_too_long",
                              "msg": f"the state is {len(call.state_text)} characters; "
                                     f"the limit is {limit}"}])
    profile = await select_profile(app, service, call.calibration, "x_calibration")
    plans = {qid: debias_for(profile, q, call.debias_method, call.debias.get(qid, ()),
                             param="x_debias")
             for qid, q in call.questions.items()}
    outcomes = await service.decide_many(
        call.state_text, call.questions,
        debias={qid: plan.shifts for qid, plan in plans.items() if plan.shifts},
        contextual=frozenset(qid for qid, plan in plans.items() if plan.method == "contextual"))
    calibrated = {qid: calibrate(profile, outcome, plans[qid], call.label_mass_floor)
                  for qid, outcome in outcomes.items()}
    return response_body(call.model or DEFAULT_MODEL, calibrated)
