"""POST /v1/systemone: the System One API answered by reading labels from any chat model.

A model that is itself a decision model (llama-server lists ``decisions`` in
its ``output_modalities``) gets the request forwarded untouched instead.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..app_keys import KIND, PROFILES, SERVICE, SETTINGS, UPSTREAM
from ..errors import InvalidRequest, Unprocessable
from ..profiles import calibrate, debias_for
from ..protocol.systemone import DEFAULT_MODEL, SystemOneCall, parse_request, response_body
from ..names import ModelNames, model_names, parse_aliases
from ..upstream import ModelInfo
from .common import check_depth, json_object, json_response, relay

__all__ = [
    "names_of", "served_here", "system_one", "system_one_answer",
]


def names_of(app: web.Application, info: ModelInfo) -> ModelNames:
    """What requests may call the served model (proxy/names.py)."""
    return model_names(info.id, info.aliases, info.path,
                       parse_aliases(app[SETTINGS].model_aliases))


async def system_one(request: web.Request) -> web.StreamResponse:
    request[KIND] = "decision"
    raw = await request.read()
    try:
        body = json_object(raw)
    except InvalidRequest as err:
        raise Unprocessable([{"loc": ["body"], "msg": err.message, "type": "json_invalid"}]) from err
    check_depth(body, raw)
    call = parse_request(body)  # validated before llama-server is asked anything
    info = await request.app[SERVICE].model()
    if not served_here(info):
        return await relay(request, request.app[UPSTREAM], raw, "/v1/systemone")
    return json_response(await system_one_answer(request.app, call, info))


def served_here(info: ModelInfo | None) -> bool:
    """Whether System One requests are answered by reading labels (not relayed):
    known once the served model is, and true unless it is a decision model."""
    return info is not None and "decisions" not in info.output_modalities


async def system_one_answer(
    app: web.Application, call: SystemOneCall, info: ModelInfo
) -> dict[str, Any]:
    """The System One answer to a validated request, read from the chat model ``info``."""
    limit = app[SETTINGS].max_state_chars
    if len(call.state_text) > limit:
        raise Unprocessable([{"loc": ["body", "state"], "type": "string_too_long",
                              "msg": f"the state is {len(call.state_text)} characters; "
                                     f"the limit is {limit}"}])
    names = names_of(app, info)
    if call.model is not None and not names.accepts(call.model):
        raise Unprocessable([{
            "loc": ["body", "model"],
            "msg": f"unknown model {call.model!r}; this server answers as "
                   f"{list(names.listed)}",
            "type": "value_error",
        }])
    store = app[PROFILES]
    profile = store.select(call.calibration, param="x_calibration")
    if profile is not None:
        store.check(profile, info, param="x_calibration")
    plans = {qid: debias_for(profile, q, call.debias_method, call.debias.get(qid, ()),
                             param="x_debias")
             for qid, q in call.questions.items()}
    outcomes = await app[SERVICE].decide_many(
        call.state_text, call.questions,
        debias={qid: plan.shifts for qid, plan in plans.items() if plan.shifts},
        contextual=frozenset(qid for qid, plan in plans.items() if plan.method == "contextual"))
    calibrated = {qid: calibrate(profile, outcome, plans[qid], call.label_mass_floor)
                  for qid, outcome in outcomes.items()}
    return response_body(call.model or DEFAULT_MODEL, calibrated)
