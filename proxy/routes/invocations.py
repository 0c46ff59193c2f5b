"""POST /invocations (SageMaker): one path for every body the proxy understands,
told apart by shape:

    {"messages": [...], ...}              chat completions (with or without semif)
    {"state": ..., "questions": {...}}    System One
    {"input": ..., "questions": [...]}    OpenAI Decisions

A ``Content-Type: application/jsonlines`` body (SageMaker Batch Transform with
``SplitType=Line`` and ``BatchStrategy=MultiRecord``) holds one decision request per
line, of any of the three shapes (chat with ``semif``); the answer is
``application/jsonlines`` in the same order, one line per input line, a failed line
answering ``{"error": {status, code, message, param[, detail]}}``. Lines are read as
many at a time as llama-server has slots; each is admitted like a request of its own.
``GET /execution-parameters`` tells Batch Transform how to call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from ..app_keys import API, KIND, METRICS, SERVICE, SETTINGS
from ..errors import InvalidRequest, ProxyError, Unprocessable, UpstreamError
from ..protocol.chat import completion_body
from ..protocol.semif import requested_logprobs
from ..protocol.systemone import parse_request
from .chat import chat_completions, chat_decision
from .common import check_depth, json_object
from .decisions import decisions, decisions_answer
from .systemone import served_here, system_one, system_one_answer

__all__ = ["JSONLINES", "invocations", "execution_parameters", "body_shape", "answer_line"]

JSONLINES = frozenset({"application/jsonlines", "application/jsonl", "application/x-jsonlines"})
_MIB = 1024 * 1024


async def invocations(request: web.Request) -> web.StreamResponse:
    if request.content_type in JSONLINES:
        return await _jsonlines(request)
    shape = body_shape(json_object(await request.read()))  # the handlers reuse aiohttp's copy
    if shape == "chat":
        return await chat_completions(request)
    if shape == "systemone":
        request[API] = "systemone"
        return await system_one(request)
    return await decisions(request)


def body_shape(body: dict[str, Any]) -> str:
    """Which API a body belongs to: "chat", "systemone" or "decisions"."""
    if "messages" in body:
        return "chat"
    if "state" in body and isinstance(body.get("questions"), dict):
        return "systemone"
    if "input" in body and isinstance(body.get("questions"), list):
        return "decisions"
    raise InvalidRequest(
        "the body is neither a chat completion (messages), a System One request "
        "(state, questions{}) nor a Decisions request (input, questions[])",
        code="unknown_body_shape",
    )


async def execution_parameters(request: web.Request) -> web.Response:
    """What SageMaker Batch Transform should send: one payload at a time per instance (each
    is read over every llama-server slot), many records per payload, up to the body limit."""
    limit = request.app[SETTINGS].max_body_bytes
    return web.json_response({"MaxConcurrentTransforms": 1, "BatchStrategy": "MULTI_RECORD",
                              "MaxPayloadInMB": max(1, limit // _MIB)})


async def _jsonlines(request: web.Request) -> web.Response:
    request[KIND] = "decision"
    app = request.app
    lines = [line for line in (await request.read()).split(b"\n") if line.strip()]
    if not lines:
        raise InvalidRequest("the jsonlines body has no lines", code="empty_body")
    limit = asyncio.Semaphore(await app[SERVICE].total_slots())

    async def one(raw: bytes) -> bytes:
        async with limit:
            return orjson.dumps(await answer_line(app, raw))

    answers = await asyncio.gather(*(one(line) for line in lines))
    return web.Response(body=b"\n".join(answers) + b"\n", content_type="application/jsonlines")


async def answer_line(app: web.Application, raw: bytes) -> dict[str, Any]:
    """One jsonlines record's answer, or its error record (counted like a request's)."""
    try:
        body = json_object(raw)
        shape = body_shape(body)
        check_depth(body, raw)
        if shape == "systemone":
            call = parse_request(body)
            info = await app[SERVICE].model()
            if not served_here(info):
                raise InvalidRequest("llama-server serves a native decision model: send System "
                                     "One requests to it one at a time", code="native_model")
            return await system_one_answer(app, call, info)
        if shape == "decisions":
            return await decisions_answer(app, body, raw)
        if body.get("semif") is None:
            raise InvalidRequest("a jsonlines line is a decision: a chat request needs semif "
                                 "(generations go to /invocations one at a time)", param="semif")
        top = requested_logprobs(body)
        outcome, model, _stream = await chat_decision(app, body, raw)
        return completion_body(outcome, model, top)
    except ProxyError as err:
        metrics = app[METRICS]
        if isinstance(err, UpstreamError) and err.status >= 500:
            metrics.upstream_errors.labels(err.code).inc()
        elif err.status < 500:
            metrics.client_errors.labels(err.code).inc()
        record: dict[str, Any] = {"status": err.status, "code": err.code, "message": err.message,
                                  "param": err.param}
        if isinstance(err, Unprocessable):
            record["detail"] = err.details
        return {"error": record}
