"""POST /invocations (SageMaker): one path for every body the proxy understands,
told apart by shape:

    {"messages": [...], ...}              chat completions (with or without semif)
    {"state": ..., "questions": {...}}    System One
    {"input": ..., "questions": [...]}    OpenAI Decisions

A ``Content-Type: application/jsonlines`` body (SageMaker Batch Transform with
``SplitType=Line`` and ``BatchStrategy=MultiRecord``) holds one decision request per
line, of any of the three shapes (chat with ``semif``); the answer is
``application/jsonlines`` in the same order, one line per input line, a failed line
answering ``{"error": {status, message, type, param, code[, detail]}}`` (a blank line
too, so the answer has as many lines as the body). The body limit bounds the lines
(Batch Transform fills a payload up to MaxPayloadInMB, whatever the count); they are
read as many at a time as llama-server has slots, each admitted like a request of its
own, and counted under the request kind "batch" (not in the decision latency).
The payload as a whole has ``PROXY_INVOCATIONS_TIMEOUT`` (the transform job's
``InvocationsTimeoutInSeconds``): a line not answered by then gets a 504 record, so the
answer arrives before SageMaker gives up on the call and retries all of it.
``GET /execution-parameters`` tells Batch Transform how to call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web

from ..app_keys import API, FACT_SHEET, KIND, METRICS, MODELS, SETTINGS
from ..errors import InvalidRequest, UpstreamTimeout, error_record
from ..facts import Facts
from ..middleware import handled
from ..recorder import Context, request_id
from .chat import chat_record, chat_reply
from .common import check_depth, deadline_of, json_object
from .decisions import decisions_record, decisions_reply
from .systemone import system_one_record, system_one_reply

__all__ = ["JSONLINES", "invocations", "execution_parameters", "body_shape", "answer_line"]

JSONLINES = frozenset({"application/jsonlines", "application/jsonl", "application/x-jsonlines"})
_MIB = 1024 * 1024
_PAYLOAD_MB = 1  # advertised payload size: python -m deploy transform's default too
# the payload's lines are answered within this share of PROXY_INVOCATIONS_TIMEOUT: the
# rest is left for sending the answer before SageMaker gives up on the call
_PAYLOAD_HEADROOM = 0.95
log = logging.getLogger("proxy")


async def invocations(request: web.Request) -> web.StreamResponse:
    if request.content_type in JSONLINES:
        return await _jsonlines(request)
    raw = await request.read()
    body = json_object(raw)
    shape = body_shape(body)
    if shape == "chat":
        return await chat_reply(request, body, raw)
    if shape == "systemone":
        request[API] = "systemone"
        return await system_one_reply(request, body, raw)
    return await decisions_reply(request, body, raw)


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
    """What SageMaker Batch Transform should send when the job does not say: one payload at
    a time per instance (each is read over every llama-server slot), many records per
    payload, 1 MB of them (every line must be answered within the invocation timeout: a
    few thousand lines at a small model's CPU speed), never more than the body limit."""
    limit = request.app[SETTINGS].max_body_bytes
    return web.json_response(
        {
            "MaxConcurrentTransforms": 1,
            "BatchStrategy": "MULTI_RECORD",
            "MaxPayloadInMB": max(1, min(_PAYLOAD_MB, limit // _MIB)),
        }
    )


async def _jsonlines(request: web.Request) -> web.Response:
    request[KIND] = "batch"
    app = request.app
    loop = asyncio.get_running_loop()
    timeout_s = app[SETTINGS].invocations_timeout_s
    deadline = loop.time() + timeout_s * _PAYLOAD_HEADROOM  # time left to send the answer
    line_deadline = deadline_of(request)  # each line's, from the payload's headers
    lines = (await request.read()).split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the last line's newline
    if not lines:
        raise InvalidRequest("the jsonlines body has no lines", code="empty_body")
    answers: list[bytes] = [b""] * len(lines)
    # line n's decisions: <payload>/<n>[/<question>]
    payload = request_id(request.headers, app[METRICS])
    todo = iter(enumerate(lines))
    late = UpstreamTimeout(
        f"the payload's {timeout_s:g} s deadline (PROXY_INVOCATIONS_TIMEOUT) passed before "
        "this line was answered; send it again",
        code="payload_deadline",
    )
    too_late = orjson.dumps(error_record(late))
    missed = 0

    async def worker() -> None:
        nonlocal missed
        for i, raw in todo:
            if loop.time() >= deadline:  # not started: nothing is sent to llama-server
                answers[i], missed = too_late, missed + 1
                continue
            try:
                # each line's own facts, on the payload's clock of time waiting on llama-server
                facts = Facts(upstream=request[FACT_SHEET].upstream)
                context = Context(
                    payload,
                    "invocations",
                    time.perf_counter(),
                    line=i,
                    deadline=line_deadline,
                    facts=facts,
                )
                async with asyncio.timeout_at(deadline):
                    answers[i] = orjson.dumps(await answer_line(app, raw, context))
                if facts.estimate is not None:  # the payload's Server-Timing: the last one's
                    request[FACT_SHEET].estimate = facts.estimate
            except TimeoutError:  # cut short: llama-server's work on it is cancelled
                answers[i], missed = too_late, missed + 1

    async with asyncio.TaskGroup() as group:
        # as many at a time as the default model has slots (a router's each have their own)
        slots = await (await app[MODELS].service(None)).discovery.total_slots()
        for _ in range(min(len(lines), slots)):
            group.create_task(worker())
    if missed:  # counted as the errors they are, logged once per payload
        app[METRICS].upstream_errors.labels(late.code).inc(missed)
        log.warning(
            "POST /invocations: %d of %d lines missed the payload's %g s deadline "
            "(PROXY_INVOCATIONS_TIMEOUT)",
            missed,
            len(lines),
            timeout_s,
        )
    return web.Response(
        body=b"\n".join(answers) + b"\n",
        content_type="application/jsonlines",
        headers={"X-Request-Id": payload},
    )


async def answer_line(app: web.Application, raw: bytes, context: Context) -> dict[str, Any]:
    """One jsonlines record's answer, or its error record: counted like a request's, an
    unexpected failure logged with an id and answered as a 500 record (the middleware's
    ``handled``). ``context``: the payload's request id and the line's number, for its
    decision ids."""
    try:
        if not raw.strip():
            raise InvalidRequest("the line is blank", code="blank_line")
        return await _answer(app, raw, context)
    except Exception as exc:  # noqa: BLE001 - one line's failure must not sink the payload
        return error_record(handled(app, "POST", "/invocations", exc, what="line"))


async def _answer(app: web.Application, raw: bytes, context: Context) -> dict[str, Any]:
    """A line answered by the same parse, service call and render as its route's."""
    body = json_object(raw)
    shape = body_shape(body)
    check_depth(body, raw)
    if shape == "systemone":
        return await system_one_record(app, body, raw, context)
    if shape == "decisions":
        return await decisions_record(app, body, raw, context)
    if body.get("semif") is None:
        raise InvalidRequest(
            "a jsonlines line is a decision: a chat request needs semif "
            "(generations go to /invocations one at a time)",
            param="semif",
        )
    if body.get("stream"):
        raise InvalidRequest("a jsonlines line is answered whole: no stream", param="stream")
    return await chat_record(app, body, raw, replace(context, question_ids=False))
