"""POST /invocations (SageMaker): one path for every body the proxy understands,
told apart by shape:

    {"messages": [...], ...}              chat completions (with or without semif)
    {"state": ..., "questions": {...}}    System One
    {"input": ..., "questions": [...]}    OpenAI Decisions
"""

from __future__ import annotations

from aiohttp import web

from ..app_keys import API
from ..errors import InvalidRequest
from .chat import chat_completions
from .common import json_object
from .decisions import decisions
from .systemone import system_one

__all__ = ["invocations"]


async def invocations(request: web.Request) -> web.StreamResponse:
    body = json_object(await request.read())  # read once; the handlers reuse aiohttp's copy
    if "messages" in body:
        return await chat_completions(request)
    if "state" in body and isinstance(body.get("questions"), dict):
        request[API] = "systemone"
        return await system_one(request)
    if "input" in body and isinstance(body.get("questions"), list):
        return await decisions(request)
    raise InvalidRequest(
        "the body is neither a chat completion (messages), a System One request "
        "(state, questions{}) nor a Decisions request (input, questions[])",
        code="unknown_body_shape",
    )
