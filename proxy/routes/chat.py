"""POST /v1/chat/completions: decisions for requests with ``semif``, relay for the rest."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..app_keys import KIND, MODELS, SETTINGS, UPSTREAM
from ..errors import InvalidRequest
from ..protocol.chat import completion_body, completion_chunks
from ..profiles import calibrate, debias_for
from ..protocol.relayed import relayed_body
from ..protocol.semif import parse_semif, refuse_incompatible, requested_logprobs
from ..decision.outcome import Outcome
from ..decision.prompt import PROMPT_FORMAT_VERSIONS
from ..served import UnknownModel
from .common import (check_depth, json_object, json_response, relay, relayed_work,
                     select_profile)

__all__ = ["chat_completions", "chat_decision"]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    body = json_object(raw)
    if body.get("semif") is None:  # checked and bounded here: a 400, not llama-server's 500
        path = "/v1/chat/completions"
        data = relayed_body(path, body, raw, request.app[SETTINGS].relay_max_tokens)
        return await relay(request, request.app[UPSTREAM], data, path,
                           relayed_work(request.app, path, body, data))
    request[KIND] = "decision"
    top = requested_logprobs(body)
    include_usage = _include_usage(body)
    outcome, model, stream = await chat_decision(request.app, body, raw)
    if not stream:
        return json_response(completion_body(outcome, model, top))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in completion_chunks(outcome, model, top, include_usage):
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise InvalidRequest("stream_options must be an object whose include_usage is a boolean",
                             param="stream_options")
    return bool(options.get("include_usage", False))


async def chat_decision(
    app: web.Application, body: dict[str, Any], raw: bytes
) -> tuple[Outcome, str | None, bool]:
    """The decision a chat body with ``semif`` asks for: (outcome, model, stream)."""
    check_depth(body, raw)
    call = parse_semif(body["semif"])
    refuse_incompatible(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be a boolean", param="stream")
    model = body.get("model") if isinstance(body.get("model"), str) else None
    try:  # one model: any name, as llama-server allows; a router: one of its models
        service = await app[MODELS].service(model, strict=False)
    except UnknownModel as exc:
        raise InvalidRequest(exc.message(), param="model", code="model_not_found") from exc
    profile = await select_profile(app, service, call.calibration, "semif.calibration",
                                   version=PROMPT_FORMAT_VERSIONS[call.layout])
    plan = debias_for(profile, call.question, call.debias_method, call.debias,
                      param="semif.debias")
    outcome = calibrate(profile, await service.decide(
        body["messages"], call.question, body.get("chat_template_kwargs"),
        debias=plan.shifts, contextual=plan.method == "contextual", layout=call.layout,
    ), plan, call.label_mass_floor)
    return outcome, model, stream
